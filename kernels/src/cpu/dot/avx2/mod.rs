//! AVX2 + FMA + F16C dot products (`u8 × i8` via `maddubs`): the K formats as register tiles
//! (`qk`), whose 1 × 1 tile is the dot product, and their prompt-sized GEMM with 8 rows side by
//! side (`qk8`); the 32-value formats with 8 rows side by side for one token or several (`q32`).
//! Every path gives the scalar dot product's bits.
//!
//! Safety: every function here requires the `avx2`, `fma` and `f16c` CPU
//! features; `Kernels::for_level` hands them out only after detecting them.

/// `[e(0), e(1), …]` for 4 or 8 indices, written out: `std::array::from_fn` without its closure.
/// A closure made in one of this module's `#[inline(always)]` helpers, which have no target
/// features of their own, has none either; where LLVM leaves it out of line inside `from_fn`
/// (core's code, not inlined whatever the call site says), every intrinsic in it becomes a call.
/// A small change elsewhere in `q32`'s decode loop did that to its 8 rows' `maddubs`: the default
/// model decoded at 4 tokens/s instead of 68 on a Zen 3 (2026-12-07), with every test passing.
macro_rules! each {
    (4, |$i:ident| $e:expr) => {
        [{ let $i = 0usize; $e }, { let $i = 1usize; $e }, { let $i = 2usize; $e }, { let $i = 3usize; $e }]
    };
    (8, |$i:ident| $e:expr) => {
        [
            { let $i = 0usize; $e },
            { let $i = 1usize; $e },
            { let $i = 2usize; $e },
            { let $i = 3usize; $e },
            { let $i = 4usize; $e },
            { let $i = 5usize; $e },
            { let $i = 6usize; $e },
            { let $i = 7usize; $e },
        ]
    };
}

pub(in crate::cpu::dot) mod q32;
pub(in crate::cpu::dot) mod qk;
pub(in crate::cpu::dot) mod qk8;

use super::GemmJob;
use crate::quant::*;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// Gives this thread's decode buffers room for `bytes` (see `dot::warm_thread`).
pub(super) fn reserve(bytes: usize) {
    // `q32`'s packs: 544 bytes per 32 values (17 per value), where the layout took 3.
    q32::reserve(bytes / 3 * 17);
}

#[inline(always)]
unsafe fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
}

#[inline(always)]
unsafe fn load256(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes at `p` (every call site passes a 32-byte field,
    // or a 32-byte run inside one); the load is unaligned, and the CPU has AVX2 (module contract above).
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// 16 bytes of packed nibbles → 32 bytes: low nibbles first, then high ones.
#[inline(always)]
pub(super) unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 16 readable bytes at `p` (the `qs` of a `Q4_0`/`Q5_0` block); the load is
    // unaligned, and the CPU has AVX2 (module contract above).
    let x = unsafe { _mm_loadu_si128(p.cast()) };
    let v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
}

/// 32 bits → 32 bytes, `val` where the bit is set and 0 elsewhere.
#[inline(always)]
pub(super) unsafe fn bits32(bits: u32, val: i8) -> __m256i {
    spread_bits(_mm256_set1_epi32(bits as i32), val)
}

/// [`bits32`] of the 32 bits in every lane of `v` (however they were broadcast: a register, or a
/// load, which costs no shuffle).
#[inline(always)]
pub(super) unsafe fn spread_bits(v: __m256i, val: i8) -> __m256i {
    #[rustfmt::skip]
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let b = _mm256_shuffle_epi8(v, spread);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
    _mm256_and_si256(set, _mm256_set1_epi8(val))
}

/// The 6-bit scales and mins of a `Q4_K`/`Q5_K` block: the 8 scales in bytes 0..8, the 8 mins
/// in bytes 8..16 (what `scale_min_k4` gives one at a time), in vector registers: the three
/// 32-bit words' masks and shifts at once (as scalar code this was a third of a one-token
/// row's instructions). Exact, like any unpacking: every level may use it.
#[inline(always)]
pub(super) unsafe fn k4_scales_mins(q: &[u8; 12]) -> __m128i {
    // SAFETY: `_mm_loadl_epi64` reads the first 8 of `q`'s 12 bytes (unaligned is fine); the rest only
    // touches registers. Needs SSE4.1 and AVX2, which every caller's level has (AVX2, or AVX-512 on top).
    unsafe {
        let w2 = i32::from_le_bytes([q[8], q[9], q[10], q[11]]);
        // Lanes: w0, w1, w2, 0.
        let v = _mm_insert_epi32::<2>(_mm_loadl_epi64(q.as_ptr().cast()), w2);
        // Scales 0..4 and mins 0..4: the low 6 bits of w0 and w1.
        let lo = _mm_and_si128(v, _mm_set1_epi8(0x3f));
        // Scales and mins 4..8: the nibbles of w2 (low for scales, high for mins) below the top
        // two bits of w0 and w1.
        let top = _mm_slli_epi32::<4>(_mm_and_si128(_mm_srli_epi32::<6>(v), _mm_set1_epi8(3)));
        let nib = _mm_srlv_epi32(_mm_shuffle_epi32::<0b10_10_10_10>(v), _mm_setr_epi32(0, 4, 0, 0));
        let hi = _mm_or_si128(_mm_and_si128(nib, _mm_set1_epi8(0x0f)), top);
        _mm_unpacklo_epi32(lo, hi)
    }
}

/// An `R`-row × `C`-token tile of dot products. Implementations compute each element with the
/// same operations whatever `R` and `C`; the single dot product is the 1 × 1 tile.
pub(super) trait TileKernel {
    type W: Block;
    type A: Sync;
    /// Rows per tile (3 or 4), with up to 4 tokens.
    const ROWS: usize;
    unsafe fn tile<const R: usize, const C: usize>(w: [&[Self::W]; R], x: [&[Self::A]; C]) -> [[f32; C]; R];
}

/// The job in tiles of `T::ROWS` rows × 4 tokens, smaller at the edges; row by row when the job
/// has one token, so the weights are one sequential stream.
#[inline(always)]
unsafe fn gemm<T: TileKernel>(job: &GemmJob<'_, T::W, T::A>) {
    let (wpr, apr) = (job.wpr, job.apr);
    // SAFETY: called only below with rows of the job (`r + i` with `r + T::ROWS <= job.rows.end`, or
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
    macro_rules! tokens {
        ($r:expr, $t0:expr, $t1:expr, [$($i:literal),+]) => {{
            let mut t = $t0;
            while t < $t1 {
                let tt = ($t1 - t).min(4);
                match tt {
                    4 => tile!($r, t, [$($i),+], [0, 1, 2, 3]),
                    3 => tile!($r, t, [$($i),+], [0, 1, 2]),
                    2 => tile!($r, t, [$($i),+], [0, 1]),
                    _ => tile!($r, t, [$($i),+], [0]),
                }
                t += tt;
            }
        }};
    }
    // SAFETY: the `GemmFn` contract: `job.out` may be written at `t * ldo + r` for the job's rows and
    // tokens, the only elements stored here (rows `r..r + T::ROWS <= job.rows.end`, tokens `t..t + 4`
    // inside `job.toks`); `T::tile` gets weight rows of `wpr` blocks and activation rows of
    // `apr >= wpr` blocks, as it needs; the CPU has AVX2/FMA/F16C (module contract).
    unsafe {
        let (t0, t1) = (job.toks.start, job.toks.end);
        let mut r = job.rows.start;
        while r < job.rows.end {
            if job.rows.end - r >= T::ROWS && t1 - t0 > 1 {
                if T::ROWS == 4 {
                    tokens!(r, t0, t1, [0, 1, 2, 3]);
                } else {
                    tokens!(r, t0, t1, [0, 1, 2]);
                }
                r += T::ROWS;
            } else {
                for t in t0..t1 {
                    tile!(r, t, [0], [0]);
                }
                r += 1;
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0(w: &[BlockQ4_0], x: &[BlockQ8A]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX2/FMA/F16C are present, this function's `#[target_feature]` contract (its caller,
    // `Kernels::for_level`, detected them); `dot32` zips the two slices, cut to `n` here.
    unsafe { q32::dot32::<BlockQ4_0>(&w[..n], &x[..n]) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_q4_0(job: &GemmJob<'_, BlockQ4_0, BlockQ8A>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `gemm32` requires.
    unsafe { q32::gemm32::<BlockQ4_0>(job) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_0(w: &[BlockQ5_0], x: &[BlockQ8A]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX2/FMA/F16C are present, this function's `#[target_feature]` contract (its caller,
    // `Kernels::for_level`, detected them); `dot32` zips the two slices, cut to `n` here.
    unsafe { q32::dot32::<BlockQ5_0>(&w[..n], &x[..n]) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_q5_0(job: &GemmJob<'_, BlockQ5_0, BlockQ8A>) {
    // SAFETY: as in `gemm_q4_0`: the caller's `GemmFn` contract is `gemm32`'s.
    unsafe { q32::gemm32::<BlockQ5_0>(job) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0(w: &[BlockQ8_0], x: &[BlockQ8A]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX2/FMA/F16C are present, this function's `#[target_feature]` contract (its caller,
    // `Kernels::for_level`, detected them); `dot32` zips the two slices, cut to `n` here.
    unsafe { q32::dot32::<BlockQ8_0>(&w[..n], &x[..n]) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_q8_0(job: &GemmJob<'_, BlockQ8_0, BlockQ8A>) {
    // SAFETY: as in `gemm_q4_0`: the caller's `GemmFn` contract is `gemm32`'s.
    unsafe { q32::gemm32::<BlockQ8_0>(job) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX2/FMA/F16C by this function's `#[target_feature]` contract; `rowdot` zips the two
    // slices, so it reads no block beyond either.
    unsafe { qk::rowdot::<BlockQ4K>(&w[..n], &x[..n]) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_q4_k(job: &GemmJob<'_, BlockQ4K, BlockQ8K>) {
    // SAFETY: the caller upholds the `GemmFn` contract (output, rows, CPU features), which is all
    // `gemm8` requires.
    unsafe { qk8::gemm8::<BlockQ4K>(job) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_k(w: &[BlockQ5K], x: &[BlockQ8K]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: as in `q4_k`: the features by `#[target_feature]`; `rowdot` stays inside both slices.
    unsafe { qk::rowdot::<BlockQ5K>(&w[..n], &x[..n]) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_q5_k(job: &GemmJob<'_, BlockQ5K, BlockQ8K>) {
    // SAFETY: as in `gemm_q4_k`: the caller's `GemmFn` contract is `gemm8`'s.
    unsafe { qk8::gemm8::<BlockQ5K>(job) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: as in `q4_k`: the features by `#[target_feature]`; `rowdot` stays inside both slices.
    unsafe { qk::rowdot::<BlockQ6K>(&w[..n], &x[..n]) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_q6_k(job: &GemmJob<'_, BlockQ6K, BlockQ8K>) {
    // SAFETY: as in `gemm_q4_k`: the caller's `GemmFn` contract is `gemm8`'s.
    unsafe { qk8::gemm8::<BlockQ6K>(job) }
}

/// Dense dot with 8-wide FMA; `load(i)` widens the 8 weights at `i` to f32.
#[inline(always)]
unsafe fn dense(n: usize, x: &[f32], load: impl Fn(usize) -> __m256, tail: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: the 8-float loads read `x[i + 8k..i + 8k + 8]` only while `i + 32 <= n` (then
    // `x[i..i + 8]` while `i + 8 <= n`), and `load` is called with the same bounds; the callers pass
    // `n <= x.len()` and a `load` valid for `i + 8 <= n`, and run with AVX2/FMA (`#[target_feature]`).
    unsafe {
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(load(i + 8 * k), _mm256_loadu_ps(x.as_ptr().add(i + 8 * k)), *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
            i += 8;
        }
        let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut sum = hsum_ps(s);
        while i < n {
            sum += tail(i) * x[i];
            i += 1;
        }
        sum
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX2/FMA by `#[target_feature]`; `n = min(w.len(), x.len())` and `dense` calls `load(i)`
    // only with `i + 8 <= n`, so the 8-float load at `w[i]` stays inside `w`.
    unsafe { dense(n, x, |i| _mm256_loadu_ps(w.as_ptr().add(i)), |i| w[i]) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16(w: &[f16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: AVX2/FMA/F16C by `#[target_feature]`; `dense` calls `load(i)` only with
    // `i + 8 <= n <= w.len()`, so the 16-byte load of 8 f16 at `w[i]` stays inside `w`.
    unsafe { dense(n, x, |i| _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i).cast())), |i| w[i].to_f32()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn bf16(w: &[bf16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    // SAFETY: only `dense` below calls `load`, with `i + 8 <= n <= w.len()`, so the 16-byte load of 8
    // bf16 at `w[i]` stays inside `w`; AVX2 by this function's `#[target_feature]`.
    let load = |i: usize| unsafe {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.as_ptr().add(i).cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
    };
    // SAFETY: AVX2/FMA by `#[target_feature]`; `n = min(w.len(), x.len())`, and `load` is valid for the
    // `i + 8 <= n` that `dense` gives it.
    unsafe { dense(n, x, load, |i| w[i].to_f32()) }
}
