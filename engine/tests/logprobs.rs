//! Log-probabilities against the independent f64 reference forward pass: each
//! generated token's log-probability and its step's alternatives are the
//! log-softmax of the model's logits after the penalties, before any grammar mask.

use crate::common;

use cachet_engine::constraint::GrammarSource;
use cachet_engine::generate::GenerateParams;
use cachet_engine::radix::TenantKey;
use cachet_engine::runtime::{Event, Request};
use cachet_engine::sampler::{SamplingParams, TokenLogprobs};
use cachet_kernels::quant::DType;
use common::*;

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = max + row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// Runs one request; returns its tokens and their log-probabilities.
fn run(
    h: &cachet_engine::runtime::EngineHandle,
    prompt: &[u32],
    params: GenerateParams,
    grammar: Option<GrammarSource>,
) -> Vec<(u32, TokenLogprobs)> {
    let mut req = Request::new(TenantKey::new("t"), prompt.to_vec(), params);
    req.grammar = grammar.map(|g| h.grammars().compile(&g).unwrap());
    let mut events = h.submit(req);
    let mut out = Vec::new();
    while let Some(e) = events.blocking_next() {
        match e {
            Event::Token { id, logprobs, .. } => out.push((id, *logprobs.expect("asked for logprobs"))),
            Event::Done(_) => return out,
            Event::Error(e) => panic!("{e}"),
        }
    }
    panic!("the stream ended without Done")
}

#[test]
fn logprobs_are_the_log_softmax_of_the_penalised_logits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    let tiny = Tiny::random(TinyArch::Qwen2, 77, false);
    tiny.write_gguf(DType::F32, &path).unwrap();
    let backend = cachet_kernels::cpu::CpuBackend::new(2).unwrap();
    let loaded = cachet_engine::loader::load(&path, &backend).unwrap();
    let h = cachet_engine::runtime::start(backend, loaded, pool(4096)).unwrap();
    let prompt = tokens(5, 24);
    for presence in [0.0f32, 1.5] {
        let params = GenerateParams {
            max_tokens: 6,
            ignore_eos: true,
            logprobs: Some(5),
            sampling: SamplingParams { temperature: 0.0, presence_penalty: presence, ..Default::default() },
            ..Default::default()
        };
        let out = run(&h, &prompt, params, None);
        assert_eq!(out.len(), 6);
        let mut all = prompt.clone();
        all.extend(out.iter().map(|(t, _)| *t));
        let reference = reference_logits(&tiny, &all);
        for (i, (token, lp)) in out.iter().enumerate() {
            let mut row = reference[prompt.len() - 1 + i].clone();
            // Presence penalty: every token generated before this step, once.
            let mut seen: Vec<u32> = out[..i].iter().map(|(t, _)| *t).collect();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                row[t as usize] -= presence;
            }
            let expect = log_softmax(&row);
            let diff = (lp.logprob as f64 - expect[*token as usize]).abs();
            assert!(diff < 0.02, "step {i}, presence {presence}: {} vs {}", lp.logprob, expect[*token as usize]);
            assert_eq!(lp.top.len(), 5);
            assert_eq!(lp.top[0].0, *token, "greedy: the drawn token is the most likely");
            for w in lp.top.windows(2) {
                assert!(w[0].1 >= w[1].1, "most likely first");
            }
            for &(t, l) in &lp.top {
                assert!((l as f64 - expect[t as usize]).abs() < 0.02, "alternative {t}: {l} vs {}", expect[t as usize]);
            }
        }
    }
    // A grammar forces digits: the forced tokens' log-probabilities are the
    // model's, not renormalised over what the mask allowed.
    let params = GenerateParams {
        max_tokens: 3,
        logprobs: Some(0),
        sampling: SamplingParams { temperature: 0.0, ..Default::default() },
        ..Default::default()
    };
    let out = run(&h, &prompt, params, Some(GrammarSource::Regex("[0-9]{3}".into())));
    let mut all = prompt.clone();
    all.extend(out.iter().map(|(t, _)| *t));
    let reference = reference_logits(&tiny, &all);
    let mut masked_away = 0.0;
    for (i, (token, lp)) in out.iter().enumerate().take(3) {
        let expect = log_softmax(&reference[prompt.len() - 1 + i]);
        assert!((lp.logprob as f64 - expect[*token as usize]).abs() < 0.02, "step {i}");
        assert!(lp.top.is_empty());
        masked_away += 1.0 - expect[*token as usize].exp();
    }
    assert!(masked_away > 0.5, "the mask mattered (the tokens were not already certain)");
}
