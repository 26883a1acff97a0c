//! AVX2 attention: the flash-style tile kernel (see the module above) for head sizes 64 and
//! 128 (other sizes go row by row through the scalar kernel), the AVX-512 kernel's structure
//! with 8 lanes. Per block of [`KEY_BLOCK`] keys: K and V converted from f16 once for every
//! query of the tile (a prefill tile holds ~128 query heads, so a long prompt reads its K/V
//! once per tile instead of once per query), scores as a register-tiled product of the
//! transposed, pre-scaled queries (8 query heads per vector) with broadcast key values, the
//! online softmax vectorised over queries, and V accumulated two queries and 32 values at a
//! time (AVX2 has 16 vector registers). Every value goes through the same operations whatever
//! the tile's size, so a decode step equals the row's place in a prefill.
//!
//! Safety: requires the features of `SimdLevel::Avx2`.

use super::{tile_by_rows, Attend, KvRows, Tile, TileBufs, TileScratch, KEY_BLOCK, Q8_BLOCK_BYTES};
use std::arch::x86_64::*;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;

/// `exp(x)`; below -87 it flushes towards 0 and above 88 it is infinite.
#[inline(always)]
unsafe fn exp256(x: __m256) -> __m256 {
    let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0)), _mm256_set1_ps(88.5));
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let pow2n =
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
    _mm256_mul_ps(p, pow2n)
}

/// One query row through the tile kernel (the per-row interface): the same arithmetic as the
/// row's place in any tile, so a decode step and a prefill chunk agree bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
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
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile(t: &Tile<'_>, sc: &mut TileScratch, out: *mut f32) {
    match t.hd {
        64 => tile_hd::<8, 64>(t, sc, out),
        128 => tile_hd::<16, 128>(t, sc, out),
        _ => tile_by_rows(t, sc, out, super::attend_scalar),
    }
}

/// Head size `HD` = `HV` vectors of 8.
#[inline(always)]
unsafe fn tile_hd<const HV: usize, const HD: usize>(t: &Tile<'_>, sc: &mut TileScratch, out: *mut f32) {
    const KB: usize = KEY_BLOCK;
    let Some(bufs) = TileBufs::carve(t, sc, 8) else { return };
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
        // Rows past the keys are zero (their scores are masked anyway).
        std::ptr::write_bytes(kf.add(nj * HD), 0, (nj4 - nj) * HD);
        std::ptr::write_bytes(vf.add(nj * HD), 0, (nj4 - nj) * HD);

        let mut iv = 0;
        while iv < mv {
            if mv - iv >= 2 {
                scores::<HD, 2>(qt, kf, s, mp, iv, nj4);
                iv += 2;
            } else {
                scores::<HD, 1>(qt, kf, s, mp, iv, nj4);
                iv += 1;
            }
        }

        // Online softmax: a key is visible to a query at or after its position; invisible ones
        // weigh exactly zero and leave the running max alone.
        for iv in 0..mv {
            let pos = _mm256_loadu_si256(qpos.add(8 * iv).cast());
            let m_old = _mm256_loadu_ps(mx.add(8 * iv));
            let mut m_new = m_old;
            for j in 0..nj4 {
                let hidden = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((kb + j) as i32), pos));
                let seen_max = _mm256_max_ps(m_new, _mm256_loadu_ps(s.add(j * mp + 8 * iv)));
                m_new = _mm256_blendv_ps(seen_max, m_new, hidden);
            }
            let a = exp256(_mm256_sub_ps(m_old, m_new));
            let mut l = _mm256_mul_ps(_mm256_loadu_ps(sum.add(8 * iv)), a);
            for j in 0..nj4 {
                let hidden = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((kb + j) as i32), pos));
                let sp = s.add(j * mp + 8 * iv);
                let p = _mm256_andnot_ps(hidden, exp256(_mm256_sub_ps(_mm256_loadu_ps(sp), m_new)));
                _mm256_storeu_ps(sp, p);
                l = _mm256_add_ps(l, p);
            }
            _mm256_storeu_ps(mx.add(8 * iv), m_new);
            _mm256_storeu_ps(sum.add(8 * iv), l);
            _mm256_storeu_ps(alpha.add(8 * iv), a);
        }

        // V in slices of 4 vectors (32 values) of the head, two queries at a time: 8
        // accumulators, 4 values and a weight in registers.
        for c0 in (0..HV).step_by(4) {
            let mut i = 0;
            while i < m {
                if m - i >= 2 {
                    values::<HD, 2>(s, vf, o, alpha, mp, i, c0, nj4);
                    i += 2;
                } else {
                    values::<HD, 1>(s, vf, o, alpha, mp, i, c0, nj4);
                    i += 1;
                }
            }
        }
        kb += KB;
    }

    bufs.finish(t, out);
}

/// The `8 · HV` values of a head at value offset `off` of `rows`, in f32, to `dst`: the values of
/// [`KvRows::to_f32`].
#[inline(always)]
unsafe fn row_f32<const HV: usize>(rows: KvRows<'_>, off: usize, dst: *mut f32) {
    match rows {
        KvRows::F16(h) => {
            let p = h.as_ptr().add(off);
            for c in 0..HV {
                _mm256_storeu_ps(dst.add(8 * c), _mm256_cvtph_ps(_mm_loadu_si128(p.add(8 * c).cast())));
            }
        }
        KvRows::Q8(b) => {
            let p = b.as_ptr().add(off / 32 * Q8_BLOCK_BYTES);
            for blk in 0..HV / 4 {
                let bp = p.add(blk * Q8_BLOCK_BYTES);
                let d = _mm256_set1_ps(half::f16::from_bits(bp.cast::<u16>().read_unaligned().to_le()).to_f32());
                for c in 0..4 {
                    let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(bp.add(2 + 8 * c).cast()));
                    _mm256_storeu_ps(dst.add(32 * blk + 8 * c), _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
                }
            }
        }
    }
}

/// Scores of the query vectors `iv0..iv0 + NI` against keys `0..nj4` (4 at a time):
/// `s[j][i] = Σ_d qt[d][i] · kf[j][d]`, summed in `d` order from zero.
#[inline(always)]
unsafe fn scores<const HD: usize, const NI: usize>(
    qt: *const f32,
    kf: *const f32,
    s: *mut f32,
    mp: usize,
    iv0: usize,
    nj4: usize,
) {
    let mut j = 0;
    while j < nj4 {
        let mut acc = [[_mm256_setzero_ps(); NI]; 4];
        for d in 0..HD {
            let mut qv = [_mm256_setzero_ps(); NI];
            for (c, q) in qv.iter_mut().enumerate() {
                *q = _mm256_loadu_ps(qt.add(d * mp + 8 * (iv0 + c)));
            }
            for (jj, acc_j) in acc.iter_mut().enumerate() {
                let k = _mm256_broadcast_ss(&*kf.add((j + jj) * HD + d));
                for (a, q) in acc_j.iter_mut().zip(&qv) {
                    *a = _mm256_fmadd_ps(*q, k, *a);
                }
            }
        }
        for (jj, acc_j) in acc.iter().enumerate() {
            for (c, a) in acc_j.iter().enumerate() {
                _mm256_storeu_ps(s.add((j + jj) * mp + 8 * (iv0 + c)), *a);
            }
        }
        j += 4;
    }
}

/// `o[i] = o[i] · alpha[i] + Σ_j s[j][i] · vf[j]` for queries `i0..i0 + NQ`, on the head's
/// vectors `c0..c0 + 4`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn values<const HD: usize, const NQ: usize>(
    s: *const f32,
    vf: *const f32,
    o: *mut f32,
    alpha: *const f32,
    mp: usize,
    i0: usize,
    c0: usize,
    nj4: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); 4]; NQ];
    for (q, acc_q) in acc.iter_mut().enumerate() {
        let a = _mm256_set1_ps(*alpha.add(i0 + q));
        for (c, x) in acc_q.iter_mut().enumerate() {
            *x = _mm256_mul_ps(_mm256_loadu_ps(o.add((i0 + q) * HD + 8 * (c0 + c))), a);
        }
    }
    for j in 0..nj4 {
        let mut v = [_mm256_setzero_ps(); 4];
        for (c, x) in v.iter_mut().enumerate() {
            *x = _mm256_loadu_ps(vf.add(j * HD + 8 * (c0 + c)));
        }
        for (q, acc_q) in acc.iter_mut().enumerate() {
            let p = _mm256_broadcast_ss(&*s.add(j * mp + i0 + q));
            for (x, vc) in acc_q.iter_mut().zip(&v) {
                *x = _mm256_fmadd_ps(p, *vc, *x);
            }
        }
    }
    for (q, acc_q) in acc.iter().enumerate() {
        for (c, x) in acc_q.iter().enumerate() {
            _mm256_storeu_ps(o.add((i0 + q) * HD + 8 * (c0 + c)), *x);
        }
    }
}

/// `gate = silu(gate) * up` = `gate / (1 + exp(-gate)) * up`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let one = _mm256_set1_ps(1.0);
    let full = n - n % 8;
    for i in (0..full).step_by(8) {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        let e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u));
    }
    for (g, u) in gate[full..n].iter_mut().zip(&up[full..n]) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}
