//! The 32-value formats' GEMM (`Q4_0`, `Q5_0`, `Q8_0`) for prompt-sized jobs with AVX-512 VNNI,
//! giving the scalar path's bits: 16 weight rows side by side in the 32-bit lanes of a register,
//! as the AVX2 level's 8-row tiles (`avx2/q32.rs`) put 8.
//!
//! A job's 16-row groups are repacked once for all its tokens: register `g`, lane `i` holds row
//! `i`'s values `4g .. 4g + 4` in unsigned form (`Q4_0` and `Q5_0` as stored; `Q8_0`'s signed
//! values + 128). A token's 4 activations at that position are broadcast (a load folded into the
//! instruction), and one `vpdpbusd` adds 64 products for 16 rows into their i32 lanes, the chain
//! starting from `−offset · Σ activations`: 8 of them leave lane `i` holding row `i`'s exact block
//! sum. Then the scalar path's float steps, `acc + (d_w · d_x) · sum`, for the 16 rows at once,
//! without fused multiply-adds — so every element is bit for bit what the scalar dot product gives,
//! and the AVX2 kernels that take the one-token and few-token jobs of the same table.

use super::super::avx2::q32::{scales8, Block32};
use super::super::avx2::qk8::transpose8;
use super::rows16::{self, Rows16};
use super::*;

/// One block of a 16-row group.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Pack16 {
    /// Register `g`, 32-bit lane `i`: row `i`'s values `4g .. 4g + 4` (unsigned form).
    w: [__m512i; 8],
    /// Lane `i`: row `i`'s scale.
    d: __m512,
}

// SAFETY: vectors only, for which all-zero bits are valid.
const EMPTY: Pack16 = unsafe { std::mem::zeroed() };

/// What the 16-row tile needs of a 32-value format beyond [`Block32`].
pub(super) trait Block16: Block32 {
    /// Subtracted from every unsigned value (`Block32::OFFSET`, and 128 for `Q8_0`).
    const UNSIGNED_OFFSET: i32;
    /// The AVX2 kernel of the format (jobs too small for 16-row groups, rows left over).
    unsafe fn small(job: &GemmJob<'_, Self, BlockQ8A>)
    where
        Self: Sized;
}

macro_rules! block16 {
    ($block:ty, $offset:expr, $small:ident) => {
        impl Block16 for $block {
            const UNSIGNED_OFFSET: i32 = $offset;
            #[inline(always)]
            unsafe fn small(job: &GemmJob<'_, Self, BlockQ8A>) {
                // SAFETY: the caller's `GemmFn` contract, and the AVX-512 level includes AVX2/FMA/F16C.
                unsafe { super::super::avx2::$small(job) }
            }
        }
    };
}

block16!(BlockQ4_0, 8, gemm_q4_0);
block16!(BlockQ5_0, 16, gemm_q5_0);
block16!(BlockQ8_0, 128, gemm_q8_0);

/// Block `s` of 16 rows, repacked.
#[inline(always)]
unsafe fn pack16<B: Block16>(lo: &[&[B]; 8], hi: &[&[B]; 8], s: usize, p: &mut Pack16) {
    // SAFETY: the caller passes `s` below every row's length; the CPU has the AVX-512 level's features
    // (module contract).
    unsafe {
        let flip = _mm256_set1_epi8(if B::SIGNED { -128 } else { 0 });
        let mut a = [_mm256_setzero_si256(); 8];
        let mut b = [_mm256_setzero_si256(); 8];
        for i in 0..8 {
            a[i] = _mm256_xor_si256(lo[i].get_unchecked(s).values(), flip);
            b[i] = _mm256_xor_si256(hi[i].get_unchecked(s).values(), flip);
        }
        let (a, b) = (transpose8(a), transpose8(b));
        for g in 0..8 {
            p.w[g] = join(a[g], b[g]);
        }
        p.d = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(scales8(lo, s)), scales8(hi, s));
    }
}

/// 16 rows (packed blocks `packs`) × `C` tokens: `out[c]` holds the 16 rows' results for token
/// `c`.
#[inline(always)]
unsafe fn tile16<B: Block16, const C: usize>(packs: &[Pack16], x: [&[BlockQ8A]; C]) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    // SAFETY: every `x[c]` holds at least `packs.len()` blocks (`rows16::gemm` passes activation rows of
    // `apr >= wpr = packs.len()` blocks), so `get_unchecked(s)` is in bounds; the 4-byte unaligned
    // reads are `qs[4g..4g + 4]` (`g < 8`: inside its 32 bytes); the CPU has the AVX-512 level's
    // features (module contract).
    unsafe {
        for (s, p) in packs.iter().enumerate() {
            let mut a: [&BlockQ8A; C] = [x[0].get_unchecked(s); C];
            for c in 1..C {
                a[c] = x[c].get_unchecked(s);
            }
            let mut t = [_mm512_setzero_si512(); C];
            for c in 0..C {
                t[c] = _mm512_set1_epi32(-B::UNSIGNED_OFFSET * a[c].sum);
            }
            for g in 0..8 {
                let wv = p.w[g];
                for c in 0..C {
                    let q = a[c].qs.as_ptr().add(4 * g);
                    t[c] = _mm512_dpbusd_epi32(t[c], wv, _mm512_set1_epi32(q.cast::<i32>().read_unaligned()));
                }
            }
            for c in 0..C {
                let d = _mm512_mul_ps(p.d, _mm512_set1_ps(a[c].d));
                acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(d, _mm512_cvtepi32_ps(t[c])));
            }
        }
    }
    acc
}

thread_local! {
    /// The packed blocks of the current job's 16-row groups (per thread).
    static PACKS: std::cell::RefCell<Vec<Pack16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// One token against 16 rows with the scalar path's bits, for decode steps beside the 16-row
/// tiles: per block, rows `p` and `p + 4` (`p + 4` and `p + 8` from `p = 4`) share a register,
/// one `vpdpbusd` each against the token's 32 activations in both halves, then the 8 registers'
/// lanes are added into one whose lane `i` is row `i`'s exact block sum (a transposing tree of
/// unpacks and adds, as AVX2's `reduce8` for 8 rows), and the scalar path's float step runs in
/// the 16 lanes. Where AVX2's 8-row kernel needs `vpmaddubsw` + `vpmaddwd` per row and block,
/// this needs one `vpdpbusd`.
#[inline(always)]
unsafe fn gemv16<B: Block16>(job: &GemmJob<'_, B, BlockQ8A>, tok: usize, r: usize) -> __m512 {
    let n = job.wpr;
    let row_bytes = n * std::mem::size_of::<B>();
    let per_block = (16 * std::mem::size_of::<B>()).div_ceil(64);
    // SAFETY: the caller passes rows `r..r + 16` and a token of the job: by the `GemmFn` contract
    // `job.w` holds each row's `n` blocks and `job.x` the token's `apr >= n`, so `get_unchecked(s)`
    // with `s < n` is in bounds; the 32-byte loads read a block's `qs`; a prefetch is only a hint
    // (its address, made with wrapping arithmetic, is never dereferenced); the CPU has the AVX-512
    // level's features (module contract).
    unsafe {
        let x = job.x.get_unchecked(tok * job.apr..tok * job.apr + n);
        let rows: [&[B]; 16] = std::array::from_fn(|i| job.w.get_unchecked((r + i) * n..(r + i + 1) * n));
        let lo: [&[B]; 8] = std::array::from_fn(|i| rows[i]);
        let hi: [&[B]; 8] = std::array::from_fn(|i| rows[8 + i]);
        let next = job.w.as_ptr().cast::<u8>().wrapping_add((r + 16) * row_bytes);
        // The signed format's values + 128 (`Block16::UNSIGNED_OFFSET`), as the tiles take them.
        let flip = _mm512_set1_epi8(if B::SIGNED { -128 } else { 0 });
        let mut acc = _mm512_setzero_ps();
        for (s, a) in x.iter().enumerate() {
            // The next group's bytes, into L2 (16 rows side by side are 16 streams; into L1 measured
            // slower, none at all half the speed).
            for l in 0..per_block {
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add((s * per_block + l) * 64).cast());
            }
            let xq = _mm512_broadcast_i64x4(load256(a.qs.as_ptr().cast()));
            let mut m = [_mm512_setzero_si512(); 8];
            for (p, m) in m.iter_mut().enumerate() {
                let (l, h) = if p < 4 { (p, p + 4) } else { (p + 4, p + 8) };
                let w = join(rows[l].get_unchecked(s).values(), rows[h].get_unchecked(s).values());
                *m = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(w, flip), xq);
            }
            // Per 128-bit lane, `lo4` holds the partial sums of m[0..4] in its 4 lanes, `hi4` of m[4..8].
            let lo4 = pair_halves(pair_rows(m[0], m[1]), pair_rows(m[2], m[3]));
            let hi4 = pair_halves(pair_rows(m[4], m[5]), pair_rows(m[6], m[7]));
            // 128-bit lanes [lo.0 + lo.1, lo.2 + lo.3, hi.0 + hi.1, hi.2 + hi.3]: rows 0..4, 4..8
            // (the high halves of m[0..4]), 8..12, 12..16.
            let sums = _mm512_add_epi32(
                _mm512_shuffle_i64x2::<0b10_00_10_00>(lo4, hi4),
                _mm512_shuffle_i64x2::<0b11_01_11_01>(lo4, hi4),
            );
            let isum = _mm512_sub_epi32(sums, _mm512_set1_epi32(B::UNSIGNED_OFFSET * a.sum));
            // The rows' scales inserted one by one (a gather, or four rows' bits joined in a
            // general-purpose register first, measured slower on Zen 4).
            let d = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(scales8(&lo, s)), scales8(&hi, s));
            let d = _mm512_mul_ps(d, _mm512_set1_ps(a.d));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum)));
        }
        acc
    }
}

/// Rows `a` and `b` paired: what lands in the same 32-bit lane added (not a closure: intrinsics
/// in a closure could be left out of line without the caller's features).
#[inline(always)]
unsafe fn pair_rows(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
}

/// Pairs of rows paired: what lands in the same 64-bit lane added.
#[inline(always)]
unsafe fn pair_halves(a: __m512i, b: __m512i) -> __m512i {
    _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
}

/// A job of one token with the scalar path's bits: 16 rows at a time ([`gemv16`]), the rows left
/// over through the AVX2 kernel (the same bits).
///
/// # Safety
/// The `GemmFn` contract, with one token; the CPU has the AVX-512 level's features.
#[inline(always)]
unsafe fn gemv_exact<B: Block16>(job: &GemmJob<'_, B, BlockQ8A>) {
    let tok = job.toks.start;
    let mut r = job.rows.start;
    // SAFETY: `gemv16` gets rows `r..r + 16` inside the job and its token; the 16-float store writes
    // rows `r..r + 16` of that token, which the `GemmFn` contract lets the job write; the rest of
    // the rows go to the AVX2 kernel as a job of their own (the same contract).
    unsafe {
        while r + 16 <= job.rows.end {
            _mm512_storeu_ps(job.out.add(tok * job.ldo + r), gemv16(job, tok, r));
            r += 16;
        }
        if r < job.rows.end {
            B::small(&GemmJob { rows: r..job.rows.end, toks: job.toks.clone(), ..*job });
        }
    }
}

/// The 32-value formats as a [`Rows16`] kernel; `WIDE`: jobs of one token through the AVX-512
/// exact kernel ([`gemv_exact`]) instead of the AVX2 one (the same bits either way).
pub(super) struct Q16<B, const WIDE: bool>(std::marker::PhantomData<B>);

impl<B: Block16, const WIDE: bool> Rows16 for Q16<B, WIDE> {
    type W = B;
    type A = BlockQ8A;
    type Pack = Pack16;
    type Scratch = ();
    const EMPTY: Pack16 = EMPTY;
    // One group's packed blocks stay in L1 (the default model's rows: 28 blocks, 16 KiB).
    const ROW_GROUPS: usize = 1;
    fn scratch() {}
    #[inline(always)]
    unsafe fn pack(lo: [&[B]; 8], hi: [&[B]; 8], s: usize, _: &mut (), p: &mut Pack16) {
        // SAFETY: the trait's contract is `pack16`'s.
        unsafe { pack16(&lo, &hi, s, p) }
    }
    #[inline(always)]
    unsafe fn tile<const C: usize>(packs: &[Pack16], x: [&[BlockQ8A]; C]) -> [__m512; C] {
        // SAFETY: the trait's contract is `tile16`'s.
        unsafe { tile16::<B, C>(packs, x) }
    }
    #[inline(always)]
    unsafe fn small(job: &GemmJob<'_, B, BlockQ8A>) {
        // SAFETY: the `GemmFn` contract, which is what both kernels need (the CPU has the AVX-512
        // level's features, as every `Rows16` kernel requires).
        unsafe {
            if WIDE && job.toks.len() == 1 {
                gemv_exact(job)
            } else {
                B::small(job)
            }
        }
    }
}

/// The GEMM of a 32-value format ([`rows16::gemm`]): all paths give the same bits.
#[inline(always)]
pub(super) unsafe fn gemm16<B: Block16, const WIDE: bool>(job: &GemmJob<'_, B, BlockQ8A>) {
    // Out of the thread-local while in use (a job never nests another).
    let mut packs = PACKS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // SAFETY: the caller's `GemmFn` contract and the CPU's features are what `rows16::gemm` needs.
    unsafe { rows16::gemm::<Q16<B, WIDE>>(job, &mut packs) };
    PACKS.with(|cell| *cell.borrow_mut() = packs);
}
