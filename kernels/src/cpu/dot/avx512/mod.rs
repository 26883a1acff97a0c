//! AVX-512 (F, BW, DQ, VL, VNNI) kernels. Quantized formats are computed as
//! register tiles of up to 4 weight rows × 4 tokens (`q32`, `qk`); the single
//! dot product is the 1 × 1 tile, so every output element goes through the
//! same operations whatever the batch. Dense formats use plain FMA dots.
//!
//! Safety: every function here requires the features of `SimdLevel::Avx512`;
//! `Kernels::for_level` hands them out only after detecting them.

use super::avx2::{bits32, k4_scales_mins, nibbles32};
use super::GemmJob;
use crate::quant::*;
use half::{bf16, f16};
use std::arch::x86_64::*;

mod q32;
mod q32x16;
mod qk;
mod qk16;
mod rows16;

use q32::Q32;
use qk::QK;

/// Gives this thread's decode buffers room for `bytes` (see `dot::warm_thread`).
pub(super) fn reserve(bytes: usize) {
    q32::reserve(bytes);
}

#[inline(always)]
pub(super) unsafe fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

#[inline(always)]
pub(super) unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p` (a 32-byte field, a run inside one, or
    // 16 f16/bf16 that `dense`'s bounds keep inside the slice); the load is unaligned, and the CPU has
    // the AVX-512 level's features (module contract above).
    unsafe { _mm256_loadu_si256(p.cast()) }
}

#[inline(always)]
pub(super) unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

#[inline(always)]
pub(super) unsafe fn hsum256(v: __m256) -> f32 {
    _mm512_reduce_add_ps(_mm512_insertf32x8(_mm512_setzero_ps(), v, 0))
}

/// The lane sum of `v` in a fixed order: the 256-bit halves added, then the 128-bit halves of
/// that, then the 64-bit halves, then the two lanes left. [`reduce16`] computes each of its
/// sums in exactly this order, so a tile's elements equal the 1 × 1 tile's bit for bit.
#[inline(always)]
pub(super) unsafe fn reduce1(v: __m512) -> f32 {
    let s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}

/// The lane sums of 16 vectors (`out[i]` is `reduce1(v[i])`, bit for bit): the same tree of
/// additions, done for all of them at once by shuffles that bring the halves of two vectors
/// side by side — 30 shuffles and 15 adds where 16 separate sums take about 130 operations
/// (a K-format tile over a 768-value row spends a fifth of its time there otherwise).
#[inline(always)]
pub(super) unsafe fn reduce16(v: &[__m512; 16]) -> [f32; 16] {
    // 512 → 256 bits: w[p] holds the 8-lane partial sums of v[2p] (low half) and v[2p + 1].
    let mut w = [_mm512_setzero_ps(); 8];
    for (p, w) in w.iter_mut().enumerate() {
        let (a, b) = (v[2 * p], v[2 * p + 1]);
        *w = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(a, b), _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b));
    }
    // 256 → 128: block k of x[q] holds the 4-lane partial sums of v[4q + k].
    let mut x = [_mm512_setzero_ps(); 4];
    for (q, x) in x.iter_mut().enumerate() {
        let (a, b) = (w[2 * q], w[2 * q + 1]);
        *x = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(a, b), _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b));
    }
    // 128 → 64: block k of y[r] holds the 2-lane sums of v[8r + k], then of v[8r + 4 + k].
    let mut y = [_mm512_setzero_ps(); 2];
    for (r, y) in y.iter_mut().enumerate() {
        let (a, b) = (x[2 * r], x[2 * r + 1]);
        *y = _mm512_add_ps(_mm512_shuffle_ps::<0b01_00_01_00>(a, b), _mm512_shuffle_ps::<0b11_10_11_10>(a, b));
    }
    // 64 → 32: lane 4k + m of z is the sum of v[k + 4m].
    let z =
        _mm512_add_ps(_mm512_shuffle_ps::<0b10_00_10_00>(y[0], y[1]), _mm512_shuffle_ps::<0b11_01_11_01>(y[0], y[1]));
    let natural = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
    let mut out = [0f32; 16];
    // SAFETY: the unaligned 64-byte store writes exactly `out` (`[f32; 16]`); AVX-512F per the module
    // contract.
    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), natural) };
    out
}

/// Every accumulator's lane sum in [`reduce1`]'s order; a full 4 × 4 tile's all at once.
#[inline(always)]
pub(super) unsafe fn tile_sums<const R: usize, const C: usize>(acc: &[[__m512; C]; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    // SAFETY: register-only reductions (`reduce16`, `reduce1`) of values copied out of `acc`; AVX-512
    // F/DQ per the module contract.
    unsafe {
        if R * C == 16 {
            let mut v = [_mm512_setzero_ps(); 16];
            for r in 0..R {
                v[r * C..(r + 1) * C].copy_from_slice(&acc[r]);
            }
            let sums = reduce16(&v);
            for (r, row) in out.iter_mut().enumerate() {
                row.copy_from_slice(&sums[r * C..(r + 1) * C]);
            }
        } else {
            for (row, acc) in out.iter_mut().zip(acc) {
                for (o, a) in row.iter_mut().zip(acc) {
                    *o = reduce1(*a);
                }
            }
        }
    }
    out
}

/// Broadcasts `a` to the low 8 lanes and `b` to the high 8.
#[inline(always)]
pub(super) unsafe fn pair(a: f32, b: f32) -> __m512 {
    _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1)
}

/// An `R`-row × `C`-token tile of dot products. Implementations compute each
/// element with the same operations whatever `R` and `C`.
pub(super) trait TileKernel {
    type W: Block;
    type A: Sync;
    unsafe fn tile<const R: usize, const C: usize>(w: [&[Self::W]; R], x: [&[Self::A]; C]) -> [[f32; C]; R];
}

/// Tiles of 4 rows × 4 tokens over the job, with smaller tiles at the edges;
/// single rows when the job has one token.
#[inline(always)]
pub(super) unsafe fn gemm<T: TileKernel>(job: &GemmJob<'_, T::W, T::A>) {
    let (wpr, apr) = (job.wpr, job.apr);
    // SAFETY: called only below with rows of the job (`r + i` with `r + 4 <= job.rows.end`, or
    // `r < job.rows.end`), and the `GemmFn` contract makes `job.w` hold each of them, `wpr` blocks long.
    let wrow = |r: usize| unsafe { job.w.get_unchecked(r * wpr..(r + 1) * wpr) };
    // SAFETY: called only below with tokens of the job (`t + j` inside `job.toks`), and the `GemmFn`
    // contract makes `job.x` hold each of them, `apr` blocks long.
    let xrow = |t: usize| unsafe { job.x.get_unchecked(t * apr..(t + 1) * apr) };
    macro_rules! tile {
        ($r:expr, $t:expr, [$($i:literal),+], [$($j:literal),+]) => {{
            let out = T::tile::<{ [$($i),+].len() }, { [$($j),+].len() }>([$(wrow($r + $i)),+], [$(xrow($t + $j)),+]);
            for (i, row) in out.iter().enumerate() {
                for (j, v) in row.iter().enumerate() {
                    *job.out.add(($t + j) * job.ldo + $r + i) = *v;
                }
            }
        }};
    }
    // SAFETY: the `GemmFn` contract: `job.out` may be written at `t * ldo + r` for the job's rows and
    // tokens, the only elements stored here (rows `r..r + 4 <= job.rows.end` or `r`, tokens inside
    // `job.toks`); `T::tile` gets weight rows of `wpr` blocks and activation rows of `apr >= wpr`
    // blocks, as it needs; the CPU has the AVX-512 level's features (module contract).
    unsafe {
        if job.toks.len() == 1 {
            let t = job.toks.start;
            let x = xrow(t);
            for r in job.rows.clone() {
                *job.out.add(t * job.ldo + r) = T::tile::<1, 1>([wrow(r)], [x])[0][0];
            }
            return;
        }
        let (t0, t1) = (job.toks.start, job.toks.end);
        let mut r = job.rows.start;
        while r < job.rows.end {
            let mut t = t0;
            // One token (GEMV): row by row, so the weights are one sequential
            // stream (lockstep rows defeat the hardware prefetcher and there is
            // no reuse to gain).
            if job.rows.end - r >= 4 && t1 - t0 > 1 {
                while t < t1 {
                    let tt = (t1 - t).min(4);
                    match tt {
                        4 => tile!(r, t, [0, 1, 2, 3], [0, 1, 2, 3]),
                        3 => tile!(r, t, [0, 1, 2, 3], [0, 1, 2]),
                        2 => tile!(r, t, [0, 1, 2, 3], [0, 1]),
                        _ => tile!(r, t, [0, 1, 2, 3], [0]),
                    }
                    t += tt;
                }
                r += 4;
            } else {
                while t < t1 {
                    if t1 - t >= 4 {
                        tile!(r, t, [0], [0, 1, 2, 3]);
                        t += 4;
                    } else {
                        tile!(r, t, [0], [0]);
                        t += 1;
                    }
                }
                r += 1;
            }
        }
    }
}

/// Dense dot with 16-wide FMA; `load(i)` widens the 16 weights at `i` to f32.
#[inline(always)]
unsafe fn dense(n: usize, x: &[f32], load: impl Fn(usize) -> __m512, tail: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: the 16-float loads read `x[i + 16k..i + 16k + 16]` only while `i + 64 <= n` (then
    // `x[i..i + 16]` while `i + 16 <= n`), and `load` is called with the same bounds; the callers pass
    // `n <= x.len()` and a `load` valid for `i + 16 <= n`, and run with AVX-512F (`#[target_feature]`).
    unsafe {
        while i + 64 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(load(i + 16 * k), _mm512_loadu_ps(x.as_ptr().add(i + 16 * k)), *a);
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(load(i), _mm512_loadu_ps(x.as_ptr().add(i)), acc[0]);
            i += 16;
        }
        let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        let mut sum = _mm512_reduce_add_ps(s);
        while i < n {
            sum += tail(i) * x[i];
            i += 1;
        }
        sum
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX-512F by `#[target_feature]`; `n = min(w.len(), x.len())` and `dense` calls `load(i)`
    // only with `i + 16 <= n`, so the 16-float load at `w[i]` stays inside `w`.
    unsafe { dense(n, x, |i| _mm512_loadu_ps(w.as_ptr().add(i)), |i| w[i]) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn f16(w: &[f16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX-512F by `#[target_feature]`; `dense` calls `load(i)` only with
    // `i + 16 <= n <= w.len()`, so the 32-byte load of 16 f16 at `w[i]` stays inside `w`.
    unsafe { dense(n, x, |i| _mm512_cvtph_ps(load256(w.as_ptr().add(i).cast())), |i| w[i].to_f32()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn bf16(w: &[bf16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: only `dense` below calls `load`, with `i + 16 <= n <= w.len()`, so the 32-byte load of
    // 16 bf16 at `w[i]` stays inside `w`; AVX-512F by this function's `#[target_feature]`.
    let load = |i: usize| unsafe {
        let h = _mm512_cvtepu16_epi32(load256(w.as_ptr().add(i).cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
    };
    // SAFETY: AVX-512F by `#[target_feature]`; `n = min(w.len(), x.len())`, and `load` is valid for
    // the `i + 16 <= n` that `dense` gives it.
    unsafe { dense(n, x, load, |i| w[i].to_f32()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4_0(w: &[BlockQ4_0], x: &[BlockQ8A]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: the AVX-512 level's features are present, this function's `#[target_feature]` contract
    // (`Kernels::for_level` detected them); the 1 × 1 tile reads blocks `0..n` of both slices, cut to
    // `n` here.
    unsafe { Q32::<BlockQ4_0>::tile::<1, 1>([&w[..n]], [&x[..n]])[0][0] }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_q4_0(job: &GemmJob<'_, BlockQ4_0, BlockQ8A>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `gemm32` requires.
    unsafe { q32::gemm32::<BlockQ4_0>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q5_0(w: &[BlockQ5_0], x: &[BlockQ8A]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: as in `q4_0`: the features by `#[target_feature]`, and both slices cut to the `n` blocks
    // the tile reads.
    unsafe { Q32::<BlockQ5_0>::tile::<1, 1>([&w[..n]], [&x[..n]])[0][0] }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_q5_0(job: &GemmJob<'_, BlockQ5_0, BlockQ8A>) {
    // SAFETY: as in `gemm_q4_0`: the caller's `GemmFn` contract is `gemm32`'s.
    unsafe { q32::gemm32::<BlockQ5_0>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q8_0(w: &[BlockQ8_0], x: &[BlockQ8A]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: as in `q4_0`: the features by `#[target_feature]`, and both slices cut to the `n` blocks
    // the tile reads.
    unsafe { Q32::<BlockQ8_0>::tile::<1, 1>([&w[..n]], [&x[..n]])[0][0] }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_q8_0(job: &GemmJob<'_, BlockQ8_0, BlockQ8A>) {
    // SAFETY: as in `gemm_q4_0`: the caller's `GemmFn` contract is `gemm32`'s.
    unsafe { q32::gemm32::<BlockQ8_0>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4_k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: as in `q4_0`: the features by `#[target_feature]`, and both slices cut to the `n` blocks
    // the tile reads.
    unsafe { QK::<BlockQ4K>::tile::<1, 1>([&w[..n]], [&x[..n]])[0][0] }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_q4_k(job: &GemmJob<'_, BlockQ4K, BlockQ8K>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `gemmk` requires.
    unsafe { qk::gemmk::<BlockQ4K>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q5_k(w: &[BlockQ5K], x: &[BlockQ8K]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: as in `q4_0`: the features by `#[target_feature]`, and both slices cut to the `n` blocks
    // the tile reads.
    unsafe { QK::<BlockQ5K>::tile::<1, 1>([&w[..n]], [&x[..n]])[0][0] }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_q5_k(job: &GemmJob<'_, BlockQ5K, BlockQ8K>) {
    // SAFETY: as in `gemm_q4_k`: the caller's `GemmFn` contract is `gemmk`'s.
    unsafe { qk::gemmk::<BlockQ5K>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q6_k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: as in `q4_0`: the features by `#[target_feature]`, and both slices cut to the `n` blocks
    // the tile reads.
    unsafe { QK::<BlockQ6K>::tile::<1, 1>([&w[..n]], [&x[..n]])[0][0] }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm_q6_k(job: &GemmJob<'_, BlockQ6K, BlockQ8K>) {
    // SAFETY: as in `gemm_q4_k`: the caller's `GemmFn` contract is `gemmk`'s.
    unsafe { qk::gemmk::<BlockQ6K>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16_q4_k(job: &GemmJob<'_, BlockQ4K, BlockQ8K>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `gemm16` requires.
    unsafe { qk16::gemm16::<BlockQ4K, false>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16_q5_k(job: &GemmJob<'_, BlockQ5K, BlockQ8K>) {
    // SAFETY: as in `gemm16_q4_k`.
    unsafe { qk16::gemm16::<BlockQ5K, false>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16_q6_k(job: &GemmJob<'_, BlockQ6K, BlockQ8K>) {
    // SAFETY: as in `gemm16_q4_k`.
    unsafe { qk16::gemm16::<BlockQ6K, false>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16_q4_0(job: &GemmJob<'_, BlockQ4_0, BlockQ8A>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `q32x16::gemm16` requires.
    unsafe { q32x16::gemm16::<BlockQ4_0, false>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16_q5_0(job: &GemmJob<'_, BlockQ5_0, BlockQ8A>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `q32x16::gemm16` requires.
    unsafe { q32x16::gemm16::<BlockQ5_0, false>(job) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16_q8_0(job: &GemmJob<'_, BlockQ8_0, BlockQ8A>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `q32x16::gemm16` requires.
    unsafe { q32x16::gemm16::<BlockQ8_0, false>(job) }
}

/// `gemm16_q4_k` with jobs of up to 4 tokens through the AVX-512 exact kernel (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16w_q4_k(job: &GemmJob<'_, BlockQ4K, BlockQ8K>) {
    // SAFETY: as in `gemm16_q4_k`.
    unsafe { qk16::gemm16::<BlockQ4K, true>(job) }
}

/// `gemm16_q5_k` with jobs of up to 4 tokens through the AVX-512 exact kernel (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16w_q5_k(job: &GemmJob<'_, BlockQ5K, BlockQ8K>) {
    // SAFETY: as in `gemm16_q4_k`.
    unsafe { qk16::gemm16::<BlockQ5K, true>(job) }
}

/// `gemm16_q6_k` with jobs of up to 4 tokens through the AVX-512 exact kernel (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16w_q6_k(job: &GemmJob<'_, BlockQ6K, BlockQ8K>) {
    // SAFETY: as in `gemm16_q4_k`.
    unsafe { qk16::gemm16::<BlockQ6K, true>(job) }
}

/// `gemm16_q4_0` with jobs of one token through the AVX-512 exact kernel (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16w_q4_0(job: &GemmJob<'_, BlockQ4_0, BlockQ8A>) {
    // SAFETY: as in `gemm16_q4_0`.
    unsafe { q32x16::gemm16::<BlockQ4_0, true>(job) }
}

/// `gemm16_q5_0` with jobs of one token through the AVX-512 exact kernel (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16w_q5_0(job: &GemmJob<'_, BlockQ5_0, BlockQ8A>) {
    // SAFETY: as in `gemm16_q4_0`.
    unsafe { q32x16::gemm16::<BlockQ5_0, true>(job) }
}

/// `gemm16_q8_0` with jobs of one token through the AVX-512 exact kernel (the same bits).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn gemm16w_q8_0(job: &GemmJob<'_, BlockQ8_0, BlockQ8A>) {
    // SAFETY: as in `gemm16_q4_0`.
    unsafe { q32x16::gemm16::<BlockQ8_0, true>(job) }
}
