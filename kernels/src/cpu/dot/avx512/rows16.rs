//! The driver the two 16-row tile kernels share (`qk16` for the K formats, `q32x16` for the
//! 32-value formats): a job's rows in groups of 16, each group's blocks repacked once for all the
//! job's tokens, then the tokens in tiles of 8, 4, 2 and 1 against up to `ROW_GROUPS` groups; jobs
//! too small to repack, and the rows left over, to the AVX2 kernels (which give the same bits).

use super::*;

/// Jobs with fewer tokens go to the AVX2 kernels ([`Rows16::small`], up to 4 tokens without
/// repacking). From 5 the AVX2 level repacks too, into 8-row groups, which were slower than these
/// tiles: 5- and 7-token passes (verifying drafts, decoding 5–7 sequences) went from 23.6 / 41.3 to
/// 33.8 / 48.4 tokens/s on the 1.5B (K formats) and from 105.8 / 140.9 to 123.1 / 156.6 on the
/// default model (32-value formats) with the tiles taking them (Intel Xeon Emerald Rapids,
/// `cachet bench --prompt 5 --gen 0`).
pub(super) const MIN_TOKENS: usize = 5;

/// A 16-row tile kernel: how block `s` of 16 rows is packed and how a tile of tokens runs
/// against a group's packed blocks.
pub(super) trait Rows16 {
    type W;
    type A;
    /// One block of 16 rows, repacked.
    type Pack: Copy;
    /// What packing needs between calls (reused for every block of a job).
    type Scratch;
    const EMPTY: Self::Pack;
    /// Groups packed together, each token tile run against all of them.
    const ROW_GROUPS: usize;
    fn scratch() -> Self::Scratch;
    /// Block `s` of the rows `lo` (0..8) and `hi` (8..16), repacked into `p`.
    ///
    /// # Safety
    /// `s` is below every row's length; the CPU has the AVX-512 level's features.
    unsafe fn pack(lo: [&[Self::W]; 8], hi: [&[Self::W]; 8], s: usize, sc: &mut Self::Scratch, p: &mut Self::Pack);
    /// 16 rows (a group's packed blocks) × `C` tokens: `out[c]` holds the rows' results for token
    /// `c`.
    ///
    /// # Safety
    /// Every `x[c]` holds at least `packs.len()` blocks; the CPU has the AVX-512 level's features.
    unsafe fn tile<const C: usize>(packs: &[Self::Pack], x: [&[Self::A]; C]) -> [__m512; C];
    /// The AVX2 kernel of the format.
    ///
    /// # Safety
    /// The `GemmFn` contract.
    unsafe fn small(job: &GemmJob<'_, Self::W, Self::A>);
}

/// The job, with `packs` as the (per-thread) room for its packed blocks.
///
/// # Safety
/// The `GemmFn` contract; the CPU has the AVX-512 level's features.
#[inline(always)]
pub(super) unsafe fn gemm<K: Rows16>(job: &GemmJob<'_, K::W, K::A>, packs: &mut Vec<K::Pack>) {
    let (toks, n) = (job.toks.len(), job.wpr);
    if toks < MIN_TOKENS || job.rows.len() < 16 || n == 0 {
        // SAFETY: the caller's `GemmFn` contract is all the AVX2 kernel requires.
        return unsafe { K::small(job) };
    }
    let mut scratch = K::scratch();
    // SAFETY: by the `GemmFn` contract `job.w` holds the job's rows of `n = wpr` blocks, `job.x` its
    // tokens with `apr >= n` blocks, and `job.out` may be written at `t * ldo + r` for them; `packs`
    // holds `groups` chunks of `n` entries (resized below), so `pack` gets `s < n`; group `gi`'s
    // 16-float stores cover rows `r + 16 gi..r + 16 (gi + 1) <= job.rows.end` of tokens inside
    // `job.toks`; the CPU has the AVX-512 level's features (the caller's contract).
    unsafe {
        let xrow = |t: usize| job.x.get_unchecked(t * job.apr..(t + 1) * job.apr);
        let wrow = |r: usize| job.w.get_unchecked(r * n..(r + 1) * n);
        let mut r = job.rows.start;
        while r + 16 <= job.rows.end {
            let groups = ((job.rows.end - r) / 16).min(K::ROW_GROUPS);
            packs.resize(groups * n, K::EMPTY);
            for (gi, group) in packs.chunks_exact_mut(n).enumerate() {
                let r = r + 16 * gi;
                let lo = [
                    wrow(r),
                    wrow(r + 1),
                    wrow(r + 2),
                    wrow(r + 3),
                    wrow(r + 4),
                    wrow(r + 5),
                    wrow(r + 6),
                    wrow(r + 7),
                ];
                let hi = [
                    wrow(r + 8),
                    wrow(r + 9),
                    wrow(r + 10),
                    wrow(r + 11),
                    wrow(r + 12),
                    wrow(r + 13),
                    wrow(r + 14),
                    wrow(r + 15),
                ];
                for (s, p) in group.iter_mut().enumerate() {
                    K::pack(lo, hi, s, &mut scratch, p);
                }
            }
            let mut t = job.toks.start;
            macro_rules! tiles {
                ($c:literal) => {
                    while job.toks.end - t >= $c {
                        let mut xs = [xrow(t); $c];
                        for (j, x) in xs.iter_mut().enumerate().skip(1) {
                            *x = xrow(t + j);
                        }
                        for (gi, group) in packs.chunks_exact(n).enumerate() {
                            for (j, v) in K::tile::<$c>(group, xs).iter().enumerate() {
                                _mm512_storeu_ps(job.out.add((t + j) * job.ldo + r + 16 * gi), *v);
                            }
                        }
                        t += $c;
                    }
                };
            }
            tiles!(8);
            tiles!(4);
            tiles!(2);
            tiles!(1);
            r += 16 * groups;
        }
        if r < job.rows.end {
            let rest = GemmJob { rows: r..job.rows.end, toks: job.toks.clone(), ..*job };
            K::small(&rest);
        }
    }
}
