//! The machine's int8 multiply-accumulate peak at a SIMD level: the instruction sequence the
//! quantized matmuls are made of (AVX2: `vpmaddubsw` then `vpmaddwd` and an add, 32 products per
//! 256-bit step; AVX-512 VNNI: `vpdpbusd`, 64 per 512-bit step), run on registers only, many
//! independent chains per thread, on every worker thread at once. No matmul can beat it, so a
//! prefill's multiply-adds per second divided by it says how much of the machine the kernels
//! use (`cachet bench` prints both, measured in the same run with the same threads).

use super::dot::SimdLevel;
use super::CpuBackend;
use std::time::Instant;

/// Multiply-adds per thread per loop iteration of each level's loop.
#[cfg(target_arch = "x86_64")]
const AVX2_MACS: u64 = 8 * 32;
#[cfg(target_arch = "x86_64")]
const AVX512_MACS: u64 = 12 * 64;

/// The int8 peak of `backend`'s SIMD level on all its threads, in multiply-adds per second;
/// `None` at the scalar level (no SIMD integer dot product to measure). Takes about `seconds`.
pub fn int8_peak(backend: &CpuBackend, seconds: f64) -> Option<f64> {
    let level = backend.level();
    let per_iter = match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => AVX2_MACS,
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => AVX512_MACS,
        _ => return None,
    };
    let run = |iters: u64| -> f64 {
        let start = Instant::now();
        backend.pool.broadcast(|_| std::hint::black_box(spin(level, iters)));
        start.elapsed().as_secs_f64()
    };
    // Size the run from a short one, then keep the best of three (a shared machine only ever
    // makes a run slower).
    let mut iters = 1 << 14;
    while run(iters) < 0.01 && iters < 1 << 30 {
        iters *= 4;
    }
    let probe = run(iters).max(1e-6);
    let iters = ((iters as f64 * seconds / 3.0 / probe) as u64).max(1);
    let best = (0..3).map(|_| run(iters)).fold(f64::INFINITY, f64::min);
    let threads = backend.threads() as f64;
    Some(per_iter as f64 * iters as f64 * threads / best)
}

/// `iters` iterations of `level`'s loop on this thread; returns a value the optimiser cannot
/// drop.
fn spin(level: SimdLevel, iters: u64) -> i32 {
    match level {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `int8_peak` reaches here only with the backend's level, which the backend
        // checked this CPU supports when it was made.
        SimdLevel::Avx2 => unsafe { spin_avx2(iters) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        SimdLevel::Avx512 => unsafe { spin_avx512(iters) },
        _ => 0,
    }
}

/// Eight independent `maddubs → madd → add` chains per iteration; the operands pass through
/// `black_box` each iteration, so no product can be hoisted out of the loop.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn spin_avx2(iters: u64) -> i32 {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut a = _mm256_set1_epi8(3);
    let b = [
        _mm256_set1_epi8(-2),
        _mm256_set1_epi8(5),
        _mm256_set1_epi8(-7),
        _mm256_set1_epi8(1),
        _mm256_set1_epi8(4),
        _mm256_set1_epi8(-3),
        _mm256_set1_epi8(6),
        _mm256_set1_epi8(-1),
    ];
    let mut acc = [_mm256_setzero_si256(); 8];
    for _ in 0..iters {
        a = std::hint::black_box(a);
        for (x, w) in acc.iter_mut().zip(&b) {
            *x = _mm256_add_epi32(*x, _mm256_madd_epi16(_mm256_maddubs_epi16(a, *w), ones));
        }
    }
    let mut s = acc[0];
    for x in &acc[1..] {
        s = _mm256_add_epi32(s, *x);
    }
    _mm256_extract_epi32::<0>(s)
}

/// Twelve independent `dpbusd` chains per iteration (its latency is several cycles).
///
/// # Safety
/// The CPU must support AVX-512 F and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn spin_avx512(iters: u64) -> i32 {
    use std::arch::x86_64::*;
    let mut a = _mm512_set1_epi8(3);
    let b = _mm512_set1_epi8(-2);
    let mut acc = [_mm512_setzero_si512(); 12];
    for _ in 0..iters {
        a = std::hint::black_box(a);
        for x in acc.iter_mut() {
            *x = _mm512_dpbusd_epi32(*x, a, b);
        }
    }
    let mut s = acc[0];
    for x in &acc[1..] {
        s = _mm512_add_epi32(s, *x);
    }
    _mm512_reduce_add_epi32(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every SIMD level this CPU has gets a finite peak, one thread's far above what a scalar
    /// loop could do (10⁸ multiply-adds a second); the scalar level gets none.
    #[test]
    fn every_simd_level_has_a_measured_peak_and_the_scalar_level_none() {
        for &level in SimdLevel::ALL.iter().filter(|l| l.is_supported()) {
            let b = CpuBackend::with_level(1, level).unwrap();
            match (level, int8_peak(&b, 0.05)) {
                (SimdLevel::Scalar, p) => assert_eq!(p, None),
                (_, Some(p)) => assert!(p.is_finite() && p > 1e8, "{level:?}: {p}"),
                (_, None) => panic!("{level:?}: no peak"),
            }
        }
    }
}
