//! AVX2 attention kernel for head sizes 64 and 128 (other sizes use the
//! scalar kernel), the same structure as the AVX-512 one with 8 lanes and one
//! head per pass over V (AVX2 has 16 vector registers).
//!
//! Safety: requires the features of `SimdLevel::Avx2`.

use super::Attend;
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

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn attend(a: &Attend<'_>, scores: &mut [f32], out: &mut [f32]) {
    match a.hd {
        64 if a.rep <= 64 => attend_hd::<8>(a, scores, out),
        128 if a.rep <= 64 => attend_hd::<16>(a, scores, out),
        _ => super::attend_scalar(a, scores, out),
    }
}

/// `HD` vectors of 8 per head.
#[inline(always)]
unsafe fn attend_hd<const HD: usize>(a: &Attend<'_>, scores: &mut [f32], out: &mut [f32]) {
    let (n, rep, hd) = (a.keys.len(), a.rep, HD * 8);
    let row = |slot: u32| slot as usize * a.kv_cols + a.offset;
    let scale = _mm_set1_ps(a.scale);

    for (j, &slot) in a.keys.iter().enumerate() {
        let kp = a.k.as_ptr().add(row(slot));
        let mut kf = [_mm256_setzero_ps(); HD];
        for (i, k) in kf.iter_mut().enumerate() {
            *k = _mm256_cvtph_ps(_mm_loadu_si128(kp.add(8 * i).cast()));
        }
        let mut h = 0;
        while h < rep {
            let mut parts = [_mm_setzero_ps(); 4];
            for (t, part) in parts.iter_mut().enumerate() {
                if h + t < rep {
                    let qp = a.q.as_ptr().add((h + t) * hd);
                    let mut acc = _mm256_mul_ps(_mm256_loadu_ps(qp), kf[0]);
                    for (i, k) in kf.iter().enumerate().skip(1) {
                        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(8 * i)), *k, acc);
                    }
                    *part = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
                }
            }
            let sums = _mm_mul_ps(_mm_hadd_ps(_mm_hadd_ps(parts[0], parts[1]), _mm_hadd_ps(parts[2], parts[3])), scale);
            let mut lanes = [0f32; 4];
            _mm_storeu_ps(lanes.as_mut_ptr(), sums);
            for (t, &v) in lanes.iter().enumerate().take(rep - h) {
                scores[(h + t) * n + j] = v;
            }
            h += 4;
        }
    }

    let mut inv = [0f32; 64];
    let full = n - n % 8;
    for (h, inv_h) in inv.iter_mut().enumerate().take(rep) {
        let sc = &mut scores[h * n..(h + 1) * n];
        let p = sc.as_mut_ptr();
        let mut maxv = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(8) {
            maxv = _mm256_max_ps(maxv, _mm256_loadu_ps(p.add(i)));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), maxv);
        let max = lanes.iter().chain(&sc[full..]).fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let maxv = _mm256_set1_ps(max);
        let mut sumv = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), maxv));
            _mm256_storeu_ps(p.add(i), e);
            sumv = _mm256_add_ps(sumv, e);
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), sumv);
        let mut sum: f32 = lanes.iter().sum();
        for v in &mut sc[full..] {
            *v = (*v - max).exp();
            sum += *v;
        }
        *inv_h = 1.0 / sum;
    }

    for (h, &inv_h) in inv.iter().enumerate().take(rep) {
        let mut acc = [_mm256_setzero_ps(); HD];
        for (j, &slot) in a.keys.iter().enumerate() {
            let vp = a.v.as_ptr().add(row(slot));
            let p = _mm256_set1_ps(*scores.get_unchecked(h * n + j));
            for (i, o) in acc.iter_mut().enumerate() {
                *o = _mm256_fmadd_ps(p, _mm256_cvtph_ps(_mm_loadu_si128(vp.add(8 * i).cast())), *o);
            }
        }
        let s = _mm256_set1_ps(inv_h);
        let op = out.as_mut_ptr().add(h * hd);
        for (i, o) in acc.iter().enumerate() {
            _mm256_storeu_ps(op.add(8 * i), _mm256_mul_ps(*o, s));
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
