//! The K formats' GEMM for prompt-sized jobs on AVX2: 8 weight rows side by side in the lanes
//! of a register, so a row's integer sums never need a horizontal reduction.
//!
//! A job's 8-row groups are repacked once for all its tokens (`Pack`, per block): chunk `k`'s
//! 32 unsigned values of each row, transposed so that register `8k + g` holds values
//! `32k + 4g .. + 4` of row `i` in 32-bit lane `i`. A token's 4 activations at that position are
//! broadcast to all lanes (a load, no shuffle), so one `maddubs` makes 32 products for 8 rows
//! (16 i16 pair sums: lanes `2i` and `2i + 1` belong to row `i`). Up to `SPAN` of them add up
//! in i16 while every sum stays below 2^15, then one `madd` with the sub-block scales per row
//! gives i32 lane `i` = row `i`'s scaled sum — 72 multiplies per 2048 products for `Q4_K`
//! where one row at a time takes 128. The mins (or `Q6_K`'s +32 offsets) are 8 more `madd`s
//! with the token's bsums.
//!
//! Each row's block sum is exact, and its float steps are the scalar path's, in the same
//! order and without fused multiply-adds, so every element is bit for bit what the scalar
//! dot product (and the AVX2 tiles, and the decode path) gives: batch invariance across paths.

use super::qk::KBlock;
use super::*;

/// One block of an 8-row group.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(in crate::cpu::dot) struct Pack {
    /// Register `8k + g`, 32-bit lane `i`: row `i`'s values `32k + 4g .. + 4` (unsigned).
    pub(in crate::cpu::dot) w: [__m256i; 64],
    /// Per scale, lane `i`: row `i`'s scale in both i16 halves (`madd` with the pair sums).
    pub(in crate::cpu::dot) sc: [[u32; 8]; 16],
    /// Lane `i` of register `q`: the two i16 factors of bsums `2q` and `2q + 1` for row `i`
    /// (`Q4_K`/`Q5_K`: mins `m_q`, `m_q`; `Q6_K`: scales `2q`, `2q + 1`).
    pub(in crate::cpu::dot) mo: [[u32; 8]; 8],
    pub(in crate::cpu::dot) d: [f32; 8],
    pub(in crate::cpu::dot) dmin: [f32; 8],
}

// SAFETY: vectors, integers and floats, for which all-zero bits are valid.
pub(in crate::cpu::dot) const EMPTY: Pack = unsafe { std::mem::zeroed() };

pub(in crate::cpu::dot) trait KBlock8: KBlock {
    /// How many `maddubs` results (groups of 4 values) add up in i16 before the scale `madd`.
    const SPAN: usize;
    /// The block's 16 scale bytes: `Q4_K`/`Q5_K` the 8 sub-block scales then the 8 mins
    /// (unsigned), `Q6_K` its 16 group scales (signed).
    unsafe fn scale_bytes(&self) -> __m128i;
    /// The block's `d` and `dmin` (`Q6_K`: `d` and 0) as f16 bits.
    fn d_bits(&self) -> (u16, u16);
    /// Fills `sc` and `mo` from the 16 scale bytes of each row, one column per byte
    /// ([`columns`]).
    unsafe fn scales(cols: [__m128i; 8], p: &mut Pack);
    /// The scale of chunk `k`'s group `g`.
    fn scale_index(k: usize, g: usize) -> usize;
    /// The block's float steps per row lane from the exact sums (`mo`'s dot with the bsums in
    /// `corr`), the scalar path's operations in its order.
    unsafe fn finish8(p: &Pack, sumi: __m256i, corr: __m256i, a: &BlockQ8K, acc: __m256) -> __m256;
}

/// The 8 rows' 16 scale bytes transposed: `out[m]` holds column `2m` (the 8 rows' byte `2m`)
/// in its low 8 bytes and column `2m + 1` in its high 8 bytes.
#[inline(always)]
unsafe fn columns(r: [__m128i; 8]) -> [__m128i; 8] {
    let mut out = [_mm_setzero_si128(); 8];
    for half in 0..2 {
        // i16 element c: rows 2k, 2k + 1 at column 8·half + c.
        let s: [__m128i; 4] = each!(4, |k| {
            if half == 0 {
                _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1])
            } else {
                _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1])
            }
        });
        // i32 element c: rows 0..4 (u[0], u[1]) or 4..8 (u[2], u[3]) at columns c, 4 + c.
        let u = [
            _mm_unpacklo_epi16(s[0], s[1]),
            _mm_unpackhi_epi16(s[0], s[1]),
            _mm_unpacklo_epi16(s[2], s[3]),
            _mm_unpackhi_epi16(s[2], s[3]),
        ];
        out[4 * half] = _mm_unpacklo_epi32(u[0], u[2]);
        out[4 * half + 1] = _mm_unpackhi_epi32(u[0], u[2]);
        out[4 * half + 2] = _mm_unpacklo_epi32(u[1], u[3]);
        out[4 * half + 3] = _mm_unpackhi_epi32(u[1], u[3]);
    }
    out
}

/// Column `c` of [`columns`]' result as 8 bytes.
#[inline(always)]
unsafe fn column(cols: &[__m128i; 8], c: usize) -> __m128i {
    let v = cols[c / 2];
    if c.is_multiple_of(2) {
        v
    } else {
        _mm_unpackhi_epi64(v, v)
    }
}

/// 8 i32 lanes' low 16 bits in both halves of each lane.
#[inline(always)]
unsafe fn twice(v: __m256i) -> __m256i {
    _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32::<16>(v))
}

#[inline(always)]
unsafe fn store(dst: &mut [u32; 8], v: __m256i) {
    // SAFETY: `dst` is 32 bytes and 32-byte aligned, as the aligned store needs: every caller passes a
    // row of `Pack::sc` or `Pack::mo`, at offsets that are multiples of 32 in the `align(32)` `Pack`;
    // the CPU has AVX2 (module contract).
    unsafe { _mm256_store_si256(dst.as_mut_ptr().cast(), v) }
}

/// `Q4_K`/`Q5_K`: `acc + (d_x · d) · sumi − (d_x · dmin) · summ`.
#[inline(always)]
unsafe fn finish_k4(p: &Pack, sumi: __m256i, summ: __m256i, a: &BlockQ8K, acc: __m256) -> __m256 {
    // SAFETY: the aligned loads read `p.d` and `p.dmin` (8 f32 each), at offsets that are multiples of
    // 32 in the `align(32)` `Pack`; the CPU has AVX2 (module contract).
    unsafe {
        let ad = _mm256_set1_ps(a.d);
        let d = _mm256_mul_ps(ad, _mm256_load_ps(p.d.as_ptr()));
        let dmin = _mm256_mul_ps(ad, _mm256_load_ps(p.dmin.as_ptr()));
        let acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)));
        _mm256_sub_ps(acc, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ)))
    }
}

/// `Q4_K`/`Q5_K`: the sub-block scales per chunk, the mins twice per bsum pair.
#[inline(always)]
unsafe fn scales_k4(cols: [__m128i; 8], p: &mut Pack) {
    // SAFETY: `store` gets rows `j < 8` of `p.sc` (16 rows) and `p.mo` (8 rows), aligned as it needs;
    // `column` gets `c < 16`; the CPU has AVX2 (module contract).
    unsafe {
        for j in 0..8 {
            store(&mut p.sc[j], twice(_mm256_cvtepu8_epi32(column(&cols, j))));
            store(&mut p.mo[j], twice(_mm256_cvtepu8_epi32(column(&cols, 8 + j))));
        }
    }
}

/// `Q4_K` and `Q5_K` share the scale layout and the float steps; only how many pair sums fit
/// i16 differs.
macro_rules! k4_block8 {
    ($block:ty, $span:expr) => {
        impl KBlock8 for $block {
            const SPAN: usize = $span;
            #[inline(always)]
            unsafe fn scale_bytes(&self) -> __m128i {
                // SAFETY: `k4_scales_mins` reads only the 12 bytes of `scales`; AVX2 per the module contract.
                unsafe { k4_scales_mins(&self.scales) }
            }
            #[inline(always)]
            fn d_bits(&self) -> (u16, u16) {
                (self.d.to_bits(), self.dmin.to_bits())
            }
            #[inline(always)]
            unsafe fn scales(cols: [__m128i; 8], p: &mut Pack) {
                // SAFETY: `scales_k4` writes only `p`'s aligned `sc` and `mo` rows; AVX2 per the module contract.
                unsafe { scales_k4(cols, p) }
            }
            #[inline(always)]
            fn scale_index(k: usize, _: usize) -> usize {
                k
            }
            #[inline(always)]
            unsafe fn finish8(p: &Pack, sumi: __m256i, corr: __m256i, a: &BlockQ8K, acc: __m256) -> __m256 {
                // SAFETY: `finish_k4` reads only `p`'s aligned `d` and `dmin`; AVX2 per the module contract.
                unsafe { finish_k4(p, sumi, corr, a, acc) }
            }
        }
    };
}

// Pair sums of at most 2 · 15 · 128 (`Q4_K`): 8 of them fit i16; 2 · 31 · 128 (`Q5_K`): 4.
k4_block8!(BlockQ4K, 8);
k4_block8!(BlockQ5K, 4);

impl KBlock8 for BlockQ6K {
    // At most 2 · 63 · 128: 2 of them (and a scale covers 16 values, 4 groups).
    const SPAN: usize = 2;
    #[inline(always)]
    unsafe fn scale_bytes(&self) -> __m128i {
        // SAFETY: the unaligned 16-byte load reads exactly `scales` (`[i8; 16]`); AVX2 per the module
        // contract.
        unsafe { _mm_loadu_si128(self.scales.as_ptr().cast()) }
    }
    #[inline(always)]
    fn d_bits(&self) -> (u16, u16) {
        (self.d.to_bits(), 0)
    }
    /// The 16 signed group scales; `mo[q]` pairs scales `2q` and `2q + 1`.
    #[inline(always)]
    unsafe fn scales(cols: [__m128i; 8], p: &mut Pack) {
        // SAFETY: `store` gets the 16 rows of `p.sc` and the 8 of `p.mo`, aligned as it needs; `column`
        // gets `g < 16`; the CPU has AVX2 (module contract).
        unsafe {
            // A loop, not `from_fn`: a closure here could be left out of line without the caller's
            // target features, every intrinsic in it a call (as it was once the AVX-512 16-row tiles
            // called this).
            let mut sc = [_mm256_setzero_si256(); 16];
            for (g, v) in sc.iter_mut().enumerate() {
                *v = twice(_mm256_cvtepi8_epi32(column(&cols, g)));
            }
            for (dst, v) in p.sc.iter_mut().zip(sc) {
                store(dst, v);
            }
            for q in 0..8 {
                store(&mut p.mo[q], _mm256_blend_epi16::<0xAA>(sc[2 * q], sc[2 * q + 1]));
            }
        }
    }
    #[inline(always)]
    fn scale_index(k: usize, g: usize) -> usize {
        2 * k + g / 4
    }
    /// `acc + (d_x · d) · (sumi − 32 · Σ sc_g · bsum_g)`.
    #[inline(always)]
    unsafe fn finish8(p: &Pack, sumi: __m256i, corr: __m256i, a: &BlockQ8K, acc: __m256) -> __m256 {
        // SAFETY: the aligned load reads `p.d` (8 f32), at a multiple of 32 bytes in the `align(32)`
        // `Pack`; the CPU has AVX2 (module contract).
        unsafe {
            let d = _mm256_mul_ps(_mm256_set1_ps(a.d), _mm256_load_ps(p.d.as_ptr()));
            let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(corr));
            _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi)))
        }
    }
}

/// `t[g]` lane `i` = `v[i]` lane `g` (8 × 8 32-bit lanes).
#[inline(always)]
pub(in crate::cpu::dot) unsafe fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    let a: [__m256i; 8] = each!(8, |j| {
        let (x, y) = (v[j & !1], v[j | 1]);
        if j.is_multiple_of(2) {
            _mm256_unpacklo_epi32(x, y)
        } else {
            _mm256_unpackhi_epi32(x, y)
        }
    });
    // b[4h + m]: dwords m and m + 4 of rows 4h..4h + 4.
    let b: [__m256i; 8] = each!(8, |j| {
        let (h, m) = (j / 4, j % 4);
        let (x, y) = (a[4 * h + m / 2], a[4 * h + 2 + m / 2]);
        if m.is_multiple_of(2) {
            _mm256_unpacklo_epi64(x, y)
        } else {
            _mm256_unpackhi_epi64(x, y)
        }
    });
    each!(8, |g| {
        let m = g % 4;
        if g < 4 {
            _mm256_permute2x128_si256(b[m], b[4 + m], 0x20)
        } else {
            _mm256_permute2x128_si256(b[m], b[4 + m], 0x31)
        }
    })
}

/// Block `s` of the 8 rows, repacked.
#[inline(always)]
pub(in crate::cpu::dot) unsafe fn pack<B: KBlock8>(rows: [&[B]; 8], s: usize, p: &mut Pack) {
    // SAFETY: `s` is below every row's length (`gemm8` passes `s < n` and rows of `n` blocks), so
    // `get_unchecked(s)` is in bounds; `pair` gets `j < 4`; the 16-byte loads read the `[u16; 8]`
    // arrays `d`/`dmin`, and the aligned stores write `p.d`/`p.dmin`, 32-byte aligned fields of the
    // `align(32)` `Pack`; the CPU has AVX2/F16C (module contract).
    unsafe {
        let mut chunks = [[_mm256_setzero_si256(); 8]; 8];
        let mut scale_rows = [_mm_setzero_si128(); 8];
        let (mut d, mut dmin) = ([0u16; 8], [0u16; 8]);
        for (i, row) in rows.iter().enumerate() {
            let b = row.get_unchecked(s);
            for j in 0..4 {
                [chunks[2 * j][i], chunks[2 * j + 1][i]] = b.pair(j);
            }
            scale_rows[i] = b.scale_bytes();
            (d[i], dmin[i]) = b.d_bits();
        }
        for (k, c) in chunks.into_iter().enumerate() {
            p.w[8 * k..8 * k + 8].copy_from_slice(&transpose8(c));
        }
        B::scales(columns(scale_rows), p);
        _mm256_store_ps(p.d.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast())));
        _mm256_store_ps(p.dmin.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(dmin.as_ptr().cast())));
    }
}

/// 8 rows (packed blocks `packs`) × `C` tokens: `out[c]` holds the 8 rows' results for token
/// `c`.
#[inline(always)]
unsafe fn tile8<B: KBlock8, const C: usize>(packs: &[Pack], x: [&[BlockQ8K]; C]) -> [__m256; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    // SAFETY: every `x[c]` holds at least `packs.len()` blocks (`gemm8` passes activation rows of
    // `apr >= wpr = packs.len()` blocks), so `get_unchecked(s)` is in bounds; the 4-byte unaligned
    // reads are `qs[32k + 4g..32k + 4g + 4]` (`k, g < 8`: inside its 256 bytes) and bsums pairs
    // `q < 8` (inside its 16 × i16); the aligned loads read rows of `p.sc` (`scale_index` is below 16)
    // and `p.mo`, 32-byte aligned in the `align(32)` `Pack`; the CPU has AVX2/FMA (module contract).
    unsafe {
        for (s, p) in packs.iter().enumerate() {
            let a: [&BlockQ8K; C] = std::array::from_fn(|c| x[c].get_unchecked(s));
            let mut sumi = [_mm256_setzero_si256(); C];
            for k in 0..8 {
                let mut t16 = [_mm256_setzero_si256(); C];
                for g in 0..8 {
                    let wv = p.w[8 * k + g];
                    for c in 0..C {
                        let q = a[c].qs.as_ptr().add(32 * k + 4 * g);
                        let xb = _mm256_set1_epi32(q.cast::<i32>().read_unaligned());
                        let m = _mm256_maddubs_epi16(wv, xb);
                        t16[c] = if g % B::SPAN == 0 { m } else { _mm256_add_epi16(t16[c], m) };
                    }
                    if (g + 1) % B::SPAN == 0 {
                        let sc = _mm256_load_si256(p.sc[B::scale_index(k, g)].as_ptr().cast());
                        for c in 0..C {
                            sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(t16[c], sc));
                        }
                    }
                }
            }
            for c in 0..C {
                let bs = a[c].bsums.as_ptr().cast::<i32>();
                let mut corr = _mm256_setzero_si256();
                for q in 0..8 {
                    let mo = _mm256_load_si256(p.mo[q].as_ptr().cast());
                    let b = _mm256_set1_epi32(bs.add(q).read_unaligned());
                    corr = _mm256_add_epi32(corr, _mm256_madd_epi16(mo, b));
                }
                acc[c] = B::finish8(p, sumi[c], corr, a[c], acc[c]);
            }
        }
    }
    acc
}

thread_local! {
    /// The packed blocks of `gemm8`'s current 8-row group (per thread).
    static PACKS: std::cell::RefCell<Vec<Pack>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Jobs with fewer tokens than this (decode steps of a few sequences) go to `qk::gemv`, which
/// unpacks each block once for all of them: up to 4 tokens it costs less than the repacking
/// (`cargo bench -p cachet-kernels --bench kernels -- --only batch`).
const MIN_TOKENS: usize = 5;

/// The GEMM of a K format: jobs of up to 4 tokens through `qk::gemv` (4 rows against all the
/// tokens at once), 8-row groups through [`tile8`], the rows left over through the register
/// tiles. All give the same bits.
#[inline(always)]
pub(super) unsafe fn gemm8<B: KBlock8>(job: &GemmJob<'_, B, BlockQ8K>) {
    let (toks, n) = (job.toks.len(), job.wpr);
    if toks < MIN_TOKENS {
        // SAFETY: the caller's `GemmFn` contract is all `qk::gemv` requires.
        return unsafe { super::qk::gemv(job) };
    }
    if job.rows.len() < 8 || n == 0 {
        // SAFETY: the caller's `GemmFn` contract is all `gemm` requires.
        return unsafe { gemm::<super::qk::QK<B>>(job) };
    }
    // Out of the thread-local while in use (a job never nests another).
    let mut packs = PACKS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    packs.resize(n, EMPTY);
    // SAFETY: by the `GemmFn` contract `job.w` holds the job's rows of `n = wpr` blocks, `job.x` its
    // tokens with `apr >= n` blocks, and `job.out` may be written at `t * ldo + r` for them; `packs`
    // has `n` entries (resized above), so `pack` gets `s < n`; the 8-float stores cover rows
    // `r..r + 8 <= job.rows.end` of token `t + j` inside `job.toks` (`token_tiles!`); the CPU has
    // AVX2/FMA/F16C (module contract).
    unsafe {
        let xrow = |t: usize| job.x.get_unchecked(t * job.apr..(t + 1) * job.apr);
        let mut r = job.rows.start;
        while r + 8 <= job.rows.end {
            let w: [&[B]; 8] = std::array::from_fn(|i| job.w.get_unchecked((r + i) * n..(r + i + 1) * n));
            for (s, p) in packs.iter_mut().enumerate() {
                pack(w, s, p);
            }
            token_tiles!(job.toks.clone(), |t, C| {
                for (j, v) in tile8::<B, C>(&packs, std::array::from_fn(|j| xrow(t + j))).iter().enumerate() {
                    _mm256_storeu_ps(job.out.add((t + j) * job.ldo + r), *v);
                }
            });
            r += 8;
        }
        if r < job.rows.end {
            let rest = GemmJob { rows: r..job.rows.end, toks: job.toks.clone(), ..*job };
            gemm::<super::qk::QK<B>>(&rest);
        }
    }
    PACKS.with(|cell| *cell.borrow_mut() = packs);
}
