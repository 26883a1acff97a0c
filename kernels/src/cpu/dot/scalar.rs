//! Portable dot products: the reference every SIMD path is tested against.
//!
//! Weight rows stay quantized; activations come quantized to `BlockQ8A`
//! (32-value formats) or `BlockQ8K` (K formats), and each block's products are
//! summed in integers. The SIMD paths combine the same exact integer partial
//! sums in other orders and agree within rounding (the AVX2 K-format kernels
//! reproduce these bit for bit).

use crate::quant::*;
use half::{bf16, f16};

pub fn q4_0(w: &[BlockQ4_0], x: &[BlockQ8A]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let mut isum = 0i32;
        for j in 0..16 {
            isum += (b.qs[j] & 0xF) as i32 * a.qs[j] as i32;
            isum += (b.qs[j] >> 4) as i32 * a.qs[j + 16] as i32;
        }
        isum -= 8 * a.sum;
        acc += (b.d.to_f32() * a.d) * isum as f32;
    }
    acc
}

pub fn q5_0(w: &[BlockQ5_0], x: &[BlockQ8A]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let qh = u32::from_le_bytes(b.qh);
        let mut isum = 0i32;
        for j in 0..16 {
            let lo = (b.qs[j] & 0xF) as u32 | (((qh >> j) & 1) << 4);
            let hi = (b.qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
            isum += lo as i32 * a.qs[j] as i32 + hi as i32 * a.qs[j + 16] as i32;
        }
        isum -= 16 * a.sum;
        acc += (b.d.to_f32() * a.d) * isum as f32;
    }
    acc
}

pub fn q8_0(w: &[BlockQ8_0], x: &[BlockQ8A]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let isum: i32 = b.qs.iter().zip(&a.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        acc += (b.d.to_f32() * a.d) * isum as f32;
    }
    acc
}

/// The float combination shared by the K formats with mins (`Q4_K`, `Q5_K`):
/// every path computes `sumi` and `summ` exactly and then this.
#[inline(always)]
pub(crate) fn combine_k_min(acc: f32, a: &BlockQ8K, d: f16, dmin: f16, sumi: i32, summ: i32) -> f32 {
    acc + (a.d * d.to_f32()) * sumi as f32 - (a.d * dmin.to_f32()) * summ as f32
}

/// Σ over sub-blocks of `m_j * (sum of the activations of sub-block j)`.
#[inline(always)]
pub(crate) fn k_mins(scales: &[u8; 12], bsums: &[i16; 16]) -> i32 {
    let mut summ = 0i32;
    for j in 0..8 {
        let (_, m) = scale_min_k4(j, scales);
        summ += m as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32);
    }
    summ
}

pub fn q4_k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for j in 0..4 {
            let (sc0, _) = scale_min_k4(2 * j, &b.scales);
            let (sc1, _) = scale_min_k4(2 * j + 1, &b.scales);
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let q = b.qs[32 * j + l];
                s0 += (q & 0xF) as i32 * a.qs[64 * j + l] as i32;
                s1 += (q >> 4) as i32 * a.qs[64 * j + 32 + l] as i32;
            }
            sumi += sc0 as i32 * s0 + sc1 as i32 * s1;
        }
        acc = combine_k_min(acc, a, b.d, b.dmin, sumi, k_mins(&b.scales, &a.bsums));
    }
    acc
}

pub fn q5_k(w: &[BlockQ5K], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for j in 0..4 {
            let (sc0, _) = scale_min_k4(2 * j, &b.scales);
            let (sc1, _) = scale_min_k4(2 * j + 1, &b.scales);
            let (mut s0, mut s1) = (0i32, 0i32);
            for l in 0..32 {
                let q = b.qs[32 * j + l];
                let h0 = ((b.qh[l] >> (2 * j)) & 1) << 4;
                let h1 = ((b.qh[l] >> (2 * j + 1)) & 1) << 4;
                s0 += ((q & 0xF) | h0) as i32 * a.qs[64 * j + l] as i32;
                s1 += ((q >> 4) | h1) as i32 * a.qs[64 * j + 32 + l] as i32;
            }
            sumi += sc0 as i32 * s0 + sc1 as i32 * s1;
        }
        acc = combine_k_min(acc, a, b.d, b.dmin, sumi, k_mins(&b.scales, &a.bsums));
    }
    acc
}

/// Σ over the 16 groups of `sc_g * 32 * (sum of the activations of group g)`:
/// the correction that turns a dot with the unsigned `q + 32` into one with `q`.
#[inline(always)]
pub(crate) fn q6_k_offset(scales: &[i8; 16], bsums: &[i16; 16]) -> i32 {
    scales.iter().zip(bsums).map(|(&s, &b)| s as i32 * b as i32).sum::<i32>() * 32
}

pub fn q6_k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.iter().zip(x) {
        // Products with the unsigned 6-bit values per 16-group.
        let mut group = [0i32; 16];
        for half in 0..2 {
            let (ql, qh) = (&b.ql[64 * half..], &b.qh[32 * half..]);
            let aq = &a.qs[128 * half..];
            for l in 0..32 {
                let q1 = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
                let q2 = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                let q3 = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                let q4 = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                let g = 8 * half + l / 16;
                group[g] += q1 as i32 * aq[l] as i32;
                group[g + 2] += q2 as i32 * aq[l + 32] as i32;
                group[g + 4] += q3 as i32 * aq[l + 64] as i32;
                group[g + 6] += q4 as i32 * aq[l + 96] as i32;
            }
        }
        let sumi: i32 = group.iter().zip(&b.scales).map(|(&s, &c)| s * c as i32).sum();
        let sumi = sumi - q6_k_offset(&b.scales, &a.bsums);
        acc += (a.d * b.d.to_f32()) * sumi as f32;
    }
    acc
}

pub fn f32(w: &[f32], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| a * b).sum()
}

pub fn f16(w: &[f16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| a.to_f32() * b).sum()
}

pub fn bf16(w: &[bf16], x: &[f32]) -> f32 {
    w.iter().zip(x).map(|(a, b)| a.to_f32() * b).sum()
}
