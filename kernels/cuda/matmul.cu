// out = x · wᵀ with w in its file format, dequantized on the fly. Needs
// common.cuh and dequant.cuh in front.
//
// x is t × k (f32, row-major), w is n × k (rows of `row_bytes` bytes), out is
// t × n. A block has MM_WARPS warps; each warp owns one weight row and up to
// MM_TILE tokens (blockIdx.y picks the token tile), so a row's weights are
// read once per tile. Lane `l` always reduces the same elements of k in the
// same order (quantized: units l, l+32, …; float formats: elements l, l+32,
// …), with fmaf, then the warp sums the lanes with a fixed butterfly: each
// output's value depends only on its row of x and of w, never on t or on the
// token's place in the tile — the kernel is batch invariant.

#define MM_WARPS 4
#define MM_TILE 8

template <int F>
__device__ __forceinline__ void matmul_body(const u8* w, const float* x, float* out, u32 n, u32 k, u32 t, u64 row_bytes) {
    const u32 warp = threadIdx.x >> 5;
    const u32 lane = threadIdx.x & 31;
    const u32 r = blockIdx.x * MM_WARPS + warp;
    if (r >= n) {
        return;
    }
    const u32 t0 = blockIdx.y * MM_TILE;
    const u32 nt = umin(MM_TILE, t - t0);
    const u8* row = w + (u64)r * row_bytes;
    const float* xt = x + (u64)t0 * k;
    float acc[MM_TILE];
#pragma unroll
    for (int i = 0; i < MM_TILE; ++i) {
        acc[i] = 0.0f;
    }
    if constexpr (is_float_fmt<F>::value) {
        for (u32 e = lane; e < k; e += 32) {
            const float wv = load_elem<F>(row, e);
#pragma unroll
            for (int i = 0; i < MM_TILE; ++i) {
                if (i < nt) {
                    acc[i] = fmaf(wv, xt[(u64)i * k + e], acc[i]);
                }
            }
        }
    } else {
        const u32 units = k / 32;
        for (u32 u = lane; u < units; u += 32) {
            float y[32];
            dequant_unit<F>(row, u, y);
#pragma unroll
            for (int i = 0; i < MM_TILE; ++i) {
                if (i < nt) {
                    // 32 consecutive floats at a 128-byte aligned offset.
                    const float4* xv = (const float4*)(xt + (u64)i * k + 32 * (u64)u);
                    float a = acc[i];
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        const float4 v = xv[j];
                        a = fmaf(y[4 * j], v.x, a);
                        a = fmaf(y[4 * j + 1], v.y, a);
                        a = fmaf(y[4 * j + 2], v.z, a);
                        a = fmaf(y[4 * j + 3], v.w, a);
                    }
                    acc[i] = a;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MM_TILE; ++i) {
        if (i < nt) {
            const float s = warp_sum(acc[i]);
            if (lane == 0) {
                out[(u64)(t0 + i) * n + r] = s;
            }
        }
    }
}

#define CACHET_MATMUL(name, F)                                                                               \
    extern "C" __global__ void matmul_##name(const u8* w, const float* x, float* out, u32 n, u32 k, u32 t, \
                                             u64 row_bytes) {                                               \
        matmul_body<F>(w, x, out, n, k, t, row_bytes);                                                      \
    }

CACHET_MATMUL(f32, FMT_F32)
CACHET_MATMUL(f16, FMT_F16)
CACHET_MATMUL(bf16, FMT_BF16)
CACHET_MATMUL(q4_0, FMT_Q4_0)
CACHET_MATMUL(q5_0, FMT_Q5_0)
CACHET_MATMUL(q8_0, FMT_Q8_0)
CACHET_MATMUL(q4_k, FMT_Q4_K)
CACHET_MATMUL(q5_k, FMT_Q5_K)
CACHET_MATMUL(q6_k, FMT_Q6_K)
