//! Every SIMD path against the scalar reference, per format: within 1e-5 of
//! the sum of absolute products (the paths combine exact integer partial sums
//! in different orders). The AVX2 kernels of the quantized formats reduce each block's
//! integer sum exactly and then take the scalar path's float steps, so there they must agree
//! bit for bit.

use cachet_kernels::backend::{AttnSeq, AttnShape, Backend, KvFormat, KvLayout, RopeConfig, RopeStyle};
use cachet_kernels::cpu::{CpuBackend, Kernels, SimdLevel};
use cachet_kernels::quant::*;
use cachet_kernels::tensor::{Bytes, HostTensor};
use half::{bf16, f16};

use cachet_kernels::testing::Lcg;

/// Every kernel table this CPU runs: each level, and the AVX-512 level with the K formats' and
/// the 32-value formats' AVX2 kernels too (the per-CPU choices; `Kernels::variants`).
fn levels() -> Vec<Kernels> {
    let v = Kernels::variants();
    println!(
        "levels on this CPU: {:?}",
        v.iter().map(|d| (d.level, d.k_level, d.q32_level, d.few_level)).collect::<Vec<_>>()
    );
    v
}

/// A two-thread backend for each of [`levels`].
fn backends() -> Vec<(Kernels, CpuBackend)> {
    levels().into_iter().map(|k| (k, CpuBackend::with_kernels(2, k).unwrap())).collect()
}

fn quantized(dtype: DType, x: &[f32]) -> Bytes {
    let mut b = vec![0u8; dtype.bytes_for(x.len()).unwrap()];
    quantize_row(dtype, x, &mut b).unwrap();
    Bytes::copy_from(&b)
}

/// Σ|w·x| from dequantized weights and activations, the scale of the error.
fn magnitude(dtype: DType, w: &Bytes, x: &[f32]) -> f32 {
    let mut wd = vec![0f32; x.len()];
    dequantize_row(dtype, w.as_slice(), &mut wd).unwrap();
    wd.iter().zip(x).map(|(a, b)| (a * b).abs()).sum()
}

fn dot(d: &Kernels, dtype: DType, w: &Bytes, x: &[f32]) -> f32 {
    let b = w.as_slice();
    let q8a = || {
        let mut a = vec![BlockQ8A::default(); x.len() / 32];
        quantize_q8a(x, &mut a);
        a
    };
    let q8k = || {
        let mut a = vec![BlockQ8K::default(); x.len() / 256];
        quantize_q8k(x, &mut a);
        a
    };
    match dtype {
        DType::F32 => (d.f32)(cast_blocks(b).unwrap(), x),
        DType::F16 => (d.f16)(cast_blocks::<f16>(b).unwrap(), x),
        DType::BF16 => (d.bf16)(cast_blocks::<bf16>(b).unwrap(), x),
        DType::Q4_0 => (d.q4_0)(cast_blocks(b).unwrap(), &q8a()),
        DType::Q5_0 => (d.q5_0)(cast_blocks(b).unwrap(), &q8a()),
        DType::Q8_0 => (d.q8_0)(cast_blocks(b).unwrap(), &q8a()),
        DType::Q4_K => (d.q4_k)(cast_blocks(b).unwrap(), &q8k()),
        DType::Q5_K => (d.q5_k)(cast_blocks(b).unwrap(), &q8k()),
        DType::Q6_K => (d.q6_k)(cast_blocks(b).unwrap(), &q8k()),
    }
}

/// Whether `d`'s kernels for `dtype` are AVX2's, which give the scalar path's bits.
fn avx2_is_scalar(d: &Kernels, dtype: DType) -> bool {
    match dtype {
        DType::Q4_K | DType::Q5_K | DType::Q6_K => d.k_level == SimdLevel::Avx2,
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => d.q32_level == SimdLevel::Avx2,
        _ => false,
    }
}

#[test]
fn every_simd_dot_matches_scalar() {
    let scalar = Kernels::scalar();
    let mut rng = Lcg(7);
    for d in levels() {
        for dtype in DType::ALL {
            // Lengths with odd block counts and (for dense) ragged tails.
            for &n in &[256usize, 768, 2304, 4864] {
                let n = if dtype.is_quantized() { n } else { n + 13 };
                for trial in 0..4 {
                    let scale = [1.0, 0.01, 100.0, 3.0][trial];
                    let w = quantized(dtype, &rng.vec(n, scale));
                    let x = rng.vec(n, 2.0);
                    let (a, b) = (dot(&scalar, dtype, &w, &x), dot(&d, dtype, &w, &x));
                    if avx2_is_scalar(&d, dtype) {
                        assert_eq!(a.to_bits(), b.to_bits(), "{:?} {dtype} n={n}: {a} vs {b}", d.level);
                    }
                    let tol = 1e-5 * magnitude(dtype, &w, &x) + 1e-30;
                    assert!((a - b).abs() <= tol, "{:?} {dtype} n={n}: {a} vs {b} (tol {tol})", d.level);
                }
            }
        }
    }
}

/// The quantized dot product stays close to the exact dot of the dequantized
/// weights with the unquantized activations (activation quantization only).
#[test]
fn quantized_dot_is_close_to_the_exact_one() {
    let mut rng = Lcg(99);
    let d = Kernels::for_level(SimdLevel::detect()).unwrap();
    for dtype in DType::ALL {
        let n = 1024;
        let w = quantized(dtype, &rng.vec(n, 1.0));
        let x = rng.vec(n, 1.0);
        let mut wd = vec![0f32; n];
        dequantize_row(dtype, w.as_slice(), &mut wd).unwrap();
        let exact: f64 = wd.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        let got = dot(&d, dtype, &w, &x) as f64;
        let tol = 0.01 * magnitude(dtype, &w, &x) as f64;
        assert!((exact - got).abs() <= tol, "{dtype}: {got} vs {exact}");
    }
}

fn matrix(cpu: &CpuBackend, dtype: DType, rows: usize, cols: usize, rng: &mut Lcg) -> cachet_kernels::cpu::CpuMatrix {
    let t = HostTensor::new(dtype, vec![rows, cols], quantized(dtype, &rng.vec(rows * cols, 1.0))).unwrap();
    cpu.load(t).unwrap()
}

/// Every level's matmul gives each output row exactly what a single-row call
/// gives (batch invariance), for every format, with an even and (for the
/// 32-value formats) an odd number of blocks per row.
#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let mut rng = Lcg(3);
    for (kernels, cpu) in backends() {
        let level = (kernels.level, kernels.k_level, kernels.q32_level);
        for (dtype, cols) in DType::ALL.into_iter().flat_map(|d| [(d, 512), (d, 544)]) {
            if cols % dtype.block_len() != 0 {
                continue;
            }
            let (rows, t) = (37, 70);
            let w = matrix(&cpu, dtype, rows, cols, &mut rng);
            let xs = rng.vec(t * cols, 1.0);
            let (mut x, mut y) = (cpu.buf(), cpu.buf());
            cpu.upload(&mut x, t, cols, &xs);
            cpu.matmul(&x, &mut [(&w, &mut y)]);
            for ti in [0, 1, 63, 64, 69] {
                let (mut x1, mut y1) = (cpu.buf(), cpu.buf());
                cpu.upload(&mut x1, 1, cols, &xs[ti * cols..(ti + 1) * cols]);
                cpu.matmul(&x1, &mut [(&w, &mut y1)]);
                assert_eq!(&y.data[ti * rows..(ti + 1) * rows], &y1.data[..], "{level:?} {dtype} {cols} row {ti}");
            }
        }
    }
}

/// `matmul_picked` (a mixture of experts' grouped call: every input times its picked weight of
/// each group, in one parallel region) gives each output bit for bit what a `matmul` of its own
/// gives, at every level and in every format, for one-token inputs (decode) and inputs of
/// several rows, with the picks out of order and weights of one group left out.
#[test]
fn picked_matmuls_equal_their_own_calls() {
    let mut rng = Lcg(41);
    for (kernels, cpu) in backends() {
        let level = (kernels.level, kernels.k_level, kernels.q32_level);
        for dtype in DType::ALL {
            let (rows, cols) = (44, 512);
            let group = |rng: &mut Lcg| (0..5).map(|_| matrix(&cpu, dtype, rows, cols, rng)).collect::<Vec<_>>();
            let (gates, ups) = (group(&mut rng), group(&mut rng));
            let pick = [3, 0, 4];
            for t in [1, 3] {
                let xs: Vec<_> = (0..pick.len() + 1)
                    .map(|_| {
                        let mut x = cpu.buf();
                        cpu.upload(&mut x, t, cols, &rng.vec(t * cols, 1.0));
                        x
                    })
                    .collect();
                let bufs = || (0..pick.len()).map(|_| cpu.buf()).collect::<Vec<_>>();
                let (mut g, mut u) = (bufs(), bufs());
                cpu.matmul_picked(&xs, &pick, &mut [(&gates, &mut g), (&ups, &mut u)]);
                for (i, &p) in pick.iter().enumerate() {
                    let (mut g1, mut u1) = (cpu.buf(), cpu.buf());
                    cpu.matmul(&xs[i], &mut [(&gates[p], &mut g1)]);
                    cpu.matmul(&xs[i], &mut [(&ups[p], &mut u1)]);
                    assert_eq!((g[i].rows, g[i].cols), (t, rows), "{level:?} {dtype}");
                    assert_eq!(g[i].data, g1.data, "{level:?} {dtype} t={t} input {i}: gate");
                    assert_eq!(u[i].data, u1.data, "{level:?} {dtype} t={t} input {i}: up");
                }
            }
        }
    }
}

/// Quantized matmuls at every level (AVX2: 8 rows side by side, repacked per job; for the K
/// formats the rows left over in tiles, for the 32-value formats the last group padded) give
/// each element the single dot product's value — at AVX2 bit for bit the scalar path's — for
/// row counts that leave 8-row groups, 4-row tiles and single rows, and token counts that leave
/// partial 4-token tiles (one token: the decode paths).
#[test]
fn quantized_matmul_equals_the_dot_product() {
    let mut rng = Lcg(11);
    let scalar = Kernels::scalar();
    for (kernels, cpu) in backends() {
        let level = (kernels.level, kernels.k_level, kernels.q32_level);
        for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
            for (rows, cols, t) in [
                (203, 768, 70),
                (45, 2048, 9),
                (37, 768, 6),
                (16, 256, 4),
                (203, 2048, 1),
                (7, 768, 2),
                (13, 512, 3),
                (11, 544, 5),
            ] {
                if cols % dtype.block_len() != 0 {
                    continue;
                }
                let wf = rng.vec(rows * cols, 1.0);
                let wb = quantized(dtype, &wf);
                let tensor = HostTensor::new(dtype, vec![rows, cols], wb.clone()).unwrap();
                let w = cpu.load(tensor).unwrap();
                let xs = rng.vec(t * cols, 1.0);
                let (mut x, mut y) = (cpu.buf(), cpu.buf());
                cpu.upload(&mut x, t, cols, &xs);
                cpu.matmul(&x, &mut [(&w, &mut y)]);
                let row_bytes = dtype.bytes_for(cols).unwrap();
                for r in 0..rows {
                    let wr = Bytes::copy_from(&wb.as_slice()[r * row_bytes..(r + 1) * row_bytes]);
                    for ti in 0..t {
                        let xr = &xs[ti * cols..(ti + 1) * cols];
                        let got = y.data[ti * rows + r];
                        let want = dot(&kernels, dtype, &wr, xr);
                        assert_eq!(got.to_bits(), want.to_bits(), "{level:?} {dtype} {rows}x{cols} row {r} token {ti}");
                        if avx2_is_scalar(&kernels, dtype) {
                            let s = dot(&scalar, dtype, &wr, xr);
                            assert_eq!(got.to_bits(), s.to_bits(), "{dtype} {rows}x{cols} row {r} token {ti}: scalar");
                        }
                    }
                }
            }
        }
    }
}

/// Attention over a slot pool matches a naive f64 computation on the same K and V as the pool
/// holds them (f16-rounded, or `Q8_0`-quantized and dequantized by the GGUF reference code), for
/// scattered slots and grouped heads.
#[test]
fn attention_matches_naive() {
    for format in KvFormat::ALL {
        attention_matches_naive_in(format);
    }
}

fn attention_matches_naive_in(format: KvFormat) {
    let cpu = CpuBackend::new(2).unwrap();
    let (heads, kv_heads, hd) = (4, 2, 64);
    let layout = KvLayout { layers: 1, slots: 64, kv_heads, head_dim: hd, format };
    let mut kv = cpu.kv(layout).unwrap();
    let mut rng = Lcg(5);
    let n = 9;
    let slots: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % 64).collect();
    let (k, v, q) = (rng.vec(n * kv_heads * hd, 1.0), rng.vec(n * kv_heads * hd, 1.0), rng.vec(n * heads * hd, 1.0));
    let (mut kb, mut vb, mut qb, mut out) = (cpu.buf(), cpu.buf(), cpu.buf(), cpu.buf());
    cpu.upload(&mut kb, n, kv_heads * hd, &k);
    cpu.upload(&mut vb, n, kv_heads * hd, &v);
    cpu.upload(&mut qb, n, heads * hd, &q);
    cpu.kv_store(&mut kv, 0, &kb, &vb, &slots);
    let shape = AttnShape { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.125 };
    let seqs = [AttnSeq { rows: 0..n, first_pos: 0, slots: 0..n }];
    cpu.attention(&qb, &kv, 0, &seqs, &slots, &shape, &mut out);
    // What the pool holds, seen unrotated: each value rounded to f16, or each head rotated
    // (Walsh–Hadamard), the row quantized to Q8_0, dequantized and rotated back.
    let held = |x: &[f32]| -> Vec<f64> {
        match format {
            KvFormat::F16 => x.iter().map(|&v| f16::from_f32(v).to_f64()).collect(),
            KvFormat::Q8_0 => {
                let mut r = x.to_vec();
                r.chunks_exact_mut(hd).for_each(cachet_kernels::cpu::hadamard);
                let mut b = vec![0u8; DType::Q8_0.bytes_for(x.len()).unwrap()];
                quantize_row(DType::Q8_0, &r, &mut b).unwrap();
                let mut back = vec![0f32; x.len()];
                dequantize_row(DType::Q8_0, &b, &mut back).unwrap();
                back.chunks_exact_mut(hd).for_each(cachet_kernels::cpu::hadamard);
                back.iter().map(|&v| v as f64).collect()
            }
        }
    };
    let (kh, vh) = (held(&k), held(&v));
    let r = |x: &Vec<f64>, i: usize| x[i];
    for t in 0..n {
        for h in 0..heads {
            let g = h / 2;
            let qh = &q[t * heads * hd + h * hd..][..hd];
            let scores: Vec<f64> = (0..=t)
                .map(|s| (0..hd).map(|d| qh[d] as f64 * r(&kh, s * kv_heads * hd + g * hd + d)).sum::<f64>() * 0.125)
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for d in 0..hd {
                let want: f64 =
                    (0..=t).map(|s| (scores[s] - max).exp() / sum * r(&vh, s * kv_heads * hd + g * hd + d)).sum();
                let got = out.data[t * heads * hd + h * hd + d] as f64;
                assert!((got - want).abs() < 1e-4, "{format:?} t={t} h={h} d={d}: {got} vs {want}");
            }
        }
    }
}

/// The rotation `Q8_0` K/V are stored in: the Walsh–Hadamard matrix (Sylvester's construction,
/// built here in f64) over √n, on pieces of the largest power of two dividing the head; its own
/// inverse.
#[test]
fn the_kv_rotation_is_the_normalized_hadamard_matrix() {
    use cachet_kernels::cpu::{hadamard, rotation};
    assert_eq!((rotation(64), rotation(128), rotation(96), rotation(32)), (64, 128, 32, 32));
    let mut rng = Lcg(31);
    for n in [32, 64, 128] {
        // H(2m) = [[H, H], [H, −H]].
        let mut h = vec![vec![1f64]];
        while h.len() < n {
            let m = h.len();
            h = (0..2 * m)
                .map(|i| (0..2 * m).map(|j| h[i % m][j % m] * if i >= m && j >= m { -1.0 } else { 1.0 }).collect())
                .collect();
        }
        let x = rng.vec(n, 3.0);
        let mut y = x.clone();
        hadamard(&mut y);
        for i in 0..n {
            let want: f64 = (0..n).map(|j| h[i][j] * x[j] as f64).sum::<f64>() / (n as f64).sqrt();
            assert!((y[i] as f64 - want).abs() < 1e-5, "n={n} [{i}]: {} vs {want}", y[i]);
        }
        hadamard(&mut y);
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b).abs() < 1e-5, "n={n}: not its own inverse");
        }
    }
}

/// Attention rows do not depend on the batch (K/V in f16 and in `Q8_0`): a 300-row prefill after 70
/// cached positions, batched with a second, short sequence, gives bit for bit
/// what each row gives alone as a one-row decode step — at every level, for
/// head sizes 64, 128 and 80 (no tile kernel) and 1, 2 or 7 query heads per
/// KV head. The tile kernels' key blocks start at fixed positions and keys a
/// query may not see add exact zeros, so this holds across tiles too.
#[test]
fn attention_rows_do_not_depend_on_the_batch() {
    let mut rng = Lcg(29);
    for (kernels, cpu) in backends() {
        let level = (kernels.level, kernels.k_level, kernels.q32_level);
        for (format, hd, rep) in
            KvFormat::ALL.into_iter().flat_map(|f| [(f, 64, 7), (f, 64, 1), (f, 128, 2), (f, 80, 2)])
        {
            let (kv_heads, heads) = (2, 2 * rep);
            let layout = KvLayout { layers: 1, slots: 512, kv_heads, head_dim: hd, format };
            if format == KvFormat::Q8_0 && hd % 32 != 0 {
                // A block would span two heads: refused, not misread.
                assert!(cpu.kv(layout).is_err(), "a Q8_0 pool for heads of {hd}");
                continue;
            }
            let mut kv = cpu.kv(layout).unwrap();
            let (a_keys, b_keys) = (370, 5);
            let n = a_keys + b_keys;
            let slots: Vec<u32> = (0..n as u32).map(|i| (i * 7 + 3) % 512).collect();
            let (k, v) = (rng.vec(n * kv_heads * hd, 1.0), rng.vec(n * kv_heads * hd, 1.0));
            let (mut kb, mut vb) = (cpu.buf(), cpu.buf());
            cpu.upload(&mut kb, n, kv_heads * hd, &k);
            cpu.upload(&mut vb, n, kv_heads * hd, &v);
            cpu.kv_store(&mut kv, 0, &kb, &vb, &slots);
            let shape = AttnShape { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 0.3 };
            let cols = heads * hd;
            let rows = 300 + b_keys;
            let q = rng.vec(rows * cols, 2.0);
            let (mut qb, mut out) = (cpu.buf(), cpu.buf());
            cpu.upload(&mut qb, rows, cols, &q);
            let seqs = [
                AttnSeq { rows: 0..300, first_pos: a_keys - 300, slots: 0..a_keys },
                AttnSeq { rows: 300..rows, first_pos: 0, slots: a_keys..n },
            ];
            cpu.attention(&qb, &kv, 0, &seqs, &slots, &shape, &mut out);
            for row in 0..rows {
                let (pos, start) = if row < 300 { (a_keys - 300 + row, 0) } else { (row - 300, a_keys) };
                let (mut q1, mut out1) = (cpu.buf(), cpu.buf());
                cpu.upload(&mut q1, 1, cols, &q[row * cols..(row + 1) * cols]);
                let one = [AttnSeq { rows: 0..1, first_pos: pos, slots: start..start + pos + 1 }];
                cpu.attention(&q1, &kv, 0, &one, &slots, &shape, &mut out1);
                assert_eq!(
                    &out.data[row * cols..(row + 1) * cols],
                    &out1.data[..],
                    "{level:?} {format:?} hd={hd} rep={rep} row {row}"
                );
            }
        }
    }
}

#[test]
fn rope_styles_rotate_the_right_pairs() {
    let cpu = CpuBackend::new(1).unwrap();
    for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
        let rope = RopeConfig::plain(8, 10000.0, style);
        let (mut table, mut x) = (cpu.buf(), cpu.buf());
        cpu.rope_table(&[0, 5], &rope, &mut table);
        let vals: Vec<f32> = (0..16).map(|i| i as f32 + 1.0).collect();
        cpu.upload(&mut x, 2, 8, &vals);
        cpu.rope(&mut x, &table, &rope);
        // Position 0 is the identity.
        assert_eq!(&x.data[..8], &vals[..8]);
        // Pair 0 rotates by 5 radians (frequency 1).
        let partner = match style {
            RopeStyle::Neox => 8 + 4,
            RopeStyle::Interleaved => 8 + 1,
        };
        let (x0, x1) = (vals[8], vals[partner]);
        let (s, c) = 5f32.sin_cos();
        assert!((x.data[8] - (x0 * c - x1 * s)).abs() < 1e-5, "{style:?}");
        assert!((x.data[partner] - (x1 * c + x0 * s)).abs() < 1e-5, "{style:?}");
        // Norms are preserved.
        let n0: f32 = vals[8..].iter().map(|v| v * v).sum();
        let n1: f32 = x.data[8..].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() / n0 < 1e-5);
    }
}

#[test]
fn rms_norm_and_silu() {
    let cpu = CpuBackend::new(1).unwrap();
    let w = cpu.load(HostTensor::from_f32(vec![4], &[1.0, 2.0, 0.5, 1.0])).unwrap();
    let (mut x, mut y) = (cpu.buf(), cpu.buf());
    cpu.upload(&mut x, 1, 4, &[1.0, -2.0, 3.0, -4.0]);
    cpu.rms_norm(&x, &w, 0.0, &mut y);
    let inv = 1.0 / (30f32 / 4.0).sqrt();
    let want = [inv, -4.0 * inv, 1.5 * inv, -4.0 * inv];
    for (a, b) in y.data.iter().zip(want) {
        assert!((a - b).abs() < 1e-6);
    }
    let mut up = cpu.buf();
    cpu.upload(&mut up, 1, 4, &[2.0; 4]);
    cpu.silu_mul(&mut x, &up);
    for (g, v) in [1.0f32, -2.0, 3.0, -4.0].iter().zip(&x.data) {
        assert!((g / (1.0 + (-g).exp()) * 2.0 - v).abs() < 1e-6);
    }
}

#[test]
fn embedding_rejects_out_of_range_tokens() {
    let cpu = CpuBackend::new(1).unwrap();
    let mut rng = Lcg(1);
    let table = matrix(&cpu, DType::Q8_0, 10, 64, &mut rng);
    let mut out = cpu.buf();
    assert!(cpu.embed(&table, &[0, 9], &mut out).is_ok());
    let e = cpu.embed(&table, &[10], &mut out).unwrap_err();
    assert!(e.to_string().contains("token id 10"), "{e}");
}

/// Every level's attention kernel against the scalar one, K/V in f16 and in `Q8_0`: head sizes
/// 64 and 128, 1 to 16 query heads per KV head, key counts around the vector widths, scattered
/// slots. Agreement within 1e-5 of the largest |V| (different summation order and a polynomial
/// exp; every level converts K/V to the same f32 values).
#[test]
fn every_simd_attention_matches_scalar() {
    use cachet_kernels::cpu::{Attend, KvRows};
    let mut rng = Lcg(17);
    let scalar = Kernels::scalar();
    for k in levels() {
        for hd in [64, 128, 96] {
            for rep in [1, 2, 4, 7, 8, 16] {
                for n in [1, 7, 15, 16, 17, 100, 513] {
                    let kv_heads = 2;
                    let kv_cols = kv_heads * hd;
                    let slots = 600;
                    let (kx, vx) = (rng.vec(slots * kv_cols, 1.0), rng.vec(slots * kv_cols, 1.0));
                    let kd: Vec<f16> = kx.iter().map(|&v| f16::from_f32(v)).collect();
                    let vd: Vec<f16> = vx.iter().map(|&v| f16::from_f32(v)).collect();
                    let q8 = |x: &[f32]| {
                        let mut b = vec![0u8; DType::Q8_0.bytes_for(x.len()).unwrap()];
                        quantize_row(DType::Q8_0, x, &mut b).unwrap();
                        b
                    };
                    let (kq, vq) = (q8(&kx), q8(&vx));
                    let keys: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % slots as u32).collect();
                    let q = rng.vec(rep * hd, 3.0);
                    for (format, kr, vr) in
                        [("f16", KvRows::F16(&kd), KvRows::F16(&vd)), ("q8_0", KvRows::Q8(&kq), KvRows::Q8(&vq))]
                    {
                        let a = Attend { q: &q, k: kr, v: vr, kv_cols, offset: hd, hd, rep, keys: &keys, scale: 0.1 };
                        let mut scores = vec![0f32; rep * n];
                        let (mut want, mut got) = (vec![0f32; rep * hd], vec![0f32; rep * hd]);
                        (scalar.attend)(&a, &mut scores, &mut want);
                        (k.attend)(&a, &mut scores, &mut got);
                        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                            assert!(
                                (w - g).abs() < 1e-5,
                                "{:?} {format} hd={hd} rep={rep} n={n} [{i}]: {g} vs {w}",
                                k.level
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_simd_silu_matches_scalar() {
    let mut rng = Lcg(23);
    let scalar = Kernels::scalar();
    for k in levels() {
        for n in [1, 7, 8, 15, 16, 17, 100, 4864] {
            let mut gate = rng.vec(n, 12.0);
            gate[0] = -100.0;
            let up = rng.vec(n, 2.0);
            let (mut a, mut b) = (gate.clone(), gate.clone());
            (scalar.silu_mul)(&mut a, &up);
            (k.silu_mul)(&mut b, &up);
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!((x - y).abs() <= 1e-6 * (1.0 + x.abs()), "{:?} n={n} [{i}] {x} vs {y}", k.level);
            }
        }
    }
}

/// The activation quantizers of every level give the bits of the obvious definition
/// (`f32::round`, saturating cast), on ties, tiny and huge blocks, NaN and infinities.
#[test]
fn every_level_quantizes_activations_like_the_definition() {
    let reference_q = |xs: &[f32]| {
        let d = xs.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        (d, xs.iter().map(|&v| (v * id).round() as i8).collect::<Vec<i8>>())
    };
    let mut rng = Lcg(11);
    let mut inputs: Vec<Vec<f32>> = (0..6).map(|i| rng.vec(512, [1.0, 1e-3, 1e4, 1e-37, 3e38, 0.0][i])).collect();
    // Exact ties after scaling: amax 127 makes id 1, so k + 0.5 lands on a half.
    inputs
        .push((0..512).map(|i| if i == 0 { 127.0 } else { (i % 255) as f32 - 127.0 + 0.5 * (i % 2) as f32 }).collect());
    let mut special = rng.vec(512, 1.0);
    (special[3], special[40], special[300], special[301]) = (f32::NAN, -0.0, f32::INFINITY, -1e-40);
    inputs.push(special);
    for d in levels() {
        for x in &inputs {
            let mut k = vec![BlockQ8K::default(); x.len() / 256];
            (d.quant_q8k)(x, &mut k);
            let mut a = vec![BlockQ8A::default(); x.len() / 32];
            (d.quant_q8a)(x, &mut a);
            for (i, b) in k.iter().enumerate() {
                let (rd, rq) = reference_q(&x[256 * i..256 * (i + 1)]);
                assert_eq!((b.d.to_bits(), b.qs.to_vec()), (rd.to_bits(), rq), "{:?} Q8_K block {i}", d.level);
                for (g, s) in b.bsums.iter().enumerate() {
                    assert_eq!(*s, b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i16).sum::<i16>());
                }
            }
            for (i, b) in a.iter().enumerate() {
                let (rd, rq) = reference_q(&x[32 * i..32 * (i + 1)]);
                assert_eq!((b.d.to_bits(), b.qs.to_vec()), (rd.to_bits(), rq.clone()), "{:?} Q8_A block {i}", d.level);
                assert_eq!(b.sum, rq.iter().map(|&q| q as i32).sum::<i32>());
            }
        }
    }
}
