// Helpers shared by every cachet kernel program. The Rust side
// (src/cuda/module.rs) puts this file, then dequant.cuh, in front of each .cu
// program before NVRTC compiles it, so the kernels need no CUDA headers:
// the f16/bf16 conversions are written here with PTX `cvt` and bit operations.
//
// Programs are compiled with --fmad=false: a multiply followed by an add is
// never contracted into an FMA behind our back, so dequantization and the
// element-wise ops round exactly as the CPU backend's Rust code does, and every
// reduction below has one fixed order (a row's result never depends on the
// batch it is in). Dot products use fmaf explicitly.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define NEG_INF __uint_as_float(0xff800000u)

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as half::f16::from_f32.
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf16_to_f32(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// Round to nearest even, NaN stays a quiet NaN (as half::bf16::from_f32).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

// Butterfly sums: every lane ends with the same bits (each step adds the same
// two values on both partners, and float addition is commutative).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, o);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024): warp sums,
// then every thread adds the warp sums in warp order. All threads get it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    v = warp_sum(v);
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        part[warp] = v;
    }
    __syncthreads();
    float s = 0.0f;
    const int warps = (blockDim.x + 31) >> 5;
    for (int i = 0; i < warps; ++i) {
        s += part[i];
    }
    __syncthreads();
    return s;
}

__device__ __forceinline__ u32 umin(u32 a, u32 b) {
    return a < b ? a : b;
}

// Index of this thread in a one-dimensional grid, and the grid's stride.
__device__ __forceinline__ u64 global_index() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 grid_stride() {
    return (u64)gridDim.x * blockDim.x;
}
