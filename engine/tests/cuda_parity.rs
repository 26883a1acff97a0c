//! A whole tiny-model forward on the CPU and on CUDA: every architecture and
//! every GGUF format, logits compared with each other and with the f64
//! reference; and on CUDA, in batch-invariant mode, chunked prefill and
//! batching give exactly the logits of a sequence run alone.
//!
//! Without a CUDA device the tests print "skipped: no CUDA device" and pass;
//! with `REQUIRE_GPU=1` a missing device fails them.
//!
//! Tolerances (max |a − b| / max |reference|, as tiny_models.rs): against the
//! reference 1% for F32/F16/BF16 weights (the f16 KV cache and summation
//! order) and 4% for quantized ones (the CPU quantizes activations to 8 bits
//! per block; CUDA keeps them f32 in the kernels). The 40-token prompt takes
//! the cuBLAS prefill path, which rounds activations (and F16 or quantized
//! weights) to bf16, 2⁻⁹ relative per value: 2% there for F16/BF16 (F32
//! weights use an fp32 GEMM and keep 1%). CPU vs CUDA: the sum of the two
//! bounds (each side is within its own of the reference; tiny_models.rs holds
//! the CPU to its bound).

use crate::common;

use cachet_engine::gguf::GgufFile;
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::cuda::{self, CudaBackend, CudaOptions};
use cachet_kernels::quant::DType;
use common::*;

fn gpu(options: CudaOptions) -> Option<CudaBackend> {
    match cuda::probe() {
        Ok(info) => Some(
            CudaBackend::with_options(0, options)
                .unwrap_or_else(|e| panic!("a CUDA device was found ({info}) but the backend failed: {e}")),
        ),
        Err(e) => {
            if std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("REQUIRE_GPU=1 but no CUDA device: {e}");
            }
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}

#[test]
fn tiny_models_match_the_cpu_in_every_format() {
    let Some(probe) = gpu(CudaOptions::default()) else { return };
    drop(probe);
    let dir = tempfile::tempdir().unwrap();
    // A prompt long enough for the cuBLAS prefill path (≥ dense_min_rows rows).
    let long: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 320).collect();
    for arch in TinyArch::ALL {
        for dtype in DType::ALL {
            let tied = matches!(dtype, DType::Q4_0 | DType::Q6_K | DType::BF16);
            let tiny = Tiny::random(arch, 11, tied);
            let path = dir.path().join(format!("{}-{dtype}.gguf", arch.name()));
            tiny.write_gguf(dtype, &path).unwrap();
            let stored = dequantized(&tiny, &GgufFile::open(&path).unwrap());
            let mut c = Runner::gguf(CpuBackend::new(2).unwrap(), &path);
            let mut g = Runner::gguf(CudaBackend::new(0).unwrap(), &path);
            for tokens in [&PROMPT[..], &long[..]] {
                let cublas = tokens.len() >= CudaOptions::default().dense_min_rows;
                let tol = match dtype {
                    d if d.is_quantized() => 0.04,
                    DType::F16 | DType::BF16 if cublas => 0.02,
                    _ => 0.01,
                };
                let cpu_tol = if dtype.is_quantized() { 0.04 } else { 0.01 };
                let reference = reference_logits(&stored, tokens);
                let (lc, lg) = (c.logits(tokens, tokens.len()), g.logits(tokens, tokens.len()));
                let (err_gpu, err_cpu, err_pair) = (worst(&lg, &reference), worst(&lc, &reference), worst(&lg, &lc));
                println!(
                    "{:6} {dtype:5} tied={tied:5} n={:2}: cuda {err_gpu:.5} cpu {err_cpu:.5} cuda-cpu {err_pair:.5}",
                    arch.name(),
                    tokens.len()
                );
                assert!(err_gpu < tol, "{} {dtype}: CUDA vs reference {err_gpu} ≥ {tol}", arch.name());
                assert!(
                    err_pair < tol + cpu_tol,
                    "{} {dtype}: CUDA vs CPU {err_pair} ≥ {}",
                    arch.name(),
                    tol + cpu_tol
                );
            }
        }
    }
}

#[test]
fn batching_and_chunking_do_not_change_cuda_results() {
    let Some(probe) = gpu(CudaOptions::batch_invariant()) else { return };
    drop(probe);
    let dir = tempfile::tempdir().unwrap();
    for dtype in [DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::F16] {
        let path = dir.path().join(format!("m-{dtype}.gguf"));
        Tiny::random(TinyArch::Qwen2, 23, false).write_gguf(dtype, &path).unwrap();
        let mut r = Runner::gguf(CudaBackend::with_options(0, CudaOptions::batch_invariant()).unwrap(), &path);
        let seqs: [&[u32]; 3] = [&PROMPT[..5], &PROMPT[..], &[7, 8, 9]];
        let alone: Vec<Vec<Vec<f32>>> = seqs.iter().map(|s| r.logits(s, s.len())).collect();
        assert_eq!(r.logits(seqs[1], 4), alone[1], "{dtype}: chunking changed the logits");
        assert_eq!(r.logits(seqs[1], 1), alone[1], "{dtype}: token-by-token decode changed the logits");

        let (rows, slots) = r.batched(&seqs);
        for (got, expected) in rows.iter().zip(&alone) {
            assert_eq!(got, expected, "{dtype}: batching changed the logits");
        }
        for s in &slots {
            r.pool.free(s).unwrap();
        }
        r.pool.check_integrity().unwrap();
    }
}

/// Token-by-token decoding replays most steps from CUDA graphs (a step's list of launches is
/// captured the second time it is seen, and captured again when a row gains a 64-key attention
/// chunk); the logits are exactly those of launching every kernel on its own.
#[test]
fn decode_steps_replayed_from_cuda_graphs_give_the_same_logits() {
    let Some(probe) = gpu(CudaOptions::batch_invariant()) else { return };
    drop(probe);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    Tiny::random(TinyArch::Qwen2, 29, false).write_gguf(DType::Q4_K, &path).unwrap();
    let tokens: Vec<u32> = (0..150u32).map(|i| (i * 53 + 11) % 320).collect();
    let eager_options = CudaOptions { graphs: false, ..CudaOptions::batch_invariant() };
    let graph_options = CudaOptions { graphs: true, ..CudaOptions::batch_invariant() };
    let mut eager = Runner::gguf(CudaBackend::with_options(0, eager_options).unwrap(), &path);
    let mut graphs = Runner::gguf(CudaBackend::with_options(0, graph_options).unwrap(), &path);
    let want = eager.logits(&tokens, 1);
    let got = graphs.logits(&tokens, 1);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "logits of token {i}");
    }
    let stats = graphs.b.graph_stats();
    println!("{stats:?}");
    assert_eq!(eager.b.graph_stats().graph_runs, 0);
    assert!(stats.captures >= 3, "a graph per 64 positions: {stats:?}");
    assert!(stats.graph_runs >= 140, "most of the 150 steps replayed: {stats:?}");
}
