//! AVX-512 attention: the flash-style tile kernel (see the module above) for
//! head sizes 64 and 128 (other sizes go row by row through the scalar
//! kernel). Per block of [`KEY_BLOCK`] keys: K and V converted from f16 once,
//! scores as a register-tiled product of the transposed, pre-scaled queries
//! (16 query heads per vector) with broadcast key values, the online softmax
//! vectorised over queries, and V accumulated for several queries per
//! converted row. Every value goes through the same operations whatever the
//! tile's size.
//!
//! Safety: requires the features of `SimdLevel::Avx512`.

use super::{tile_by_rows, Attend, KvRows, Tile, TileBufs, TileScratch, KEY_BLOCK, Q8_BLOCK_BYTES};
use std::arch::x86_64::*;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// `exp(x)`, relative error about 2e-7; below -87 it flushes towards 0 and
/// above 88 it is infinite.
#[inline(always)]
pub(crate) unsafe fn exp512(x: __m512) -> __m512 {
    let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0)), _mm512_set1_ps(88.5));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(LOG2E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
}

/// One query row through the tile kernel (the per-row interface).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub unsafe fn attend(a: &Attend<'_>, _scores: &mut [f32], out: &mut [f32]) {
    if a.keys.is_empty() {
        out.fill(0.0);
        return;
    }
    let t = Tile {
        q: a.q,
        q_cols: a.rep * a.hd,
        rows: 1,
        pos0: a.keys.len() - 1,
        head0: 0,
        rep: a.rep,
        hd: a.hd,
        k: a.k,
        v: a.v,
        kv_cols: a.kv_cols,
        offset: a.offset,
        keys: a.keys,
        scale: a.scale,
    };
    tile(&t, &mut TileScratch::default(), out.as_mut_ptr());
}

/// The tile kernel (a [`super::TileFn`]).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub unsafe fn tile(t: &Tile<'_>, sc: &mut TileScratch, out: *mut f32) {
    match t.hd {
        64 => tile_hd::<4, 64, 6>(t, sc, out),
        128 => tile_hd::<8, 128, 4>(t, sc, out),
        _ => tile_by_rows(t, sc, out, super::attend_scalar),
    }
}

/// Head size `HD` = `HV` vectors of 16; `NQ` queries per pass over V.
#[inline(always)]
unsafe fn tile_hd<const HV: usize, const HD: usize, const NQ: usize>(
    t: &Tile<'_>,
    sc: &mut TileScratch,
    out: *mut f32,
) {
    const KB: usize = KEY_BLOCK;
    let Some(bufs) = TileBufs::carve(t, sc, 16) else { return };
    let TileBufs { m, mv, mp, qt, s, kf, vf, o, mx, sum, alpha, qpos } = bufs;
    let nk = t.keys.len();

    let mut kb = 0;
    while kb < nk {
        let nj = KB.min(nk - kb);
        let nj4 = nj.next_multiple_of(4);
        for j in 0..nj {
            let off = *t.keys.get_unchecked(kb + j) as usize * t.kv_cols + t.offset;
            row_f32::<HV>(t.k, off, kf.add(j * HD));
            row_f32::<HV>(t.v, off, vf.add(j * HD));
        }
        // Keys in steps of 8 for the scores (at most `KB`, a multiple of 8).
        let nj8 = nj.next_multiple_of(8);
        // Rows past the keys are zero (their scores are masked anyway).
        std::ptr::write_bytes(kf.add(nj * HD), 0, (nj8 - nj) * HD);
        std::ptr::write_bytes(vf.add(nj * HD), 0, (nj4 - nj) * HD);

        let mut iv = 0;
        while iv < mv {
            let ni = (mv - iv).min(2);
            match ni {
                2 => scores::<HD, 2>(qt, kf, s, mp, iv, nj8),
                _ => scores::<HD, 1>(qt, kf, s, mp, iv, nj8),
            }
            iv += ni;
        }

        // Online softmax: a key is visible to a query at or after its position;
        // invisible ones weigh exactly zero and leave the running max alone.
        for iv in 0..mv {
            let pos = _mm512_loadu_si512(qpos.add(16 * iv).cast());
            let m_old = _mm512_loadu_ps(mx.add(16 * iv));
            let mut m_new = m_old;
            for j in 0..nj4 {
                let seen = _mm512_cmple_epi32_mask(_mm512_set1_epi32((kb + j) as i32), pos);
                m_new = _mm512_mask_max_ps(m_new, seen, m_new, _mm512_loadu_ps(s.add(j * mp + 16 * iv)));
            }
            let a = exp512(_mm512_sub_ps(m_old, m_new));
            let mut l = _mm512_mul_ps(_mm512_loadu_ps(sum.add(16 * iv)), a);
            for j in 0..nj4 {
                let seen = _mm512_cmple_epi32_mask(_mm512_set1_epi32((kb + j) as i32), pos);
                let sp = s.add(j * mp + 16 * iv);
                let p = _mm512_maskz_mov_ps(seen, exp512(_mm512_sub_ps(_mm512_loadu_ps(sp), m_new)));
                _mm512_storeu_ps(sp, p);
                l = _mm512_add_ps(l, p);
            }
            _mm512_storeu_ps(mx.add(16 * iv), m_new);
            _mm512_storeu_ps(sum.add(16 * iv), l);
            _mm512_storeu_ps(alpha.add(16 * iv), a);
        }

        // V in column slices of 4 vectors (64 values), so that more queries share each loaded
        // slice (a 128-value head's whole rows for 2 queries at a time read V from L2 faster than
        // the multiplies used it).
        for c0 in (0..HV).step_by(4) {
            let mut i = 0;
            while i < m {
                let nq = (m - i).min(NQ);
                match nq {
                    6 => values::<HD, 6>(s, vf, o, alpha, mp, i, nj4, c0),
                    5 => values::<HD, 5>(s, vf, o, alpha, mp, i, nj4, c0),
                    4 => values::<HD, 4>(s, vf, o, alpha, mp, i, nj4, c0),
                    3 => values::<HD, 3>(s, vf, o, alpha, mp, i, nj4, c0),
                    2 => values::<HD, 2>(s, vf, o, alpha, mp, i, nj4, c0),
                    _ => values::<HD, 1>(s, vf, o, alpha, mp, i, nj4, c0),
                }
                i += nq;
            }
        }
        kb += KB;
    }

    bufs.finish(t, out);
}

/// The `16 · HV` values of a head at value offset `off` of `rows`, in f32, to `dst`: the values
/// of [`KvRows::to_f32`].
#[inline(always)]
unsafe fn row_f32<const HV: usize>(rows: KvRows<'_>, off: usize, dst: *mut f32) {
    match rows {
        KvRows::F16(h) => {
            let p = h.as_ptr().add(off);
            for c in 0..HV {
                _mm512_storeu_ps(dst.add(16 * c), _mm512_cvtph_ps(_mm256_loadu_si256(p.add(16 * c).cast())));
            }
        }
        KvRows::Q8(b) => {
            let p = b.as_ptr().add(off / 32 * Q8_BLOCK_BYTES);
            for blk in 0..HV / 2 {
                let bp = p.add(blk * Q8_BLOCK_BYTES);
                let d = _mm512_set1_ps(half::f16::from_bits(bp.cast::<u16>().read_unaligned().to_le()).to_f32());
                for c in 0..2 {
                    let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(bp.add(2 + 16 * c).cast()));
                    _mm512_storeu_ps(dst.add(32 * blk + 16 * c), _mm512_mul_ps(_mm512_cvtepi32_ps(q), d));
                }
            }
        }
    }
}

/// Scores of the query vectors `iv0..iv0 + NI` against keys `0..nj8` (8 at a
/// time): `s[j][i] = Σ_d qt[d][i] · kf[j][d]`, summed in `d` order from zero.
/// 8 keys × 2 query vectors per step (rather than 4 × 4) read the transposed
/// queries half as often, and a decode step's single query vector still has 8
/// independent chains.
#[inline(always)]
unsafe fn scores<const HD: usize, const NI: usize>(
    qt: *const f32,
    kf: *const f32,
    s: *mut f32,
    mp: usize,
    iv0: usize,
    nj8: usize,
) {
    let mut j = 0;
    while j < nj8 {
        let mut acc = [[_mm512_setzero_ps(); NI]; 8];
        for d in 0..HD {
            let mut qv = [_mm512_setzero_ps(); NI];
            for (c, q) in qv.iter_mut().enumerate() {
                *q = _mm512_loadu_ps(qt.add(d * mp + 16 * (iv0 + c)));
            }
            for (jj, acc_j) in acc.iter_mut().enumerate() {
                let k = _mm512_set1_ps(*kf.add((j + jj) * HD + d));
                for (a, q) in acc_j.iter_mut().zip(&qv) {
                    *a = _mm512_fmadd_ps(*q, k, *a);
                }
            }
        }
        for (jj, acc_j) in acc.iter().enumerate() {
            for (c, a) in acc_j.iter().enumerate() {
                _mm512_storeu_ps(s.add((j + jj) * mp + 16 * (iv0 + c)), *a);
            }
        }
        j += 8;
    }
}

/// `o[i] = o[i] · alpha[i] + Σ_j s[j][i] · vf[j]` for queries `i0..i0 + NQ`, in the 4 vectors of
/// columns from vector `c0` (each element's sum in `j` order, whatever the slicing).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn values<const HD: usize, const NQ: usize>(
    s: *const f32,
    vf: *const f32,
    o: *mut f32,
    alpha: *const f32,
    mp: usize,
    i0: usize,
    nj4: usize,
    c0: usize,
) {
    const HV: usize = 4;
    let (o, vf) = (o.add(16 * c0), vf.add(16 * c0));
    let mut acc = [[_mm512_setzero_ps(); HV]; NQ];
    for (q, acc_q) in acc.iter_mut().enumerate() {
        let a = _mm512_set1_ps(*alpha.add(i0 + q));
        for (c, x) in acc_q.iter_mut().enumerate() {
            *x = _mm512_mul_ps(_mm512_loadu_ps(o.add((i0 + q) * HD + 16 * c)), a);
        }
    }
    for j in 0..nj4 {
        let mut v = [_mm512_setzero_ps(); HV];
        for (c, x) in v.iter_mut().enumerate() {
            *x = _mm512_loadu_ps(vf.add(j * HD + 16 * c));
        }
        for (q, acc_q) in acc.iter_mut().enumerate() {
            let p = _mm512_set1_ps(*s.add(j * mp + i0 + q));
            for (x, vc) in acc_q.iter_mut().zip(&v) {
                *x = _mm512_fmadd_ps(p, *vc, *x);
            }
        }
    }
    for (q, acc_q) in acc.iter().enumerate() {
        for (c, x) in acc_q.iter().enumerate() {
            _mm512_storeu_ps(o.add((i0 + q) * HD + 16 * c), *x);
        }
    }
}

/// `gate = silu(gate) * up` = `gate / (1 + exp(-gate)) * up`.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i < n {
        let mask: __mmask16 = if n - i >= 16 { 0xFFFF } else { ((1u32 << (n - i)) - 1) as __mmask16 };
        let g = _mm512_maskz_loadu_ps(mask, gate.as_ptr().add(i));
        let u = _mm512_maskz_loadu_ps(mask, up.as_ptr().add(i));
        let e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
        let v = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u);
        _mm512_mask_storeu_ps(gate.as_mut_ptr().add(i), mask, v);
        i += 16;
    }
}
