// The GGML weight formats, decoded exactly as kernels/src/quant/dequant.rs
// does (same operations in the same order, so the values are bit-identical).
// Layouts as kernels/src/quant/blocks.rs: every block starts at an even
// address (block sizes are even and allocations are 256-byte aligned), so
// 16-bit loads are aligned.
//
// A quantized row is decoded in units of 32 consecutive values: unit `u` holds
// values 32u..32u+32 (one Q4_0/Q5_0/Q8_0 block, or one sub-block of a K block).

#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q4_0 3
#define FMT_Q5_0 4
#define FMT_Q8_0 5
#define FMT_Q4_K 6
#define FMT_Q5_K 7
#define FMT_Q6_K 8

template <int F>
struct is_float_fmt {
    static constexpr bool value = F == FMT_F32 || F == FMT_F16 || F == FMT_BF16;
};

__device__ __forceinline__ u16 load_u16(const u8* p) {
    return *(const u16*)p;
}

// Element `k` of a row of a float format.
template <int F>
__device__ __forceinline__ float load_elem(const u8* row, u32 k);

template <>
__device__ __forceinline__ float load_elem<FMT_F32>(const u8* row, u32 k) {
    return ((const float*)row)[k];
}

template <>
__device__ __forceinline__ float load_elem<FMT_F16>(const u8* row, u32 k) {
    return f16_to_f32(((const u16*)row)[k]);
}

template <>
__device__ __forceinline__ float load_elem<FMT_BF16>(const u8* row, u32 k) {
    return bf16_to_f32(((const u16*)row)[k]);
}

// The 6-bit scale and min of sub-block j (0..8) of a Q4_K/Q5_K block.
__device__ __forceinline__ void scale_min_k4(u32 j, const u8* q, u32* sc, u32* m) {
    if (j < 4) {
        *sc = q[j] & 63u;
        *m = q[j + 4] & 63u;
    } else {
        *sc = (q[j + 4] & 0xFu) | ((u32)(q[j - 4] >> 6) << 4);
        *m = (u32)(q[j + 4] >> 4) | ((u32)(q[j] >> 6) << 4);
    }
}

// Unit `u` (values 32u..32u+32) of a quantized row, into y[0..32].
template <int F>
__device__ __forceinline__ void dequant_unit(const u8* row, u32 u, float* y);

// Q4_0, 18 bytes: d (f16), qs[16]; value j in the low nibble of qs[j], value
// j + 16 in its high nibble; d * (q - 8).
template <>
__device__ __forceinline__ void dequant_unit<FMT_Q4_0>(const u8* row, u32 u, float* y) {
    const u8* b = row + (u64)u * 18;
    const float d = f16_to_f32(load_u16(b));
    const u8* qs = b + 2;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const u32 q = qs[j];
        y[j] = d * (float)((int)(q & 0xFu) - 8);
        y[j + 16] = d * (float)((int)(q >> 4) - 8);
    }
}

// Q5_0, 22 bytes: d (f16), qh (u32 LE, bit j = fifth bit of value j), qs[16];
// d * (q - 16).
template <>
__device__ __forceinline__ void dequant_unit<FMT_Q5_0>(const u8* row, u32 u, float* y) {
    const u8* b = row + (u64)u * 22;
    const float d = f16_to_f32(load_u16(b));
    const u32 qh = (u32)load_u16(b + 2) | ((u32)load_u16(b + 4) << 16);
    const u8* qs = b + 6;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const u32 q = qs[j];
        const u32 h0 = ((qh >> j) & 1u) << 4;
        const u32 h1 = ((qh >> (j + 16)) & 1u) << 4;
        y[j] = d * (float)((int)((q & 0xFu) | h0) - 16);
        y[j + 16] = d * (float)((int)((q >> 4) | h1) - 16);
    }
}

// Q8_0, 34 bytes: d (f16), qs[32] (i8); d * q.
template <>
__device__ __forceinline__ void dequant_unit<FMT_Q8_0>(const u8* row, u32 u, float* y) {
    const u8* b = row + (u64)u * 34;
    const float d = f16_to_f32(load_u16(b));
    const i8* qs = (const i8*)(b + 2);
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        y[j] = d * (float)qs[j];
    }
}

// Q4_K, 144 bytes: d, dmin (f16), scales[12], qs[128]. Sub-block s = 2j + hi
// takes nibble `hi` of qs[32j..32j+32]; d*sc*q - dmin*m.
template <>
__device__ __forceinline__ void dequant_unit<FMT_Q4_K>(const u8* row, u32 u, float* y) {
    const u8* b = row + (u64)(u >> 3) * 144;
    const u32 s = u & 7u;
    const float d = f16_to_f32(load_u16(b));
    const float dmin = f16_to_f32(load_u16(b + 2));
    u32 sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    const float d1 = d * (float)sc;
    const float m1 = dmin * (float)m;
    const u8* qs = b + 16 + 32 * (s >> 1);
    const u32 shift = 4 * (s & 1u);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        y[l] = d1 * (float)((qs[l] >> shift) & 0xFu) - m1;
    }
}

// Q5_K, 176 bytes: d, dmin (f16), scales[12], qh[32], qs[128]. Like Q4_K with
// bit s of qh[l] as the fifth bit.
template <>
__device__ __forceinline__ void dequant_unit<FMT_Q5_K>(const u8* row, u32 u, float* y) {
    const u8* b = row + (u64)(u >> 3) * 176;
    const u32 s = u & 7u;
    const float d = f16_to_f32(load_u16(b));
    const float dmin = f16_to_f32(load_u16(b + 2));
    u32 sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    const float d1 = d * (float)sc;
    const float m1 = dmin * (float)m;
    const u8* qh = b + 16;
    const u8* qs = b + 48 + 32 * (s >> 1);
    const u32 shift = 4 * (s & 1u);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const u32 h = ((u32)(qh[l] >> s) & 1u) << 4;
        y[l] = d1 * (float)(((qs[l] >> shift) & 0xFu) | h) - m1;
    }
}

// Q6_K, 210 bytes: ql[128], qh[64], scales[16] (i8), d (f16). Half `h` (128
// values) uses ql[64h..], qh[32h..], scales[8h..]; its part s (32 values)
// takes nibble s>>1 of ql[32(s&1) + l], bits 2s..2s+2 of qh[l], and scale
// 2s + l/16; d * sc * (q - 32).
template <>
__device__ __forceinline__ void dequant_unit<FMT_Q6_K>(const u8* row, u32 u, float* y) {
    const u8* b = row + (u64)(u >> 3) * 210;
    const u32 half = (u >> 2) & 1u;
    const u32 s = u & 3u;
    const float d = f16_to_f32(load_u16(b + 208));
    const u8* ql = b + 64 * half + 32 * (s & 1u);
    const u8* qh = b + 128 + 32 * half;
    const i8* sc = (const i8*)(b + 192 + 8 * half + 2 * s);
    const u32 shift_l = 4 * (s >> 1);
    const u32 shift_h = 2 * s;
    const float d0 = d * (float)sc[0];
    const float d1 = d * (float)sc[1];
#pragma unroll
    for (int l = 0; l < 32; ++l) {
        const int q = (int)(((ql[l] >> shift_l) & 0xFu) | (((qh[l] >> shift_h) & 3u) << 4)) - 32;
        y[l] = (l < 16 ? d0 : d1) * (float)q;
    }
}
