//! AVX-512 (F, BW, DQ, VL, VNNI) dot products: `vpdpbusd` sums four `u8 × i8`
//! products into each i32 lane, so weights are used in their unsigned
//! (offset) form and corrected once per block with the activations' sum.
//!
//! Safety: every function here requires the features of `SimdLevel::Avx512`;
//! `Kernels::for_level` hands them out only after detecting them.

use super::avx2::{bits32, nibbles32};
use super::scalar::{combine_k_min, k_mins, q6_k_offset};
use crate::quant::*;
use half::{bf16, f16};
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

#[inline(always)]
unsafe fn load256(p: *const u8) -> __m256i {
    unsafe { _mm256_loadu_si256(p.cast()) }
}

#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// The unsigned 32 weights of one block, and the offset to correct by.
trait Block32: Block {
    const OFFSET: i32;
    fn d(&self) -> f16;
    unsafe fn weights(&self) -> __m256i;
}

impl Block32 for BlockQ4_0 {
    const OFFSET: i32 = 8;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        unsafe { nibbles32(self.qs.as_ptr()) }
    }
}

impl Block32 for BlockQ5_0 {
    const OFFSET: i32 = 16;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        unsafe { _mm256_or_si256(nibbles32(self.qs.as_ptr()), bits32(u32::from_le_bytes(self.qh), 0x10)) }
    }
}

impl Block32 for BlockQ8_0 {
    const OFFSET: i32 = 128;
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    unsafe fn weights(&self) -> __m256i {
        unsafe { _mm256_xor_si256(load256(self.qs.as_ptr().cast()), _mm256_set1_epi8(-128)) }
    }
}

/// Two blocks per 512-bit step; an odd last block in a 256-bit step.
#[inline(always)]
unsafe fn dot32<B: Block32>(w: &[B], x: &[BlockQ8A]) -> f32 {
    let n = w.len().min(x.len());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    unsafe {
        while i + 2 <= n {
            let (b0, b1, a0, a1) = (&w[i], &w[i + 1], &x[i], &x[i + 1]);
            let wv = join(b0.weights(), b1.weights());
            let xv = join(load256(a0.qs.as_ptr().cast()), load256(a1.qs.as_ptr().cast()));
            #[rustfmt::skip]
            let init = _mm512_setr_epi32(
                -B::OFFSET * a0.sum, 0, 0, 0, 0, 0, 0, 0,
                -B::OFFSET * a1.sum, 0, 0, 0, 0, 0, 0, 0,
            );
            let p = _mm512_dpbusd_epi32(init, wv, xv);
            let d0 = _mm256_set1_ps(f16_to_f32(b0.d()) * a0.d);
            let d1 = _mm256_set1_ps(f16_to_f32(b1.d()) * a1.d);
            let d = _mm512_insertf32x8(_mm512_castps256_ps512(d0), d1, 1);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), d, acc);
            i += 2;
        }
        let mut sum = _mm512_reduce_add_ps(acc);
        if i < n {
            let (b, a) = (&w[i], &x[i]);
            let init = _mm256_setr_epi32(-B::OFFSET * a.sum, 0, 0, 0, 0, 0, 0, 0);
            let p = _mm256_dpbusd_epi32(init, b.weights(), load256(a.qs.as_ptr().cast()));
            let d = _mm256_set1_ps(f16_to_f32(b.d()) * a.d);
            sum += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(p), d));
        }
        sum
    }
}

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    _mm512_reduce_add_ps(_mm512_insertf32x8(_mm512_setzero_ps(), v, 0))
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4_0(w: &[BlockQ4_0], x: &[BlockQ8A]) -> f32 {
    unsafe { dot32(w, x) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q5_0(w: &[BlockQ5_0], x: &[BlockQ8A]) -> f32 {
    unsafe { dot32(w, x) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q8_0(w: &[BlockQ8_0], x: &[BlockQ8A]) -> f32 {
    unsafe { dot32(w, x) }
}

#[inline(always)]
unsafe fn splat2(lo: i32, hi: i32) -> __m512i {
    join(_mm256_set1_epi32(lo), _mm256_set1_epi32(hi))
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q4_k(w: &[BlockQ4K], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    let low = _mm256_set1_epi8(0x0F);
    for (b, a) in w.iter().zip(x) {
        let mut iacc = _mm512_setzero_si512();
        for j in 0..4 {
            let (sc0, _) = scale_min_k4(2 * j, &b.scales);
            let (sc1, _) = scale_min_k4(2 * j + 1, &b.scales);
            unsafe {
                let q = load256(b.qs[32 * j..].as_ptr());
                let wv = join(_mm256_and_si256(q, low), _mm256_and_si256(_mm256_srli_epi16(q, 4), low));
                let xv = _mm512_loadu_si512(a.qs[64 * j..].as_ptr().cast());
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
                iacc = _mm512_add_epi32(iacc, _mm512_mullo_epi32(p, splat2(sc0 as i32, sc1 as i32)));
            }
        }
        let sumi = _mm512_reduce_add_epi32(iacc);
        acc = combine_k_min(acc, a, b.d, b.dmin, sumi, k_mins(&b.scales, &a.bsums));
    }
    acc
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q5_k(w: &[BlockQ5K], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    let low = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    for (b, a) in w.iter().zip(x) {
        let mut iacc = _mm512_setzero_si512();
        let qh = unsafe { load256(b.qh.as_ptr()) };
        for j in 0..4 {
            let (sc0, _) = scale_min_k4(2 * j, &b.scales);
            let (sc1, _) = scale_min_k4(2 * j + 1, &b.scales);
            unsafe {
                let q = load256(b.qs[32 * j..].as_ptr());
                let h0 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)), one);
                let h1 = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32 + 1)), one);
                let lo = _mm256_or_si256(_mm256_and_si256(q, low), _mm256_slli_epi16(h0, 4));
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low), _mm256_slli_epi16(h1, 4));
                let xv = _mm512_loadu_si512(a.qs[64 * j..].as_ptr().cast());
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), join(lo, hi), xv);
                iacc = _mm512_add_epi32(iacc, _mm512_mullo_epi32(p, splat2(sc0 as i32, sc1 as i32)));
            }
        }
        let sumi = _mm512_reduce_add_epi32(iacc);
        acc = combine_k_min(acc, a, b.d, b.dmin, sumi, k_mins(&b.scales, &a.bsums));
    }
    acc
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn q6_k(w: &[BlockQ6K], x: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    let low = _mm512_set1_epi8(0x0F);
    let three = _mm256_set1_epi8(3);
    for (b, a) in w.iter().zip(x) {
        let mut iacc = _mm512_setzero_si512();
        let scales = unsafe { _mm_loadu_si128(b.scales.as_ptr().cast()) };
        for half in 0..2 {
            unsafe {
                let ql = _mm512_loadu_si512(b.ql[64 * half..].as_ptr().cast());
                let qh = load256(b.qh[32 * half..].as_ptr());
                let hb = |shift: i32| _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift)), three);
                let ha = _mm512_slli_epi16(join(hb(0), hb(2)), 4);
                let hz = _mm512_slli_epi16(join(hb(4), hb(6)), 4);
                let qa = _mm512_or_si512(_mm512_and_si512(ql, low), ha);
                let qz = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low), hz);
                let xs = a.qs[128 * half..].as_ptr();
                let pa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qa, _mm512_loadu_si512(xs.cast()));
                let pz = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qz, _mm512_loadu_si512(xs.add(64).cast()));
                // Each i32 lane covers 4 values; a 16-value group's scale covers 4 lanes.
                let g = 8 * half as i8;
                #[rustfmt::skip]
                let idx_a = _mm_setr_epi8(g, g, g, g, g + 1, g + 1, g + 1, g + 1,
                                          g + 2, g + 2, g + 2, g + 2, g + 3, g + 3, g + 3, g + 3);
                let idx_z = _mm_add_epi8(idx_a, _mm_set1_epi8(4));
                let sa = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, idx_a));
                let sz = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(scales, idx_z));
                iacc = _mm512_add_epi32(iacc, _mm512_mullo_epi32(pa, sa));
                iacc = _mm512_add_epi32(iacc, _mm512_mullo_epi32(pz, sz));
            }
        }
        let sumi = _mm512_reduce_add_epi32(iacc) - q6_k_offset(&b.scales, &a.bsums);
        acc += (a.d * b.d.to_f32()) * sumi as f32;
    }
    acc
}

/// Dense dot with 16-wide FMA; `load(i)` widens the 16 weights at `i` to f32.
#[inline(always)]
unsafe fn dense(n: usize, x: &[f32], load: impl Fn(usize) -> __m512, tail: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    unsafe {
        while i + 64 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(load(i + 16 * k), _mm512_loadu_ps(x.as_ptr().add(i + 16 * k)), *a);
            }
            i += 64;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(load(i), _mm512_loadu_ps(x.as_ptr().add(i)), acc[0]);
            i += 16;
        }
        let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        let mut sum = _mm512_reduce_add_ps(s);
        while i < n {
            sum += tail(i) * x[i];
            i += 1;
        }
        sum
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn f32(w: &[f32], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    unsafe { dense(n, x, |i| _mm512_loadu_ps(w.as_ptr().add(i)), |i| w[i]) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn f16(w: &[f16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    unsafe { dense(n, x, |i| _mm512_cvtph_ps(load256(w.as_ptr().add(i).cast())), |i| w[i].to_f32()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")]
pub unsafe fn bf16(w: &[bf16], x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let load = |i: usize| unsafe {
        let h = _mm512_cvtepu16_epi32(load256(w.as_ptr().add(i).cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32(h, 16))
    };
    unsafe { dense(n, x, load, |i| w[i].to_f32()) }
}
