//! The K formats' GEMM for prompt-sized jobs with AVX-512 VNNI, giving the scalar path's bits:
//! 16 weight rows side by side in the 32-bit lanes of a register, as the AVX2 level's
//! [`qk8`](super::super::avx2::qk8) puts 8, with `vpdpbusd` where AVX2 needs `maddubs` and
//! `madd`.
//!
//! A job's 16-row groups are repacked once for all its tokens: two AVX2 [`Pack`]s (rows 0..8 and
//! 8..16) joined, so register `8k + g` holds values `32k + 4g .. + 4` of row `i` (unsigned) in
//! lane `i`. A token's 4 activations at that position are broadcast (a load folded into the
//! instruction), and one `vpdpbusd` adds 64 products for 16 rows into their i32 lanes: a
//! sub-block's (`Q6_K`: a group's) 32 (16) values take 8 (4) of them, then one `vpmulld` by the
//! rows' scales and an add give the exact scaled sum. The mins (`Q6_K`: the +32 offsets) are 8
//! `vpdpwssd` with the token's bsums. Per 4,096 products: 64 `vpdpbusd`, 8 `vpmulld`, 8
//! `vpdpwssd` and the block's float steps, where the 512-bit `maddubs` kernels needed twice the
//! multiplies and Intel's port 5 for their lane crossings.
//!
//! `Q4_K` (the catalogue's main format) takes a cheaper route to the same sums, the *paired*
//! layout ([`sums_paired`]): each row's 8 values at a position sit in two neighbouring lanes of
//! one register (rows 0, 1, 4, 5, … in one, 2, 3, 6, 7, … in the other), so one broadcast of 8
//! activations serves two `vpdpbusd`, and each lane sums 16 of a sub-block's 32 values — at most
//! 16 · 15 · 128 = 30,720, an i16. `vpackssdw` of the two registers then leaves every row's two
//! half sums side by side, in row order, and one `vpdpwssd` with the scale in both halves adds
//! `scale · sum` to the row's i32 (where `vpmulld` is two µops on Intel and needs an add), and the
//! mins take 4 `vpdpwssd` against the activations' 32-value sums (`BlockQ8K::ssums`) instead of 8.
//! Per 4,096 products: 64 `vpdpbusd`, 8 `vpackssdw`, 12 `vpdpwssd` and the float steps — 1.2–1.3×
//! the plain tile's speed on an Intel Xeon (Emerald Rapids), where the `vpdpbusd` ports were the
//! limit. (`Q5_K`'s and `Q6_K`'s half sums do not fit in i16.)
//!
//! Every row's block sum is exact and its float steps are the scalar path's, in the same order
//! and without fused multiply-adds, so every element is bit for bit what the scalar dot product
//! gives — and the AVX2 kernels that take the one-token and few-token jobs of the same table
//! (batch invariance across paths).

use super::super::avx2::qk as x2;
use super::super::avx2::qk8::{pack, KBlock8, Pack, EMPTY};
use super::qk::dpwssd;
use super::rows16::{self, Rows16};
use super::*;

/// One block of a 16-row group.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Pack16 {
    /// Register `8k + g`, 32-bit lane `i`: row `i`'s values `32k + 4g .. + 4` (unsigned).
    w: [__m512i; 64],
    /// Per scale index, lane `i`: row `i`'s scale (i32).
    sc: [__m512i; 16],
    /// Lane `i` of register `q`: the two i16 factors of bsums `2q` and `2q + 1` for row `i`.
    mo: [__m512i; 8],
    d: __m512,
    dmin: __m512,
}

// SAFETY: vectors only, for which all-zero bits are valid.
const EMPTY16: Pack16 = unsafe { std::mem::zeroed() };

/// What the 16-row tile needs of a K format beyond [`KBlock8`].
pub(super) trait KBlock16: KBlock8 {
    /// Groups of 4 values under one scale: 8 (a 32-value sub-block) or 4 (`Q6_K`'s 16).
    const GROUPS: usize;
    /// Whether a sub-block's two halves' sums fit in i16 (`Q4_K`: 16 × 15 × 128 < 2^15), so that
    /// the scale is applied by `vpackssdw` + `vpdpwssd` on the packed halves (the paired layout).
    const PAIRED: bool = false;
    /// The block's float steps per row lane from the exact sums, the scalar path's operations in
    /// its order (as `KBlock8::finish8`).
    unsafe fn finish16(p: &Pack16, sumi: __m512i, corr: __m512i, a: &BlockQ8K, acc: __m512) -> __m512;
    /// The AVX2 kernel of the format (jobs too small for 16-row groups, rows left over).
    unsafe fn small(job: &GemmJob<'_, Self, BlockQ8K>)
    where
        Self: Sized;
}

/// `Q4_K`/`Q5_K`: `acc + (d_x · d) · sumi − (d_x · dmin) · summ`.
#[inline(always)]
unsafe fn finish_k4(p: &Pack16, sumi: __m512i, summ: __m512i, a: &BlockQ8K, acc: __m512) -> __m512 {
    let ad = _mm512_set1_ps(a.d);
    let d = _mm512_mul_ps(ad, p.d);
    let dmin = _mm512_mul_ps(ad, p.dmin);
    let acc = _mm512_add_ps(acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi)));
    _mm512_sub_ps(acc, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ)))
}

macro_rules! k4_block16 {
    ($block:ty, $small:ident, $paired:expr) => {
        impl KBlock16 for $block {
            const GROUPS: usize = 8;
            const PAIRED: bool = $paired;
            #[inline(always)]
            unsafe fn finish16(p: &Pack16, sumi: __m512i, corr: __m512i, a: &BlockQ8K, acc: __m512) -> __m512 {
                // SAFETY: registers only; the CPU has the AVX-512 level's features (module contract).
                unsafe { finish_k4(p, sumi, corr, a, acc) }
            }
            #[inline(always)]
            unsafe fn small(job: &GemmJob<'_, Self, BlockQ8K>) {
                // SAFETY: the caller's `GemmFn` contract, and the AVX-512 level includes AVX2/FMA/F16C.
                unsafe { super::super::avx2::$small(job) }
            }
        }
    };
}

k4_block16!(BlockQ4K, gemm_q4_k, true);
k4_block16!(BlockQ5K, gemm_q5_k, false);

impl KBlock16 for BlockQ6K {
    const GROUPS: usize = 4;
    /// `acc + (d_x · d) · (sumi − 32 · Σ sc_g · bsum_g)`.
    #[inline(always)]
    unsafe fn finish16(p: &Pack16, sumi: __m512i, corr: __m512i, a: &BlockQ8K, acc: __m512) -> __m512 {
        let d = _mm512_mul_ps(_mm512_set1_ps(a.d), p.d);
        let sumi = _mm512_sub_epi32(sumi, _mm512_slli_epi32::<5>(corr));
        _mm512_add_ps(acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi)))
    }
    #[inline(always)]
    unsafe fn small(job: &GemmJob<'_, Self, BlockQ8K>) {
        // SAFETY: as for the other formats.
        unsafe { super::super::avx2::gemm_q6_k(job) }
    }
}

/// An AVX2 pack's 8 lanes (32-byte aligned; not a closure: intrinsics in a closure made here
/// could be left out of line without the caller's features).
#[inline(always)]
unsafe fn ld(v: &[u32; 8]) -> __m256i {
    // SAFETY: `v` is a 32-byte aligned row of an `align(32)` `Pack`; the CPU has AVX2 (module contract).
    unsafe { _mm256_load_si256(v.as_ptr().cast()) }
}

/// Two packs' 8 floats as 16 lanes, `a`'s low.
#[inline(always)]
unsafe fn ps(a: &[f32; 8], b: &[f32; 8]) -> __m512 {
    // SAFETY: as for `ld`.
    unsafe { _mm512_insertf32x8::<1>(_mm512_castps256_ps512(_mm256_load_ps(a.as_ptr())), _mm256_load_ps(b.as_ptr())) }
}

/// Two 8-row packs of a block as one 16-row pack. Paired layout: register `8k + 2m` holds rows
/// 0, 1, 4, 5, 8, 9, 12, 13 and `8k + 2m + 1` rows 2, 3, 6, 7, 10, 11, 14, 15, each row in two
/// lanes — values `32k + 8m .. + 4` and `32k + 8m + 4 .. + 8` — so one broadcast of 8 activations
/// serves both, and `vpackssdw` of the two registers' sums puts each row's two halves side by side
/// in row order.
#[inline(always)]
unsafe fn join16<B: KBlock16>(lo: &Pack, hi: &Pack, p: &mut Pack16) {
    // SAFETY: the aligned loads read whole `[u32; 8]` / `[f32; 8]` rows of the `align(32)` AVX2 packs,
    // each at a multiple of 32 bytes; the CPU has the AVX-512 level's features (module contract).
    unsafe {
        if B::PAIRED {
            for x in (0..64).step_by(2) {
                let (l0, l1, h0, h1) = (lo.w[x], lo.w[x + 1], hi.w[x], hi.w[x + 1]);
                p.w[x] = join(_mm256_unpacklo_epi32(l0, l1), _mm256_unpacklo_epi32(h0, h1));
                p.w[x + 1] = join(_mm256_unpackhi_epi32(l0, l1), _mm256_unpackhi_epi32(h0, h1));
            }
            // The scale in both i16 halves of its lane, as `vpdpwssd` takes it.
            for (j, sc) in p.sc.iter_mut().enumerate() {
                *sc = join(ld(&lo.sc[j]), ld(&hi.sc[j]));
            }
            // Lane `i` of register `q < 4`: mins `2q` and `2q + 1` of row `i` as i16, for the
            // sub-block sums `ssums` (`Pack::mo` holds each min in both halves).
            for q in 0..4 {
                let l = _mm256_blend_epi16::<0b1010_1010>(ld(&lo.mo[2 * q]), ld(&lo.mo[2 * q + 1]));
                let h = _mm256_blend_epi16::<0b1010_1010>(ld(&hi.mo[2 * q]), ld(&hi.mo[2 * q + 1]));
                p.mo[q] = join(l, h);
            }
        } else {
            for (x, w) in p.w.iter_mut().enumerate() {
                *w = join(lo.w[x], hi.w[x]);
            }
            // `Pack::sc` holds each scale in both i16 halves of its lane; the arithmetic shift leaves it
            // as an i32, its sign kept (`Q6_K`'s scales are signed).
            for (j, sc) in p.sc.iter_mut().enumerate() {
                *sc = _mm512_srai_epi32::<16>(join(ld(&lo.sc[j]), ld(&hi.sc[j])));
            }
            for (q, mo) in p.mo.iter_mut().enumerate() {
                *mo = join(ld(&lo.mo[q]), ld(&hi.mo[q]));
            }
        }
        p.d = ps(&lo.d, &hi.d);
        p.dmin = ps(&lo.dmin, &hi.dmin);
    }
}

/// 16 rows (packed blocks `packs`) × `C` tokens: `out[c]` holds the 16 rows' results for token
/// `c`.
#[inline(always)]
unsafe fn tile16<B: KBlock16, const C: usize>(packs: &[Pack16], x: [&[BlockQ8K]; C]) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    // SAFETY: every `x[c]` holds at least `packs.len()` blocks (`rows16::gemm` passes activation rows of
    // `apr >= wpr = packs.len()` blocks), so `get_unchecked(s)` is in bounds; the 4-byte unaligned
    // reads are bsums pairs `q < 8` (inside its 16 × i16) and `ssums` pairs `q < 4` (inside its
    // 8 × i16); the CPU has the AVX-512 level's features (module contract).
    unsafe {
        for (s, p) in packs.iter().enumerate() {
            let mut a: [&BlockQ8K; C] = [x[0].get_unchecked(s); C];
            for c in 1..C {
                a[c] = x[c].get_unchecked(s);
            }
            let sumi = if B::PAIRED { sums_paired::<B, C>(p, &a) } else { sums::<B, C>(p, &a) };
            for c in 0..C {
                let mut corr = _mm512_setzero_si512();
                if B::PAIRED {
                    let ss = a[c].ssums.as_ptr().cast::<i32>();
                    for q in 0..4 {
                        corr = dpwssd(corr, p.mo[q], _mm512_set1_epi32(ss.add(q).read_unaligned()));
                    }
                } else {
                    let bs = a[c].bsums.as_ptr().cast::<i32>();
                    for q in 0..8 {
                        corr = _mm512_dpwssd_epi32(corr, p.mo[q], _mm512_set1_epi32(bs.add(q).read_unaligned()));
                    }
                }
                acc[c] = B::finish16(p, sumi[c], corr, a[c], acc[c]);
            }
        }
    }
    acc
}

/// A block's exact scaled sums for `C` tokens: per scale, the `vpdpbusd` chain of its groups, one
/// `vpmulld` by the rows' scales and an add.
#[inline(always)]
unsafe fn sums<B: KBlock16, const C: usize>(p: &Pack16, a: &[&BlockQ8K; C]) -> [__m512i; C] {
    let mut sumi = [_mm512_setzero_si512(); C];
    // SAFETY: the 4-byte unaligned reads are `qs[32k + 4g..32k + 4g + 4]` (`k, g < 8`: inside its
    // 256 bytes); `scale_index` is below 16; the CPU has the AVX-512 level's features (module
    // contract).
    unsafe {
        for k in 0..8 {
            for h in 0..8 / B::GROUPS {
                let mut t = [_mm512_setzero_si512(); C];
                for g in h * B::GROUPS..(h + 1) * B::GROUPS {
                    let wv = p.w[8 * k + g];
                    for c in 0..C {
                        let q = a[c].qs.as_ptr().add(32 * k + 4 * g);
                        let xb = _mm512_set1_epi32(q.cast::<i32>().read_unaligned());
                        t[c] = _mm512_dpbusd_epi32(t[c], wv, xb);
                    }
                }
                let sc = p.sc[B::scale_index(k, h * B::GROUPS)];
                for c in 0..C {
                    sumi[c] = _mm512_add_epi32(sumi[c], _mm512_mullo_epi32(t[c], sc));
                }
            }
        }
    }
    sumi
}

/// [`sums`] for the paired layout (`KBlock16::PAIRED`; see the module doc): per sub-block and
/// token, 8 `vpdpbusd` in two chains, one `vpackssdw` and one `vpdpwssd`.
#[inline(always)]
unsafe fn sums_paired<B: KBlock16, const C: usize>(p: &Pack16, a: &[&BlockQ8K; C]) -> [__m512i; C] {
    let mut sumi = [_mm512_setzero_si512(); C];
    // SAFETY: the 8-byte unaligned reads are `qs[32k + 8m..32k + 8m + 8]` (`k < 8`, `m < 4`: inside
    // its 256 bytes); the CPU has the AVX-512 level's features (module contract).
    unsafe {
        for k in 0..8 {
            let mut tx = [_mm512_setzero_si512(); C];
            let mut ty = [_mm512_setzero_si512(); C];
            for m in 0..4 {
                let (wx, wy) = (p.w[8 * k + 2 * m], p.w[8 * k + 2 * m + 1]);
                for c in 0..C {
                    let q = a[c].qs.as_ptr().add(32 * k + 8 * m);
                    let xb = _mm512_set1_epi64(q.cast::<i64>().read_unaligned());
                    tx[c] = _mm512_dpbusd_epi32(tx[c], wx, xb);
                    ty[c] = _mm512_dpbusd_epi32(ty[c], wy, xb);
                }
            }
            let sc = p.sc[B::scale_index(k, 0)];
            for c in 0..C {
                sumi[c] = dpwssd(sumi[c], _mm512_packs_epi32(tx[c], ty[c]), sc);
            }
        }
    }
    sumi
}

thread_local! {
    /// The packed blocks of the current job's 16-row groups (per thread).
    static PACKS: std::cell::RefCell<Vec<Pack16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The K formats as a [`Rows16`] kernel; `WIDE`: jobs of up to 4 tokens through the AVX-512
/// exact kernel ([`super::qk::gemv_exact`]) instead of the AVX2 one (the same bits either way).
pub(super) struct K16<B, const WIDE: bool>(std::marker::PhantomData<B>);

impl<B: KBlock16 + super::qk::KBlock + x2::KBlock, const WIDE: bool> Rows16 for K16<B, WIDE> {
    type W = B;
    type A = BlockQ8K;
    type Pack = Pack16;
    /// The two 8-row halves of a block, packed as the AVX2 level packs them.
    type Scratch = (Pack, Pack);
    const EMPTY: Pack16 = EMPTY16;
    // A long row's activations (the FFN down projection's 4,864 or 8,960 values per token, ~2.8 MB
    // for 512 tokens) are read from beyond L2 once per 64 rows instead of once per 16.
    const ROW_GROUPS: usize = 4;
    fn scratch() -> (Pack, Pack) {
        (EMPTY, EMPTY)
    }
    #[inline(always)]
    unsafe fn pack(lo: [&[B]; 8], hi: [&[B]; 8], s: usize, sc: &mut (Pack, Pack), p: &mut Pack16) {
        // SAFETY: the trait's contract (`s` inside every row, the CPU's features) is `pack`'s.
        unsafe {
            pack(lo, s, &mut sc.0);
            pack(hi, s, &mut sc.1);
            join16::<B>(&sc.0, &sc.1, p);
        }
    }
    #[inline(always)]
    unsafe fn tile<const C: usize>(packs: &[Pack16], x: [&[BlockQ8K]; C]) -> [__m512; C] {
        // SAFETY: the trait's contract is `tile16`'s.
        unsafe { tile16::<B, C>(packs, x) }
    }
    #[inline(always)]
    unsafe fn small(job: &GemmJob<'_, B, BlockQ8K>) {
        // SAFETY: the `GemmFn` contract, which is what both kernels need (the CPU has the AVX-512
        // level's features, as every `Rows16` kernel requires).
        unsafe {
            if WIDE && job.toks.len() < rows16::MIN_TOKENS {
                super::qk::gemv_exact(job)
            } else {
                B::small(job)
            }
        }
    }
}

/// The GEMM of a K format ([`rows16::gemm`]): all paths give the same bits.
#[inline(always)]
pub(super) unsafe fn gemm16<B: KBlock16 + super::qk::KBlock + x2::KBlock, const WIDE: bool>(
    job: &GemmJob<'_, B, BlockQ8K>,
) {
    // Out of the thread-local while in use (a job never nests another).
    let mut packs = PACKS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // SAFETY: the caller's `GemmFn` contract and the CPU's features are what `rows16::gemm` needs.
    unsafe { rows16::gemm::<K16<B, WIDE>>(job, &mut packs) };
    PACKS.with(|cell| *cell.borrow_mut() = packs);
}
