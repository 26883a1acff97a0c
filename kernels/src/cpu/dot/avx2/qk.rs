//! Register tiles of the K formats (`Q4_K`, `Q5_K`, `Q6_K`) against `BlockQ8K` activations for
//! AVX2. Per 256-value block, each row's weights are unpacked once into eight chunks of 32
//! unsigned values with their sub-block scales (kept in L1 for all the tokens of the tile), and
//! each token's activations are loaded once for all the rows. Each element goes through the
//! operations of the single dot product (the 1 × 1 tile) in the same order — the integer sums per
//! chunk, then the same float steps per block — so results are bit for bit the same whatever the
//! tile or batch.

use super::*;

/// One block's weights, unpacked: chunk `k` holds the values `32k..32k + 32` (unsigned) and the
/// scale of each i16 lane of `maddubs`' result.
#[derive(Clone, Copy)]
pub(super) struct Chunks {
    w: [__m256i; 8],
    sc: [__m256i; 8],
}

pub(super) trait KBlock: Block {
    unsafe fn chunks(&self) -> Chunks;
    /// The block's contribution added to `acc`, given the integer sum of its chunks.
    unsafe fn finish(&self, acc: f32, a: &BlockQ8K, sumi: i32) -> f32;
}

/// Σ m_j · (bsums[2j] + bsums[2j + 1]) over the 8 sub-blocks of a `Q4_K`/`Q5_K` block: integer
/// arithmetic, exactly `k_mins`.
#[inline(always)]
unsafe fn mins_dot(scales: &[u8; 12], bsums: &[i16; 16]) -> i32 {
    let mut m = [0i16; 8];
    for (j, v) in m.iter_mut().enumerate() {
        *v = i16::from(scale_min_k4(j, scales).1);
    }
    unsafe {
        let b = _mm256_loadu_si256(bsums.as_ptr().cast());
        // Pairs of bsums (i16, at most 2 × 16 × 127 each) summed into 8 i32, packed back to i16.
        let pairs = _mm256_madd_epi16(b, _mm256_set1_epi16(1));
        let pairs = _mm_packs_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
        let prod = _mm_madd_epi16(_mm_loadu_si128(m.as_ptr().cast()), pairs);
        let s = _mm_add_epi32(prod, _mm_shuffle_epi32(prod, 0b01_00_11_10));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
    }
}

/// The i16 scale vector of a chunk whose 16 lanes share `scale`.
#[inline(always)]
unsafe fn same(scale: u8) -> __m256i {
    _mm256_set1_epi16(i16::from(scale))
}

impl KBlock for BlockQ4K {
    #[inline(always)]
    unsafe fn chunks(&self) -> Chunks {
        let low = _mm256_set1_epi8(0x0F);
        let mut c = Chunks { w: [_mm256_setzero_si256(); 8], sc: [_mm256_setzero_si256(); 8] };
        for j in 0..4 {
            unsafe {
                let q = load256(self.qs[32 * j..].as_ptr());
                c.w[2 * j] = _mm256_and_si256(q, low);
                c.w[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                c.sc[2 * j] = same(scale_min_k4(2 * j, &self.scales).0);
                c.sc[2 * j + 1] = same(scale_min_k4(2 * j + 1, &self.scales).0);
            }
        }
        c
    }
    #[inline(always)]
    unsafe fn finish(&self, acc: f32, a: &BlockQ8K, sumi: i32) -> f32 {
        combine_k_min(acc, a, self.d, self.dmin, sumi, unsafe { mins_dot(&self.scales, &a.bsums) })
    }
}

impl KBlock for BlockQ5K {
    #[inline(always)]
    unsafe fn chunks(&self) -> Chunks {
        let low = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let mut c = Chunks { w: [_mm256_setzero_si256(); 8], sc: [_mm256_setzero_si256(); 8] };
        unsafe {
            let qh = load256(self.qh.as_ptr());
            for j in 0..4 {
                let q = load256(self.qs[32 * j..].as_ptr());
                let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)), one);
                let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32 + 1)), one);
                c.w[2 * j] = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_slli_epi16(h0, 4));
                c.w[2 * j + 1] =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), _mm256_slli_epi16(h1, 4));
                c.sc[2 * j] = same(scale_min_k4(2 * j, &self.scales).0);
                c.sc[2 * j + 1] = same(scale_min_k4(2 * j + 1, &self.scales).0);
            }
        }
        c
    }
    #[inline(always)]
    unsafe fn finish(&self, acc: f32, a: &BlockQ8K, sumi: i32) -> f32 {
        combine_k_min(acc, a, self.d, self.dmin, sumi, unsafe { mins_dot(&self.scales, &a.bsums) })
    }
}

impl KBlock for BlockQ6K {
    #[inline(always)]
    unsafe fn chunks(&self) -> Chunks {
        let low = _mm256_set1_epi8(0x0F);
        let three = _mm256_set1_epi8(3);
        let mut c = Chunks { w: [_mm256_setzero_si256(); 8], sc: [_mm256_setzero_si256(); 8] };
        for half in 0..2 {
            let sc = |g: usize| self.scales[8 * half + g] as i16;
            unsafe {
                let ql0 = load256(self.ql[64 * half..].as_ptr());
                let ql1 = load256(self.ql[64 * half + 32..].as_ptr());
                let qh = load256(self.qh[32 * half..].as_ptr());
                let hbits = |shift: i32| {
                    let h = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), three);
                    _mm256_slli_epi16(h, 4)
                };
                let k = 4 * half;
                c.w[k] = _mm256_or_si256(_mm256_and_si256(ql0, low), hbits(0));
                c.w[k + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low), hbits(2));
                c.w[k + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), hbits(4));
                c.w[k + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), hbits(6));
                for g in 0..4 {
                    c.sc[k + g] = _mm256_set_m128i(_mm_set1_epi16(sc(2 * g + 1)), _mm_set1_epi16(sc(2 * g)));
                }
            }
        }
        c
    }
    #[inline(always)]
    unsafe fn finish(&self, acc: f32, a: &BlockQ8K, sumi: i32) -> f32 {
        let offset = unsafe {
            let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr().cast()));
            hsum_epi32(_mm256_madd_epi16(s, _mm256_loadu_si256(a.bsums.as_ptr().cast()))) * 32
        };
        acc + (a.d * self.d.to_f32()) * (sumi - offset) as f32
    }
}

/// An `R`-row × `C`-token tile of dot products; the single dot product is the 1 × 1 tile.
#[inline(always)]
pub(super) unsafe fn tilek<B: KBlock, const R: usize, const C: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8K]; C],
) -> [[f32; C]; R] {
    let n = w[0].len();
    let mut out = [[0f32; C]; R];
    unsafe {
        let mut prep = [Chunks { w: [_mm256_setzero_si256(); 8], sc: [_mm256_setzero_si256(); 8] }; R];
        let mut iacc = [[_mm256_setzero_si256(); C]; R];
        for i in 0..n {
            for r in 0..R {
                prep[r] = w[r].get_unchecked(i).chunks();
            }
            for c in 0..C {
                let a = x[c].get_unchecked(i);
                let mut xs = [_mm256_setzero_si256(); 8];
                for (k, v) in xs.iter_mut().enumerate() {
                    *v = load256(a.qs.as_ptr().add(32 * k).cast());
                }
                for r in 0..R {
                    let mut acc = _mm256_setzero_si256();
                    for (k, &xk) in xs.iter().enumerate() {
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(prep[r].w[k], xk), prep[r].sc[k]);
                        acc = _mm256_add_epi32(acc, p);
                    }
                    iacc[r][c] = acc;
                }
            }
            // The integer sums of a row's tokens reduced together, then each token's float steps
            // in the single dot product's order.
            for r in 0..R {
                let sums = hsum4(&iacc[r]);
                for c in 0..C {
                    out[r][c] = w[r].get_unchecked(i).finish(out[r][c], x[c].get_unchecked(i), sums[c]);
                }
            }
        }
    }
    out
}

/// The lane sums of up to 4 vectors (exact: integer adds in any order give the same i32).
#[inline(always)]
unsafe fn hsum4<const C: usize>(v: &[__m256i; C]) -> [i32; 4] {
    if C == 1 {
        return [unsafe { hsum_epi32(v[0]) }, 0, 0, 0];
    }
    let mut at = [_mm256_setzero_si256(); 4];
    at[..C].copy_from_slice(v);
    let s = _mm256_hadd_epi32(_mm256_hadd_epi32(at[0], at[1]), _mm256_hadd_epi32(at[2], at[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let mut out = [0i32; 4];
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), s) };
    out
}

/// The K formats as a tile kernel.
pub(super) struct QK<B>(std::marker::PhantomData<B>);

impl<B: KBlock> TileKernel for QK<B> {
    type W = B;
    type A = BlockQ8K;
    const ROWS: usize = 4;
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(w: [&[B]; R], x: [&[BlockQ8K]; C]) -> [[f32; C]; R] {
        unsafe { tilek(w, x) }
    }
}
