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
pub(in crate::cpu::dot) struct Chunks {
    w: [__m256i; 8],
    sc: [__m256i; 8],
    /// `Q4_K`/`Q5_K`: the 8 sub-block mins (i16).
    mins: __m128i,
    /// `Q6_K`: the 16 sub-block scales (i16).
    sc16: __m256i,
    /// The block's scales as f32 (`d`, and `dmin` where there is one).
    pub(in crate::cpu::dot) d: f32,
    pub(in crate::cpu::dot) dmin: f32,
}

// SAFETY: every field is a vector or a float, for which all-zero bits are valid.
const EMPTY: Chunks = unsafe { std::mem::zeroed() };

pub(in crate::cpu::dot) trait KBlock: Block {
    /// The block's scales (spread per chunk), mins and float scales; no weights yet.
    unsafe fn head(&self) -> Chunks;
    /// The unsigned weights of chunks `2j` and `2j + 1` (`j < 4`).
    unsafe fn pair(&self, j: usize) -> [__m256i; 2];
    /// The whole block unpacked.
    #[inline(always)]
    unsafe fn chunks(&self) -> Chunks {
        // SAFETY: `pair` gets `j < 4`, its contract; `head` and `pair` read only this block's own fields;
        // the CPU has AVX2 (module contract).
        unsafe {
            let mut c = self.head();
            for j in 0..4 {
                [c.w[2 * j], c.w[2 * j + 1]] = self.pair(j);
            }
            c
        }
    }
    /// What `finish` needs of a token's block, prepared once for all the rows of a tile.
    unsafe fn token(a: &BlockQ8K) -> __m256i;
    /// The block's contribution added to `acc`, given its unpacked form `c`, the token's block
    /// `a` and what `token` made of it, and the integer sum of its chunks.
    unsafe fn finish(&self, c: &Chunks, acc: f32, a: &BlockQ8K, t: __m256i, sumi: i32) -> f32;
    /// Lanes whose sum is the block's integer correction that `finish` computes (`Q4_K`/`Q5_K`:
    /// the mins' dot with the bsum pairs; `Q6_K`: the scales' dot with the bsums, before × 32).
    unsafe fn corr(c: &Chunks, t: __m256i) -> __m256i;
    /// `finish` for 4 rows in the lanes of `acc` (`ad`: the token's scale; `d`, `dmin`: the
    /// rows'; `sumi`, `corr`: their exact sums): the same float steps per lane.
    unsafe fn finish4(acc: __m128, ad: f32, d: __m128, dmin: __m128, sumi: __m128i, corr: __m128i) -> __m128;
}

/// `Q4_K`/`Q5_K`'s `finish4`: `acc + (d_x · d) · sumi − (d_x · dmin) · summ` per lane.
#[inline(always)]
unsafe fn finish4_k4(acc: __m128, ad: f32, d: __m128, dmin: __m128, sumi: __m128i, summ: __m128i) -> __m128 {
    let ad = _mm_set1_ps(ad);
    let acc = _mm_add_ps(acc, _mm_mul_ps(_mm_mul_ps(ad, d), _mm_cvtepi32_ps(sumi)));
    _mm_sub_ps(acc, _mm_mul_ps(_mm_mul_ps(ad, dmin), _mm_cvtepi32_ps(summ)))
}

/// Pairs of a `BlockQ8K`'s bsums (i16, at most 2 × 16 × 127 each) summed into 8 i32 and packed
/// back to i16, in the low 128-bit lane: the sums of the 8 sub-blocks of 32 values.
#[inline(always)]
unsafe fn bsum_pairs(a: &BlockQ8K) -> __m256i {
    // SAFETY: the unaligned load reads 32 bytes, exactly `a.bsums` (16 × i16); the rest only touches
    // registers; the CPU has AVX2 (module contract).
    unsafe {
        let b = _mm256_loadu_si256(a.bsums.as_ptr().cast());
        let pairs = _mm256_madd_epi16(b, _mm256_set1_epi16(1));
        _mm256_castsi128_si256(_mm_packs_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1)))
    }
}

/// The 8 sub-block scales and 8 mins of a `Q4_K`/`Q5_K` block's 12 packed bytes, all at once
/// (what `scale_min_k4` gives one at a time): scales as i16 in the first result, mins in the
/// second.
#[inline(always)]
unsafe fn scales_mins_k4(q: &[u8; 12]) -> (__m128i, __m128i) {
    // SAFETY: `k4_scales_mins` reads only the 12 bytes of `q`; the rest only touches registers; the CPU
    // has AVX2 (module contract).
    unsafe {
        let wide = _mm256_cvtepu8_epi16(k4_scales_mins(q));
        (_mm256_castsi256_si128(wide), _mm256_extracti128_si256(wide, 1))
    }
}

/// Each of the 8 i16 `scales` spread over the 16 lanes of its chunk's scale vector.
#[inline(always)]
unsafe fn spread(scales: __m128i, sc: &mut [__m256i; 8]) {
    // SAFETY: register-only AVX2 shuffles; the CPU has AVX2 (module contract).
    unsafe {
        let both = _mm256_broadcastsi128_si256(scales);
        for (k, v) in sc.iter_mut().enumerate() {
            let pick = _mm256_set1_epi16((((2 * k + 1) << 8) | (2 * k)) as i16);
            *v = _mm256_shuffle_epi8(both, pick);
        }
    }
}

/// Σ m_j · (bsums[2j] + bsums[2j + 1]) over the 8 sub-blocks of a `Q4_K`/`Q5_K` block (`pairs`
/// from `bsum_pairs`): integer arithmetic, exactly `k_mins`.
#[inline(always)]
unsafe fn mins_dot(mins: __m128i, pairs: __m256i) -> i32 {
    // SAFETY: register-only SSE2/AVX2 arithmetic; the CPU has AVX2 (module contract).
    unsafe {
        let prod = _mm_madd_epi16(mins, _mm256_castsi256_si128(pairs));
        let s = _mm_add_epi32(prod, _mm_shuffle_epi32(prod, 0b01_00_11_10));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
    }
}

/// The head of a `Q4_K`/`Q5_K` block (their scales, mins and float scales share one layout).
#[inline(always)]
unsafe fn head_k4(scales: &[u8; 12], d: f16, dmin: f16) -> Chunks {
    let mut c = EMPTY;
    // SAFETY: `scales_mins_k4` reads only the 12-byte `scales`, `spread` writes only `c.sc`; the CPU
    // has AVX2 (module contract).
    unsafe {
        let (scales, mins) = scales_mins_k4(scales);
        spread(scales, &mut c.sc);
        c.mins = mins;
    }
    // SAFETY: register-only F16C conversions; the CPU has F16C (module contract).
    (c.d, c.dmin) = unsafe { (f16_to_f32(d), f16_to_f32(dmin)) };
    c
}

/// `combine_k_min` with the block's scales already converted (the same float steps).
#[inline(always)]
fn combine(acc: f32, a: &BlockQ8K, c: &Chunks, sumi: i32, summ: i32) -> f32 {
    acc + (a.d * c.d) * sumi as f32 - (a.d * c.dmin) * summ as f32
}

/// What `Q4_K` and `Q5_K` share: the head (scales, mins and float scales in one layout), the
/// token's bsum pairs and the float steps; only the chunk unpacking differs.
macro_rules! k4_common {
    () => {
        #[inline(always)]
        unsafe fn head(&self) -> Chunks {
            // SAFETY: `head_k4` reads only the 12-byte `scales` it is given; AVX2/F16C per the module contract.
            unsafe { head_k4(&self.scales, self.d, self.dmin) }
        }
        #[inline(always)]
        unsafe fn token(a: &BlockQ8K) -> __m256i {
            // SAFETY: `bsum_pairs` reads only the 32-byte `bsums` of `a`; AVX2 per the module contract.
            unsafe { bsum_pairs(a) }
        }
        #[inline(always)]
        unsafe fn finish(&self, c: &Chunks, acc: f32, a: &BlockQ8K, t: __m256i, sumi: i32) -> f32 {
            // SAFETY: register-only arithmetic; AVX2 per the module contract.
            combine(acc, a, c, sumi, unsafe { mins_dot(c.mins, t) })
        }
        #[inline(always)]
        unsafe fn corr(c: &Chunks, t: __m256i) -> __m256i {
            _mm256_zextsi128_si256(_mm_madd_epi16(c.mins, _mm256_castsi256_si128(t)))
        }
        #[inline(always)]
        unsafe fn finish4(acc: __m128, ad: f32, d: __m128, dmin: __m128, sumi: __m128i, corr: __m128i) -> __m128 {
            // SAFETY: register-only arithmetic; AVX2 per the module contract.
            unsafe { finish4_k4(acc, ad, d, dmin, sumi, corr) }
        }
    };
}

impl KBlock for BlockQ4K {
    #[inline(always)]
    unsafe fn pair(&self, j: usize) -> [__m256i; 2] {
        let low = _mm256_set1_epi8(0x0F);
        // SAFETY: `j < 4` (`pair`'s contract), so the 32-byte load at `qs[32 * j]` stays inside the
        // 128-byte `qs`; the CPU has AVX2 (module contract).
        unsafe {
            let q = load256(self.qs.as_ptr().add(32 * j));
            [_mm256_and_si256(q, low), _mm256_and_si256(_mm256_srli_epi16(q, 4), low)]
        }
    }
    k4_common!();
}

impl KBlock for BlockQ5K {
    #[inline(always)]
    unsafe fn pair(&self, j: usize) -> [__m256i; 2] {
        let low = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        // SAFETY: the loads read the 32-byte `qh` and, as `j < 4` (`pair`'s contract), `qs[32j..32j + 32]`
        // inside the 128-byte `qs`; the CPU has AVX2 (module contract).
        unsafe {
            let qh = load256(self.qh.as_ptr());
            let q = load256(self.qs.as_ptr().add(32 * j));
            let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)), one);
            let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32 + 1)), one);
            [
                _mm256_or_si256(_mm256_and_si256(q, low), _mm256_slli_epi16(h0, 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), _mm256_slli_epi16(h1, 4)),
            ]
        }
    }
    k4_common!();
}

impl KBlock for BlockQ6K {
    #[inline(always)]
    unsafe fn head(&self) -> Chunks {
        let mut c = EMPTY;
        // SAFETY: the unaligned 16-byte load reads exactly `scales` (`[i8; 16]`); the rest only touches
        // registers; the CPU has AVX2 (module contract).
        unsafe {
            // The 16 sub-block scales as i16; chunk g of a half takes scale 2g for its first 16
            // values (the low 128-bit lane) and 2g + 1 for the next 16.
            let s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr().cast()));
            c.sc16 = s16;
            let halves = [_mm256_permute2x128_si256(s16, s16, 0x00), _mm256_permute2x128_si256(s16, s16, 0x11)];
            for (half, scales) in halves.into_iter().enumerate() {
                for g in 0..4 {
                    let (lo, hi) = (((4 * g + 1) << 8) | (4 * g), ((4 * g + 3) << 8) | (4 * g + 2));
                    let pick = _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16));
                    c.sc[4 * half + g] = _mm256_shuffle_epi8(scales, pick);
                }
            }
        }
        // SAFETY: a register-only F16C conversion; the CPU has F16C (module contract).
        c.d = unsafe { f16_to_f32(self.d) };
        c
    }
    /// Chunks `4·half + {0, 1}` (`j = 2·half`) or `4·half + {2, 3}` (`j = 2·half + 1`): the low
    /// or the high nibbles of the half's two 32-byte `ql` runs, with their 2-bit `qh` parts.
    #[inline(always)]
    unsafe fn pair(&self, j: usize) -> [__m256i; 2] {
        let low = _mm256_set1_epi8(0x0F);
        let three = _mm256_set1_epi8(3);
        let half = j / 2;
        // SAFETY: `j < 4` (`pair`'s contract), so `half <= 1`: the 32-byte loads read
        // `ql[64 * half..64 * half + 64]` inside the 128-byte `ql` and `qh[32 * half..32 * half + 32]`
        // inside the 64-byte `qh`; the CPU has AVX2 (module contract).
        unsafe {
            let ql0 = load256(self.ql.as_ptr().add(64 * half));
            let ql1 = load256(self.ql.as_ptr().add(64 * half + 32));
            let qh = load256(self.qh.as_ptr().add(32 * half));
            let h = |v: __m256i| _mm256_slli_epi16(_mm256_and_si256(v, three), 4);
            if j.is_multiple_of(2) {
                [
                    _mm256_or_si256(_mm256_and_si256(ql0, low), h(qh)),
                    _mm256_or_si256(_mm256_and_si256(ql1, low), h(_mm256_srli_epi16(qh, 2))),
                ]
            } else {
                [
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), h(_mm256_srli_epi16(qh, 4))),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), h(_mm256_srli_epi16(qh, 6))),
                ]
            }
        }
    }
    #[inline(always)]
    unsafe fn token(a: &BlockQ8K) -> __m256i {
        // SAFETY: the unaligned load reads 32 bytes, exactly `a.bsums` (16 × i16); AVX2 per the module
        // contract.
        unsafe { _mm256_loadu_si256(a.bsums.as_ptr().cast()) }
    }
    #[inline(always)]
    unsafe fn finish(&self, c: &Chunks, acc: f32, a: &BlockQ8K, t: __m256i, sumi: i32) -> f32 {
        // SAFETY: register-only arithmetic; AVX2 per the module contract.
        let offset = unsafe { hsum_epi32(_mm256_madd_epi16(c.sc16, t)) * 32 };
        acc + (a.d * c.d) * (sumi - offset) as f32
    }
    #[inline(always)]
    unsafe fn corr(c: &Chunks, t: __m256i) -> __m256i {
        _mm256_madd_epi16(c.sc16, t)
    }
    #[inline(always)]
    unsafe fn finish4(acc: __m128, ad: f32, d: __m128, _: __m128, sumi: __m128i, corr: __m128i) -> __m128 {
        let d = _mm_mul_ps(_mm_set1_ps(ad), d);
        _mm_add_ps(acc, _mm_mul_ps(d, _mm_cvtepi32_ps(_mm_sub_epi32(sumi, _mm_slli_epi32::<5>(corr)))))
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
    // SAFETY: every `w[r]` and `x[c]` holds at least `n = w[0].len()` blocks (`gemm` passes weight rows
    // of `wpr` and activation rows of `apr >= wpr` blocks), so `get_unchecked(i)` with `i < n` is in
    // bounds; the activation loads read `qs[32k..32k + 32]`, `k < 8`, inside its 256 bytes; the CPU
    // has AVX2/FMA/F16C (module contract).
    unsafe {
        let mut prep = [EMPTY; R];
        let mut iacc = [[_mm256_setzero_si256(); C]; R];
        let mut tok = [_mm256_setzero_si256(); C];
        for i in 0..n {
            for r in 0..R {
                prep[r] = w[r].get_unchecked(i).chunks();
            }
            for c in 0..C {
                let a = x[c].get_unchecked(i);
                tok[c] = B::token(a);
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
                    out[r][c] =
                        w[r].get_unchecked(i).finish(&prep[r], out[r][c], x[c].get_unchecked(i), tok[c], sums[c]);
                }
            }
        }
    }
    out
}

/// A block's exact integer lanes against one token, unpacking each chunk pair right before its
/// products (`h`: the block's head).
#[inline(always)]
unsafe fn lanes<B: KBlock>(b: &B, h: &Chunks, a: &BlockQ8K) -> __m256i {
    let mut iacc = _mm256_setzero_si256();
    // SAFETY: `pair` gets `j < 4`; the loads read `a.qs[64j..64j + 64]`, inside its 256 bytes; the CPU
    // has AVX2 (module contract).
    unsafe {
        for j in 0..4 {
            let [w0, w1] = b.pair(j);
            let x0 = load256(a.qs.as_ptr().add(64 * j).cast());
            let x1 = load256(a.qs.as_ptr().add(64 * j + 32).cast());
            iacc = _mm256_add_epi32(iacc, _mm256_madd_epi16(_mm256_maddubs_epi16(w0, x0), h.sc[2 * j]));
            iacc = _mm256_add_epi32(iacc, _mm256_madd_epi16(_mm256_maddubs_epi16(w1, x1), h.sc[2 * j + 1]));
        }
    }
    iacc
}

/// One row against one token, unpacking each chunk pair right before its products (nothing of
/// the block is kept beyond its scales): the same integer sums and float steps as the 1 × 1 tile
/// of [`tilek`], so the same bits.
#[inline(always)]
pub(in crate::cpu::dot) unsafe fn rowdot<B: KBlock>(w: &[B], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    // SAFETY: `zip` yields only blocks of both slices, and `head`, `finish`, `token` and `lanes` read
    // only the blocks they are given; AVX2/FMA/F16C per the module contract.
    unsafe {
        for (b, a) in w.iter().zip(x) {
            let h = b.head();
            acc = b.finish(&h, acc, a, B::token(a), hsum_epi32(lanes(b, &h, a)));
        }
    }
    acc
}

/// The lane sums of up to 4 vectors (exact: integer adds in any order give the same i32).
#[inline(always)]
unsafe fn hsum4<const C: usize>(v: &[__m256i; C]) -> [i32; 4] {
    if C == 1 {
        // SAFETY: register-only AVX2 arithmetic; the CPU has AVX2 (module contract).
        return [unsafe { hsum_epi32(v[0]) }, 0, 0, 0];
    }
    let mut at = [_mm256_setzero_si256(); 4];
    at[..C].copy_from_slice(v);
    let mut out = [0i32; 4];
    // SAFETY: the unaligned 16-byte store writes exactly `out` (`[i32; 4]`); AVX2 per the module contract.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), sums4(at)) };
    out
}

/// The lane sums of 4 vectors, in the lanes of one.
#[inline(always)]
pub(in crate::cpu::dot) unsafe fn sums4(v: [__m256i; 4]) -> __m128i {
    let s = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1))
}

/// `C` tokens against 4 rows, in the lanes of 4-wide vectors: each row's block as in
/// [`rowdot`], its head and weights unpacked once for all the tokens (a decode step of `C`
/// sequences reads and unpacks the rows once), then per token the 4 rows' integer sums and
/// corrections reduced together and their float steps done side by side (a third of a
/// one-token block's operations were the horizontal sums and the scalar steps). Per token the
/// same exact sums and float steps as [`rowdot`], so the same bits.
#[inline(always)]
unsafe fn gemv4c<B: KBlock, L: Lanes<B>, const C: usize>(w: [&[B]; 4], x: [&[BlockQ8K]; C]) -> [__m128; C] {
    let mut acc = [_mm_setzero_ps(); C];
    // The 4 rows are contiguous, and so are the next 4: the hardware sees 4 strided streams, so
    // fetch the next group's bytes in step (one group ahead, `4 · size_of::<B>()` per block).
    let ahead = w[3].as_ptr().wrapping_add(w[3].len()).cast::<u8>();
    let step = 4 * std::mem::size_of::<B>();
    // SAFETY: the four `w[r]` and every `x[c]` hold at least `w[0].len()` blocks (`gemv` cuts each
    // weight row and token row to `n = wpr` blocks), so `get_unchecked(s)` is in bounds; `lanes`
    // reads only the blocks it is given and `_mm_loadu_ps` the 4-float arrays `d`/`dmin`; a prefetch is only a hint (its pointer, made
    // with `wrapping_add`, is never dereferenced); the CPU has AVX2/FMA/F16C (module contract).
    unsafe {
        for s in 0..w[0].len() {
            let p = ahead.wrapping_add(s * step);
            for line in (0..step).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line).cast());
            }
            let a: [&BlockQ8K; C] = std::array::from_fn(|c| x[c].get_unchecked(s));
            let mut sums = [[_mm256_setzero_si256(); 4]; C];
            let mut corr = [[_mm256_setzero_si256(); 4]; C];
            let (mut d, mut dmin) = ([0f32; 4], [0f32; 4]);
            for r in 0..4 {
                let b = w[r].get_unchecked(s);
                let h = b.head();
                let lanes = L::lanes::<C>(b, &h, &a);
                for c in 0..C {
                    sums[c][r] = lanes[c];
                    corr[c][r] = B::corr(&h, B::token(a[c]));
                }
                (d[r], dmin[r]) = (h.d, h.dmin);
            }
            let (d, dmin) = (_mm_loadu_ps(d.as_ptr()), _mm_loadu_ps(dmin.as_ptr()));
            for c in 0..C {
                acc[c] = B::finish4(acc[c], a[c].d, d, dmin, sums4(sums[c]), sums4(corr[c]));
            }
        }
    }
    acc
}

/// How a row's block meets `C` tokens in the few-token kernel ([`gemv4c`]): per token, 8 i32
/// lanes whose sum is the block's exact scaled integer sum (`h`: the block's head).
pub(in crate::cpu::dot) trait Lanes<B> {
    /// # Safety
    /// The CPU has the implementation's features (AVX2 at least).
    unsafe fn lanes<const C: usize>(b: &B, h: &Chunks, a: &[&BlockQ8K; C]) -> [__m256i; C];
}

/// This level's [`Lanes`]: each chunk pair unpacked right before its products, `maddubs` and
/// `madd` with the scales.
pub(in crate::cpu::dot) struct Avx2Lanes;

impl<B: KBlock> Lanes<B> for Avx2Lanes {
    #[inline(always)]
    unsafe fn lanes<const C: usize>(b: &B, h: &Chunks, a: &[&BlockQ8K; C]) -> [__m256i; C] {
        let mut sums = [_mm256_setzero_si256(); C];
        // SAFETY: `pair` gets `j < 4`; the loads read `a[c].qs[64j..64j + 64]` inside its 256 bytes;
        // the CPU has AVX2 (the trait's contract).
        unsafe {
            for j in 0..4 {
                let [w0, w1] = b.pair(j);
                for c in 0..C {
                    let x0 = load256(a[c].qs.as_ptr().add(64 * j).cast());
                    let x1 = load256(a[c].qs.as_ptr().add(64 * j + 32).cast());
                    let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, x0), h.sc[2 * j]);
                    let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, x1), h.sc[2 * j + 1]);
                    sums[c] = _mm256_add_epi32(sums[c], _mm256_add_epi32(p0, p1));
                }
            }
        }
        sums
    }
}

/// A job of a few tokens (a decode step's): rows 4 at a time against up to 4 tokens at once
/// ([`gemv4c`]), the rest through [`rowdot`].
#[inline(always)]
pub(super) unsafe fn gemv<B: KBlock>(job: &GemmJob<'_, B, BlockQ8K>) {
    // SAFETY: the caller's `GemmFn` contract is `gemv_by`'s, and the CPU has AVX2/FMA/F16C.
    unsafe { gemv_by::<B, Avx2Lanes>(job) }
}

/// A job of a few tokens: rows 4 at a time against up to 4 tokens at once ([`gemv4c`] with the
/// blocks' lanes from `L`), the rows left over through [`rowdot`] (the same bits).
///
/// # Safety
/// The `GemmFn` contract; the CPU has AVX2/FMA/F16C and `L`'s features.
#[inline(always)]
pub(in crate::cpu::dot) unsafe fn gemv_by<B: KBlock, L: Lanes<B>>(job: &GemmJob<'_, B, BlockQ8K>) {
    let n = job.wpr;
    // SAFETY: by the `GemmFn` contract `job.w` holds the job's rows of `n = wpr` blocks, `job.x` its
    // tokens with `apr >= n` blocks (`x(t)` takes the first `n`), and `job.out` may be written at
    // `t * ldo + r` for them: the 4-float stores cover rows `r..r + 4 <= job.rows.end` of token
    // `t + j` inside `job.toks` (`token_tiles!`); the CPU has AVX2/FMA/F16C (module contract) and
    // `L`'s features (the caller's).
    unsafe {
        let x = |t: usize| job.x.get_unchecked(t * job.apr..t * job.apr + n);
        let mut r = job.rows.start;
        while r + 4 <= job.rows.end {
            let w: [&[B]; 4] = std::array::from_fn(|i| job.w.get_unchecked((r + i) * n..(r + i + 1) * n));
            token_tiles!(job.toks.clone(), |t, C| {
                for (j, v) in gemv4c::<B, L, C>(w, std::array::from_fn(|j| x(t + j))).iter().enumerate() {
                    _mm_storeu_ps(job.out.add((t + j) * job.ldo + r), *v);
                }
            });
            r += 4;
        }
        for r in r..job.rows.end {
            for t in job.toks.clone() {
                *job.out.add(t * job.ldo + r) = rowdot(job.w.get_unchecked(r * n..(r + 1) * n), x(t));
            }
        }
    }
}

/// The K formats as a tile kernel.
pub(super) struct QK<B>(std::marker::PhantomData<B>);

impl<B: KBlock> TileKernel for QK<B> {
    type W = B;
    type A = BlockQ8K;
    const ROWS: usize = 4;
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(w: [&[B]; R], x: [&[BlockQ8K]; C]) -> [[f32; C]; R] {
        if R == 1 && C == 1 {
            let mut out = [[0f32; C]; R];
            // SAFETY: `rowdot` zips the two rows, so it reads no block beyond either; AVX2/FMA/F16C per the
            // module contract.
            out[0][0] = unsafe { rowdot(w[0], x[0]) };
            return out;
        }
        // SAFETY: `gemm` passes rows of at least `w[0].len()` blocks each (`wpr` weight blocks,
        // `apr >= wpr` activation blocks), which is what `tilek` requires; same CPU features.
        unsafe { tilek(w, x) }
    }
}
