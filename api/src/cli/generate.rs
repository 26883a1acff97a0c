//! `cachet generate`: one completion on this machine, streamed to stdout,
//! with prompt and decode speed (and optionally a per-op profile) on stderr.

use anyhow::{bail, Context};
use cachet_engine::chat_template::ChatMessage;
use cachet_engine::generate::{GenerateParams, Generator};
use cachet_engine::kv_pool::PoolSize;
use cachet_engine::sampler::SamplingParams;
use cachet_kernels::backend::Backend;
use cachet_kernels::cpu::CpuBackend;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The prompt text.
    #[arg(long, required_unless_present = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long, conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Take special tokens written in the prompt (`<|im_start|>`) as plain text; by default
    /// they are the tokens they name, as on `/v1/completions`.
    #[arg(long, conflicts_with = "chat")]
    pub plain: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// A .gguf file or a Hugging Face directory (default: the default model, pulled if missing).
    #[arg(long, env = "CACHET_MODEL")]
    pub model: Option<PathBuf>,
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop before this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Worker threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// auto (a CUDA GPU when usable, else the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value = "auto", env = "CACHET_DEVICE")]
    pub device: String,
    /// On CUDA: long prefills through cuBLAS on bf16 weight copies (gives up batch invariance).
    #[arg(long)]
    pub cublas_prefill: bool,
    /// KV pool size in tokens (default: the model's context, at most 8192).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Print where the time went, per op.
    #[arg(long)]
    pub profile: bool,
    /// Print one JSON object (text and statistics) instead of streaming.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let model_path = super::model_path(args.model.as_deref())?;
    let prompt_text = match (&args.prompt, &args.prompt_file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        (None, None) => bail!("give --prompt or --prompt-file"),
    };
    match crate::device::select(args.device.parse().map_err(anyhow::Error::msg)?)? {
        crate::device::Device::Cpu => {
            let mut backend = CpuBackend::new(args.threads)?;
            if args.profile {
                backend = backend.with_profiling();
            }
            let gen = generate_on(&args, &model_path, prompt_text, backend)?;
            if args.profile {
                print_profile(&gen.backend().profile(), None);
            }
        }
        crate::device::Device::Cuda(info) => {
            if args.profile {
                bail!("--profile times the CPU backend's ops; run with --device cpu");
            }
            generate_on(&args, &model_path, prompt_text, crate::device::cuda_backend(&info, args.cublas_prefill)?)?;
        }
    }
    Ok(())
}

/// Loads the model on `backend`, generates and reports; returns the generator (for its profile).
fn generate_on<B: Backend>(
    args: &GenerateArgs,
    model_path: &std::path::Path,
    prompt_text: String,
    backend: B,
) -> anyhow::Result<Generator<B>> {
    let load_start = Instant::now();
    let loaded = cachet_engine::loader::load(model_path, &backend)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let load_time = load_start.elapsed();
    let config = loaded.model.config().clone();
    let ctx = args.ctx.unwrap_or(config.max_context.min(8192));
    let (name, file_bytes) = (loaded.name.clone(), loaded.file_bytes);
    let mut gen = Generator::new(backend, loaded, PoolSize::Tokens(ctx))?;

    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(prompt_text));
        gen.chat_prompt(&messages)?
    } else {
        gen.model().tokenizer.encode(&prompt_text, !args.plain)?
    };
    let params = GenerateParams {
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repetition_penalty,
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            seed: args.seed,
            logit_bias: Vec::new(),
        },
        max_tokens: args.max_tokens,
        stop: args.stop.clone(),
        stop_token_ids: Vec::new(),
        ignore_eos: args.ignore_eos,
        logprobs: None,
    };
    let stdout = std::io::stdout();
    let json = args.json;
    let mut on_text = |piece: &str| {
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    let out = gen.generate(&prompt, &params, &mut on_text)?;
    let peak_rss = peak_rss_bytes();
    let kv_bytes = gen.pool().layout().bytes();
    let finish = out.finish_reason.as_str();
    if json {
        let stats = serde_json::json!({
            "text": out.text,
            "model": name,
            "backend": gen.backend().name(),
            "prompt_tokens": out.prompt_tokens,
            "generated_tokens": out.tokens.len(),
            "finish_reason": finish,
            "load_seconds": load_time.as_secs_f64(),
            "prefill_seconds": out.prefill_time.as_secs_f64(),
            "decode_seconds": out.decode_time.as_secs_f64(),
            "prompt_tokens_per_second": out.prefill_tps(),
            "decode_tokens_per_second": out.decode_tps(),
            "model_file_bytes": file_bytes,
            "kv_pool_bytes": kv_bytes,
            "peak_rss_bytes": peak_rss,
        });
        println!("{stats}");
    } else {
        println!();
        eprintln!(
            "\nprompt: {} tokens in {:.2} s ({:.1} tok/s) · generated: {} tokens in {:.2} s ({:.1} tok/s) · finish: {finish}",
            out.prompt_tokens,
            out.prefill_time.as_secs_f64(),
            out.prefill_tps(),
            out.tokens.len(),
            out.decode_time.as_secs_f64(),
            out.decode_tps(),
        );
        eprintln!(
            "model: {name} ({:.0} MiB, memory-mapped) · backend: {} · KV pool: {ctx} tokens ({:.0} MiB) · peak RSS: {}",
            file_bytes as f64 / (1 << 20) as f64,
            gen.backend().name(),
            kv_bytes as f64 / (1 << 20) as f64,
            peak_rss.map_or("n/a".into(), |b| format!("{:.0} MiB", b as f64 / (1 << 20) as f64)),
        );
    }
    Ok(gen)
}

/// Time per op; with the machine's int8 peak (`peak`, multiply-adds per second: see
/// [`cachet_kernels::cpu::int8_peak`]), each matmul's rate as a share of it.
pub(super) fn print_profile(profile: &cachet_kernels::cpu::Profile, peak: Option<f64>) {
    let total: f64 = profile.iter().map(|o| o.time.as_secs_f64()).sum();
    eprintln!("\n{:>8} {:>6} {:>9} {:>8} {:>7}  op", "ms", "%", "calls", "GMAC/s", "of peak");
    for o in profile {
        let secs = o.time.as_secs_f64();
        let rate = o.macs as f64 / secs.max(1e-9);
        let gmacs = if o.macs > 0 { format!("{:.1}", rate / 1e9) } else { String::new() };
        let share = match peak {
            Some(p) if o.macs > 0 && o.label.starts_with("matmul") => format!("{:.0}%", 100.0 * rate / p),
            _ => String::new(),
        };
        eprintln!(
            "{:>8.1} {:>5.1}% {:>9} {gmacs:>8} {share:>7}  {}",
            secs * 1e3,
            100.0 * secs / total.max(1e-9),
            o.calls,
            o.label
        );
    }
}

/// Peak resident set size of this process (Linux `VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
