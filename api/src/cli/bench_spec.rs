//! `cachet bench --spec`: what speculative decoding gives on a code edit.
//!
//! The prompt holds a real file (`scripts/fairness_check.py` of this repository, ~100 lines)
//! and asks for the whole file back with one function renamed — what an agent's `write_file`
//! does after a small change. Two engines on the same model, one drafting (`draft_tokens`, the
//! default) and one not, answer it greedily (`--batch` copies at once), in alternating rounds;
//! the prompt is cached before the rounds, so they time decoding. Reported: decode tokens/s per
//! sequence (tokens after the first over the time from the first to the last, median over
//! requests and rounds), the drafted tokens the model confirmed, and tokens per pass; and that
//! both engines wrote the same tokens.

use super::bench::median;
use anyhow::Context;
use cachet_engine::chat_template::ChatMessage;
use cachet_engine::generate::GenerateParams;
use cachet_engine::kv_pool::PoolSize;
use cachet_engine::radix::TenantKey;
use cachet_engine::runtime::{self, EngineConfig, EngineHandle, Request};
use cachet_kernels::backend::Backend;
use serde_json::json;
use std::time::Instant;

/// The file the answer repeats.
const FILE: &str = include_str!("../../../scripts/fairness_check.py");

/// One round on `engine`: `batch` greedy copies at once. Per request: its decode rate and its
/// tokens.
fn round(engine: &EngineHandle, prompt: &[u32], batch: usize, gen: usize) -> anyhow::Result<Vec<(f64, Vec<u32>)>> {
    let streams: Vec<_> = (0..batch)
        .map(|_| {
            let params = GenerateParams { max_tokens: gen, ..Default::default() };
            engine.submit(Request::new(TenantKey::new("bench"), prompt.to_vec(), params))
        })
        .collect();
    std::thread::scope(|scope| {
        let readers: Vec<_> = streams
            .into_iter()
            .map(|mut s| {
                scope.spawn(move || -> anyhow::Result<(f64, Vec<u32>)> {
                    let (mut first, mut last, mut tokens) = (None, None, Vec::new());
                    while let Some(event) = s.blocking_next() {
                        match event {
                            runtime::Event::Token { id, .. } => {
                                let now = Instant::now();
                                first.get_or_insert(now);
                                last = Some(now);
                                tokens.push(id);
                            }
                            runtime::Event::Done(_) => break,
                            runtime::Event::Error(e) => return Err(e.into()),
                        }
                    }
                    let secs = match (first, last) {
                        (Some(a), Some(b)) => (b - a).as_secs_f64(),
                        _ => 0.0,
                    };
                    Ok(((tokens.len().saturating_sub(1)) as f64 / secs.max(1e-9), tokens))
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().map_err(|_| anyhow::anyhow!("a reader failed"))?).collect()
    })
}

/// Runs the comparison; `backend` makes each engine's backend.
pub fn run<B: Backend + 'static>(
    args: &super::bench::BenchArgs,
    path: &std::path::Path,
    backend: impl Fn() -> anyhow::Result<B>,
) -> anyhow::Result<()> {
    let load = |b: &B| cachet_engine::loader::load(path, b).with_context(|| format!("loading {}", path.display()));
    let (b_on, b_off) = (backend()?, backend()?);
    let (on, off) = (load(&b_on)?, load(&b_off)?);
    let name = on.name.clone();
    let template = on.chat_template.as_ref().context("the model has no chat template")?;
    let messages = [ChatMessage::user(format!(
        "Here is scripts/fairness_check.py:\n\n```python\n{FILE}```\n\nRename the function `post` to \
         `send_request` everywhere in it. Answer with the whole new file in one ```python block and nothing else."
    ))];
    let text = template.render(&messages, true, None)?;
    let prompt = on.tokenizer.encode(&text, true)?;
    let max_batch = args.batch.iter().copied().max().unwrap_or(1);
    let cfg = EngineConfig {
        pool: PoolSize::Tokens((max_batch * (args.gen + 80) + 2 * prompt.len()).max(4096)),
        overload_factor: 0.0,
        ..EngineConfig::default()
    };
    let drafts = args.draft_tokens.map_or(cfg.draft_tokens, |d| d as usize).max(1);
    let engine_on = runtime::start(b_on, on, EngineConfig { draft_tokens: drafts, ..cfg.clone() })?;
    let engine_off = runtime::start(b_off, off, EngineConfig { draft_tokens: 0, ..cfg })?;
    let warm = GenerateParams { max_tokens: 1, ..Default::default() };
    for e in [&engine_on, &engine_off] {
        e.submit(Request::new(TenantKey::new("bench"), prompt.clone(), warm.clone())).collect_blocking().result?;
    }

    let mut rows = Vec::new();
    for &batch in &args.batch {
        let before = engine_on.snapshot_blocking().unwrap_or_default();
        let (mut with, mut without, mut same, mut tokens) = (Vec::new(), Vec::new(), true, 0);
        for r in 0..args.reps.max(1) {
            let order = if r % 2 == 0 { [true, false] } else { [false, true] };
            let mut outputs = Vec::new();
            for drafting in order {
                let got = round(if drafting { &engine_on } else { &engine_off }, &prompt, batch, args.gen)?;
                let rates = got.iter().map(|g| g.0);
                if drafting {
                    with.extend(rates);
                    tokens += got.iter().map(|g| g.1.len()).sum::<usize>();
                } else {
                    without.extend(rates);
                }
                outputs.extend(got.into_iter().map(|g| g.1));
            }
            same &= outputs.windows(2).all(|w| w[0] == w[1]);
        }
        let after = engine_on.snapshot_blocking().unwrap_or_default();
        let drafted = after.drafted_tokens - before.drafted_tokens;
        let accepted = after.accepted_tokens - before.accepted_tokens;
        // Every token not confirmed from a draft took a pass of its own sequence.
        let per_pass = tokens as f64 / (tokens as u64).saturating_sub(accepted).max(1) as f64;
        rows.push((batch, median(without), median(with), drafted, accepted, per_pass, same));
    }
    if args.json {
        let rows: Vec<_> = rows
            .iter()
            .map(|(b, off, on, d, a, p, same)| {
                json!({"batch": b, "plain_tps": off, "drafting_tps": on, "ratio": on / off, "drafted": d,
                    "accepted": a, "tokens_per_pass": p, "same_tokens": same})
            })
            .collect();
        println!(
            "{}",
            json!({"model": name, "prompt_tokens": prompt.len(), "gen": args.gen, "draft_tokens": drafts, "rows": rows})
        );
        return Ok(());
    }
    println!(
        "model: {name} · a code edit: prompt {} tokens (a ~100-line Python file), up to {} tokens back, greedy · \
         draft_tokens {drafts} · {} rounds, alternating",
        prompt.len(),
        args.gen,
        args.reps.max(1)
    );
    println!("| sequences | decode tok/s per sequence, plain | drafting | ratio | drafted | confirmed | tokens per pass | same tokens |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---|");
    for (batch, off, on, d, a, p, same) in &rows {
        println!(
            "| {batch} | {off:.1} | {on:.1} | {:.2} | {d} | {a} ({:.0}%) | {p:.2} | {} |",
            on / off,
            100.0 * *a as f64 / (*d).max(1) as f64,
            if *same { "yes" } else { "NO" }
        );
    }
    if rows.iter().any(|r| !r.6) {
        anyhow::bail!("drafting changed the tokens");
    }
    Ok(())
}
