//! `cachet bench`: prompt processing and decode speed of the engine, measured
//! the way `llama-bench` measures them (pseudo-random tokens, no sampling):
//! `pp` = one forward pass over a `--prompt`-token prompt, `tg` = `--gen`
//! single-token decode steps for each of `--batch` sequences at once.

use anyhow::Context;
use cachet_engine::kv_pool::{KvPool, PoolSize, SlotId};
use cachet_engine::model::{ForwardScratch, LogitsFor, Model, SeqChunk};
use cachet_engine::sampler::Rng;
use cachet_kernels::backend::Backend;
use cachet_kernels::cpu::CpuBackend;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// A .gguf file or Hugging Face directory (default: the default model, pulled if missing).
    #[arg(long, env = "CACHET_MODEL")]
    pub model: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// auto (a CUDA GPU when usable, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", env = "CACHET_DEVICE")]
    pub device: String,
    /// On CUDA: long prefills through cuBLAS on bf16 weight copies (gives up batch invariance).
    #[arg(long)]
    pub cublas_prefill: bool,
    /// Prompt tokens of the prefill test (0 skips it).
    #[arg(long, default_value_t = 512)]
    pub prompt: usize,
    /// Decode steps of the generation test (0 skips it).
    #[arg(long, default_value_t = 128)]
    pub gen: usize,
    /// Context already in the KV cache when each test starts (llama-bench's `-d`): the prompt
    /// test's tokens and each sequence's decode steps come after this many (untimed) tokens.
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// How the KV pool stores K and V (`f16`, `q8_0`; `[engine] kv_format`).
    #[arg(long, default_value = "f16", value_parser = parse_kv_format)]
    pub kv_format: cachet_kernels::backend::KvFormat,
    /// Sequences decoded together (comma-separated list).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub batch: Vec<usize>,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print per-op time of the whole run.
    #[arg(long)]
    pub profile: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Instead: time to first token of a request whose first N tokens are
    /// cached (by an earlier request with the same prefix) vs. cold, through
    /// the engine loop and its prefix cache.
    #[arg(long, value_name = "N")]
    pub reuse: Option<usize>,
    /// Instead: decode speed with a tool-call grammar vs without, through the
    /// engine loop (at each --batch), and grammar compile times for 20 tools.
    #[arg(long, conflicts_with = "reuse")]
    pub grammar: bool,
    /// Instead: decode speed with speculative decoding (drafts from the prompt and output) vs
    /// without, through the engine loop, on a code edit (a file asked back with a rename).
    #[arg(long, conflicts_with_all = ["reuse", "grammar"])]
    pub spec: bool,
    /// Instead: the KL divergence of next-token distributions with K/V in `--kv-format` against
    /// f16 over this text file's windows (`llama-perplexity --kl-divergence`'s figures).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["reuse", "grammar", "spec"])]
    pub kv_kl: Option<PathBuf>,
    /// With --kv-kl: tokens per window (llama-perplexity's `-c`).
    #[arg(long, default_value_t = 2048)]
    pub kl_ctx: usize,
    /// With --kv-kl: at most this many windows (llama-perplexity's `--chunks`; 0: all the text's).
    #[arg(long, default_value_t = 0)]
    pub kl_windows: usize,
    /// With --spec: the longest draft per sequence and pass (`[engine] draft_tokens`; default: its
    /// default).
    #[arg(long, requires = "spec", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub draft_tokens: Option<u32>,
}

fn parse_kv_format(s: &str) -> Result<cachet_kernels::backend::KvFormat, String> {
    cachet_kernels::backend::KvFormat::parse(s).ok_or_else(|| format!("unknown K/V format {s:?} (f16, q8_0)"))
}

struct Bench<B: Backend> {
    b: B,
    model: Model<B>,
    pool: KvPool<B>,
    scratch: ForwardScratch<B>,
    logits: Vec<f32>,
    rng: Rng,
    depth: usize,
}

impl<B: Backend> Bench<B> {
    fn tokens(&mut self, n: usize) -> Vec<u32> {
        let vocab = self.model.config().vocab_size as u64;
        (0..n).map(|_| (self.rng.next_u64() % vocab) as u32).collect()
    }

    fn forward(&mut self, seqs: Vec<SeqChunk<'_>>) -> anyhow::Result<()> {
        Ok(self.model.forward(&self.b, self.pool.storage_mut(), &seqs, &mut self.scratch, &mut self.logits)?)
    }

    /// Fills the first `self.depth` of `slots` with a context (untimed), in passes of 512.
    fn fill(&mut self, slots: &[SlotId]) -> anyhow::Result<()> {
        let context = self.tokens(self.depth);
        for start in (0..self.depth).step_by(512) {
            let end = (start + 512).min(self.depth);
            self.forward(vec![SeqChunk {
                tokens: &context[start..end],
                start_pos: start,
                slots: SlotId::raw(&slots[..end]),
                logits: LogitsFor::None,
            }])?;
        }
        Ok(())
    }

    /// Seconds for one forward pass over `n` prompt tokens (after `depth` tokens of context).
    fn prefill(&mut self, n: usize) -> anyhow::Result<f64> {
        let tokens = self.tokens(n);
        let depth = self.depth;
        let slots = self.pool.allocate(depth + n)?;
        let filled = self.fill(&slots);
        let start = Instant::now();
        let r = filled.and_then(|_| {
            self.forward(vec![SeqChunk {
                tokens: &tokens,
                start_pos: depth,
                slots: SlotId::raw(&slots),
                logits: LogitsFor::Last,
            }])
        });
        let secs = start.elapsed().as_secs_f64();
        self.pool.free(&slots)?;
        r.map(|_| secs)
    }

    /// Seconds for `steps` decode steps of `batch` sequences (each starting
    /// from one untimed token after `depth` tokens of context).
    fn decode(&mut self, batch: usize, steps: usize) -> anyhow::Result<f64> {
        let depth = self.depth;
        let mut slots: Vec<Vec<SlotId>> = Vec::new();
        for _ in 0..batch {
            let s = self.pool.allocate(depth + 1 + steps)?;
            self.fill(&s)?;
            slots.push(s);
        }
        let first = self.tokens(batch);
        let seqs = (0..batch)
            .map(|i| SeqChunk {
                tokens: &first[i..i + 1],
                start_pos: depth,
                slots: SlotId::raw(&slots[i][..depth + 1]),
                logits: LogitsFor::Last,
            })
            .collect();
        let mut result = self.forward(seqs);
        let start = Instant::now();
        for step in 1..=steps {
            if result.is_err() {
                break;
            }
            let next = self.tokens(batch);
            let seqs = (0..batch)
                .map(|i| SeqChunk {
                    tokens: &next[i..i + 1],
                    start_pos: depth + step,
                    slots: SlotId::raw(&slots[i][..depth + step + 1]),
                    logits: LogitsFor::Last,
                })
                .collect();
            result = self.forward(seqs);
        }
        let secs = start.elapsed().as_secs_f64();
        for s in &slots {
            self.pool.free(s)?;
        }
        result.map(|_| secs)
    }
}

/// Memory bandwidth in GB/s, best of 5: reading 512 MiB (summing it), and a
/// STREAM-style copy of 256 MiB (read + write bytes counted).
fn bandwidth(pool: &rayon::ThreadPool) -> (f64, f64) {
    use rayon::prelude::*;
    let n = 64 << 20;
    let src = vec![1u64; n];
    let mut dst = vec![0u64; n / 2];
    let best = |f: &mut dyn FnMut()| {
        f();
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let read = best(&mut || {
        let s: u64 = pool.install(|| {
            src.par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                .reduce(|| 0, u64::wrapping_add)
        });
        std::hint::black_box(s);
    });
    let copy = best(&mut || {
        pool.install(|| {
            dst.par_chunks_mut(1 << 15).zip(src.par_chunks(1 << 15)).for_each(|(d, s)| d.copy_from_slice(s))
        })
    });
    ((n * 8) as f64 / read / 1e9, (n * 8) as f64 / copy / 1e9)
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let path = super::model_path(args.model.as_deref())?;
    let device = crate::device::select(args.device.parse().map_err(anyhow::Error::msg)?)?;
    if args.spec {
        return match device {
            crate::device::Device::Cpu => super::bench_spec::run(&args, &path, || Ok(CpuBackend::new(args.threads)?)),
            crate::device::Device::Cuda(info) => {
                super::bench_spec::run(&args, &path, || crate::device::cuda_backend(&info, args.cublas_prefill))
            }
        };
    }
    if let Some(text) = &args.kv_kl {
        return match device {
            crate::device::Device::Cpu => super::bench_kl::run(&args, &path, text, CpuBackend::new(args.threads)?),
            crate::device::Device::Cuda(info) => {
                super::bench_kl::run(&args, &path, text, crate::device::cuda_backend(&info, args.cublas_prefill)?)
            }
        };
    }
    if args.grammar {
        return match device {
            crate::device::Device::Cpu => super::bench_grammar::run(&args, &path, CpuBackend::new(args.threads)?),
            crate::device::Device::Cuda(info) => {
                super::bench_grammar::run(&args, &path, crate::device::cuda_backend(&info, args.cublas_prefill)?)
            }
        };
    }
    match (device, args.reuse) {
        (crate::device::Device::Cpu, Some(prefix)) => reuse(&args, &path, prefix, CpuBackend::new(args.threads)?),
        (crate::device::Device::Cuda(info), Some(prefix)) => {
            reuse(&args, &path, prefix, crate::device::cuda_backend(&info, args.cublas_prefill)?)
        }
        (crate::device::Device::Cpu, None) => {
            let mut b = CpuBackend::new(args.threads)?;
            if args.profile {
                b = b.with_profiling();
            }
            let threads = b.threads();
            let (read_gbs, copy_gbs) =
                bandwidth(&rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("thread pool")?);
            let peak = cachet_kernels::cpu::int8_peak(&b, 0.5);
            let b = speeds(&args, &path, b, Machine { read_gbs, copy_gbs, int8_peak: peak })?;
            if args.profile {
                super::generate::print_profile(&b.profile(), peak);
            }
            Ok(())
        }
        (crate::device::Device::Cuda(info), None) => {
            // The device's memory bandwidth from its clock and bus width (no copy measured).
            let peak = info.peak_bandwidth_gbs().unwrap_or(f64::NAN);
            let mut b = crate::device::cuda_backend(&info, args.cublas_prefill)?;
            if args.profile {
                // CACHET_CUDA_PROFILE=host: host time per op only, the step at its usual speed.
                b = if std::env::var("CACHET_CUDA_PROFILE").is_ok_and(|v| v == "host") {
                    b.with_host_timing()
                } else {
                    b.with_timing()
                };
            }
            let b = speeds(&args, &path, b, Machine { read_gbs: peak, copy_gbs: f64::NAN, int8_peak: None })?;
            if let Some(p) = b.profile().filter(|_| args.profile) {
                print_cuda_profile(&p);
            }
            Ok(())
        }
    }
}

/// Per op: calls, host time and GPU time; then the GPU's idle time between ops.
fn print_cuda_profile(p: &cachet_kernels::cuda::CudaProfile) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let gpu: f64 = p.ops.values().map(|o| ms(o.gpu)).sum();
    eprintln!("\n{:>10} {:>10} {:>6} {:>9}  op", "host ms", "gpu ms", "gpu %", "calls");
    let mut ops: Vec<_> = p.ops.iter().collect();
    ops.sort_by_key(|(_, t)| std::cmp::Reverse(t.gpu));
    for (op, t) in ops {
        let share = 100.0 * ms(t.gpu) / gpu.max(1e-9);
        eprintln!("{:>10.1} {:>10.1} {share:>5.1}% {:>9}  {op}", ms(t.host), ms(t.gpu), t.calls);
    }
    let host: f64 = p.ops.values().map(|o| ms(o.host)).sum();
    eprintln!("{host:>10.1} {gpu:>10.1} {:>6} {:>9}  total", "", "");
    eprintln!("{:>10} {:>10.1} {:>6} {:>9}  GPU idle between ops (waiting for the host)", "", ms(p.gpu_idle), "", "");
}

/// Prefill and decode speeds on `b`, with weight bandwidth as a share of `read_gbs`; returns the
/// backend (for its profile).
/// What the machine can do, measured in the same run: memory bandwidth (GB/s) and, on the CPU,
/// the int8 multiply-add peak (per second, all threads).
struct Machine {
    read_gbs: f64,
    copy_gbs: f64,
    int8_peak: Option<f64>,
}

/// Multiply-adds of a dense model's weight matmuls per prompt token (the output layer, computed
/// for the last token only, left out); `None` for a mixture of experts (its tokens read
/// different experts).
fn matmul_macs_per_token(c: &cachet_engine::config::ModelConfig) -> Option<u64> {
    if c.moe.is_some() {
        return None;
    }
    let (q, kv) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
    let per_layer = c.hidden * (q + 2 * kv) + q * c.hidden + 3 * c.hidden * c.intermediate;
    Some((per_layer * c.n_layers) as u64)
}

fn speeds<B: Backend>(args: &BenchArgs, path: &std::path::Path, b: B, machine: Machine) -> anyhow::Result<B> {
    let Machine { read_gbs, copy_gbs, int8_peak } = machine;
    let loaded = cachet_engine::loader::load(path, &b).with_context(|| format!("loading {}", path.display()))?;
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let slots = (args.depth + args.prompt).max(max_batch * (args.depth + args.gen + 1)).max(16);
    let pool = KvPool::with_format(&b, loaded.model.config(), PoolSize::Tokens(slots), args.kv_format)?;
    let scratch = ForwardScratch::new(&b);
    let mut bench = Bench { b, model: loaded.model, pool, scratch, logits: Vec::new(), rng: Rng::new(1234), depth: 0 };

    let step_bytes = bench.model.step_bytes();
    let macs_per_token = matmul_macs_per_token(bench.model.config());
    // A prefill's int8 multiply-adds per second (its weight matmuls over its whole time), and
    // that as a share of the peak.
    let int8_rate = |test: &str, tps: f64| {
        let rate = macs_per_token.filter(|_| test.starts_with("pp")).map(|m| m as f64 * tps)?;
        Some((rate, int8_peak.map(|p| rate / p)))
    };

    // Warm-up: fault the weights in and size the buffers.
    bench.prefill(args.prompt.clamp(1, 64))?;
    bench.decode(1, 2)?;
    bench.depth = args.depth;
    let mut at = if args.depth > 0 { format!(" @ d{}", args.depth) } else { String::new() };
    if args.kv_format != cachet_kernels::backend::KvFormat::F16 {
        at += &format!(" kv {}", args.kv_format.name());
    }

    let mut rows = Vec::new();
    if args.prompt > 0 {
        let times: Vec<f64> = (0..args.reps.max(1)).map(|_| bench.prefill(args.prompt)).collect::<Result<_, _>>()?;
        rows.push((format!("pp{}{at}", args.prompt), 1, args.prompt as f64 / median(times.clone()), times));
    }
    if args.gen > 0 {
        for &batch in &args.batch {
            let times: Vec<f64> =
                (0..args.reps.max(1)).map(|_| bench.decode(batch, args.gen)).collect::<Result<_, _>>()?;
            rows.push((format!("tg{}{at}", args.gen), batch, (batch * args.gen) as f64 / median(times.clone()), times));
        }
    }
    if args.json {
        let tests: Vec<serde_json::Value> = rows
            .iter()
            .map(|(test, batch, tps, times)| {
                let (macs, of_peak) = int8_rate(test, *tps).map_or((None, None), |(r, f)| (Some(r), f));
                serde_json::json!({"test": test, "batch": batch, "tokens_per_second": tps, "seconds": times,
                    "weight_gbs": if test.starts_with("tg") { tps / *batch as f64 * step_bytes as f64 / 1e9 } else { 0.0 },
                    "int8_macs_per_second": macs, "of_int8_peak": of_peak})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"model": loaded.name, "backend": bench.b.name(), "tests": tests,
                "read_gbs": read_gbs, "copy_gbs": copy_gbs, "step_bytes": step_bytes,
                "int8_peak_macs_per_second": int8_peak, "matmul_macs_per_token": macs_per_token,
                "host_weights": format!("{:?}", loaded.host_weights),
                "expert_bytes": bench.model.expert_bytes().map(|(all, read)| serde_json::json!({"all": all, "read": read}))})
        );
    } else {
        println!("model: {} · backend: {} · weights {}", loaded.name, bench.b.name(), loaded.host_weights.describe());
        println!(
            "memory: read {read_gbs:.1} GB/s, copy {copy_gbs:.1} GB/s · a decode step reads {:.1} MB of weights \
             (limit at read bandwidth: {:.1} steps/s)",
            step_bytes as f64 / 1e6,
            read_gbs * 1e9 / step_bytes as f64
        );
        if let (Some((all, read)), Some(m)) = (bench.model.expert_bytes(), &bench.model.config().moe) {
            println!(
                "mixture of experts: {} of {} experts active; a step reads {:.1} of their {:.1} MB \
                 (counted above; a batch reads the union of its tokens' experts)",
                m.active,
                m.experts,
                read as f64 / 1e6,
                all as f64 / 1e6
            );
        }
        if let Some(p) = int8_peak {
            println!(
                "int8 multiply-add peak: {:.1} G/s on the backend's threads (its SIMD level's dot-product \
                 instructions on registers, measured in this run)",
                p / 1e9
            );
        }
        println!(
            "| test | sequences | tokens/s (median of {}) | weight GB/s | of read bandwidth | int8 GMAC/s | of int8 peak |",
            args.reps.max(1)
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for (test, batch, tps, _) in &rows {
            if test.starts_with("tg") {
                let gbs = tps / *batch as f64 * step_bytes as f64 / 1e9;
                println!("| {test} | {batch} | {tps:.1} | {gbs:.1} | {:.0}% | | |", 100.0 * gbs / read_gbs);
            } else {
                let (rate, share) = match int8_rate(test, *tps) {
                    Some((r, f)) => {
                        (format!("{:.1}", r / 1e9), f.map_or(String::new(), |f| format!("{:.0}%", 100.0 * f)))
                    }
                    None => (String::new(), String::new()),
                };
                println!("| {test} | {batch} | {tps:.1} | | | {rate} | {share} |");
            }
        }
    }
    Ok(bench.b)
}

/// `--reuse N`: per round, a fresh N-token prefix; request A (prefix + 16
/// tokens) runs cold, then request B (prefix + 16 other tokens) reuses A's
/// cached prefix. Reports the median TTFT of each and their ratio.
fn reuse<B: Backend + 'static>(args: &BenchArgs, path: &std::path::Path, prefix: usize, b: B) -> anyhow::Result<()> {
    use cachet_engine::generate::GenerateParams;
    use cachet_engine::radix::TenantKey;
    use cachet_engine::runtime::{self, EngineConfig, Request};
    let loaded = cachet_engine::loader::load(path, &b).with_context(|| format!("loading {}", path.display()))?;
    let name = loaded.name.clone();
    let vocab = loaded.model.config().vocab_size as u64;
    let cfg = EngineConfig {
        pool: PoolSize::Tokens((4 * (prefix + 64)).max(4096)),
        overload_factor: 0.0,
        ..EngineConfig::default()
    };
    let engine = runtime::start(b, loaded, cfg)?;
    let mut rng = Rng::new(99);
    let mut draw = |n: usize| (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect::<Vec<u32>>();
    let (mut cold, mut warm, mut cached) = (Vec::new(), Vec::new(), 0);
    let params = GenerateParams { max_tokens: 1, ignore_eos: true, ..Default::default() };
    for _ in 0..args.reps.max(1) {
        let p = draw(prefix);
        let (sa, sb) = (draw(16), draw(16));
        let run = |tokens: Vec<u32>| -> anyhow::Result<cachet_engine::runtime::Completion> {
            let out = engine.submit(Request::new(TenantKey::new("bench"), tokens, params.clone())).collect_blocking();
            Ok(out.result?)
        };
        let a = run([p.clone(), sa].concat())?;
        let bb = run([p, sb].concat())?;
        cold.push(a.ttft.unwrap_or_default().as_secs_f64());
        warm.push(bb.ttft.unwrap_or_default().as_secs_f64());
        cached = bb.cached_tokens;
    }
    let (c, w) = (median(cold.clone()), median(warm.clone()));
    if args.json {
        println!(
            "{}",
            serde_json::json!({"model": name, "prefix": prefix, "cold_ttft": cold, "cached_ttft": warm,
                "cached_tokens": cached, "ratio": c / w})
        );
    } else {
        println!("model: {name} · prefix: {prefix} tokens · {} rounds", args.reps.max(1));
        println!("| request | cached prompt tokens | TTFT (median) |");
        println!("|---|---:|---:|");
        println!("| cold: {prefix} + 16 tokens | 0 | {:.3} s |", c);
        println!("| same prefix, new 16-token suffix | {cached} | {:.3} s |", w);
        println!("\ncached / cold: {:.1}× lower", c / w);
    }
    Ok(())
}
