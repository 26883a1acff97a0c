//! Tiles of the 32-value formats (`Q4_0`, `Q5_0`, `Q8_0`) against `BlockQ8A`
//! activations: `vpdpbusd` on the weights' unsigned form, corrected with the
//! activations' block sums, two blocks per 512-bit step.

use super::*;

/// The unsigned 32 weights of one block, and the offset to correct by.
pub(super) trait Block32: Block {
    const OFFSET: i32;
    fn d(&self) -> f16;
    unsafe fn weights(&self) -> __m256i;
}

impl Block32 for BlockQ4_0 {
    const OFFSET: i32 = 8;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        unsafe { nibbles32(self.qs.as_ptr()) }
    }
}

impl Block32 for BlockQ5_0 {
    const OFFSET: i32 = 16;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        unsafe { _mm256_or_si256(nibbles32(self.qs.as_ptr()), bits32(u32::from_le_bytes(self.qh), 0x10)) }
    }
}

impl Block32 for BlockQ8_0 {
    const OFFSET: i32 = 128;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        unsafe { _mm256_xor_si256(load256(self.qs.as_ptr().cast()), _mm256_set1_epi8(-128)) }
    }
}

/// An `R`-row × `C`-token tile of dot products over 32-value blocks: two
/// blocks per 512-bit step, an odd last block in a 256-bit step. Every
/// element goes through the same operations whatever `R` and `C` are, so a
/// row's result does not depend on the tile (or batch) it is computed in; the
/// single dot product is the 1 × 1 tile.
#[inline(always)]
pub(super) unsafe fn tile32<B: Block32, const R: usize, const C: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8A]; C],
) -> [[f32; C]; R] {
    let n = w[0].len();
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let mut i = 0;
    unsafe {
        while i + 2 <= n {
            let mut wv = [_mm512_setzero_si512(); R];
            let mut sw = [_mm512_setzero_ps(); R];
            for r in 0..R {
                if R > 1 {
                    // Rows are read in lockstep: keep each stream ahead of the hardware prefetcher.
                    _mm_prefetch::<_MM_HINT_T0>(w[r].as_ptr().wrapping_add(i + 16).cast());
                }
                let (b0, b1) = (w[r].get_unchecked(i), w[r].get_unchecked(i + 1));
                wv[r] = join(b0.weights(), b1.weights());
                sw[r] = pair(f16_to_f32(b0.d()), f16_to_f32(b1.d()));
            }
            for c in 0..C {
                let (a0, a1) = (x[c].get_unchecked(i), x[c].get_unchecked(i + 1));
                let xv = join(load256(a0.qs.as_ptr().cast()), load256(a1.qs.as_ptr().cast()));
                #[rustfmt::skip]
                let init = _mm512_setr_epi32(
                    -B::OFFSET * a0.sum, 0, 0, 0, 0, 0, 0, 0,
                    -B::OFFSET * a1.sum, 0, 0, 0, 0, 0, 0, 0,
                );
                let sx = pair(a0.d, a1.d);
                for r in 0..R {
                    let p = _mm512_dpbusd_epi32(init, wv[r], xv);
                    acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(sw[r], sx), acc[r][c]);
                }
            }
            i += 2;
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
            }
        }
        if i < n {
            for r in 0..R {
                let b = w[r].get_unchecked(i);
                let wv = b.weights();
                for c in 0..C {
                    let a = x[c].get_unchecked(i);
                    let init = _mm256_setr_epi32(-B::OFFSET * a.sum, 0, 0, 0, 0, 0, 0, 0);
                    let p = _mm256_dpbusd_epi32(init, wv, load256(a.qs.as_ptr().cast()));
                    let d = _mm256_set1_ps(f16_to_f32(b.d()) * a.d);
                    out[r][c] += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(p), d));
                }
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
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(w: [&[B]; R], x: [&[BlockQ8A]; C]) -> [[f32; C]; R] {
        unsafe { tile32(w, x) }
    }
}
