//! AVX-512 attention kernel for head sizes 64 and 128 (other sizes use the
//! scalar kernel): f16 K/V rows converted with `vcvtph2ps` once per task,
//! dot products of up to four heads reduced together, a vectorised `exp`,
//! and V accumulated for several heads per converted row.
//!
//! Safety: requires the features of `SimdLevel::Avx512`.

use super::Attend;
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

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub unsafe fn attend(a: &Attend<'_>, scores: &mut [f32], out: &mut [f32]) {
    match a.hd {
        64 if a.rep <= 64 => attend_hd::<4, 4>(a, scores, out),
        128 if a.rep <= 64 => attend_hd::<8, 2>(a, scores, out),
        _ => super::attend_scalar(a, scores, out),
    }
}

/// `HD` vectors of 16 per head; `G` heads share each converted V row.
#[inline(always)]
unsafe fn attend_hd<const HD: usize, const G: usize>(a: &Attend<'_>, scores: &mut [f32], out: &mut [f32]) {
    let (n, rep, hd) = (a.keys.len(), a.rep, HD * 16);
    let row = |slot: u32| slot as usize * a.kv_cols + a.offset;
    let scale = _mm_set1_ps(a.scale);

    // Scores: q_h · k_j for every key, four heads reduced at once.
    for (j, &slot) in a.keys.iter().enumerate() {
        let kp = a.k.as_ptr().add(row(slot));
        let mut kf = [_mm512_setzero_ps(); HD];
        for (i, k) in kf.iter_mut().enumerate() {
            *k = _mm512_cvtph_ps(_mm256_loadu_si256(kp.add(16 * i).cast()));
        }
        let mut h = 0;
        while h < rep {
            let mut parts = [_mm_setzero_ps(); 4];
            for (t, part) in parts.iter_mut().enumerate() {
                if h + t < rep {
                    let qp = a.q.as_ptr().add((h + t) * hd);
                    let mut acc = _mm512_mul_ps(_mm512_loadu_ps(qp), kf[0]);
                    for (i, k) in kf.iter().enumerate().skip(1) {
                        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(16 * i)), *k, acc);
                    }
                    let s = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps::<1>(acc));
                    *part = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
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

    // Softmax numerators exp(s - max); the 1/sum is applied to the output.
    let mut inv = [0f32; 64];
    let tail = (n % 16) as u32;
    let tail_mask: __mmask16 = ((1u32 << tail) - 1) as __mmask16;
    for (h, inv_h) in inv.iter_mut().enumerate().take(rep) {
        let sc = scores[h * n..(h + 1) * n].as_mut_ptr();
        let full = n - tail as usize;
        let mut maxv = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(16) {
            maxv = _mm512_max_ps(maxv, _mm512_loadu_ps(sc.add(i)));
        }
        let mut max = _mm512_reduce_max_ps(maxv);
        if tail > 0 {
            max = max.max(_mm512_mask_reduce_max_ps(tail_mask, _mm512_maskz_loadu_ps(tail_mask, sc.add(full))));
        }
        let maxv = _mm512_set1_ps(max);
        let mut sumv = _mm512_setzero_ps();
        for i in (0..full).step_by(16) {
            let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sc.add(i)), maxv));
            _mm512_storeu_ps(sc.add(i), e);
            sumv = _mm512_add_ps(sumv, e);
        }
        if tail > 0 {
            let e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail_mask, sc.add(full)), maxv));
            _mm512_mask_storeu_ps(sc.add(full), tail_mask, e);
            sumv = _mm512_mask_add_ps(sumv, tail_mask, sumv, e);
        }
        *inv_h = 1.0 / _mm512_reduce_add_ps(sumv);
    }

    // Output: Σ_j p_hj v_j for G heads per pass over V.
    let mut h0 = 0;
    while h0 < rep {
        let mut acc = [[_mm512_setzero_ps(); HD]; G];
        for (j, &slot) in a.keys.iter().enumerate() {
            let vp = a.v.as_ptr().add(row(slot));
            let mut vf = [_mm512_setzero_ps(); HD];
            for (i, v) in vf.iter_mut().enumerate() {
                *v = _mm512_cvtph_ps(_mm256_loadu_si256(vp.add(16 * i).cast()));
            }
            for (t, acc_t) in acc.iter_mut().enumerate() {
                if h0 + t < rep {
                    let p = _mm512_set1_ps(*scores.get_unchecked((h0 + t) * n + j));
                    for (o, v) in acc_t.iter_mut().zip(&vf) {
                        *o = _mm512_fmadd_ps(p, *v, *o);
                    }
                }
            }
        }
        for (t, acc_t) in acc.iter().enumerate() {
            if h0 + t < rep {
                let s = _mm512_set1_ps(inv[h0 + t]);
                let op = out.as_mut_ptr().add((h0 + t) * hd);
                for (i, o) in acc_t.iter().enumerate() {
                    _mm512_storeu_ps(op.add(16 * i), _mm512_mul_ps(*o, s));
                }
            }
        }
        h0 += G;
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
