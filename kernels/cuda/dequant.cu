// Whole rows of a weight dequantized: gathered embedding rows (f32) and the
// dense bf16 copy of a matrix that cuBLAS multiplies for prefill. Needs
// common.cuh and dequant.cuh in front. One row per block; a thread decodes
// units of 32 values (quantized formats) or single values (float formats).

// One row of the table per block: out[i] = dequantized row tokens[i] (f32).
template <int F>
__device__ __forceinline__ void embed_body(const u8* w, const u32* tokens, float* out, u32 cols, u64 row_bytes) {
    const u8* row = w + (u64)tokens[blockIdx.x] * row_bytes;
    float* o = out + (u64)blockIdx.x * cols;
    if constexpr (is_float_fmt<F>::value) {
        for (u32 e = threadIdx.x; e < cols; e += blockDim.x) {
            o[e] = load_elem<F>(row, e);
        }
    } else {
        for (u32 u = threadIdx.x; u < cols / 32; u += blockDim.x) {
            float y[32];
            dequant_unit<F>(row, u, y);
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                o[32 * u + j] = y[j];
            }
        }
    }
}

// One row per block: the whole matrix dequantized to bf16 (the dense copy
// cuBLAS multiplies for prefill).
template <int F>
__device__ __forceinline__ void to_bf16_body(const u8* w, u16* out, u32 cols, u64 row_bytes) {
    const u8* row = w + (u64)blockIdx.x * row_bytes;
    u16* o = out + (u64)blockIdx.x * cols;
    if constexpr (is_float_fmt<F>::value) {
        for (u32 e = threadIdx.x; e < cols; e += blockDim.x) {
            o[e] = f32_to_bf16(load_elem<F>(row, e));
        }
    } else {
        for (u32 u = threadIdx.x; u < cols / 32; u += blockDim.x) {
            float y[32];
            dequant_unit<F>(row, u, y);
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                o[32 * u + j] = f32_to_bf16(y[j]);
            }
        }
    }
}

#define CACHET_DEQUANT(name, F)                                                                    \
    extern "C" __global__ void embed_##name(const u8* w, const u32* tokens, float* out, u32 cols,  \
                                            u64 row_bytes) {                                        \
        embed_body<F>(w, tokens, out, cols, row_bytes);                                             \
    }                                                                                               \
    extern "C" __global__ void to_bf16_##name(const u8* w, u16* out, u32 cols, u64 row_bytes) {    \
        to_bf16_body<F>(w, out, cols, row_bytes);                                                   \
    }

CACHET_DEQUANT(f32, FMT_F32)
CACHET_DEQUANT(f16, FMT_F16)
CACHET_DEQUANT(bf16, FMT_BF16)
CACHET_DEQUANT(q4_0, FMT_Q4_0)
CACHET_DEQUANT(q5_0, FMT_Q5_0)
CACHET_DEQUANT(q8_0, FMT_Q8_0)
CACHET_DEQUANT(q4_k, FMT_Q4_K)
CACHET_DEQUANT(q5_k, FMT_Q5_K)
CACHET_DEQUANT(q6_k, FMT_Q6_K)
