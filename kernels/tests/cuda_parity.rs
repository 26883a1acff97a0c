//! CPU vs CUDA parity of every backend op and every weight format. Each case
//! runs the same inputs through `CpuBackend` and `CudaBackend`; the CUDA
//! results are also held to an exact (f64) reference where the CPU itself is
//! approximate.
//!
//! Without a CUDA device every test prints "skipped: no CUDA device" and
//! passes; with `REQUIRE_GPU=1` a missing device fails them.
//!
//! Tolerances, and why:
//! - bit-exact: embedding rows (both dequantize with the same operations in
//!   the same order; the kernels are compiled with `--fmad=false`), `add`,
//!   `add_bias`, `gather_rows`, `rope` given the same table, and `kv_store`
//!   (f32 → f16 rounds to nearest even on both);
//! - 1e-4 of the row's largest value: `rms_norm` and `rms_norm_heads` (the
//!   sum of squares is added in another order: ~n·2⁻²⁴ relative at worst);
//! - 1e-6 absolute: the RoPE table (`cosf`/`sinf` on the GPU are within 2 ulp,
//!   the CPU's libm within 1);
//! - 1e-5·(1 + |x|): `silu_mul` (`expf` within 2 ulp; the CPU's SIMD exp is
//!   held to the same bound against its scalar one);
//! - matmul, against the f64 product of the stored weights, relative to
//!   Σ|x·w| of the output: 1e-5 for the dequantizing kernel (f32 activations,
//!   f32 accumulation); 5e-3 for the cuBLAS prefill path (activations and
//!   weights rounded to bf16, 2⁻⁹ relative each); CPU vs CUDA 1.2e-2 for the
//!   quantized formats, because the CPU quantizes activations to 8 bits per
//!   block (held to 1e-2 of that magnitude by its own tests);
//! - attention: 1e-4 of the largest |v| against the CPU and the f64 reference
//!   on the same f16 K/V. Both pools hold bit-identical f16 values, so what
//!   differs is the order of the f32 sums, the online softmax (chunks of 64
//!   keys merged with rescaling) and `expf`'s last bits — about 1e-6 in
//!   practice, so the bound is loose on purpose; the f16 rounding of K/V
//!   itself (2⁻¹¹ relative) is what makes attention "looser" than f32 ops
//!   when compared with f32 K/V, and it is excluded here by construction.
//!
//! Batch invariance, demanded exactly: with `CudaOptions::batch_invariant()`
//! a matmul row and an attention row do not depend on the batch.

use cachet_kernels::backend::*;
use cachet_kernels::cpu::{CpuBackend, CpuBuf};
use cachet_kernels::cuda::{self, CudaBackend, CudaOptions};
use cachet_kernels::quant::{quantize_row, DType};
use cachet_kernels::tensor::{Bytes, HostTensor};
use half::f16;

/// The CUDA backend, or `None` (after printing why) when there is no device.
fn gpu(options: CudaOptions) -> Option<CudaBackend> {
    match cuda::probe() {
        Ok(info) => {
            let b = CudaBackend::with_options(0, options)
                .unwrap_or_else(|e| panic!("a CUDA device was found ({info}) but the backend failed: {e}"));
            Some(b)
        }
        Err(e) => {
            if std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("REQUIRE_GPU=1 but no CUDA device: {e}");
            }
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

fn cpu() -> CpuBackend {
    CpuBackend::new(2).unwrap()
}

use cachet_kernels::testing::Lcg;

/// A `rows × cols` tensor of `dtype` from random values, and the values it stores.
fn tensor(dtype: DType, rows: usize, cols: usize, rng: &mut Lcg, scale: f32) -> (HostTensor, Vec<f32>) {
    let values = rng.vec(rows * cols, scale);
    let mut bytes = vec![0u8; dtype.bytes_for(rows * cols).unwrap()];
    quantize_row(dtype, &values, &mut bytes).unwrap();
    let t = HostTensor::new(dtype, vec![rows, cols], Bytes::copy_from(&bytes)).unwrap();
    let stored = t.to_f32().unwrap();
    (t, stored)
}

fn up_cpu(b: &CpuBackend, rows: usize, cols: usize, data: &[f32]) -> CpuBuf {
    let mut x = b.buf();
    b.upload(&mut x, rows, cols, data);
    x
}

fn up_gpu(b: &CudaBackend, rows: usize, cols: usize, data: &[f32]) -> cuda::CudaBuf {
    let mut x = b.buf();
    b.upload(&mut x, rows, cols, data);
    x
}

fn down(b: &CudaBackend, x: &cuda::CudaBuf) -> Vec<f32> {
    let mut out = Vec::new();
    b.download(x, &mut out);
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn probe_never_panics_and_agrees_with_the_backend() {
    match cuda::probe() {
        Ok(info) => {
            println!("{info}");
            assert!(info.total_memory > 0 && info.free_memory <= info.total_memory);
            let Some(g) = gpu(CudaOptions::default()) else { return };
            let free = g.memory_available().expect("the driver reports free memory");
            assert!(free > 0 && free <= info.total_memory, "{free}");
            assert!(g.name().starts_with("cuda ("), "{}", g.name());
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            assert!(CudaBackend::new(0).is_err());
            gpu(CudaOptions::default());
        }
    }
}

#[test]
fn embedding_rows_are_bit_exact_in_every_format() {
    let Some(g) = gpu(CudaOptions::default()) else { return };
    let c = cpu();
    let mut rng = Lcg(1);
    for dtype in DType::ALL {
        let (t, _) = tensor(dtype, 40, 512, &mut rng, 1.0);
        let (wc, wg) = (c.load(t.clone()).unwrap(), g.load(t).unwrap());
        let tokens = [0u32, 39, 7, 7, 22];
        let (mut oc, mut og) = (c.buf(), g.buf());
        c.embed(&wc, &tokens, &mut oc).unwrap();
        g.embed(&wg, &tokens, &mut og).unwrap();
        assert_eq!(g.buf_shape(&og), (5, 512));
        assert_eq!(bits(&down(&g, &og)), bits(&oc.data), "{dtype}");
        let e = g.embed(&wg, &[40], &mut og).unwrap_err();
        assert!(e.to_string().contains("token id 40"), "{e}");
    }
}

/// Σ_k |x_k · w_k| of every output: the scale a dot product's rounding error
/// is proportional to.
fn magnitudes(x: &[f32], w: &[f32], t: usize, n: usize, k: usize) -> Vec<f64> {
    (0..t * n)
        .map(|i| {
            let (ti, ni) = (i / n, i % n);
            (0..k).map(|j| (x[ti * k + j] as f64 * w[ni * k + j] as f64).abs()).sum()
        })
        .collect()
}

fn exact(x: &[f32], w: &[f32], t: usize, n: usize, k: usize) -> Vec<f64> {
    (0..t * n)
        .map(|i| {
            let (ti, ni) = (i / n, i % n);
            (0..k).map(|j| x[ti * k + j] as f64 * w[ni * k + j] as f64).sum()
        })
        .collect()
}

fn assert_close(what: &str, got: &[f32], want: &[f64], mag: &[f64], tol: f64) {
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(err <= tol * m + 1e-30, "{what} [{i}]: {g} vs {w} (error {err}, allowed {})", tol * m);
    }
}

#[test]
fn matmul_matches_the_cpu_and_the_exact_product_in_every_format() {
    let Some(g) = gpu(CudaOptions::default()) else { return };
    let c = cpu();
    let mut rng = Lcg(2);
    let (n, k) = (72, 512);
    for dtype in DType::ALL {
        let (t_w, w) = tensor(dtype, n, k, &mut rng, 0.5);
        let (wc, wg) = (c.load(t_w.clone()).unwrap(), g.load(t_w).unwrap());
        // 1 and 9 rows: the dequantizing kernel (one token tile, two tiles);
        // 40 rows: cuBLAS on the dense copy (≥ dense_min_rows).
        for t in [1usize, 9, 40] {
            let x = rng.vec(t * k, 1.0);
            let (mut yc, mut yg) = (c.buf(), g.buf());
            c.matmul(&up_cpu(&c, t, k, &x), &mut [(&wc, &mut yc)]);
            g.matmul(&up_gpu(&g, t, k, &x), &mut [(&wg, &mut yg)]);
            assert_eq!(g.buf_shape(&yg), (t, n));
            let got = down(&g, &yg);
            let (want, mag) = (exact(&x, &w, t, n, k), magnitudes(&x, &w, t, n, k));
            let cublas = t >= g.options().dense_min_rows && wg.has_dense_copy();
            let tol = match (cublas, dtype) {
                (true, DType::F32) => 1e-5,
                (true, _) => 5e-3,
                (false, _) => 1e-5,
            };
            assert_close(&format!("{dtype} t={t} vs exact"), &got, &want, &mag, tol);
            let cpu_tol = if dtype.is_quantized() { 1.2e-2 } else { tol + 1e-5 };
            let cpu64: Vec<f64> = yc.data.iter().map(|&v| v as f64).collect();
            assert_close(&format!("{dtype} t={t} vs cpu"), &got, &cpu64, &mag, cpu_tol);
        }
    }
}

#[test]
fn matmul_jobs_share_x_and_rows_do_not_depend_on_the_batch() {
    let Some(g) = gpu(CudaOptions::batch_invariant()) else { return };
    let mut rng = Lcg(3);
    let k = 256;
    for dtype in DType::ALL {
        let (t1, _) = tensor(dtype, 33, k, &mut rng, 0.5);
        let (t2, _) = tensor(dtype, 8, k, &mut rng, 0.5);
        let (w1, w2) = (g.load(t1).unwrap(), g.load(t2).unwrap());
        assert!(!w1.has_dense_copy());
        let t = 45;
        let x = rng.vec(t * k, 1.0);
        let (mut y1, mut y2) = (g.buf(), g.buf());
        g.matmul(&up_gpu(&g, t, k, &x), &mut [(&w1, &mut y1), (&w2, &mut y2)]);
        let (all1, all2) = (down(&g, &y1), down(&g, &y2));
        for ti in [0, 7, 8, 44] {
            let (mut s1, mut s2) = (g.buf(), g.buf());
            g.matmul(&up_gpu(&g, 1, k, &x[ti * k..(ti + 1) * k]), &mut [(&w1, &mut s1), (&w2, &mut s2)]);
            assert_eq!(bits(&down(&g, &s1)), bits(&all1[ti * 33..(ti + 1) * 33]), "{dtype} row {ti}");
            assert_eq!(bits(&down(&g, &s2)), bits(&all2[ti * 8..(ti + 1) * 8]), "{dtype} row {ti}");
        }
    }
}

#[test]
fn element_ops_match_the_cpu() {
    let Some(g) = gpu(CudaOptions::default()) else { return };
    let c = cpu();
    let mut rng = Lcg(4);
    let (rows, cols, hd) = (7, 384, 64);
    let x = rng.vec(rows * cols, 3.0);
    let y = rng.vec(rows * cols, 3.0);
    let vec_tensor = |v: &[f32]| HostTensor::from_f32(vec![v.len()], v);
    let bias = rng.vec(cols, 1.0);
    let norm: Vec<f32> = rng.vec(cols, 0.2).iter().map(|v| v + 1.0).collect();
    let head_norm: Vec<f32> = rng.vec(hd, 0.2).iter().map(|v| v + 1.0).collect();
    let (bc, bg) = (c.load(vec_tensor(&bias)).unwrap(), g.load(vec_tensor(&bias)).unwrap());
    let (nc, ng) = (c.load(vec_tensor(&norm)).unwrap(), g.load(vec_tensor(&norm)).unwrap());
    let (hc, hg) = (c.load(vec_tensor(&head_norm)).unwrap(), g.load(vec_tensor(&head_norm)).unwrap());

    // add, add_bias: exact.
    let (mut xc, mut xg) = (up_cpu(&c, rows, cols, &x), up_gpu(&g, rows, cols, &x));
    c.add(&mut xc, &up_cpu(&c, rows, cols, &y));
    g.add(&mut xg, &up_gpu(&g, rows, cols, &y));
    c.add_bias(&mut xc, &bc);
    g.add_bias(&mut xg, &bg);
    assert_eq!(bits(&down(&g, &xg)), bits(&xc.data), "add, add_bias");

    // rms_norm and rms_norm_heads: 1e-4 of the row's largest value.
    let close = |what: &str, got: &[f32], want: &[f32], group: usize, tol: f32| {
        for (gr, wr) in got.chunks(group).zip(want.chunks(group)) {
            let scale = wr.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
            for (a, b) in gr.iter().zip(wr) {
                assert!((a - b).abs() <= tol * scale, "{what}: {a} vs {b}");
            }
        }
    };
    let (mut oc, mut og) = (c.buf(), g.buf());
    c.rms_norm(&up_cpu(&c, rows, cols, &x), &nc, 1e-6, &mut oc);
    g.rms_norm(&up_gpu(&g, rows, cols, &x), &ng, 1e-6, &mut og);
    close("rms_norm", &down(&g, &og), &oc.data, cols, 1e-4);
    let (mut xc, mut xg) = (up_cpu(&c, rows, cols, &x), up_gpu(&g, rows, cols, &x));
    c.rms_norm_heads(&mut xc, &hc, 1e-6, hd);
    g.rms_norm_heads(&mut xg, &hg, 1e-6, hd);
    close("rms_norm_heads", &down(&g, &xg), &xc.data, hd, 1e-4);

    // silu_mul: 1e-5 (1 + |x|).
    let (mut gc, mut gg) = (up_cpu(&c, rows, cols, &x), up_gpu(&g, rows, cols, &x));
    c.silu_mul(&mut gc, &up_cpu(&c, rows, cols, &y));
    g.silu_mul(&mut gg, &up_gpu(&g, rows, cols, &y));
    for (a, b) in down(&g, &gg).iter().zip(&gc.data) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "silu_mul: {a} vs {b}");
    }

    // gather_rows: exact.
    let (mut oc, mut og) = (c.buf(), g.buf());
    c.gather_rows(&up_cpu(&c, rows, cols, &x), &[6, 0, 3, 3], &mut oc);
    g.gather_rows(&up_gpu(&g, rows, cols, &x), &[6, 0, 3, 3], &mut og);
    assert_eq!(g.buf_shape(&og), (4, cols));
    assert_eq!(bits(&down(&g, &og)), bits(&oc.data), "gather_rows");
    g.gather_rows(&up_gpu(&g, rows, cols, &x), &[], &mut og);
    assert_eq!(g.buf_shape(&og), (0, cols));
    assert!(down(&g, &og).is_empty());
}

#[test]
fn rope_table_and_both_rope_styles_match_the_cpu() {
    let Some(g) = gpu(CudaOptions::default()) else { return };
    let c = cpu();
    let mut rng = Lcg(5);
    let positions: Vec<u32> = vec![0, 1, 2, 17, 255, 256, 4095, 40_000, 131_071];
    // Qwen2.5's YaRN (factor 4 over 32k): blended frequencies and the attention factor.
    let yarn = Yarn {
        factor: 4.0,
        original_context: 32_768,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: Yarn::default_attention_factor(4.0, 1.0),
        truncate: true,
    };
    for (hd, theta, yarn) in [(64, 10_000.0, None), (128, 1_000_000.0, None), (128, 1_000_000.0, Some(yarn))] {
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            let rope = RopeConfig { yarn, ..RopeConfig::plain(hd, theta, style) };
            let (mut tc, mut tg) = (c.buf(), g.buf());
            c.rope_table(&positions, &rope, &mut tc);
            g.rope_table(&positions, &rope, &mut tg);
            assert_eq!(g.buf_shape(&tg), (positions.len(), hd));
            for (a, b) in down(&g, &tg).iter().zip(&tc.data) {
                assert!((a - b).abs() <= 1e-6, "rope table hd={hd}: {a} vs {b}");
            }
            // Rotation with the same (CPU) table on both: exact.
            let cols = 3 * hd;
            let x = rng.vec(positions.len() * cols, 2.0);
            let (mut xc, mut xg) = (up_cpu(&c, positions.len(), cols, &x), up_gpu(&g, positions.len(), cols, &x));
            let same = up_gpu(&g, positions.len(), hd, &tc.data);
            c.rope(&mut xc, &tc, &rope);
            g.rope(&mut xg, &same, &rope);
            assert_eq!(bits(&down(&g, &xg)), bits(&xc.data), "rope {style:?} hd={hd}");
        }
    }
}

/// A pool with scattered slots: sequence `i` of `lens` owns `slots[i]`.
struct Case {
    lens: Vec<usize>,
    slots: Vec<Vec<u32>>,
    kv_slots: usize,
}

impl Case {
    fn new(lens: &[usize], rng: &mut Lcg) -> Case {
        let total: usize = lens.iter().sum();
        let kv_slots = total + 17;
        // A fixed pseudo-random permutation of the slots.
        let mut all: Vec<u32> = (0..kv_slots as u32).collect();
        for i in (1..all.len()).rev() {
            let j = ((rng.f() * 0.5 + 0.5) * i as f32) as usize % (i + 1);
            all.swap(i, j);
        }
        let mut slots = Vec::new();
        let mut at = 0;
        for &l in lens {
            slots.push(all[at..at + l].to_vec());
            at += l;
        }
        Case { lens: lens.to_vec(), slots, kv_slots }
    }
}

/// Stores K/V of every position of every sequence, then runs attention for
/// the last `news[i]` positions of sequence `i` (prefill chunks or decode).
#[allow(clippy::too_many_arguments)]
fn run_attention<B: Backend>(
    b: &B,
    case: &Case,
    shape: &AttnShape,
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    q: &[Vec<f32>],
    news: &[usize],
) -> (Vec<f32>, B::Kv) {
    let kv_cols = shape.n_kv_heads * shape.head_dim;
    let q_cols = shape.n_heads * shape.head_dim;
    let layout = KvLayout {
        layers: 2,
        slots: case.kv_slots,
        kv_heads: shape.n_kv_heads,
        head_dim: shape.head_dim,
        format: KvFormat::F16,
    };
    let mut kv = b.kv(layout).unwrap();
    for (i, &len) in case.lens.iter().enumerate() {
        let (mut kb, mut vb) = (b.buf(), b.buf());
        b.upload(&mut kb, len, kv_cols, &k[i]);
        b.upload(&mut vb, len, kv_cols, &v[i]);
        b.kv_store(&mut kv, 1, &kb, &vb, &case.slots[i]);
    }
    let mut seqs = Vec::new();
    let mut all_slots = Vec::new();
    let mut qs = Vec::new();
    let mut row = 0;
    for (i, (&len, &new)) in case.lens.iter().zip(news).enumerate() {
        let first_pos = len - new;
        let s0 = all_slots.len();
        all_slots.extend_from_slice(&case.slots[i]);
        seqs.push(AttnSeq { rows: row..row + new, first_pos, slots: s0..all_slots.len() });
        qs.extend_from_slice(&q[i][first_pos * q_cols..len * q_cols]);
        row += new;
    }
    let mut qb = b.buf();
    b.upload(&mut qb, row, q_cols, &qs);
    let mut out = b.buf();
    b.attention(&qb, &kv, 1, &seqs, &all_slots, shape, &mut out);
    assert_eq!(b.buf_shape(&out), (row, q_cols));
    let mut host = Vec::new();
    b.download(&out, &mut host);
    (host, kv)
}

/// The f64 attention of every new row, from the f16-rounded K/V.
fn reference_attention(
    case: &Case,
    s: &AttnShape,
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    q: &[Vec<f32>],
    news: &[usize],
) -> Vec<f64> {
    let (hd, rep) = (s.head_dim, s.n_heads / s.n_kv_heads);
    let kv_cols = s.n_kv_heads * hd;
    let r16 = |x: f32| f16::from_f32(x).to_f32() as f64;
    let mut out = Vec::new();
    for (i, (&len, &new)) in case.lens.iter().zip(news).enumerate() {
        for pos in len - new..len {
            for h in 0..s.n_heads {
                let g = h / rep;
                let qh = &q[i][(pos * s.n_heads + h) * hd..][..hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|j| {
                        let kj = &k[i][j * kv_cols + g * hd..][..hd];
                        qh.iter().zip(kj).map(|(&a, &b)| a as f64 * r16(b)).sum::<f64>() * s.scale as f64
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    out.push((0..=pos).map(|j| e[j] / sum * r16(v[i][j * kv_cols + g * hd + d])).sum());
                }
            }
        }
    }
    out
}

#[test]
fn attention_matches_the_cpu_for_prefill_and_decode() {
    let Some(g) = gpu(CudaOptions::default()) else { return };
    let c = cpu();
    let mut rng = Lcg(6);
    // (heads, kv heads, head_dim): GQA 7:1 (Qwen2.5-0.5B), 2:1, MHA with 128.
    for (nh, nkv, hd) in [(14, 2, 64), (4, 2, 64), (2, 2, 128)] {
        let shape = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
        // Lengths crossing the 64-key tiles and 256-key chunks.
        let case = Case::new(&[1, 70, 300, 600], &mut rng);
        let kv_cols = nkv * hd;
        let k: Vec<Vec<f32>> = case.lens.iter().map(|&l| rng.vec(l * kv_cols, 1.5)).collect();
        let v: Vec<Vec<f32>> = case.lens.iter().map(|&l| rng.vec(l * kv_cols, 1.0)).collect();
        let q: Vec<Vec<f32>> = case.lens.iter().map(|&l| rng.vec(l * nh * hd, 1.5)).collect();
        // A whole prefill, chunks and single decode steps.
        for news in [vec![1, 70, 300, 600], vec![1, 5, 44, 1], vec![1, 1, 1, 1]] {
            let (oc, kvc) = run_attention(&c, &case, &shape, &k, &v, &q, &news);
            let (og, kvg) = run_attention(&g, &case, &shape, &k, &v, &q, &news);
            // The pools hold the same f16 bits in the same places.
            let (gk, gv) = g.read_kv(&kvg, 1);
            assert_eq!(cachet_kernels::cpu::KvData::F16(gk), kvc.layers[1].k, "K pool layout");
            assert_eq!(cachet_kernels::cpu::KvData::F16(gv), kvc.layers[1].v, "V pool layout");
            let want = reference_attention(&case, &shape, &k, &v, &q, &news);
            for (i, ((&a, &b), &w)) in og.iter().zip(&oc).zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-4, "nh={nh} hd={hd} news={news:?} [{i}]: cuda {a} vs cpu {b}");
                assert!((a as f64 - w).abs() <= 1e-4, "nh={nh} hd={hd} news={news:?} [{i}]: cuda {a} vs exact {w}");
            }
        }
    }
}

#[test]
fn attention_rows_do_not_depend_on_the_batch_or_the_chunking() {
    let Some(g) = gpu(CudaOptions::batch_invariant()) else { return };
    let mut rng = Lcg(7);
    let (nh, nkv, hd) = (14, 2, 64);
    let shape = AttnShape { n_heads: nh, n_kv_heads: nkv, head_dim: hd, scale: 0.125 };
    let case = Case::new(&[3, 260, 513], &mut rng);
    let kv_cols = nkv * hd;
    let k: Vec<Vec<f32>> = case.lens.iter().map(|&l| rng.vec(l * kv_cols, 1.5)).collect();
    let v: Vec<Vec<f32>> = case.lens.iter().map(|&l| rng.vec(l * kv_cols, 1.0)).collect();
    let q: Vec<Vec<f32>> = case.lens.iter().map(|&l| rng.vec(l * nh * hd, 1.5)).collect();
    let width = nh * hd;
    // Whole prefills of all three at once.
    let (all, _) = run_attention(&g, &case, &shape, &k, &v, &q, &case.lens);
    // The last row of each as a decode step, all three in one batch.
    let (last, _) = run_attention(&g, &case, &shape, &k, &v, &q, &[1, 1, 1]);
    let mut row = 0;
    for (i, &len) in case.lens.iter().enumerate() {
        row += len;
        assert_eq!(bits(&last[i * width..(i + 1) * width]), bits(&all[(row - 1) * width..row * width]), "seq {i}");
    }
    // The middle sequence's last 10 rows as a chunk, alone.
    let alone = Case { lens: vec![260], slots: vec![case.slots[1].clone()], kv_slots: case.kv_slots };
    let (chunk, _) = run_attention(&g, &alone, &shape, &k[1..2], &v[1..2], &q[1..2], &[10]);
    let end = 3 + 260;
    assert_eq!(bits(&chunk), bits(&all[(end - 10) * width..end * width]), "a chunk alone");
}

#[test]
fn kv_pool_and_memory() {
    let Some(g) = gpu(CudaOptions::default()) else { return };
    let layout = KvLayout { layers: 3, slots: 100, kv_heads: 2, head_dim: 64, format: KvFormat::F16 };
    let kv = g.kv(layout).unwrap();
    let (k, v) = g.read_kv(&kv, 2);
    assert_eq!((k.len(), v.len()), (100 * 128, 100 * 128));
    assert!(k.iter().chain(&v).all(|x| x.to_bits() == 0), "a new pool is zeroed");
    let huge = KvLayout { layers: 1, slots: 1 << 40, kv_heads: 8, head_dim: 128, format: KvFormat::F16 };
    assert!(matches!(g.kv(huge), Err(BackendError::OutOfMemory { .. }) | Err(BackendError::Device(_))));
}

/// K/V rows exported from the CPU pool and imported into the GPU's (other slots) read back the
/// same, and the GPU exports them as the CPU did: a prefix can move between the two.
#[test]
fn kv_rows_move_between_the_cpu_and_the_gpu_pool() {
    let Some(g) = gpu(CudaOptions::default()) else { return };
    let c = cpu();
    let mut rng = Lcg(8);
    let layout = KvLayout { layers: 2, slots: 64, kv_heads: 2, head_dim: 64, format: KvFormat::F16 };
    let cols = layout.kv_heads * layout.head_dim;
    let mut ckv = c.kv(layout).unwrap();
    let (mut kb, mut vb) = (c.buf(), c.buf());
    c.upload(&mut kb, 5, cols, &rng.vec(5 * cols, 1.5));
    c.upload(&mut vb, 5, cols, &rng.vec(5 * cols, 1.0));
    c.kv_store(&mut ckv, 1, &kb, &vb, &[2, 40, 3, 63, 0]);
    let mut rows = Vec::new();
    c.kv_export(&ckv, 1, &[2, 40, 3, 63, 0], &mut rows).unwrap();
    let mut gkv = g.kv(layout).unwrap();
    let to = [10u32, 11, 12, 50, 1];
    g.kv_import(&mut gkv, 1, &to, &rows).unwrap();
    let mut back = Vec::new();
    g.kv_export(&gkv, 1, &to, &mut back).unwrap();
    assert_eq!(back, rows);
    let (k, _) = g.read_kv(&gkv, 1);
    for (i, &s) in to.iter().enumerate() {
        let row: Vec<u16> = k[s as usize * cols..(s as usize + 1) * cols].iter().map(|x| x.to_bits()).collect();
        assert_eq!(row, rows[i * cols..(i + 1) * cols], "slot {s}");
    }
    assert!(matches!(g.kv_export(&gkv, 1, &[64], &mut back), Err(BackendError::KvRows(_))));
}

/// The engine makes its backend on one thread and runs it on another: every op there (growing a
/// buffer frees the old one, which needs the context current), dropping buffers there, and the
/// per-op timing. The slot tables `kv_store` keeps on the device between calls are replaced
/// whenever the slots change (stores to A, B, then A again land where they should).
#[test]
fn a_backend_made_on_one_thread_runs_on_another() {
    // With graphs on: ops queue their work, and buffers dropped on that thread run it first.
    let Some(g) = gpu(CudaOptions { graphs: true, ..CudaOptions::default() }) else { return };
    let g = g.with_timing();
    let mut rng = Lcg(21);
    let (w, wf) = tensor(DType::Q8_0, 64, 256, &mut rng, 0.5);
    let weight = g.load(w).unwrap();
    let layout = KvLayout { layers: 1, slots: 16, kv_heads: 1, head_dim: 64, format: KvFormat::F16 };
    let mut kv = g.kv(layout).unwrap();
    let x = rng.vec(3 * 256, 1.0);
    let rows: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(2 * 64, 1.0)).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut small = up_gpu(&g, 1, 8, &[1.0; 8]);
            g.resize(&mut small, 4, 1024); // frees the first allocation on this thread
            let xb = up_gpu(&g, 3, 256, &x);
            let mut out = g.buf();
            g.matmul(&xb, &mut [(&weight, &mut out)]);
            let got = down(&g, &out);
            let want = exact(&x, &wf, 3, 64, 256);
            assert_close("matmul on another thread", &got, &want, &magnitudes(&x, &wf, 3, 64, 256), 1e-5);
            for (slots, row) in [([1u32, 2], &rows[0]), ([5, 6], &rows[1]), ([1, 2], &rows[2])] {
                let k = up_gpu(&g, 2, 64, row);
                let v = up_gpu(&g, 2, 64, row);
                g.kv_store(&mut kv, 0, &k, &v, &slots);
                let (kr, _) = g.read_kv(&kv, 0);
                for (i, &slot) in slots.iter().enumerate() {
                    let stored: Vec<f32> =
                        kr[slot as usize * 64..(slot as usize + 1) * 64].iter().map(|h| h.to_f32()).collect();
                    let want: Vec<f32> = row[i * 64..(i + 1) * 64].iter().map(|&v| f16::from_f32(v).to_f32()).collect();
                    assert_eq!(stored, want, "slot {slot}");
                }
            }
            drop(small);
        });
    });
    let p = g.profile().expect("timing is on");
    assert_eq!(p.ops["matmul"].calls, 1);
    assert_eq!(p.ops["kv_store"].calls, 3);
    assert!(p.ops["matmul"].gpu > std::time::Duration::ZERO, "{p:?}");
}
