//! Tiles of the K formats (`Q4_K`, `Q5_K`, `Q6_K`) against `BlockQ8K`
//! activations. Per 256-value block: four chunks of 64 unsigned weights,
//! `vpdpbusd` with the activations (sums of 4 products, at most 4 · 63 · 127:
//! they fit i16), two `vpackssdw` to i16 and two `vpdpwssd` with the sub-block
//! scales into i32 lanes — 6 multiplies per block where `vpmaddubsw` +
//! `vpdpwssd` per chunk took 8 — then one float FMA with `d_w · d_x` (and one
//! with the mins for `Q4_K`/`Q5_K`). The weights' scales are unpacked once per
//! block and row and reused for every token of the tile.

use super::super::avx2::qk as x2;
use super::*;

/// One block's weights, ready for the tile.
#[derive(Clone, Copy)]
pub(super) struct Prep {
    /// Chunk `j`: the 64 unsigned values at positions `64j..64j + 64`.
    wv: [__m512i; 4],
    /// The scale of each i16 lane of the packed chunk sums: chunks 0 and 1, then 2 and 3.
    sc: [__m512i; 2],
    /// `-dmin · m_j` in lanes 0..8 (`Q4_K`/`Q5_K`), zero elsewhere.
    min: __m512,
    /// The 16 group scales as i16 (`Q6_K`'s offset correction).
    off: __m256i,
    d: f32,
}

pub(super) trait KBlock: Block {
    /// Values are stored `+32` (`Q6_K`): subtract `32 · Σ sc_g · bsum_g`.
    const OFFSET: bool;
    /// Subtract `dmin · Σ m_j · sum_j` (`Q4_K`, `Q5_K`).
    const MINS: bool;
    unsafe fn prep(&self) -> Prep;
}

/// Where the packed sums come from: i16 lane `k` of `vpackssdw(d_a, d_b)` (128-bit lane
/// `L = k / 8`, position `p = k % 8`) is i32 lane `4L + p` of `d_a` for `p < 4`, else lane
/// `4L + p − 4` of `d_b`; i32 lane `i` of chunk `j`'s sums covers values `64j + 4i .. + 4`.
/// Those values' scale is number `(64j + 4i) / size` (`size`: values per scale); the result
/// indexes the scales for chunks `2h` and `2h + 1`.
const fn pack_index(h: usize, size: usize) -> [i16; 32] {
    let mut idx = [0i16; 32];
    let mut k = 0;
    while k < 32 {
        let (l, p) = (k / 8, k % 8);
        let (j, i) = if p < 4 { (2 * h, 4 * l + p) } else { (2 * h + 1, 4 * l + p - 4) };
        idx[k] = ((64 * j + 4 * i) / size) as i16;
        k += 1;
    }
    idx
}

/// `Q4_K`/`Q5_K`: 8 sub-blocks of 32 values.
const K4_IDX: [[i16; 32]; 2] = [pack_index(0, 32), pack_index(1, 32)];
/// `Q6_K`: 16 groups of 16 values.
const K6_IDX: [[i16; 32]; 2] = [pack_index(0, 16), pack_index(1, 16)];

/// The scales (i16, in the low lanes of `s`) spread over the packed sums' lanes.
#[inline(always)]
unsafe fn spread(s: __m512i, idx: &[[i16; 32]; 2]) -> [__m512i; 2] {
    // SAFETY: each unaligned load reads 64 bytes, exactly one `[i16; 32]` of `idx`; AVX-512F/BW per
    // the module contract.
    unsafe { idx.map(|i| _mm512_permutexvar_epi16(_mm512_loadu_si512(i.as_ptr().cast()), s)) }
}

/// `Q4_K`/`Q5_K`'s 8 sub-block scales (bytes 0..8 of `sm`), spread.
#[inline(always)]
unsafe fn sub_block_scales(sm: __m128i) -> [__m512i; 2] {
    // SAFETY: `spread` reads only the constant `K4_IDX`; the rest only touches registers; AVX-512F/BW
    // per the module contract.
    unsafe { spread(_mm512_castsi128_si512(_mm_cvtepu8_epi16(sm)), &K4_IDX) }
}

/// `-dmin · m_j` for the 8 mins (bytes 8..16 of `sm`), in lanes 0..8.
#[inline(always)]
unsafe fn mins(sm: __m128i, dmin: f32) -> __m512 {
    let mf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(sm, sm)));
    _mm512_insertf32x8(_mm512_setzero_ps(), _mm256_mul_ps(mf, _mm256_set1_ps(-dmin)), 0)
}

/// Chunk `j` of a `Q4_K`/`Q5_K` block's values from its 32 bytes of nibbles: the low nibbles'
/// 32 values then the high nibbles' 32, as the activations run. The bytes go to both 256-bit
/// halves by a broadcast load and the upper half is shifted by a variable shift, so no
/// lane-crossing insert is needed (port 5 on Intel cores, where these tiles are bound on it).
#[inline(always)]
unsafe fn nibble_chunk(qs: *const u8) -> __m512i {
    // SAFETY: the callers pass `qs[32 * j..]` of a 128-byte `qs` with `j < 4`, at least the 32 bytes
    // read here; the load is unaligned; AVX2 is part of the AVX-512 level (module contract).
    let q = _mm512_broadcast_i64x4(unsafe { load256(qs) });
    _mm512_and_si512(_mm512_srlv_epi64(q, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), _mm512_set1_epi8(0x0F))
}

/// A block's two f16 scales (`d`, `dmin`) as f32, by one conversion.
#[inline(always)]
unsafe fn scales_f32(d: f16, dmin: f16) -> (f32, f32) {
    let both = _mm_cvtph_ps(_mm_cvtsi32_si128((d.to_bits() as u32 | (dmin.to_bits() as u32) << 16) as i32));
    (_mm_cvtss_f32(both), _mm_cvtss_f32(_mm_movehdup_ps(both)))
}

impl KBlock for BlockQ4K {
    const OFFSET: bool = false;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn prep(&self) -> Prep {
        let sm = k4_scales_mins(&self.scales);
        let (d, dmin) = scales_f32(self.d, self.dmin);
        let mut wv = [_mm512_setzero_si512(); 4];
        for (j, w) in wv.iter_mut().enumerate() {
            *w = nibble_chunk(self.qs[32 * j..].as_ptr());
        }
        Prep { wv, sc: sub_block_scales(sm), min: mins(sm, dmin), off: _mm256_setzero_si256(), d }
    }
}

impl KBlock for BlockQ5K {
    const OFFSET: bool = false;
    const MINS: bool = true;
    #[inline(always)]
    unsafe fn prep(&self) -> Prep {
        let sm = k4_scales_mins(&self.scales);
        let (d, dmin) = scales_f32(self.d, self.dmin);
        // The 32 qh bytes in both halves; bit 2j of byte i is the fifth bit of chunk j's value
        // i (low half), bit 2j + 1 that of its value 32 + i (high half): 16 where it is set.
        let qh = _mm512_broadcast_i64x4(load256(self.qh.as_ptr()));
        let mut wv = [_mm512_setzero_si512(); 4];
        for (j, w) in wv.iter_mut().enumerate() {
            // Bit 2j in the low half, 2j + 1 in the high half.
            let shift = _mm512_add_epi64(_mm512_set1_epi64(2 * j as i64), _mm512_set_epi64(1, 1, 1, 1, 0, 0, 0, 0));
            let high = _mm512_slli_epi64::<4>(_mm512_and_si512(_mm512_srlv_epi64(qh, shift), _mm512_set1_epi8(1)));
            *w = _mm512_or_si512(nibble_chunk(self.qs[32 * j..].as_ptr()), high);
        }
        Prep { wv, sc: sub_block_scales(sm), min: mins(sm, dmin), off: _mm256_setzero_si256(), d }
    }
}

impl KBlock for BlockQ6K {
    const OFFSET: bool = true;
    const MINS: bool = false;
    #[inline(always)]
    unsafe fn prep(&self) -> Prep {
        let low = _mm512_set1_epi8(0x0F);
        let top = _mm512_set1_epi8(0x30);
        let mut wv = [_mm512_setzero_si512(); 4];
        for half in 0..2 {
            let ql = _mm512_loadu_si512(self.ql[64 * half..].as_ptr().cast());
            // The half's 32 qh bytes in both 256-bit halves (a broadcast load, no insert): value
            // i of the half takes bits 0-1 of byte i, 32 + i bits 2-3, 64 + i bits 4-5, 96 + i
            // bits 6-7, each moved to bits 4-5 by a per-half variable shift.
            let qh = _mm512_broadcast_i64x4(load256(self.qh[32 * half..].as_ptr()));
            let ha = _mm512_and_si512(_mm512_sllv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), top);
            let hz = _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), top);
            wv[2 * half] = _mm512_or_si512(_mm512_and_si512(ql, low), ha);
            wv[2 * half + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), low), hz);
        }
        let off = _mm256_cvtepi8_epi16(_mm_loadu_si128(self.scales.as_ptr().cast()));
        let sc = spread(_mm512_castsi256_si512(off), &K6_IDX);
        Prep { wv, sc, min: _mm512_setzero_ps(), off, d: f16_to_f32(self.d) }
    }
}

/// `vpdpwssd`, written out: given `_mm512_dpwssd_epi32`, LLVM's generic x86-64 tuning splits it
/// into `vpmaddwd` + `vpaddd` (one more uop per 64 values; the kernels' hottest instruction).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: a register-only instruction of AVX-512 VNNI, which the callers' levels require.
    unsafe {
        std::arch::asm!("vpdpwssd {acc}, {a}, {b}", acc = inout(zmm_reg) acc, a = in(zmm_reg) a, b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags));
    }
    acc
}

/// An `R`-row × `C`-token tile. Each element: per block, exact i32 lanes
/// from `vpdpwssd`, then `acc = fma(float(lanes), d_w·d_x, acc)` (and the
/// mins FMA); one horizontal sum at the end.
#[inline(always)]
pub(super) unsafe fn tilek<B: KBlock, const R: usize, const C: usize>(
    w: [&[B]; R],
    x: [&[BlockQ8K]; C],
) -> [[f32; C]; R] {
    tilek_core::<B, R, C, false>(w, &[], x)
}

/// The tile, with the blocks' `Prep`s made here or (`PACKED`) read from
/// `preps` (row `r`, block `s` at `r * n + s`): the same operations after.
#[inline(always)]
unsafe fn tilek_core<B: KBlock, const R: usize, const C: usize, const PACKED: bool>(
    w: [&[B]; R],
    preps: &[Prep],
    x: [&[BlockQ8K]; C],
) -> [[f32; C]; R] {
    let n = w[0].len();
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // Row by row, and each row's blocks in order: the row's C accumulators stay in registers
    // for the whole row (with the blocks outermost they lived on the stack), and the tokens'
    // blocks are loaded as operands (they stay in L1 for the R rows).
    for (r, row) in acc.iter_mut().enumerate() {
        for s in 0..n {
            let p = if PACKED {
                *preps.get_unchecked(r * n + s)
            } else {
                if R > 1 {
                    _mm_prefetch::<_MM_HINT_T0>(w[r].as_ptr().wrapping_add(s + 2).cast());
                }
                w[r].get_unchecked(s).prep()
            };
            for (c, acc) in row.iter_mut().enumerate() {
                let a = x[c].get_unchecked(s);
                let mut d = [_mm512_setzero_si512(); 4];
                for (j, d) in d.iter_mut().enumerate() {
                    let xv = _mm512_loadu_si512(a.qs.as_ptr().add(64 * j).cast());
                    *d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), p.wv[j], xv);
                }
                let lanes = _mm512_madd_epi16(_mm512_packs_epi32(d[0], d[1]), p.sc[0]);
                let mut lanes = dpwssd(lanes, _mm512_packs_epi32(d[2], d[3]), p.sc[1]);
                if B::OFFSET {
                    let o = _mm256_madd_epi16(p.off, _mm256_loadu_si256(a.bsums.as_ptr().cast()));
                    let o = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_slli_epi32::<5>(o), 0);
                    lanes = _mm512_sub_epi32(lanes, o);
                }
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes), _mm512_set1_ps(p.d * a.d), *acc);
                if B::MINS {
                    let ms = _mm512_insertf32x8(_mm512_setzero_ps(), _mm256_loadu_ps(a.msum.as_ptr()), 0);
                    *acc = _mm512_fmadd_ps(p.min, ms, *acc);
                }
            }
        }
    }
    tile_sums(&acc)
}

/// The K formats as a tile kernel.
pub(super) struct QK<B>(std::marker::PhantomData<B>);

impl<B: KBlock> TileKernel for QK<B> {
    type W = B;
    type A = BlockQ8K;
    #[inline(always)]
    unsafe fn tile<const R: usize, const C: usize>(w: [&[B]; R], x: [&[BlockQ8K]; C]) -> [[f32; C]; R] {
        // SAFETY: `gemm` passes rows of at least `w[0].len()` blocks each (`wpr` weight blocks,
        // `apr >= wpr` activation blocks), which is what `tilek` requires; same CPU features.
        unsafe { tilek(w, x) }
    }
}

thread_local! {
    /// The prepared blocks of `gemmk`'s current row group (per thread).
    static PREPS: std::cell::RefCell<Vec<Prep>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The GEMM over K-format blocks for jobs of several tokens: each 4-row
/// group's blocks are prepared (unpacked weights and scales) once for all the
/// job's tokens instead of once per 4 tokens. Every element goes through the
/// operations of `tilek`, so results are bit for bit the single dot product's.
#[inline(always)]
pub(super) unsafe fn gemmk<B: KBlock>(job: &GemmJob<'_, B, BlockQ8K>) {
    let (toks, n) = (job.toks.len(), job.wpr);
    if toks < 4 || job.rows.len() < 4 || n == 0 {
        // SAFETY: the caller's `GemmFn` contract is all `gemm` requires.
        return unsafe { gemm::<QK<B>>(job) };
    }
    // Out of the thread-local while in use (see `q32::gemm32`).
    let mut preps = PREPS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    // SAFETY: by the `GemmFn` contract `job.w` holds the job's rows of `n = wpr` blocks, `job.x` its
    // tokens with `apr >= n` blocks, and `job.out` may be written at `t * ldo + r` for them:
    // `tilek_core` reads `preps[i * n + s]` (the 4 rows' `n` blocks each, pushed above) and `n` blocks
    // of each token row, and the stores cover rows `r..r + 4 <= job.rows.end` of tokens `t + j` inside
    // `job.toks`; the CPU has the AVX-512 level's features (module contract).
    unsafe {
        let xrow = |t: usize| job.x.get_unchecked(t * job.apr..(t + 1) * job.apr);
        let mut r = job.rows.start;
        while r + 4 <= job.rows.end {
            let w: [&[B]; 4] = std::array::from_fn(|i| job.w.get_unchecked((r + i) * n..(r + i + 1) * n));
            preps.clear();
            for row in &w {
                for b in row.iter() {
                    preps.push(b.prep());
                }
            }
            let mut t = job.toks.start;
            while t < job.toks.end {
                let tt = (job.toks.end - t).min(4);
                macro_rules! tile {
                    ($c:literal) => {{
                        let out = tilek_core::<B, 4, $c, true>(w, &preps, std::array::from_fn(|j| xrow(t + j)));
                        for (i, row) in out.iter().enumerate() {
                            for (j, v) in row.iter().enumerate() {
                                *job.out.add((t + j) * job.ldo + r + i) = *v;
                            }
                        }
                    }};
                }
                match tt {
                    4 => tile!(4),
                    3 => tile!(3),
                    2 => tile!(2),
                    _ => tile!(1),
                }
                t += tt;
            }
            r += 4;
        }
        if r < job.rows.end {
            let rest = GemmJob { rows: r..job.rows.end, toks: job.toks.clone(), ..*job };
            gemm::<QK<B>>(&rest);
        }
    }
    PREPS.with(|cell| *cell.borrow_mut() = preps);
}

/// The few-token kernel's block lanes ([`x2::Lanes`]) beside the exact 16-row tiles
/// ([`super::qk16`]): each row's block unpacked as the tiles above unpack it ([`KBlock::prep`]:
/// 4 `vpdpbusd` of 64 values, two `vpackssdw`, one `vpmaddwd` and one `vpdpwssd` with the
/// sub-block scales give exact i32 lanes, where AVX2 needs 8 `vpmaddubsw` + 8 `vpmaddwd`). The
/// rest is AVX2's [`x2::gemv_by`]: 4 rows at a time, their integer sums and corrections reduced
/// together, the float steps in the scalar path's order. Integer sums are exact in any order, so
/// every element is the scalar dot product's (`kernels/tests/simd_paths.rs`).
struct WideLanes;

impl<B: KBlock + x2::KBlock> x2::Lanes<B> for WideLanes {
    #[inline(always)]
    unsafe fn lanes<const C: usize>(b: &B, _: &x2::Chunks, a: &[&BlockQ8K; C]) -> [__m256i; C] {
        let mut sums = [_mm256_setzero_si256(); C];
        // SAFETY: `prep` reads only the block it is given; the 64-byte activation loads read
        // `qs[64j..64j + 64]`, `j < 4`, inside its 256 bytes; the callers run with the AVX-512 level's
        // features (the trait's contract).
        unsafe {
            let pr = b.prep();
            for c in 0..C {
                let mut dd = [_mm512_setzero_si512(); 4];
                for (j, dd) in dd.iter_mut().enumerate() {
                    let xv = _mm512_loadu_si512(a[c].qs.as_ptr().add(64 * j).cast());
                    *dd = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pr.wv[j], xv);
                }
                let lanes = _mm512_madd_epi16(_mm512_packs_epi32(dd[0], dd[1]), pr.sc[0]);
                let lanes = dpwssd(lanes, _mm512_packs_epi32(dd[2], dd[3]), pr.sc[1]);
                sums[c] = _mm256_add_epi32(_mm512_castsi512_si256(lanes), _mm512_extracti64x4_epi64::<1>(lanes));
            }
        }
        sums
    }
}

/// A job of a few tokens with the scalar path's bits ([`WideLanes`]).
///
/// # Safety
/// The `GemmFn` contract; the CPU has the AVX-512 level's features.
#[inline(always)]
pub(super) unsafe fn gemv_exact<B: KBlock + x2::KBlock>(job: &GemmJob<'_, B, BlockQ8K>) {
    // SAFETY: the caller's contract is `gemv_by`'s, with `WideLanes`' features (the AVX-512 level's).
    unsafe { x2::gemv_by::<B, WideLanes>(job) }
}
