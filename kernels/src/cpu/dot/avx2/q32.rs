//! Register tiles of the 32-value formats (`Q4_0`, `Q5_0`, `Q8_0`) against `BlockQ8A`
//! activations for AVX2: a block's weights are unpacked once per row and used for every token of
//! the tile, a token's activations loaded once and used for every row. Each element goes through
//! the operations of the single dot product (the 1 × 1 tile) in the same order, so results are bit
//! for bit the same whatever the tile or batch.

use super::*;

/// A 32-value block as the tile uses it.
pub(super) trait Block32: Block {
    /// What is kept of a block's weights for all the tokens of a tile.
    type Prep: Copy;
    /// Subtracted from every weight's stored value (corrected with the activations' block sums).
    const OFFSET: i32;
    /// Rows per tile (with 4 tokens): as many as the 16 vector registers hold without spilling
    /// (on a 2-core Zen 3, `cargo bench -p cachet-kernels --bench kernels`, one noisy run each:
    /// `Q5_0` 4 × 4 57–70 GFLOP/s, 3 × 4 64, 2 × 4 60, 4 × 3 47; `Q8_0`, which keeps two
    /// registers per row, 3 × 4 54–64, 4 × 4 50).
    const ROWS: usize;
    fn d(&self) -> f16;
    unsafe fn zero() -> Self::Prep;
    unsafe fn prep(&self) -> Self::Prep;
    /// Σ w·x of the block as 8 i32 lanes (before the offset correction).
    unsafe fn dot(w: Self::Prep, x: __m256i) -> __m256i;
}

impl Block32 for BlockQ4_0 {
    type Prep = __m256i;
    const OFFSET: i32 = 8;
    const ROWS: usize = 4;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn prep(&self) -> __m256i {
        unsafe { nibbles32(self.qs.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        unsafe { dot_u8i8(w, x) }
    }
}

impl Block32 for BlockQ5_0 {
    type Prep = __m256i;
    const OFFSET: i32 = 16;
    const ROWS: usize = 4;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn prep(&self) -> __m256i {
        unsafe { _mm256_or_si256(nibbles32(self.qs.as_ptr()), bits32(u32::from_le_bytes(self.qh), 0x10)) }
    }
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        unsafe { dot_u8i8(w, x) }
    }
}

impl Block32 for BlockQ8_0 {
    /// The weights and their absolute values: `|w| × (x with w's sign)` keeps `maddubs`'
    /// products within i16.
    type Prep = (__m256i, __m256i);
    const OFFSET: i32 = 0;
    const ROWS: usize = 3;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn zero() -> (__m256i, __m256i) {
        (_mm256_setzero_si256(), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn prep(&self) -> (__m256i, __m256i) {
        unsafe {
            let w = load256(self.qs.as_ptr().cast());
            (w, _mm256_sign_epi8(w, w))
        }
    }
    #[inline(always)]
    unsafe fn dot((w, abs): (__m256i, __m256i), x: __m256i) -> __m256i {
        unsafe { dot_u8i8(abs, _mm256_sign_epi8(x, w)) }
    }
}

/// An `R`-row × `C`-token tile of dot products; the single dot product is the 1 × 1 tile.
#[inline(always)]
pub(super) unsafe fn tile32<B: Block32, const R: usize, const C: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8A]; C],
) -> [[f32; C]; R] {
    let n = w[0].len();
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    unsafe {
        let mut wp = [B::zero(); R];
        let mut dw = [_mm256_setzero_ps(); R];
        for i in 0..n {
            for r in 0..R {
                let b = w[r].get_unchecked(i);
                wp[r] = b.prep();
                dw[r] = _mm256_set1_ps(f16_to_f32(b.d()));
            }
            for c in 0..C {
                let a = x[c].get_unchecked(i);
                let xq = load256(a.qs.as_ptr().cast());
                let dx = _mm256_set1_ps(a.d);
                let correction = _mm256_setr_epi32(-B::OFFSET * a.sum, 0, 0, 0, 0, 0, 0, 0);
                for r in 0..R {
                    let mut p = B::dot(wp[r], xq);
                    if B::OFFSET != 0 {
                        p = _mm256_add_epi32(p, correction);
                    }
                    acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[r], dx), acc[r][c]);
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = hsum_ps(acc[r][c]);
            }
        }
        out
    }
}

/// The 32-value formats as a tile kernel.
pub(super) struct Q32<B>(std::marker::PhantomData<B>);

impl<B: Block32> TileKernel for Q32<B> {
    type W = B;
    type A = BlockQ8A;
    const ROWS: usize = B::ROWS;
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(w: [&[B]; R], x: [&[BlockQ8A]; C]) -> [[f32; C]; R] {
        unsafe { tile32(w, x) }
    }
}
