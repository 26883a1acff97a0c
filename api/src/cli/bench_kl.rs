//! `cachet bench --kv-kl FILE`: how far K/V stored in 8 bits moves the model's next-token
//! distributions from K/V in f16.
//!
//! The file's text (no chat template) is cut into windows of `--kl-ctx` tokens, as llama.cpp's
//! `llama-perplexity` cuts it; each window runs through the model twice, in passes of 512, once
//! with its K/V in f16 and once in `--kv-format`. At the positions `llama-perplexity` scores
//! (the second half of each window, but its last position) the KL divergence
//! `KL(p_f16 ‖ p_other)` of the two next-token distributions is taken (in f64), and whether their
//! top tokens are the same. Reported: the mean KL divergence with its standard error, its 99th
//! percentile and maximum, the share of same top tokens and both runs' perplexity — what `llama-perplexity
//! --kl-divergence` prints for its own KV formats, so the two can be set side by side on the
//! same GGUF and text (`scripts/kv-fidelity.sh`).

use super::bench::BenchArgs;
use anyhow::Context;
use cachet_engine::kv_pool::{KvPool, PoolSize, SlotId};
use cachet_engine::model::{ForwardScratch, LogitsFor, SeqChunk};
use cachet_engine::sampler::argmax;
use cachet_kernels::backend::{Backend, KvFormat};
use std::path::Path;

/// `log_softmax(x)` in f64.
fn log_softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    let log_sum = sum.ln() + max;
    x.iter().map(|&v| v as f64 - log_sum).collect()
}

/// `KL(p ‖ q)` from log-probabilities.
fn kl(logp: &[f64], logq: &[f64]) -> f64 {
    logp.iter().zip(logq).map(|(&p, &q)| p.exp() * (p - q)).sum::<f64>().max(0.0)
}

pub fn run<B: Backend>(args: &BenchArgs, model: &Path, text: &Path, b: B) -> anyhow::Result<()> {
    anyhow::ensure!(args.kv_format != KvFormat::F16, "--kv-kl compares f16 K/V with another --kv-format (q8_0)");
    let loaded = cachet_engine::loader::load(model, &b).with_context(|| format!("loading {}", model.display()))?;
    let body = std::fs::read_to_string(text).with_context(|| format!("reading {}", text.display()))?;
    let tokens = loaded.tokenizer.encode(&body, false)?;
    let ctx = args.kl_ctx;
    let windows = (tokens.len() / ctx.max(1)).min(if args.kl_windows > 0 { args.kl_windows } else { usize::MAX });
    anyhow::ensure!(
        ctx >= 4 && windows >= 1,
        "{} holds {} tokens: less than one window of --kl-ctx {ctx}",
        text.display(),
        tokens.len()
    );
    let config = loaded.model.config().clone();
    anyhow::ensure!(ctx <= config.max_context, "--kl-ctx {ctx} is past the model's context of {}", config.max_context);
    let vocab = config.vocab_size;
    let formats = [KvFormat::F16, args.kv_format];
    let mut pools = formats
        .iter()
        .map(|&f| KvPool::with_format(&b, &config, PoolSize::Tokens(ctx), f))
        .collect::<Result<Vec<_>, _>>()?;
    let mut scratch = ForwardScratch::new(&b);
    let (mut base, mut out) = (Vec::new(), Vec::new());
    let (mut klds, mut same, mut nll) = (Vec::new(), 0usize, [0f64; 2]);
    let first = ctx / 2;
    for w in 0..windows {
        let window = &tokens[w * ctx..(w + 1) * ctx];
        let slots: Vec<_> = pools.iter_mut().map(|p| p.allocate(ctx)).collect::<Result<_, _>>()?;
        for start in (0..ctx).step_by(512) {
            let end = (start + 512).min(ctx);
            for (i, pool) in pools.iter_mut().enumerate() {
                let chunk = [SeqChunk {
                    tokens: &window[start..end],
                    start_pos: start,
                    slots: SlotId::raw(&slots[i][..end]),
                    logits: LogitsFor::All,
                }];
                let logits = if i == 0 { &mut base } else { &mut out };
                loaded.model.forward(&b, pool.storage_mut(), &chunk, &mut scratch, logits)?;
            }
            // Positions first..ctx - 1 (each predicts the next token of the window).
            for pos in start.max(first)..end.min(ctx - 1) {
                let row = (pos - start) * vocab..(pos - start + 1) * vocab;
                let (p, q) = (&base[row.clone()], &out[row]);
                let (lp, lq) = (log_softmax(p), log_softmax(q));
                klds.push(kl(&lp, &lq));
                same += (argmax(p) == argmax(q)) as usize;
                let next = window[pos + 1] as usize;
                nll[0] -= lp[next];
                nll[1] -= lq[next];
            }
        }
        for (pool, s) in pools.iter_mut().zip(&slots) {
            pool.free(s)?;
        }
        eprintln!(
            "window {} of {windows}: mean KL divergence so far {:.6}",
            w + 1,
            klds.iter().sum::<f64>() / klds.len() as f64
        );
    }
    let n = klds.len() as f64;
    let mean = klds.iter().sum::<f64>() / n;
    let sd = (klds.iter().map(|k| (k - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    klds.sort_by(f64::total_cmp);
    let p99 = klds[((n * 0.99) as usize).min(klds.len() - 1)];
    let max = klds[klds.len() - 1];
    println!(
        "K/V {} against f16: {} windows of {ctx} tokens, {} positions scored ({})",
        args.kv_format.name(),
        windows,
        klds.len(),
        text.display()
    );
    println!(
        "| mean KL divergence | ± (standard error) | 99th percentile | maximum | same top token | perplexity, f16 \
         | perplexity, {} |",
        args.kv_format.name()
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {mean:.6} | {:.6} | {p99:.6} | {max:.6} | {:.2}% | {:.4} | {:.4} |",
        sd / n.sqrt(),
        100.0 * same as f64 / n,
        (nll[0] / n).exp(),
        (nll[1] / n).exp()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_divergence_is_zero_for_the_same_distribution_and_positive_otherwise() {
        let p = log_softmax(&[1.0, 2.0, 3.0]);
        assert!(kl(&p, &p).abs() < 1e-15);
        // p = (1/4, 3/4), q = (1/2, 1/2): 1/4 · ln(1/2) + 3/4 · ln(3/2).
        let (p, q) = (log_softmax(&[0.0, 3f32.ln()]), log_softmax(&[0.0, 0.0]));
        let want = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((kl(&p, &q) - want).abs() < 1e-7, "{} vs {want}", kl(&p, &q));
        assert_eq!(argmax(&[0.5, 3.0, -1.0]), 1);
    }
}
