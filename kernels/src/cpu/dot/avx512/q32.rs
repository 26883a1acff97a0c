//! Tiles of the 32-value formats (`Q4_0`, `Q5_0`, `Q8_0`) against `BlockQ8A`
//! activations: `vpdpbusd` on the weights' unsigned form, corrected with the
//! activations' block sums, two blocks per 512-bit step.

use super::*;

/// The unsigned 32 weights of one block, and the offset to correct by.
pub(super) trait Block32: Block {
    const OFFSET: i32;
    fn d(&self) -> f16;
    unsafe fn weights(&self) -> __m256i;
    /// Two blocks' weights, `a`'s in the low half: the bytes of
    /// `join(a.weights(), b.weights())`, in fewer instructions where the format allows.
    #[inline(always)]
    unsafe fn weights2(a: &Self, b: &Self) -> __m512i {
        // SAFETY: `weights` reads only the fields of the block it is called on; the CPU has the AVX-512
        // level's features (module contract).
        unsafe { join(a.weights(), b.weights()) }
    }
}

/// Two blocks' scales, `a`'s in lanes 0..8 and `b`'s in 8..16 (exact, as `pair`).
#[inline(always)]
unsafe fn scales2<B: Block32>(a: &B, b: &B) -> __m512 {
    let bits = a.d().to_bits() as i32 | (b.d().to_bits() as i32) << 16;
    let both = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    #[rustfmt::skip]
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(both))
}

/// The odd last block of a row against a token's block, in one 256-bit step
/// (`wv` is `b.weights()`): every path ends a row with exactly this.
#[inline(always)]
unsafe fn odd_block<B: Block32>(b: &B, wv: __m256i, a: &BlockQ8A) -> f32 {
    // SAFETY: the only load reads 32 bytes, exactly `a.qs`; the rest only touches registers; the CPU
    // has AVX-512 VNNI/VL and F16C (module contract).
    unsafe {
        let init = _mm256_setr_epi32(-B::OFFSET * a.sum, 0, 0, 0, 0, 0, 0, 0);
        let p = _mm256_dpbusd_epi32(init, wv, load256(a.qs.as_ptr().cast()));
        let d = _mm256_set1_ps(f16_to_f32(b.d()) * a.d);
        hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(p), d))
    }
}

/// Two blocks' 16 bytes of nibbles as `join(nibbles32(a), nibbles32(b))`: each
/// 16-byte half loaded once, placed in two 128-bit lanes, the upper lane of
/// each pair shifted right by 4, then masked.
#[inline(always)]
unsafe fn nibbles64(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: the callers pass two pointers to 16 readable bytes each (the `qs` of `Q4_0`/`Q5_0`
    // blocks), which the unaligned loads read; the rest only touches registers; AVX-512F/BW per the
    // module contract.
    unsafe {
        let y =
            _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(a.cast())), _mm_loadu_si128(b.cast()), 1);
        let y = _mm512_castsi256_si512(y);
        // 128-bit lanes [a, a, b, b].
        let v = _mm512_shuffle_i64x2::<0b01_01_00_00>(y, y);
        let v = _mm512_mask_srli_epi16::<4>(v, 0xFF00_FF00, v);
        _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
    }
}

impl Block32 for BlockQ4_0 {
    const OFFSET: i32 = 8;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        // SAFETY: `nibbles32` reads 16 bytes at the pointer, exactly `qs`; AVX2 is part of the AVX-512
        // level (module contract).
        unsafe { nibbles32(self.qs.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn weights2(a: &Self, b: &Self) -> __m512i {
        // SAFETY: `nibbles64` reads 16 bytes at each pointer, exactly each block's `qs`; AVX-512F/BW per
        // the module contract.
        unsafe { nibbles64(a.qs.as_ptr(), b.qs.as_ptr()) }
    }
}

impl Block32 for BlockQ5_0 {
    const OFFSET: i32 = 16;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        // SAFETY: `nibbles32` reads 16 bytes at the pointer, exactly `qs`; `bits32` only touches
        // registers; AVX2 is part of the AVX-512 level (module contract).
        unsafe { _mm256_or_si256(nibbles32(self.qs.as_ptr()), bits32(u32::from_le_bytes(self.qh), 0x10)) }
    }
    /// The fifth bits straight from a mask register: bit `j` of the two `qh`
    /// words is byte `j`'s, and a masked add sets it.
    #[inline(always)]
    unsafe fn weights2(a: &Self, b: &Self) -> __m512i {
        let high = u32::from_le_bytes(a.qh) as u64 | (u32::from_le_bytes(b.qh) as u64) << 32;
        // SAFETY: `nibbles64` reads 16 bytes at each pointer, exactly each block's `qs`; the masked add
        // only touches registers; AVX-512F/BW per the module contract.
        unsafe {
            let v = nibbles64(a.qs.as_ptr(), b.qs.as_ptr());
            _mm512_mask_add_epi8(v, high, v, _mm512_set1_epi8(0x10))
        }
    }
}

impl Block32 for BlockQ8_0 {
    const OFFSET: i32 = 128;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        // SAFETY: `load256` reads 32 bytes, exactly `qs` (`[i8; 32]`); AVX2 is part of the AVX-512 level
        // (module contract).
        unsafe { _mm256_xor_si256(load256(self.qs.as_ptr().cast()), _mm256_set1_epi8(-128)) }
    }
    #[inline(always)]
    unsafe fn weights2(a: &Self, b: &Self) -> __m512i {
        // SAFETY: each `load256` reads 32 bytes, exactly one block's `qs`; AVX-512F per the module contract.
        unsafe {
            let v = join(load256(a.qs.as_ptr().cast()), load256(b.qs.as_ptr().cast()));
            _mm512_xor_si512(v, _mm512_set1_epi8(-128))
        }
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
    // SAFETY: every `w[r]` and `x[c]` holds at least `n = w[0].len()` blocks (the dot products cut both
    // to `n`; `gemm` passes weight rows of `wpr` and activation rows of `apr >= wpr` blocks), so
    // `get_unchecked` of `i` and `i + 1` while `i + 2 <= n`, then of `i < n`, is in bounds; the loads
    // read 32-byte `qs` fields; a prefetch is only a hint (its `wrapping_add` pointer is never
    // dereferenced); the CPU has the AVX-512 level's features (module contract).
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
                wv[r] = B::weights2(b0, b1);
                sw[r] = scales2(b0, b1);
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
        let mut out = tile_sums(&acc);
        if i < n {
            for r in 0..R {
                let b = w[r].get_unchecked(i);
                let wv = b.weights();
                for c in 0..C {
                    out[r][c] += odd_block(b, wv, x[c].get_unchecked(i));
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
        // SAFETY: `gemm` passes rows of at least `w[0].len()` blocks each (`wpr` weight blocks,
        // `apr >= wpr` activation blocks), which is what `tile32` requires; same CPU features.
        unsafe { tile32(w, x) }
    }
}

thread_local! {
    /// Decoded weights and laid-out activations of `gemm32` (per thread).
    static PACKED: std::cell::RefCell<Vec<__m512i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Gives this thread's buffer room for `bytes` (see `dot::warm_thread`).
pub(super) fn reserve(bytes: usize) {
    super::super::reserve(&PACKED, bytes);
}

/// The GEMM over 32-value blocks for jobs of several tokens. `tile32` decodes
/// a row's weights again for every 4 tokens and lays out a token's
/// activations again for every 4 rows; here each 4-row group's weights are
/// decoded once for all the job's tokens and each token's activations once
/// for all its rows, then the tiles load them. Every element goes through
/// exactly the operations of `tile32` (same integer sums, same float steps,
/// same order), so results are bit for bit those of the single dot product.
#[inline(always)]
pub(super) unsafe fn gemm32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    let (toks, n) = (job.toks.len(), job.wpr);
    if toks == 1 && n >= 2 {
        // SAFETY: the caller's `GemmFn` contract is all `gemv32` requires.
        return unsafe { gemv32::<B>(job) };
    }
    if toks < 4 || job.rows.len() < 4 || n < 2 {
        // SAFETY: the caller's `GemmFn` contract is all `gemm` requires.
        return unsafe { gemm::<Q32<B>>(job) };
    }
    let pairs = n / 2;
    // Per token and pair: activations, their offset correction, their scales;
    // then per row of a group and pair: weights and weight scales.
    let (act_len, w_len) = (toks * pairs * 3, 4 * pairs * 2);
    // Taken out of the thread-local for the duration: code in a closure would
    // not inherit the caller's target features, and the intrinsics would
    // become calls.
    let mut buf = PACKED.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    if buf.len() < act_len + w_len {
        // SAFETY: register-only AVX-512F intrinsic; the CPU has it (module contract).
        buf.resize(act_len + w_len, unsafe { _mm512_setzero_si512() });
    }
    {
        let (act, wts) = buf.split_at_mut(act_len);
        // SAFETY: `buf` holds at least `act_len + w_len` vectors (resized above): `act` is `3 * pairs` per
        // token (token `t`'s slice goes to `lay_out`), `wts` is `2 * pairs` per row of the 4-row group, so
        // `(i * pairs + p) * 2 + 1 < 8 * pairs = w_len`. By the `GemmFn` contract `job.w` holds the job's
        // rows of `n` blocks (`2p + 1 < n`), `job.x` its tokens with `apr >= n` blocks (`lay_out` reads
        // `2 * pairs <= n`), and `job.out` may be written for them, which `packed_tile` and `gemm` keep
        // to; the CPU has the AVX-512 level's features (module contract).
        unsafe {
            for t in 0..toks {
                let x = job.x.get_unchecked((job.toks.start + t) * job.apr..);
                lay_out::<B>(x, pairs, &mut act[t * pairs * 3..(t + 1) * pairs * 3]);
            }
            let mut r = job.rows.start;
            while r + 4 <= job.rows.end {
                for i in 0..4 {
                    let w = job.w.get_unchecked((r + i) * n..);
                    for p in 0..pairs {
                        let (b0, b1) = (w.get_unchecked(2 * p), w.get_unchecked(2 * p + 1));
                        let wt = wts.as_mut_ptr().add((i * pairs + p) * 2);
                        *wt = B::weights2(b0, b1);
                        *wt.add(1) = _mm512_castps_si512(scales2(b0, b1));
                    }
                }
                let mut t = 0;
                while t < toks {
                    let tt = (toks - t).min(4);
                    match tt {
                        4 => packed_tile::<B, 4>(job, act, wts, pairs, r, t),
                        3 => packed_tile::<B, 3>(job, act, wts, pairs, r, t),
                        2 => packed_tile::<B, 2>(job, act, wts, pairs, r, t),
                        _ => packed_tile::<B, 1>(job, act, wts, pairs, r, t),
                    }
                    t += tt;
                }
                r += 4;
            }
            // The last rows (fewer than 4) through the plain tiles.
            if r < job.rows.end {
                let rest = GemmJob { rows: r..job.rows.end, toks: job.toks.clone(), ..*job };
                gemm::<Q32<B>>(&rest);
            }
        }
    }
    PACKED.with(|cell| *cell.borrow_mut() = buf);
}

/// One token's activations laid out as `gemm32` lays them out: per pair of
/// blocks, the 64 values, their offset correction and their scales.
#[inline(always)]
unsafe fn lay_out<B: Block32>(x: &[BlockQ8A], pairs: usize, act: &mut [__m512i]) {
    // SAFETY: the callers pass `x` with at least `2 * pairs` blocks (an activation row, `apr >= n` by
    // the `GemmFn` contract) and `act` with at least `3 * pairs` vectors (`gemm32`: one token's slice;
    // `gemv32`: resized to that), so `x[2p + 1]` and `act[3p + 2]` are in bounds; each load reads a
    // block's 32-byte `qs`; AVX-512F per the module contract.
    unsafe {
        for p in 0..pairs {
            let (a0, a1) = (x.get_unchecked(2 * p), x.get_unchecked(2 * p + 1));
            let at = act.as_mut_ptr().add(p * 3);
            *at = join(load256(a0.qs.as_ptr().cast()), load256(a1.qs.as_ptr().cast()));
            #[rustfmt::skip]
            let init = _mm512_setr_epi32(
                -B::OFFSET * a0.sum, 0, 0, 0, 0, 0, 0, 0,
                -B::OFFSET * a1.sum, 0, 0, 0, 0, 0, 0, 0,
            );
            *at.add(1) = init;
            *at.add(2) = _mm512_castps_si512(pair(a0.d, a1.d));
        }
    }
}

/// Decode (a job of one token): the token's activations are laid out once for
/// all the job's rows, then each row is one sequential stream of weights
/// (rows read in lockstep defeat the hardware prefetcher) that only decodes its
/// blocks: `tile32`'s per-block work on the activation side (two loads and a
/// join, the offset vector, the scale pair) is done once per job instead of
/// once per row. The operations per element are `tile32`'s, in its order, so
/// the result is bit for bit the 1 × 1 tile's.
#[inline(always)]
unsafe fn gemv32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    let n = job.wpr;
    let pairs = n / 2;
    let tok = job.toks.start;
    let mut act = PACKED.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    if act.len() < pairs * 3 {
        // SAFETY: register-only AVX-512F intrinsic; the CPU has it (module contract).
        act.resize(pairs * 3, unsafe { _mm512_setzero_si512() });
    }
    // SAFETY: by the `GemmFn` contract the job's token `tok` is `apr >= n` blocks of `job.x` (`lay_out`
    // reads `2 * pairs`, the odd block reads `n - 1`), its rows are `n` blocks of `job.w`, and
    // `job.out` may be written at `tok * ldo + r` for them; `act` holds at least `3 * pairs` vectors
    // (resized above), so `act[3p + 2]` is in bounds; AVX-512 level features per the module contract.
    unsafe {
        let x = job.x.get_unchecked(tok * job.apr..(tok + 1) * job.apr);
        lay_out::<B>(x, pairs, &mut act);
        for r in job.rows.clone() {
            let w = job.w.get_unchecked(r * n..(r + 1) * n);
            let mut acc = _mm512_setzero_ps();
            for p in 0..pairs {
                let (b0, b1) = (w.get_unchecked(2 * p), w.get_unchecked(2 * p + 1));
                let (wv, sw) = (B::weights2(b0, b1), scales2(b0, b1));
                let at = act.as_ptr().add(p * 3);
                let (xv, init, sx) = (*at, *at.add(1), _mm512_castsi512_ps(*at.add(2)));
                let d = _mm512_dpbusd_epi32(init, wv, xv);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sw, sx), acc);
            }
            let mut v = reduce1(acc);
            if n % 2 == 1 {
                let b = w.get_unchecked(n - 1);
                v += odd_block(b, b.weights(), x.get_unchecked(n - 1));
            }
            *job.out.add(tok * job.ldo + r) = v;
        }
    }
    PACKED.with(|cell| *cell.borrow_mut() = act);
}

/// Rows `r..r + 4` × job tokens `t..t + C` from the packed buffers.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `i` and `c` index several arrays in step
unsafe fn packed_tile<B: Block32, const C: usize>(
    job: &GemmJob<'_, B, BlockQ8A>,
    act: &[__m512i],
    wts: &[__m512i],
    pairs: usize,
    r: usize,
    t: usize,
) {
    const R: usize = 4;
    let n = job.wpr;
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    // SAFETY: `gemm32` prepared rows `r..r + 4` into `wts` (`(i * pairs + p) * 2 + 1 < 8 * pairs`) and
    // laid out every job token in `act` (`((t + c) * pairs + p) * 3 + 2 < toks * pairs * 3`, as
    // `t + c < toks`); rows `r..r + 4` and tokens `toks.start + t + c` are the job's, so the weight
    // rows, the activation block `tok * apr + n - 1` (`apr >= n`) and the `job.out` stores are the
    // `GemmFn` contract's; AVX-512 level features per the module contract.
    unsafe {
        for p in 0..pairs {
            let mut wv = [_mm512_setzero_si512(); R];
            let mut sw = [_mm512_setzero_ps(); R];
            for i in 0..R {
                let wt = wts.as_ptr().add((i * pairs + p) * 2);
                wv[i] = *wt;
                sw[i] = _mm512_castsi512_ps(*wt.add(1));
            }
            for c in 0..C {
                let at = act.as_ptr().add(((t + c) * pairs + p) * 3);
                let (xv, init, sx) = (*at, *at.add(1), _mm512_castsi512_ps(*at.add(2)));
                for i in 0..R {
                    let d = _mm512_dpbusd_epi32(init, wv[i], xv);
                    acc[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sw[i], sx), acc[i][c]);
                }
            }
        }
        let sums = tile_sums(&acc);
        for i in 0..R {
            let w = job.w.get_unchecked((r + i) * n..(r + i + 1) * n);
            for c in 0..C {
                let tok = job.toks.start + t + c;
                let mut v = sums[i][c];
                if n % 2 == 1 {
                    let b = w.get_unchecked(n - 1);
                    v += odd_block(b, b.weights(), job.x.get_unchecked(tok * job.apr + n - 1));
                }
                *job.out.add(tok * job.ldo + r + i) = v;
            }
        }
    }
}
