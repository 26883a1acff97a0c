//! The 32-value formats (`Q4_0`, `Q5_0`, `Q8_0`) against `BlockQ8A` activations on AVX2, with
//! the scalar path's arithmetic: each block's integer sum exact, then `acc + (d_w · d_x) · sum`
//! in f32, block after block, without fused multiply-adds. So every path here — the dot product,
//! one token's rows, several tokens' 8-row groups — gives each element bit for bit what the
//! scalar dot product gives, whatever the batch (batch invariance, and the same bits as the
//! scalar level).
//!
//! - One token (decode, [`gemv32`]): 8 rows at a time. Each row's 32 products as `maddubs` pair
//!   sums, added pairwise across rows (`hadd`) until lane `i` holds row `i`'s block sum; then the
//!   float steps for the 8 rows at once.
//! - Several tokens ([`packed32`]): as the K formats' `qk8`, each 8-row group's blocks are
//!   repacked once for all the job's tokens (register `g`, 32-bit lane `i`: row `i`'s values
//!   `4g .. 4g + 4`); a token's 4 activations at that position are broadcast to every lane, so one
//!   `maddubs` makes 32 products for 8 rows, up to `SPAN` of them add up in i16, and lane `i` ends
//!   as row `i`'s block sum with no horizontal step. Per 256 products and token: 8 `maddubs`, a
//!   few adds and one set of float steps, where a row at a time took 8 of each (the `Q5_0` GEMM
//!   of the default model's prompt passes 2× faster, `cargo bench -p cachet-kernels --bench
//!   kernels -- --only gemm`).

use super::qk8::transpose8;
use super::*;

/// A 32-value block as these kernels use it.
pub(in crate::cpu::dot) trait Block32: Block {
    /// Subtracted from every weight's stored value (corrected with the activations' block sums).
    const OFFSET: i32;
    /// `maddubs` results (pair sums, at most 2 · max|w| · 128) that add up in i16 before they
    /// widen to i32: `SPAN` of them stay below 2^15. Divides 8.
    const SPAN: usize;
    /// Signed stored values (`Q8_0`): `maddubs` gets `|w|` and the activations with `w`'s sign.
    const SIGNED: bool;
    fn d(&self) -> f16;
    /// The block's 32 stored values as bytes, in the activations' order.
    unsafe fn values(&self) -> __m256i;
}

impl Block32 for BlockQ4_0 {
    const OFFSET: i32 = 8;
    // Pair sums of at most 2 · 15 · 128 = 3,840: 8 of them fit.
    const SPAN: usize = 8;
    const SIGNED: bool = false;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: `nibbles32` reads 16 bytes at the pointer, exactly `qs`; the CPU has AVX2 (module contract).
        unsafe { nibbles32(self.qs.as_ptr()) }
    }
}

impl Block32 for BlockQ5_0 {
    const OFFSET: i32 = 16;
    // Pair sums of at most 2 · 31 · 128 = 7,936: 4 of them fit.
    const SPAN: usize = 4;
    const SIGNED: bool = false;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: `nibbles_at` reads 16 bytes at the pointer, exactly `qs`, and `bits_at` 4, exactly `qh`;
        // the CPU has AVX2 (module contract).
        unsafe { _mm256_or_si256(nibbles_at(self.qs.as_ptr()), bits_at(self.qh.as_ptr())) }
    }
}

/// `nibbles32` with a broadcast load in place of the lane insert: the 16 bytes in both halves,
/// the upper half shifted by a nibble (with [`bits_at`], 1.06× the default model's prompt pass
/// on a 2-core Zen 3 against `nibbles32` and `bits32`).
#[inline(always)]
unsafe fn nibbles_at(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 16 readable bytes at `p` (a block's `qs`); unaligned is fine; the CPU has
    // AVX2 (module contract).
    unsafe {
        let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F))
    }
}

/// `bits32(qh, 0x10)` with the 4 bytes broadcast from memory (a load, not a shuffle).
#[inline(always)]
unsafe fn bits_at(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 4 readable bytes at `p` (a block's `qh`); the CPU has AVX2 (module contract).
    unsafe { spread_bits(_mm256_castps_si256(_mm256_broadcast_ss(&*p.cast::<f32>())), 0x10) }
}

impl Block32 for BlockQ8_0 {
    const OFFSET: i32 = 0;
    // Pair sums up to 2 · 128 · 127 = 32,512: one at a time.
    const SPAN: usize = 1;
    const SIGNED: bool = true;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn values(&self) -> __m256i {
        // SAFETY: `load256` reads 32 bytes, exactly `qs` (`[i8; 32]`); the CPU has AVX2 (module contract).
        unsafe { load256(self.qs.as_ptr().cast()) }
    }
}

/// The 16 pair sums of `w · x` (each exact in i16: see [`Block32::SPAN`]).
#[inline(always)]
unsafe fn pairs<B: Block32>(w: __m256i, x: __m256i) -> __m256i {
    if B::SIGNED {
        _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    } else {
        _mm256_maddubs_epi16(w, x)
    }
}

/// The scalar path's float step for 8 rows: `acc + (d · d_x) · isum` per lane.
#[inline(always)]
unsafe fn finish8(acc: __m256, d: __m256, dx: f32, isum: __m256i) -> __m256 {
    _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(isum)))
}

/// The dot product of a row and a token: the scalar path's steps with each block's integer sum
/// in a register.
#[inline(always)]
pub(super) unsafe fn dot32<B: Block32>(w: &[B], x: &[BlockQ8A]) -> f32 {
    let mut acc = 0f32;
    // SAFETY: `load256` reads an activation block's 32-byte `qs`; `values` reads its weight block; the
    // CPU has AVX2/F16C (the caller's `#[target_feature]` contract).
    unsafe {
        for (b, a) in w.iter().zip(x) {
            let p = _mm256_madd_epi16(pairs::<B>(b.values(), load256(a.qs.as_ptr().cast())), _mm256_set1_epi16(1));
            let isum = hsum_epi32(p) - B::OFFSET * a.sum;
            acc += (f16_to_f32(b.d()) * a.d) * isum as f32;
        }
    }
    acc
}

/// 8 rows' pair sums of one block → lane `i` = row `i`'s block sum (i32): a transpose that adds
/// as it goes (unpacks and adds; a tree of `hadd`s measured the same).
#[inline(always)]
unsafe fn reduce8<B: Block32>(m: [__m256i; 8]) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    // `lo`: rows 0..4 in 32-bit lanes 0..4 (low 128 bits: their bytes 0..16, high: 16..32); `hi`: rows 4..8.
    let (lo, hi) = if B::SPAN >= 4 {
        // In i16 each lane ends as 4 pair sums (below 2^15 when 4 fit), then one `madd` widens.
        let t: [__m256i; 4] = each!(4, |k| pair_rows(m[2 * k], m[2 * k + 1], true));
        (_mm256_madd_epi16(pair_halves(t[0], t[1], true), ones), _mm256_madd_epi16(pair_halves(t[2], t[3], true), ones))
    } else {
        let q: [__m256i; 8] = each!(8, |k| _mm256_madd_epi16(m[k], ones));
        let t: [__m256i; 4] = each!(4, |k| pair_rows(q[2 * k], q[2 * k + 1], false));
        (pair_halves(t[0], t[1], false), pair_halves(t[2], t[3], false))
    };
    _mm256_add_epi32(_mm256_permute2x128_si256::<0x20>(lo, hi), _mm256_permute2x128_si256::<0x31>(lo, hi))
}

/// `x + y` in 16- or 32-bit lanes.
#[inline(always)]
unsafe fn add_lanes(x: __m256i, y: __m256i, i16: bool) -> __m256i {
    if i16 {
        _mm256_add_epi16(x, y)
    } else {
        _mm256_add_epi32(x, y)
    }
}

/// [`reduce8`]'s first step: rows `a` and `b` paired, what lands in the same 32-bit lane added.
#[inline(always)]
unsafe fn pair_rows(a: __m256i, b: __m256i, i16: bool) -> __m256i {
    add_lanes(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b), i16)
}

/// [`reduce8`]'s second step: pairs of rows paired, what lands in the same 64-bit lane added.
#[inline(always)]
unsafe fn pair_halves(a: __m256i, b: __m256i, i16: bool) -> __m256i {
    add_lanes(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b), i16)
}

/// The 8 rows' scales of block `s` as f32.
#[inline(always)]
pub(in crate::cpu::dot) unsafe fn scales8<B: Block32>(rows: &[&[B]; 8], s: usize) -> __m256 {
    // SAFETY: the callers pass `s` below every row's length; the conversion needs F16C (module contract).
    unsafe {
        // Inserted one by one: 8 two-byte stores read back as one vector would stall the load.
        let d = |i: usize| rows[i].get_unchecked(s).d().to_bits() as i16;
        _mm256_cvtph_ps(_mm_setr_epi16(d(0), d(1), d(2), d(3), d(4), d(5), d(6), d(7)))
    }
}

/// Rows `r..r + k` (`k <= 8`) of the job, padded to 8 with copies of the last (whose lanes are
/// computed and dropped).
#[inline(always)]
unsafe fn group<'a, B>(job: &GemmJob<'a, B, BlockQ8A>, r: usize, k: usize) -> [&'a [B]; 8] {
    let n = job.wpr;
    // SAFETY: `r + min(i, k - 1) < job.rows.end` (the callers pass `k >= 1` rows left), and the
    // `GemmFn` contract makes `job.w` hold every row of the job, `n` blocks long.
    std::array::from_fn(|i| unsafe { job.w.get_unchecked((r + i.min(k - 1)) * n..(r + i.min(k - 1) + 1) * n) })
}

/// Stores the first `k` lanes of `v` at `out[0..k]`.
#[inline(always)]
unsafe fn store_lanes(out: *mut f32, v: __m256, k: usize) {
    // SAFETY: the callers pass `out` valid for `k <= 8` floats (the job's rows `r..r + k` of one token).
    unsafe {
        if k == 8 {
            _mm256_storeu_ps(out, v);
        } else {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), out, k);
        }
    }
}

/// Prefetches block `s`'s share of the next 8-row group, at `next`. The 8 rows are read side by
/// side, 8 streams that the hardware prefetchers follow poorly (on a 2-core Zen 3 the default
/// model's decode ran at 0.7× the speed of a row at a time without this, 1.16× with it); the next
/// group's bytes, which follow this group's, are fetched 8 blocks' worth of lines per block.
#[inline(always)]
unsafe fn prefetch<B>(next: *const u8, s: usize) {
    let per_block = (8 * std::mem::size_of::<B>()).div_ceil(64);
    for l in 0..per_block {
        // SAFETY: a prefetch never faults, whatever the address (past the weights' end too: the
        // address is made with wrapping arithmetic and never dereferenced); SSE is part of AVX2.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add((s * per_block + l) * 64).cast()) };
    }
}

/// Decode (a job of one token): 8 rows at a time, each block's 8 row sums reduced across rows
/// ([`reduce8`]), the float steps in the rows' lanes.
#[inline(always)]
unsafe fn gemv32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    let (n, tok) = (job.wpr, job.toks.start);
    // SAFETY: by the `GemmFn` contract the job's token is `apr >= n` blocks of `job.x`, its rows `n`
    // blocks of `job.w` ([`group`]), and `job.out` may be written at `tok * ldo + r` for them (`k` rows
    // from `r`, inside the job); `s < n` for every block read; the CPU has AVX2/FMA/F16C (module contract).
    unsafe {
        let x = job.x.get_unchecked(tok * job.apr..tok * job.apr + n);
        let row_bytes = n * std::mem::size_of::<B>();
        let mut r = job.rows.start;
        while r < job.rows.end {
            let k = (job.rows.end - r).min(8);
            let rows = group(job, r, k);
            let next = job.w.as_ptr().cast::<u8>().wrapping_add((r + 8) * row_bytes);
            let mut acc = _mm256_setzero_ps();
            for (s, a) in x.iter().enumerate() {
                prefetch::<B>(next, s);
                let xq = load256(a.qs.as_ptr().cast());
                let m: [__m256i; 8] = each!(8, |i| pairs::<B>(rows[i].get_unchecked(s).values(), xq));
                let isum = _mm256_sub_epi32(reduce8::<B>(m), _mm256_set1_epi32(B::OFFSET * a.sum));
                acc = finish8(acc, scales8(&rows, s), a.d, isum);
            }
            store_lanes(job.out.add(tok * job.ldo + r), acc, k);
            r += k;
        }
    }
}

/// One block of an 8-row group, repacked for [`tile8`].
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct Pack32 {
    /// Register `g`, 32-bit lane `i`: row `i`'s values `4g .. 4g + 4` (`|w|` for signed formats).
    w: [__m256i; 8],
    /// Signed formats: the same with the signs (what the activations take theirs from).
    s: [__m256i; 8],
    /// Lane `i`: row `i`'s scale.
    d: [f32; 8],
}

// SAFETY: vectors and floats, for which all-zero bits are valid.
const EMPTY: Pack32 = unsafe { std::mem::zeroed() };

/// Block `s` of the 8 rows, repacked.
#[inline(always)]
unsafe fn pack<B: Block32>(rows: &[&[B]; 8], s: usize, p: &mut Pack32) {
    // SAFETY: the callers pass `s` below every row's length; the aligned store writes `p.d`, 32-byte
    // aligned in the `align(32)` `Pack32`; the CPU has AVX2/F16C (module contract).
    unsafe {
        let t = transpose8(each!(8, |i| rows[i].get_unchecked(s).values()));
        for (g, v) in t.into_iter().enumerate() {
            if B::SIGNED {
                p.s[g] = v;
                p.w[g] = _mm256_sign_epi8(v, v);
            } else {
                p.w[g] = v;
            }
        }
        _mm256_store_ps(p.d.as_mut_ptr(), scales8(rows, s));
    }
}

/// 8 rows (packed blocks `packs`) × `C` tokens: `out[c]` holds the 8 rows' results for token `c`.
#[inline(always)]
unsafe fn tile8<B: Block32, const C: usize>(packs: &[Pack32], x: [&[BlockQ8A]; C]) -> [__m256; C] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); C];
    // SAFETY: every `x[c]` holds at least `packs.len()` blocks (`packed32` passes activation rows of
    // `apr >= wpr = packs.len()` blocks), so `get_unchecked(s)` is in bounds; the 4-byte unaligned reads
    // are `qs[4g..4g + 4]` (`g < 8`: inside its 32 bytes); the aligned load reads `p.d`, 32-byte aligned
    // in the `align(32)` `Pack32`; the CPU has AVX2 (module contract).
    unsafe {
        for (s, p) in packs.iter().enumerate() {
            let a: [&BlockQ8A; C] = std::array::from_fn(|c| x[c].get_unchecked(s));
            let mut sumi = [_mm256_setzero_si256(); C];
            let mut t16 = [_mm256_setzero_si256(); C];
            for g in 0..8 {
                for c in 0..C {
                    let xb = _mm256_set1_epi32(a[c].qs.as_ptr().add(4 * g).cast::<i32>().read_unaligned());
                    let m = if B::SIGNED {
                        _mm256_maddubs_epi16(p.w[g], _mm256_sign_epi8(xb, p.s[g]))
                    } else {
                        _mm256_maddubs_epi16(p.w[g], xb)
                    };
                    t16[c] = if g % B::SPAN == 0 { m } else { _mm256_add_epi16(t16[c], m) };
                    if (g + 1) % B::SPAN == 0 {
                        let q = _mm256_madd_epi16(t16[c], ones);
                        sumi[c] = if g + 1 == B::SPAN { q } else { _mm256_add_epi32(sumi[c], q) };
                    }
                }
            }
            let d = _mm256_load_ps(p.d.as_ptr());
            for c in 0..C {
                let isum = _mm256_sub_epi32(sumi[c], _mm256_set1_epi32(B::OFFSET * a[c].sum));
                acc[c] = finish8(acc[c], d, a[c].d, isum);
            }
        }
    }
    acc
}

thread_local! {
    /// The packed blocks of `packed32`'s current 8-row group (per thread).
    static PACKS: std::cell::RefCell<Vec<Pack32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Gives this thread's buffer room for `bytes` (see `dot::warm_thread`): verification passes of
/// a few tokens (speculative decoding) between decode steps then do not allocate.
pub(super) fn reserve(bytes: usize) {
    super::super::reserve(&PACKS, bytes);
}

/// The job: [`gemv32`] when it has one token, else [`packed32`].
#[inline(always)]
pub(super) unsafe fn gemm32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    // SAFETY: the caller's `GemmFn` contract is exactly what `gemv32` and `packed32` require.
    unsafe {
        if job.toks.len() == 1 {
            gemv32(job)
        } else {
            packed32(job)
        }
    }
}

/// A job of several tokens: each 8-row group (the last one padded) repacked once, then
/// [`tile8`] over the tokens, 4 at a time.
#[inline(always)]
unsafe fn packed32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    let n = job.wpr;
    // Out of the thread-local while in use (a job never nests another).
    let mut packs = PACKS.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    packs.resize(n, EMPTY);
    // SAFETY: by the `GemmFn` contract `job.w` holds the job's rows of `n = wpr` blocks (`group`),
    // `job.x` its tokens with `apr >= n` blocks, and `job.out` may be written at `t * ldo + r` for them;
    // `packs` has `n` entries, so `pack` gets `s < n`; the stores cover rows `r..r + k <= job.rows.end`
    // of tokens `t + j` inside `job.toks` (`token_tiles!`); the CPU has AVX2/FMA/F16C (module contract).
    unsafe {
        let xrow = |t: usize| job.x.get_unchecked(t * job.apr..(t + 1) * job.apr);
        let row_bytes = n * std::mem::size_of::<B>();
        let mut r = job.rows.start;
        while r < job.rows.end {
            let k = (job.rows.end - r).min(8);
            let rows = group(job, r, k);
            let next = job.w.as_ptr().cast::<u8>().wrapping_add((r + 8) * row_bytes);
            for (s, p) in packs.iter_mut().enumerate() {
                prefetch::<B>(next, s);
                pack(&rows, s, p);
            }
            token_tiles!(job.toks.clone(), |t, C| {
                for (j, v) in tile8::<B, C>(&packs, std::array::from_fn(|j| xrow(t + j))).iter().enumerate() {
                    store_lanes(job.out.add((t + j) * job.ldo + r), *v, k);
                }
            });
            r += k;
        }
    }
    PACKS.with(|cell| *cell.borrow_mut() = packs);
}
