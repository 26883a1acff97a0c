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
        // SAFETY: `nibbles32` reads 16 bytes at the pointer, exactly `qs`; the CPU has AVX2 (module contract).
        unsafe { nibbles32(self.qs.as_ptr()) }
    }
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 arithmetic; the CPU has AVX2 (module contract).
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
        // SAFETY: `nibbles32` reads 16 bytes at the pointer, exactly `qs`; `bits32` only touches registers;
        // the CPU has AVX2 (module contract).
        unsafe { _mm256_or_si256(nibbles32(self.qs.as_ptr()), bits32(u32::from_le_bytes(self.qh), 0x10)) }
    }
    #[inline(always)]
    unsafe fn dot(w: __m256i, x: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 arithmetic; the CPU has AVX2 (module contract).
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
        // SAFETY: `load256` reads 32 bytes, exactly `qs` (`[i8; 32]`); the CPU has AVX2 (module contract).
        unsafe {
            let w = load256(self.qs.as_ptr().cast());
            (w, _mm256_sign_epi8(w, w))
        }
    }
    #[inline(always)]
    unsafe fn dot((w, abs): (__m256i, __m256i), x: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 arithmetic; the CPU has AVX2 (module contract).
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
    // SAFETY: every `w[r]` and `x[c]` holds at least `n = w[0].len()` blocks (the dot products cut both
    // to `n`; `gemm` passes weight rows of `wpr` and activation rows of `apr >= wpr` blocks), so
    // `get_unchecked(i)` with `i < n` is in bounds; the loads read 32-byte `qs` fields; the CPU has
    // AVX2/FMA/F16C (module contract).
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
        // SAFETY: `gemm` passes rows of at least `w[0].len()` blocks each (`wpr` weight blocks,
        // `apr >= wpr` activation blocks), which is what `tile32` requires; same CPU features.
        unsafe { tile32(w, x) }
    }
}

thread_local! {
    /// Laid-out activations (and `packed32`'s prepared weights), per thread: one buffer for both
    /// paths, so that a prompt pass sizes it for the decode steps after it (no allocation in
    /// steady-state decode, `engine/tests/no_alloc.rs`).
    static PACKED: std::cell::RefCell<Vec<__m256i>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Gives this thread's buffer room for `bytes` (see `dot::warm_thread`).
pub(super) fn reserve(bytes: usize) {
    super::super::reserve(&PACKED, bytes);
}

/// The job: `gemv32` when it has one token, `packed32` when it has several tokens and rows to
/// share the preparation over, else the tiles.
#[inline(always)]
pub(super) unsafe fn gemm32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    // SAFETY: the caller's `GemmFn` contract is exactly what `gemv32`, `packed32` and `gemm` require.
    unsafe {
        if job.toks.len() == 1 {
            gemv32(job)
        } else if job.toks.len() >= 8 && job.rows.len() >= PACK_ROWS {
            packed32(job)
        } else {
            gemm::<Q32<B>>(job)
        }
    }
}

/// Rows of `packed32`'s tiles: their accumulators and the token's operands fit the 16 vector
/// registers, since the prepared weights are read from L1.
const PACK_ROWS: usize = 3;

/// A job of several tokens: each token's activations are laid out once for all the job's rows
/// (as `gemv32` does) and each `PACK_ROWS`-row group's blocks prepared once for all its tokens;
/// the tiles then only load them. The operations per element are `tile32`'s, in its order, so
/// results are bit for bit the single dot product's.
#[inline(always)]
unsafe fn packed32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    let (toks, n) = (job.toks.len(), job.wpr);
    // A prepared block is one or two vectors (`Q8_0` keeps the absolute values too).
    let words = std::mem::size_of::<B::Prep>() / 32;
    debug_assert!(std::mem::size_of::<B::Prep>() % 32 == 0 && std::mem::align_of::<B::Prep>() <= 32);
    let (act_len, w_len) = (toks * n * 3, PACK_ROWS * n * (words + 1));
    let mut buf = PACKED.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    if buf.len() < act_len + w_len {
        // SAFETY: register-only AVX intrinsic; the CPU has AVX2 (module contract).
        buf.resize(act_len + w_len, unsafe { _mm256_setzero_si256() });
    }
    // SAFETY: `buf` holds at least `act_len + w_len` vectors (resized above): `act` is `3n` per token
    // (token `t`'s slice goes to `lay_out`), `wts` is `PACK_ROWS * n * words` vectors of prepared blocks
    // then `PACK_ROWS * n` scale vectors, so `preps.add(j * n + i)` and `dws.add(j * n + i)` (`j` below
    // `PACK_ROWS`, `i < n`) stay inside `wts`; `__m256i` storage is 32-byte aligned, enough for
    // `B::Prep` (one or two `__m256i`, see the debug_assert). By the `GemmFn` contract `job.w` holds
    // the job's rows of `n = wpr` blocks, `job.x` its tokens with `apr >= n` blocks (`lay_out` reads
    // `n`), and `job.out` may be written for them, which `packed_tile` and `gemm` keep to; the CPU has
    // AVX2/FMA/F16C (module contract).
    unsafe {
        let (act, wts) = buf.split_at_mut(act_len);
        for t in 0..toks {
            let x = job.x.get_unchecked((job.toks.start + t) * job.apr..);
            lay_out::<B>(x, n, &mut act[3 * t * n..3 * (t + 1) * n]);
        }
        // Prepared blocks first (row-major), then their scales.
        let preps = wts.as_mut_ptr().cast::<B::Prep>();
        let dws = wts.as_mut_ptr().add(PACK_ROWS * n * words).cast::<__m256>();
        let mut r = job.rows.start;
        while r + PACK_ROWS <= job.rows.end {
            for j in 0..PACK_ROWS {
                let w = job.w.get_unchecked((r + j) * n..(r + j + 1) * n);
                for (i, b) in w.iter().enumerate() {
                    *preps.add(j * n + i) = b.prep();
                    *dws.add(j * n + i) = _mm256_set1_ps(f16_to_f32(b.d()));
                }
            }
            token_tiles!(0..toks, |t, C| { packed_tile::<B, C>(job, act, preps, dws, r, t) });
            r += PACK_ROWS;
        }
        if r < job.rows.end {
            let rest = GemmJob { rows: r..job.rows.end, toks: job.toks.clone(), ..*job };
            gemm::<Q32<B>>(&rest);
        }
    }
    PACKED.with(|cell| *cell.borrow_mut() = buf);
}

/// Rows `r..r + PACK_ROWS` × job tokens `t..t + C` from the packed buffers.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` and `c` index several arrays in step
unsafe fn packed_tile<B: Block32, const C: usize>(
    job: &GemmJob<'_, B, BlockQ8A>,
    act: &[__m256i],
    preps: *const B::Prep,
    dws: *const __m256,
    r: usize,
    t: usize,
) {
    const R: usize = PACK_ROWS;
    let n = job.wpr;
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    // SAFETY: `packed32` laid out `3n` vectors per job token in `act` and prepared rows
    // `r..r + PACK_ROWS` at `preps`/`dws` (index `j * n + i`); `t + c < toks` (`token_tiles!` over
    // `0..toks`), so `3 * ((t + c) * n + i) + 2` is inside `act`; rows `r..r + PACK_ROWS` and tokens
    // `toks.start + t + c` are the job's, so the `job.out` stores are the `GemmFn` contract's; the CPU
    // has AVX2/FMA (module contract).
    unsafe {
        for i in 0..n {
            for c in 0..C {
                let at = act.as_ptr().add(3 * ((t + c) * n + i));
                let (xq, correction, dx) = (*at, *at.add(1), _mm256_castsi256_ps(*at.add(2)));
                for j in 0..R {
                    let mut p = B::dot(*preps.add(j * n + i), xq);
                    if B::OFFSET != 0 {
                        p = _mm256_add_epi32(p, correction);
                    }
                    let dw = *dws.add(j * n + i);
                    acc[j][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, dx), acc[j][c]);
                }
            }
        }
        for j in 0..R {
            for c in 0..C {
                *job.out.add((job.toks.start + t + c) * job.ldo + r + j) = hsum_ps(acc[j][c]);
            }
        }
    }
}

/// One token's `n` activation blocks laid out for the tiles: per block, the 32 values, the offset
/// correction, the scale.
#[inline(always)]
unsafe fn lay_out<B: Block32>(x: &[BlockQ8A], n: usize, act: &mut [__m256i]) {
    // SAFETY: the callers pass `x` with at least `n` blocks (an activation row, `apr >= wpr = n` by the
    // `GemmFn` contract) and `act` with at least `3n` vectors (`packed32`: one token's `3n` slice;
    // `gemv32`: resized to `3n`), so `x[i]` and `act[3i..3i + 3]` are in bounds; each load reads a
    // block's 32-byte `qs`; the CPU has AVX2 (module contract).
    unsafe {
        for i in 0..n {
            let a = x.get_unchecked(i);
            let at = act.as_mut_ptr().add(3 * i);
            *at = load256(a.qs.as_ptr().cast());
            *at.add(1) = _mm256_setr_epi32(-B::OFFSET * a.sum, 0, 0, 0, 0, 0, 0, 0);
            *at.add(2) = _mm256_castps_si256(_mm256_set1_ps(a.d));
        }
    }
}

/// Decode (a job of one token): the token's activations are laid out once for all the job's rows
/// (per block: the 32 values, the offset correction, the scale), then each row is one sequential
/// stream of weights that only unpacks its blocks. The operations per element are `tile32`'s, in
/// its order, so the result is bit for bit the 1 × 1 tile's.
#[inline(always)]
unsafe fn gemv32<B: Block32>(job: &GemmJob<'_, B, BlockQ8A>) {
    let n = job.wpr;
    let tok = job.toks.start;
    let mut act = PACKED.with(|cell| std::mem::take(&mut *cell.borrow_mut()));
    if act.len() < n * 3 {
        // SAFETY: register-only AVX intrinsic; the CPU has AVX2 (module contract).
        act.resize(n * 3, unsafe { _mm256_setzero_si256() });
    }
    // SAFETY: by the `GemmFn` contract the job's token `tok` is `apr >= n` blocks of `job.x` (what
    // `lay_out` reads), its rows are `n` blocks of `job.w`, and `job.out` may be written at
    // `tok * ldo + r` for them; `act` holds at least `3n` vectors (resized above), so `act[3i + 2]`
    // for `i < n` is in bounds; the CPU has AVX2/FMA/F16C (module contract).
    unsafe {
        let x = job.x.get_unchecked(tok * job.apr..(tok + 1) * job.apr);
        lay_out::<B>(x, n, &mut act);
        for r in job.rows.clone() {
            let w = job.w.get_unchecked(r * n..(r + 1) * n);
            let mut acc = _mm256_setzero_ps();
            for (i, b) in w.iter().enumerate() {
                let at = act.as_ptr().add(3 * i);
                let mut p = B::dot(b.prep(), *at);
                if B::OFFSET != 0 {
                    p = _mm256_add_epi32(p, *at.add(1));
                }
                let dw = _mm256_set1_ps(f16_to_f32(b.d()));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, _mm256_castsi256_ps(*at.add(2))), acc);
            }
            *job.out.add(tok * job.ldo + r) = hsum_ps(acc);
        }
    }
    PACKED.with(|cell| *cell.borrow_mut() = act);
}
