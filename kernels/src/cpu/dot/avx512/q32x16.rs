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

/// The 32-value formats as a [`Rows16`] kernel.
pub(super) struct Q16<B>(std::marker::PhantomData<B>);

impl<B: Block16> Rows16 for Q16<B> {
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
        // SAFETY: the `GemmFn` contract.
        unsafe { B::small(job) }
    }
}

/// The GEMM of a 32-value format ([`rows16::gemm`]): all paths give the same bits.
#[inline(always)]
pub(super) unsafe fn gemm16<B: Block16>(job: &GemmJob<'_, B, BlockQ8A>) {
    // Out of the thread-local while in use (a job never nests another).
    let mut packs = PACKS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // SAFETY: the caller's `GemmFn` contract and the CPU's features are what `rows16::gemm` needs.
    unsafe { rows16::gemm::<Q16<B>>(job, &mut packs) };
    PACKS.with(|cell| *cell.borrow_mut() = packs);
}
