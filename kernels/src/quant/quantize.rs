//! Quantization from f32. The weight quantizers are simple (per-block
//! min/max, no search): they exist to write test models in every format, not
//! to compete with llama.cpp's `quantize`. The activation quantizers are the
//! hot path of the integer dot products.

use super::*;
use half::{bf16, f16};

/// Quantizes `x` into `out` in `dtype` (`out.len()` must be
/// `dtype.bytes_for(x.len())`).
pub fn quantize_row(dtype: DType, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let expected = dtype.bytes_for(x.len())?;
    if out.len() != expected {
        return Err(QuantError::ByteLength { dtype, expected, got: out.len() });
    }
    let block = dtype.block_len();
    let size = dtype.block_bytes();
    for (xs, o) in x.chunks_exact(block).zip(out.chunks_exact_mut(size)) {
        match dtype {
            DType::F32 => o.copy_from_slice(&xs[0].to_le_bytes()),
            DType::F16 => o.copy_from_slice(&f16::from_f32(xs[0]).to_le_bytes()),
            DType::BF16 => o.copy_from_slice(&bf16::from_f32(xs[0]).to_le_bytes()),
            DType::Q4_0 => write(o, &q4_0(xs)),
            DType::Q5_0 => write(o, &q5_0(xs)),
            DType::Q8_0 => write(o, &q8_0(xs)),
            DType::Q4_K => write(o, &q4_k(xs)),
            DType::Q5_K => write(o, &q5_k(xs)),
            DType::Q6_K => write(o, &q6_k(xs)),
        }
    }
    Ok(())
}

fn write<T: Block>(out: &mut [u8], block: &T) {
    out.copy_from_slice(block_bytes(std::slice::from_ref(block)));
}

/// The value of largest magnitude, with its sign.
fn signed_max(xs: &[f32]) -> f32 {
    xs.iter().fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

fn q4_0(xs: &[f32]) -> BlockQ4_0 {
    let max = signed_max(xs);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = q(xs[j]) | (q(xs[j + 16]) << 4);
    }
    BlockQ4_0 { d: f16::from_f32(d), qs }
}

fn q5_0(xs: &[f32]) -> BlockQ5_0 {
    let max = signed_max(xs);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = |v: f32| ((v * id + 16.5) as i32).clamp(0, 31) as u32;
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        let (a, b) = (q(xs[j]), q(xs[j + 16]));
        qs[j] = ((a & 0xF) | ((b & 0xF) << 4)) as u8;
        qh |= ((a >> 4) << j) | ((b >> 4) << (j + 16));
    }
    BlockQ5_0 { d: f16::from_f32(d), qh: qh.to_le_bytes(), qs }
}

fn q8_0(xs: &[f32]) -> BlockQ8_0 {
    let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(xs) {
        *q = (v * id).round() as i8;
    }
    BlockQ8_0 { d: f16::from_f32(d), qs }
}

/// Per-sub-block affine parameters of a K block: for each sub-block, the scale
/// and the (non-negative) offset to subtract, quantized to 6 bits against the
/// block's `d`/`dmin`. Returns `(d, dmin, scales, mins)`.
fn k_affine(xs: &[f32], sub: usize, levels: f32) -> (f32, f32, Vec<u8>, Vec<u8>) {
    let n = xs.len() / sub;
    let mut scale = vec![0f32; n];
    let mut min = vec![0f32; n];
    for (i, c) in xs.chunks_exact(sub).enumerate() {
        let lo = c.iter().fold(0.0f32, |m, &v| m.min(v));
        let hi = c.iter().fold(f32::MIN, |m, &v| m.max(v));
        scale[i] = (hi - lo) / levels;
        min[i] = -lo;
    }
    let max_scale = scale.iter().fold(0.0f32, |m, &v| m.max(v));
    let max_min = min.iter().fold(0.0f32, |m, &v| m.max(v));
    let d = max_scale / 63.0;
    let dmin = max_min / 63.0;
    let q6 = |v: f32, d: f32| {
        if d > 0.0 {
            (v / d).round().clamp(0.0, 63.0) as u8
        } else {
            0
        }
    };
    let sc = scale.iter().map(|&s| q6(s, d)).collect();
    let m = min.iter().map(|&s| q6(s, dmin)).collect();
    (d, dmin, sc, m)
}

fn pack_scales_k4(sc: &[u8], m: &[u8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] = sc[j] & 63;
            q[j + 4] = m[j] & 63;
        } else {
            q[j + 4] = (sc[j] & 0xF) | ((m[j] & 0xF) << 4);
            q[j - 4] |= (sc[j] >> 4) << 6;
            q[j] |= (m[j] >> 4) << 6;
        }
    }
    q
}

/// Quantizes one value of a K sub-block with 6-bit scale `sc` and min `m`.
fn k_level(v: f32, d: f32, dmin: f32, sc: u8, m: u8, max: i32) -> i32 {
    let (ds, dm) = (d * sc as f32, dmin * m as f32);
    if ds == 0.0 {
        return 0;
    }
    (((v + dm) / ds).round() as i32).clamp(0, max)
}

fn q4_k(xs: &[f32]) -> BlockQ4K {
    let (d, dmin, sc, m) = k_affine(xs, 32, 15.0);
    let (d, dmin) = (f16::from_f32(d), f16::from_f32(dmin));
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let mut qs = [0u8; 128];
    for j in 0..4 {
        for l in 0..32 {
            let lo = k_level(xs[64 * j + l], df, dminf, sc[2 * j], m[2 * j], 15);
            let hi = k_level(xs[64 * j + 32 + l], df, dminf, sc[2 * j + 1], m[2 * j + 1], 15);
            qs[32 * j + l] = (lo | (hi << 4)) as u8;
        }
    }
    BlockQ4K { d, dmin, scales: pack_scales_k4(&sc, &m), qs }
}

fn q5_k(xs: &[f32]) -> BlockQ5K {
    let (d, dmin, sc, m) = k_affine(xs, 32, 31.0);
    let (d, dmin) = (f16::from_f32(d), f16::from_f32(dmin));
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let mut qs = [0u8; 128];
    let mut qh = [0u8; 32];
    for j in 0..4 {
        for l in 0..32 {
            let lo = k_level(xs[64 * j + l], df, dminf, sc[2 * j], m[2 * j], 31);
            let hi = k_level(xs[64 * j + 32 + l], df, dminf, sc[2 * j + 1], m[2 * j + 1], 31);
            qs[32 * j + l] = ((lo & 0xF) | ((hi & 0xF) << 4)) as u8;
            qh[l] |= (((lo >> 4) << (2 * j)) | ((hi >> 4) << (2 * j + 1))) as u8;
        }
    }
    BlockQ5K { d, dmin, scales: pack_scales_k4(&sc, &m), qh, qs }
}

fn q6_k(xs: &[f32]) -> BlockQ6K {
    let mut scale = [0f32; 16];
    for (i, c) in xs.chunks_exact(16).enumerate() {
        scale[i] = signed_max(c) / -32.0;
    }
    let max_scale = signed_max(&scale);
    let d = if max_scale != 0.0 { max_scale / -128.0 } else { 0.0 };
    let dh = f16::from_f32(d);
    let df = dh.to_f32();
    let mut scales = [0i8; 16];
    for (s, &v) in scales.iter_mut().zip(&scale) {
        *s = if df != 0.0 { (v / df).round().clamp(-128.0, 127.0) as i8 } else { 0 };
    }
    let mut q = [0u8; 256];
    for (i, v) in q.iter_mut().enumerate() {
        let ds = df * scales[i / 16] as f32;
        let level = if ds != 0.0 { (xs[i] / ds).round() as i32 } else { 0 };
        *v = (level.clamp(-32, 31) + 32) as u8;
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for half in 0..2 {
        let (q, ql, qh) = (&q[128 * half..], &mut ql[64 * half..], &mut qh[32 * half..]);
        for l in 0..32 {
            let (q1, q2, q3, q4) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
            ql[l] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[l + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    BlockQ6K { ql, qh, scales, d: dh }
}

/// `f32::round` (halves away from zero) in operations a compiler vectorizes: `v − trunc(v)` is
/// exact, so this is the same value for every input, NaN and infinities included.
#[inline(always)]
fn round_away(v: f32) -> f32 {
    let t = v.trunc();
    if (v - t).abs() >= 0.5 {
        t + 1f32.copysign(v)
    } else {
        t
    }
}

/// The largest `|v|` (`f32::max` ignores NaN, as a fold over `xs` does), in 16 lanes so that it
/// vectorizes: `max` is exact, so the order does not change the result.
#[inline(always)]
fn amax(xs: &[f32]) -> f32 {
    let mut m = [0f32; 16];
    let mut chunks = xs.chunks_exact(16);
    for c in &mut chunks {
        for (m, v) in m.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    let tail = chunks.remainder().iter().fold(0f32, |m, v| m.max(v.abs()));
    m.iter().fold(tail, |a, &b| a.max(b))
}

/// `v.round() as i8` (saturating; NaN gives 0), through `i32` so that it vectorizes.
#[inline(always)]
fn to_i8(v: f32) -> i8 {
    let r = round_away(v).clamp(-128.0, 127.0);
    let r = if r.is_nan() { 0.0 } else { r };
    // SAFETY: `r` is an integer in -128..=127 (not NaN, not infinite).
    unsafe { r.to_int_unchecked::<i32>() as i8 }
}

/// Quantizes activations for the 32-value formats: per block, `d = amax/127`
/// and `q = round(x/d)`, plus the block's sum of `q`. Inlined into each SIMD level's copy
/// (see `simd`).
#[inline(always)]
pub fn quantize_q8a(x: &[f32], out: &mut [BlockQ8A]) {
    debug_assert_eq!(x.len(), out.len() * 32);
    for (xs, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let d = amax(xs) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = to_i8(v * id);
        }
        b.d = d;
        b.sum = b.qs.iter().map(|&q| q as i32).sum();
    }
}

/// Quantizes activations for the K formats: per 256 values, `d = amax/127`,
/// `q = round(x/d)`, and the sum of every 16 and every 32 `q`. Inlined into each SIMD level's copy (see
/// `simd`).
#[inline(always)]
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), out.len() * 256);
    for (xs, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let d = amax(xs) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in b.qs.iter_mut().zip(xs) {
            *q = to_i8(v * id);
        }
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        for ((m, s), pair) in b.msum.iter_mut().zip(&mut b.ssums).zip(b.bsums.chunks_exact(2)) {
            // At most 32 · 128 in magnitude.
            *s = pair[0] + pair[1];
            *m = d * *s as f32;
        }
        b.d = d;
    }
}

/// The activation quantizers compiled for the x86 SIMD levels (the CPU backend's kernel table
/// picks them; the portable copies above are the scalar level's). Every operation is exact or
/// the same IEEE operation at every level, so all copies give the same bits.
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd {
    use super::*;

    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8a_avx2(x: &[f32], out: &mut [BlockQ8A]) {
        quantize_q8a(x, out)
    }

    /// # Safety
    /// As `q8a_avx2`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn q8k_avx2(x: &[f32], out: &mut [BlockQ8K]) {
        quantize_q8k(x, out)
    }

    /// # Safety
    /// The CPU must have AVX-512 F, BW, DQ and VL (and AVX2, FMA, F16C).
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    pub unsafe fn q8a_avx512(x: &[f32], out: &mut [BlockQ8A]) {
        quantize_q8a(x, out)
    }

    /// # Safety
    /// As `q8a_avx512`.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    pub unsafe fn q8k_avx512(x: &[f32], out: &mut [BlockQ8K]) {
        quantize_q8k(x, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed as f32).sin() * (1.0 + (i % 7) as f32 * 0.3)).collect()
    }

    /// Every weight format round-trips within the error its bit width allows.
    #[test]
    fn quantize_then_dequantize_is_close() {
        let x = wave(512, 3);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for dtype in DType::ALL {
            let mut bytes = vec![0u8; dtype.bytes_for(x.len()).unwrap()];
            quantize_row(dtype, &x, &mut bytes).unwrap();
            let mut y = vec![0f32; x.len()];
            // Vec<u8> from the global allocator is at least 8-aligned here.
            dequantize_row(dtype, &bytes, &mut y).unwrap();
            let bits = match dtype {
                DType::F32 => 24.0,
                DType::F16 => 10.0,
                DType::BF16 => 7.0,
                DType::Q8_0 => 7.0,
                DType::Q6_K => 4.0,
                DType::Q5_0 | DType::Q5_K => 3.0,
                DType::Q4_0 | DType::Q4_K => 2.0,
            };
            let tol = amax * 2f32.powf(-bits);
            let err = x.iter().zip(&y).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(err <= tol, "{dtype}: max error {err} > {tol}");
        }
    }

    #[test]
    fn activation_blocks_carry_their_sums() {
        let x = wave(512, 9);
        let mut a = vec![BlockQ8A::default(); 16];
        quantize_q8a(&x, &mut a);
        for b in &a {
            assert_eq!(b.sum, b.qs.iter().map(|&q| q as i32).sum::<i32>());
        }
        let mut k = vec![BlockQ8K::default(); 2];
        quantize_q8k(&x, &mut k);
        for (i, b) in k.iter().enumerate() {
            for (g, s) in b.bsums.iter().enumerate() {
                assert_eq!(*s as i32, b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum::<i32>());
            }
            let back: Vec<f32> = b.qs.iter().map(|&q| q as f32 * b.d).collect();
            for (u, v) in back.iter().zip(&x[256 * i..]) {
                assert!((u - v).abs() <= b.d * 0.5 + 1e-6);
            }
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let x = wave(40, 1);
        let mut out = vec![0u8; 100];
        assert!(matches!(quantize_row(DType::Q4_0, &x, &mut out), Err(QuantError::PartialBlock { .. })));
        let mut y = vec![0f32; 32];
        assert!(matches!(dequantize_row(DType::Q8_0, &[0u8; 30], &mut y), Err(QuantError::ByteLength { .. })));
        // A row length a file may claim whose size overflows (found by fuzzing the GGUF reader).
        let huge = usize::MAX / 32 * 32;
        assert!(matches!(DType::Q8_0.bytes_for(huge), Err(QuantError::TooLarge { .. })));
        assert!(matches!(DType::F32.bytes_for(usize::MAX), Err(QuantError::TooLarge { .. })));
    }
}
