// Row-wise element ops on row-major f32 matrices, the same arithmetic as
// kernels/src/cpu/ops.rs. Needs common.cuh in front.

// x[i] += y[i], or y[i % cols] when `broadcast` (a bias added to every row).
extern "C" __global__ void add_f32(float* x, const float* y, u64 n, u32 cols, u32 broadcast) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        x[i] += broadcast ? y[i % cols] : y[i];
    }
}

// gate[i] = silu(gate[i]) * up[i].
extern "C" __global__ void silu_mul_f32(float* gate, const float* up, u64 n) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// One block per group of `group` values: out = w * (x * 1/sqrt(mean(x²) + eps)).
__device__ __forceinline__ void rms_norm_group(const float* x, const float* w, float* out, u32 group, float eps) {
    const float* xr = x + (u64)blockIdx.x * group;
    float* o = out + (u64)blockIdx.x * group;
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < group; i += blockDim.x) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = block_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)group + eps);
    for (u32 i = threadIdx.x; i < group; i += blockDim.x) {
        o[i] = w[i] * (xr[i] * inv);
    }
}

extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* out, u32 group, float eps) {
    rms_norm_group(x, w, out, group, eps);
}

// In place (each thread rewrites only the values it read after the block sum).
extern "C" __global__ void rms_norm_inplace_f32(float* x, const float* w, u32 group, float eps) {
    rms_norm_group(x, w, x, group, eps);
}

// Per position p (row r): half cosines then half sines of p * inv_freq[j], times
// `scale` (YaRN's attention factor, else 1). `inv_freq` holds f32 bits, computed on
// the host exactly as the CPU does.
extern "C" __global__ void rope_table_f32(const u32* positions, const u32* inv_freq, float* out, u32 n, u32 half, float scale) {
    const u64 total = (u64)n * half;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 r = i / half;
        const u32 j = (u32)(i % half);
        const float angle = (float)positions[r] * __uint_as_float(inv_freq[j]);
        out[r * 2 * half + j] = cosf(angle) * scale;
        out[r * 2 * half + half + j] = sinf(angle) * scale;
    }
}

// Rotates every head of every row of x (rows × cols) by its row of `table`
// (head_dim wide: cosines then sines). One thread per rotated pair.
extern "C" __global__ void rope_f32(float* x, const float* table, u32 rows, u32 cols, u32 head_dim, u32 interleaved) {
    const u32 half = head_dim / 2;
    const u32 pairs = cols / 2;
    const u64 total = (u64)rows * pairs;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 r = i / pairs;
        const u32 p = (u32)(i % pairs);
        const u32 head = p / half;
        const u32 j = p % half;
        const float c = table[r * head_dim + j];
        const float s = table[r * head_dim + half + j];
        float* h = x + r * cols + (u64)head * head_dim;
        const u32 ia = interleaved ? 2 * j : j;
        const u32 ib = interleaved ? 2 * j + 1 : j + half;
        const float a = h[ia];
        const float b = h[ib];
        h[ia] = a * c - b * s;
        h[ib] = b * c + a * s;
    }
}

// out[i] = x[rows[i]] (cols wide).
extern "C" __global__ void gather_rows_f32(const float* x, const u32* rows, float* out, u32 n, u32 cols) {
    const u64 total = (u64)n * cols;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 r = i / cols;
        const u32 c = (u32)(i % cols);
        out[i] = x[(u64)rows[r] * cols + c];
    }
}

// x[table[i]] += bits_as_float(table[n + i]) * y[i] (cols wide); the rows are distinct, so no two
// threads write one value.
extern "C" __global__ void add_rows_scaled_f32(float* x, const float* y, const u32* table, u32 n, u32 cols) {
    const u64 total = (u64)n * cols;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 r = i / cols;
        const u32 c = (u32)(i % cols);
        const float s = __uint_as_float(table[n + r]);
        float* d = x + (u64)table[r] * cols + c;
        *d = __fadd_rn(*d, __fmul_rn(s, y[i]));
    }
}

// Row i of k and v (cols wide) into slot slots[i] of the layer's K/V (f16).
extern "C" __global__ void kv_store_f16(const float* k, const float* v, u16* kc, u16* vc, const u32* slots, u32 n, u32 cols) {
    const u64 total = (u64)n * cols;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 r = i / cols;
        const u32 c = (u32)(i % cols);
        const u64 dst = (u64)slots[r] * cols + c;
        kc[dst] = f32_to_f16(k[i]);
        vc[dst] = f32_to_f16(v[i]);
    }
}

// Slot slots[i] of the layer's K and V (f16 bits) into row i of k_out and v_out: a K/V export.
extern "C" __global__ void kv_gather_f16(const u16* kc, const u16* vc, const u32* slots, u16* k_out, u16* v_out, u32 n, u32 cols) {
    const u64 total = (u64)n * cols;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 r = i / cols;
        const u32 c = (u32)(i % cols);
        const u64 src = (u64)slots[r] * cols + c;
        k_out[i] = kc[src];
        v_out[i] = vc[src];
    }
}

// Row i of k and v (f16 bits) into slot slots[i] of the layer's K and V: a K/V import.
extern "C" __global__ void kv_scatter_f16(const u16* k, const u16* v, u16* kc, u16* vc, const u32* slots, u32 n, u32 cols) {
    const u64 total = (u64)n * cols;
    for (u64 i = global_index(); i < total; i += grid_stride()) {
        const u64 r = i / cols;
        const u32 c = (u32)(i % cols);
        const u64 dst = (u64)slots[r] * cols + c;
        kc[dst] = k[i];
        vc[dst] = v[i];
    }
}

// x (f32) to bf16: the activations of a cuBLAS GEMM.
extern "C" __global__ void activations_to_bf16(const float* x, u16* out, u64 n) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        out[i] = f32_to_bf16(x[i]);
    }
}
