//! Kernel micro-benchmarks, in one run so ratios are comparable:
//! - memory bandwidth (STREAM-style copy over arrays far larger than the caches),
//! - GEMV (one activation row, as in decode) per weight format, in GB/s of
//!   weights read, and as a fraction of the measured bandwidth,
//! - GEMM (512 activation rows, as in prefill) per format, in GFLOP/s,
//! - decode attention over 512 … 16k cached tokens.
//!
//! `cargo bench -p cachet-kernels --bench kernels -- [--threads N] [--quick] [--only SECTIONS]`
//! (`SECTIONS`: a comma-separated subset of
//! `memory,gemv,batch,compute,gemm,expert,decode-experts,attention`; all by default)

use cachet_kernels::backend::{AttnSeq, AttnShape, Backend, KvFormat, KvLayout};
use cachet_kernels::cpu::{CpuBackend, SimdLevel};
use cachet_kernels::quant::{quantize_row, DType};
use cachet_kernels::tensor::{Bytes, HostTensor};
use rayon::prelude::*;
use std::time::{Duration, Instant};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

/// Best time of `reps` runs of `f` (after one warm-up run).
fn best(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    cachet_kernels::testing::Lcg::new(seed).vec(n, 1.0)
}

fn matrix(cpu: &CpuBackend, dtype: DType, rows: usize, cols: usize) -> cachet_kernels::cpu::CpuMatrix {
    // Quantize one row block and repeat it: quantizing 100+ MB would dominate the run.
    let pattern_rows = 64.min(rows);
    let src = random(pattern_rows * cols, 7);
    let row_bytes = dtype.bytes_for(cols).unwrap();
    let mut pattern = vec![0u8; row_bytes * pattern_rows];
    quantize_row(dtype, &src, &mut pattern).unwrap();
    let mut bytes = Vec::with_capacity(row_bytes * rows);
    while bytes.len() < row_bytes * rows {
        let take = (row_bytes * rows - bytes.len()).min(pattern.len());
        bytes.extend_from_slice(&pattern[..take]);
    }
    cpu.load(HostTensor::new(dtype, vec![rows, cols], Bytes::copy_from(&bytes)).unwrap()).unwrap()
}

fn main() {
    let threads: usize = arg("--threads").map_or(2, |t| t.parse().unwrap());
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = if quick { 3 } else { 7 };
    let only = arg("--only");
    let run = |section: &str| only.as_deref().is_none_or(|o| o.split(',').any(|s| s == section));
    let level = SimdLevel::detect();
    let cpu = CpuBackend::with_level(threads, level).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    println!("# cachet kernel benchmarks: {threads} threads, {} kernels\n", level.name());

    // Bandwidth: copy 256 MiB to another 256 MiB (read + write); GEMV needs the read figure.
    let mut read_gbs = f64::NAN;
    if run("memory") || run("gemv") {
        let n = 64 << 20;
        let src = vec![1f32; n];
        let mut dst = vec![0f32; n];
        let copy = best(reps, || {
            pool.install(|| {
                dst.par_chunks_mut(1 << 16).zip(src.par_chunks(1 << 16)).for_each(|(d, s)| d.copy_from_slice(s))
            })
        });
        let words: Vec<u64> = vec![1; n / 2];
        let read_only = best(reps, || {
            let s: u64 = pool.install(|| {
                words
                    .par_chunks(1 << 15)
                    .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                    .reduce(|| 0, u64::wrapping_add)
            });
            std::hint::black_box(s);
        });
        let copy_gbs = (2 * n * 4) as f64 / copy.as_secs_f64() / 1e9;
        read_gbs = (n * 4) as f64 / read_only.as_secs_f64() / 1e9;
        println!("| memory | GB/s |\n|---|---:|");
        println!("| copy (STREAM-style, read + write counted) | {copy_gbs:.1} |");
        println!("| read (integer sum) | {read_gbs:.1} |\n");
        drop((src, dst, words));
    }

    // GEMV: one row against ~128 MB of weights (far beyond the 32 MiB L3).
    if run("gemv") {
        println!("| GEMV, 1 row × [rows × 4096] | weight MB | ms | GB/s | of read bandwidth |");
        println!("|---|---:|---:|---:|---:|");
        let cols = 4096;
        for dtype in DType::ALL {
            let rows = (128usize << 20) / dtype.bytes_for(cols).unwrap();
            let w = matrix(&cpu, dtype, rows, cols);
            let mb = (rows * dtype.bytes_for(cols).unwrap()) as f64 / 1e6;
            let (mut x, mut y) = (cpu.buf(), cpu.buf());
            cpu.upload(&mut x, 1, cols, &random(cols, 3));
            let t = best(reps, || cpu.matmul(&x, &mut [(&w, &mut y)]));
            let gbs = mb / 1e3 / t.as_secs_f64();
            println!(
                "| {dtype} ({rows} rows) | {mb:.0} | {:.2} | {gbs:.1} | {:.0}% |",
                t.as_secs_f64() * 1e3,
                100.0 * gbs / read_gbs
            );
        }
        {
            let w = matrix(&cpu, DType::Q8_0, 151_936, 896);
            let mb = (151_936 * DType::Q8_0.bytes_for(896).unwrap()) as f64 / 1e6;
            let (mut x, mut y) = (cpu.buf(), cpu.buf());
            cpu.upload(&mut x, 1, 896, &random(896, 3));
            let t = best(reps, || cpu.matmul(&x, &mut [(&w, &mut y)]));
            let gbs = mb / 1e3 / t.as_secs_f64();
            println!(
                "| Q8_0 output projection 151936 × 896 | {mb:.0} | {:.2} | {gbs:.1} | {:.0}% |\n",
                t.as_secs_f64() * 1e3,
                100.0 * gbs / read_gbs
            );
        }
    }

    // Batched decode: t sequences' tokens against ~64 MB of weights (beyond the caches), so an
    // ideal kernel reads the weights once whatever t is: the time of t tokens over one token's.
    if run("batch") {
        let ts = [1usize, 2, 3, 4, 6, 8, 16];
        print!("| batched decode, t × [rows × 4096], ms (× one token's) |");
        ts.iter().for_each(|t| print!(" t = {t} |"));
        println!("\n|---|{}", "---:|".repeat(ts.len()));
        let cols = 4096;
        for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
            let rows = (64usize << 20) / dtype.bytes_for(cols).unwrap() / 8 * 8;
            let w = matrix(&cpu, dtype, rows, cols);
            print!("| {dtype} |");
            let mut one = f64::NAN;
            for &t in &ts {
                let (mut x, mut y) = (cpu.buf(), cpu.buf());
                cpu.upload(&mut x, t, cols, &random(t * cols, 3));
                let ms = best(reps, || cpu.matmul(&x, &mut [(&w, &mut y)])).as_secs_f64() * 1e3;
                if t == 1 {
                    one = ms;
                }
                print!(" {ms:.2} ({:.2}) |", ms / one);
            }
            println!();
        }
        println!();
    }

    // Compute cost: one thread, a 512 KiB matrix that stays in L2, so memory bandwidth (which
    // moves a lot on shared machines) does not enter: ns per 256 weights for 1, 4, 16 and 64 tokens.
    if run("compute") {
        println!("| compute, 1 thread, L2-resident [rows × 2048] | tokens | ns per 256 weights per token |");
        println!("|---|---:|---:|");
        let one = CpuBackend::with_level(1, level).unwrap();
        let cols = 2048;
        for dtype in DType::ALL.into_iter().filter(|d| d.is_quantized()) {
            let rows = (512 << 10) / dtype.bytes_for(cols).unwrap() / 4 * 4;
            let w = matrix(&one, dtype, rows, cols);
            for t in [1usize, 4, 16, 64] {
                let (mut x, mut y) = (one.buf(), one.buf());
                one.upload(&mut x, t, cols, &random(t * cols, 3));
                let inner = 64;
                let d = best(reps, || {
                    for _ in 0..inner {
                        one.matmul(&x, &mut [(&w, &mut y)]);
                    }
                });
                let ns = d.as_secs_f64() * 1e9 / inner as f64 / (rows * cols / 256 * t) as f64;
                println!("| {dtype} ({rows} rows) | {t} | {ns:.2} |");
            }
        }
        println!();
    }

    // GEMM: 512 rows (a prefill) × [4096 × 1536].
    if run("gemm") {
        println!("| GEMM, 512 × [4096 × 1536] | ms | GFLOP/s |\n|---|---:|---:|");
        let (t, n, k) = (512, 4096, 1536);
        let xs = random(t * k, 5);
        for dtype in DType::ALL {
            let w = matrix(&cpu, dtype, n, k);
            let (mut x, mut y) = (cpu.buf(), cpu.buf());
            cpu.upload(&mut x, t, k, &xs);
            let d = best(reps.min(3), || cpu.matmul(&x, &mut [(&w, &mut y)]));
            let gflops = 2.0 * (t * n * k) as f64 / d.as_secs_f64() / 1e9;
            println!("| {dtype} | {:.1} | {gflops:.1} |", d.as_secs_f64() * 1e3);
        }
    }

    // Expert-sized GEMM: a mixture of experts' prefill runs each expert over the few rows routed
    // to it (Qwen3-Coder-30B-A3B: 128 experts of 768 × 2048, 8 per token: 32 rows per expert
    // in a 512-token pass on average).
    if run("expert") {
        println!("\n| expert GEMM, t × [768 × 2048] | t | ms | GFLOP/s |\n|---|---:|---:|---:|");
        let (n, k) = (768, 2048);
        for dtype in [DType::Q4_K, DType::Q6_K] {
            let w = matrix(&cpu, dtype, n, k);
            for t in [1usize, 4, 8, 32, 128, 512] {
                let xs = random(t * k, 5);
                let (mut x, mut y) = (cpu.buf(), cpu.buf());
                cpu.upload(&mut x, t, k, &xs);
                let d = best(reps, || cpu.matmul(&x, &mut [(&w, &mut y)]));
                let gflops = 2.0 * (t * n * k) as f64 / d.as_secs_f64() / 1e9;
                println!("| {dtype} | {t} | {:.3} | {gflops:.1} |", d.as_secs_f64() * 1e3);
            }
        }
        println!();
    }

    // A mixture of experts' decode: one token through expert-sized gate + up projections
    // (768 × 2048 `Q4_K` each), one call per expert, over 64 experts (113 MB, far beyond the
    // caches), as a decode step does it; and the same bytes as 8 calls of 8 experts' rows, so the
    // cost of a call per expert shows; and 8 calls of `matmul_picked` over 8 experts each.
    if run("decode-experts") {
        println!("| decode, experts' gate + up, 1 token | µs per expert | GB/s of weights |\n|---|---:|---:|");
        let (rows, k, experts) = (768, 2048, 64);
        let gates: Vec<_> = (0..experts).map(|_| matrix(&cpu, DType::Q4_K, rows, k)).collect();
        let ups: Vec<_> = (0..experts).map(|_| matrix(&cpu, DType::Q4_K, rows, k)).collect();
        let merged: Vec<_> = (0..experts / 8).map(|_| matrix(&cpu, DType::Q4_K, 16 * rows, k)).collect();
        let (mut x, mut y1, mut y2) = (cpu.buf(), cpu.buf(), cpu.buf());
        cpu.upload(&mut x, 1, k, &random(k, 9));
        let mb = 2.0 * DType::Q4_K.bytes_for(rows * k).unwrap() as f64 / 1e6;
        let per_expert = best(reps, || {
            cpu.scope(|| {
                for e in 0..experts {
                    cpu.matmul(&x, &mut [(&gates[e], &mut y1), (&ups[e], &mut y2)]);
                }
            })
        });
        let eight = best(reps, || {
            cpu.scope(|| {
                for w in &merged {
                    cpu.matmul(&x, &mut [(w, &mut y1)]);
                }
            })
        });
        // As a decode step calls it: a token's 8 experts' gate + up in one `matmul_picked`.
        let inputs: Vec<_> = (0..8).map(|_| x.clone()).collect();
        let (mut g, mut u): (Vec<_>, Vec<_>) = (0..8).map(|_| (cpu.buf(), cpu.buf())).unzip();
        let picks: Vec<Vec<usize>> = (0..experts / 8).map(|c| (8 * c..8 * c + 8).collect()).collect();
        let picked = best(reps, || {
            cpu.scope(|| {
                for pick in &picks {
                    cpu.matmul_picked(&inputs, pick, &mut [(&gates, &mut g), (&ups, &mut u)]);
                }
            })
        });
        for (name, d) in
            [("one call per expert", per_expert), ("8 experts per call", eight), ("8 experts picked per call", picked)]
        {
            let us = d.as_secs_f64() * 1e6 / experts as f64;
            println!("| {name} | {us:.1} | {:.1} |", mb / us * 1e3);
        }
        println!();
    }

    // Decode attention: one query token over `ctx` cached tokens (Qwen2.5-0.5B heads).
    if !run("attention") {
        return;
    }
    println!("\n| decode attention, 14 heads / 2 KV heads × 64 | µs per token per layer |\n|---|---:|");
    for ctx in [512usize, 4096, 16384] {
        let d = attention_time(&cpu, reps, (14, 2, 64), ctx, 1);
        println!("| context {ctx} | {:.0} |", d.as_secs_f64() * 1e6);
    }

    // Prefill attention: the last 512 rows of a causal prompt of `ctx` tokens, the 1.5B's heads
    // (12 / 2 KV × 128), as a long agent prompt's chunks meet it.
    println!("\n| prefill attention, 512 rows, 12 heads / 2 KV heads × 128 | ms per layer | G multiply-adds/s |\n|---|---:|---:|");
    let (heads, hd, rows) = (12, 128, 512);
    for ctx in [512usize, 4096] {
        let d = attention_time(&cpu, reps, (heads, 2, hd), ctx, rows);
        // Q·K and P·V over the keys each row sees.
        let macs: f64 = (0..rows).map(|r| (ctx - rows + r + 1) as f64).sum::<f64>() * (2 * heads * hd) as f64;
        println!("| context {ctx} | {:.2} | {:.1} |", d.as_secs_f64() * 1e3, macs / d.as_secs_f64() / 1e9);
    }
}

/// Best time of one layer's attention for the last `rows` rows of a `ctx`-token sequence, with
/// `(query heads, KV heads, head size)`, the K/V cache (f16) holding all `ctx` positions.
fn attention_time(
    cpu: &CpuBackend,
    reps: usize,
    (heads, kv_heads, hd): (usize, usize, usize),
    ctx: usize,
    rows: usize,
) -> Duration {
    let layout = KvLayout { layers: 1, slots: ctx, kv_heads, head_dim: hd, format: KvFormat::F16 };
    let mut kv = cpu.kv(layout).unwrap();
    let slots: Vec<u32> = (0..ctx as u32).collect();
    let (mut k, mut v, mut q, mut out) = (cpu.buf(), cpu.buf(), cpu.buf(), cpu.buf());
    cpu.upload(&mut k, ctx, kv_heads * hd, &random(ctx * kv_heads * hd, 1));
    cpu.upload(&mut v, ctx, kv_heads * hd, &random(ctx * kv_heads * hd, 2));
    cpu.kv_store(&mut kv, 0, &k, &v, &slots);
    cpu.upload(&mut q, rows, heads * hd, &random(rows * heads * hd, 3));
    let shape = AttnShape { n_heads: heads, n_kv_heads: kv_heads, head_dim: hd, scale: 1.0 / (hd as f32).sqrt() };
    let seqs = [AttnSeq { rows: 0..rows, first_pos: ctx - rows, slots: 0..ctx }];
    best(reps, || cpu.attention(&q, &kv, 0, &seqs, &slots, &shape, &mut out))
}
