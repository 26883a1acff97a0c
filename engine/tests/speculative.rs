//! Speculative decoding on a tiny random-weight model: drafted tokens are checked by the model
//! in the same pass, so what a request gets is exactly what decoding one token at a time gives
//! — greedy or sampled with a seed, with penalties, stop tokens and log-probabilities — alone or
//! batched with others, and the slots of rejected drafts go back.

use crate::common;
use common::{pool, tiny_engine, tokens};

use cachet_engine::constraint::{Grammar, GrammarSource};
use cachet_engine::generate::GenerateParams;
use cachet_engine::radix::TenantKey;
use cachet_engine::runtime::{EngineConfig, EngineHandle, Event, Request};
use cachet_engine::sampler::SamplingParams;

/// A prompt that repeats a 12-token phrase: the model's output soon repeats something the
/// drafter has seen.
fn repetitive(seed: u64, n: usize) -> Vec<u32> {
    tokens(seed, 12).into_iter().cycle().take(n).collect()
}

fn cases() -> Vec<(Vec<u32>, GenerateParams)> {
    let greedy = GenerateParams { max_tokens: 48, ignore_eos: true, ..Default::default() };
    let sampled = GenerateParams {
        sampling: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            repetition_penalty: 1.1,
            seed: Some(7),
            ..Default::default()
        },
        ..greedy.clone()
    };
    let logprobs = GenerateParams { logprobs: Some(3), ..greedy.clone() };
    let mut prompts: Vec<Vec<u32>> = (0..4).map(|i| repetitive(i, 40 + 24 * i as usize)).collect();
    prompts.push(tokens(9, 30));
    let mut cases = Vec::new();
    for (i, p) in prompts.into_iter().enumerate() {
        cases.push((p.clone(), greedy.clone()));
        cases.push((p.clone(), if i % 2 == 0 { sampled.clone() } else { logprobs.clone() }));
    }
    // A stop token that the greedy output of the first prompt produces part way.
    cases.push((repetitive(0, 40), GenerateParams { stop_token_ids: vec![repetitive(0, 40)[5]], ..greedy }));
    cases
}

/// Every event of a request, written out (token ids, texts, log-probabilities, the end).
fn events(h: &EngineHandle, prompt: &[u32], params: &GenerateParams) -> Vec<String> {
    constrained_events(h, prompt, params, None)
}

/// [`events`] of a request under `grammar`.
fn constrained_events(
    h: &EngineHandle,
    prompt: &[u32],
    params: &GenerateParams,
    grammar: Option<&Grammar>,
) -> Vec<String> {
    let mut r = Request::new(TenantKey::new("t"), prompt.to_vec(), params.clone());
    r.grammar = grammar.cloned();
    let mut s = h.submit(r);
    let mut out = Vec::new();
    while let Some(e) = s.blocking_next() {
        match e {
            Event::Token { id, text, logprobs } => out.push(format!("{id} {text:?} {logprobs:?}")),
            Event::Done(c) => {
                out.push(format!("done {:?} {}", c.finish_reason, c.output_tokens));
                break;
            }
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
    out
}

#[test]
fn drafted_outputs_are_those_of_decoding_one_token_at_a_time() {
    let plain = tiny_engine(EngineConfig { draft_tokens: 0, ..pool(8192) });
    let spec = tiny_engine(EngineConfig { draft_tokens: 16, ..pool(8192) });
    let cases = cases();
    let want: Vec<Vec<String>> = cases.iter().map(|(p, g)| events(&plain, p, g)).collect();
    // One at a time, then all together (drafted chunks beside other sequences' tokens).
    for (i, (p, g)) in cases.iter().enumerate() {
        assert_eq!(events(&spec, p, g), want[i], "case {i} alone");
    }
    std::thread::scope(|scope| {
        let runs: Vec<_> = cases.iter().map(|(p, g)| scope.spawn(|| events(&spec, p, g))).collect();
        for (i, run) in runs.into_iter().enumerate() {
            assert_eq!(run.join().unwrap(), want[i], "case {i} batched");
        }
    });
    let s = spec.snapshot_blocking().unwrap();
    assert!(s.accepted_tokens > 0, "no draft was confirmed, so the test checked nothing: {s:?}");
    assert!(s.drafted_tokens > s.accepted_tokens, "no draft was rejected: {s:?}");
    assert_eq!(plain.snapshot_blocking().unwrap().drafted_tokens, 0);
    spec.check_integrity_blocking().unwrap();
    assert_eq!(s.kv_used, s.cached_slots, "slots held outside the cache with nothing running: {s:?}");
}

/// Under a grammar a draft is cut at its first token the grammar would not allow, and each
/// verified position is masked by the grammar's state after the tokens before it: outputs are
/// those of decoding one token at a time, and drafts were confirmed.
#[test]
fn drafted_outputs_under_a_grammar_are_those_of_decoding_one_token_at_a_time() {
    let plain = tiny_engine(EngineConfig { draft_tokens: 0, ..pool(8192) });
    let spec = tiny_engine(EngineConfig { draft_tokens: 16, ..pool(8192) });
    let sources = [
        GrammarSource::Regex("[a-d ]{1,120}".into()),
        // Complete after a few repeats, where a draft of the repeats goes on.
        GrammarSource::Regex("(ab ){3}".into()),
        GrammarSource::JsonSchema(
            r#"{"type": "array", "items": {"enum": ["read", "write", "list"]}, "maxItems": 30}"#.into(),
        ),
    ];
    let greedy = GenerateParams { max_tokens: 100, ..Default::default() };
    let seeded = GenerateParams {
        sampling: SamplingParams { temperature: 0.7, seed: Some(3), ..Default::default() },
        ..greedy.clone()
    };
    let before = spec.snapshot_blocking().unwrap();
    for source in &sources {
        let (g_plain, g_spec) = (plain.grammars().compile(source).unwrap(), spec.grammars().compile(source).unwrap());
        for (i, params) in [&greedy, &seeded].into_iter().enumerate() {
            for prompt in [repetitive(i as u64, 40), tokens(20 + i as u64, 30)] {
                let want = constrained_events(&plain, &prompt, params, Some(&g_plain));
                assert_eq!(constrained_events(&spec, &prompt, params, Some(&g_spec)), want, "{source:?}, {params:?}");
            }
        }
    }
    let s = spec.snapshot_blocking().unwrap();
    assert!(s.accepted_tokens > before.accepted_tokens, "no draft was confirmed under a grammar: {s:?}");
    spec.check_integrity_blocking().unwrap();
}

/// The tokens of one sampled request (seeded with `seed`).
fn sampled(h: &EngineHandle, prompt: &[u32], params: &GenerateParams, seed: u64) -> Vec<u32> {
    let mut p = params.clone();
    p.sampling.seed = Some(seed);
    // A tenant of its own: no earlier answer to draft from (see the test below).
    let mut s = h.submit(Request::new(TenantKey::new(format!("t{seed}").as_str()), prompt.to_vec(), p));
    let mut out = Vec::new();
    while let Some(e) = s.blocking_next() {
        match e {
            Event::Token { id, .. } => out.push(id),
            Event::Done(_) => break,
            Event::Error(e) => panic!("request failed: {e}"),
        }
    }
    out
}

/// A de Bruijn sequence of order 4 over `alphabet`: every 4 tokens (so every 2 and 3) occur in it,
/// so that whatever a request writes in that alphabet, the drafter finds its last tokens in the
/// prompt and drafts what followed them there, a guess unrelated to the model's distribution.
fn de_bruijn(alphabet: &[u32]) -> Vec<u32> {
    fn db(t: usize, p: usize, k: usize, a: &mut [usize; 5], out: &mut Vec<usize>) {
        if t > 4 {
            if 4 % p == 0 {
                out.extend_from_slice(&a[1..=p]);
            }
            return;
        }
        a[t] = a[t - p];
        db(t + 1, p, k, a, out);
        for j in a[t - p] + 1..k {
            a[t] = j;
            db(t + 1, t, k, a, out);
        }
    }
    let mut seq = Vec::new();
    db(1, 1, alphabet.len(), &mut [0; 5], &mut seq);
    let wrap: Vec<usize> = seq[..3].to_vec();
    seq.extend(wrap);
    seq.into_iter().map(|i| alphabet[i]).collect()
}

/// The distribution of sampled tokens is unchanged by drafting, as a statistical test. The
/// prompt holds every 4-token sequence of a 3-token alphabet and `logit_bias` keeps the output
/// within it, so a draft is there at nearly every position, and it is the prompt's continuation,
/// not a sample of the model's distribution. `N` requests with drafting and `N` without, on
/// seeds that do not overlap (two independent samples; each request a tenant of its own, so no
/// earlier answer is drafted from), and a two-sample χ² test on the pairs (token before, token) at
/// each position at a significance of 0.001 (critical values from Wilson–Hilferty). A kept draft
/// that was not the token sampled moves the pairs towards the prompt's continuations: breaking
/// the rule on purpose (a draft kept whenever it was the likeliest token) failed this test.
#[test]
fn sampled_tokens_follow_the_same_distribution_with_drafting() {
    const N: u64 = 3000;
    let plain = tiny_engine(EngineConfig { draft_tokens: 0, ..pool(8192) });
    let spec = tiny_engine(EngineConfig { draft_tokens: 16, ..pool(8192) });
    let alphabet = [5, 17, 42];
    let prompt = de_bruijn(&alphabet);
    assert_eq!(prompt.len(), 84);
    let params = GenerateParams {
        max_tokens: 6,
        ignore_eos: true,
        sampling: SamplingParams {
            temperature: 1.0,
            logit_bias: alphabet.iter().map(|&t| (t, 100.0)).collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    // Waves of concurrent requests (both engines batch them).
    let run = |h: &EngineHandle, seeds: std::ops::Range<u64>| -> Vec<Vec<u32>> {
        let seeds: Vec<u64> = seeds.collect();
        let mut out = Vec::new();
        for wave in seeds.chunks(16) {
            std::thread::scope(|scope| {
                let (prompt, params) = (&prompt, &params);
                let runs: Vec<_> = wave.iter().map(|&s| scope.spawn(move || sampled(h, prompt, params, s))).collect();
                out.extend(runs.into_iter().map(|r| r.join().unwrap()));
            });
        }
        out
    };
    let (a, b) = (run(&plain, 0..N), run(&spec, N..2 * N));
    let s = spec.snapshot_blocking().unwrap();
    assert!(s.accepted_tokens > N / 4, "too few drafts confirmed for the test to see their effect: {s:?}");
    assert!(a.iter().chain(&b).all(|o| o.len() == 6 && o.iter().all(|t| alphabet.contains(t))), "outside the alphabet");
    for pos in 1..6 {
        let mut counts: std::collections::BTreeMap<(u32, u32), (f64, f64)> = Default::default();
        for out in &a {
            counts.entry((out[pos - 1], out[pos])).or_default().0 += 1.0;
        }
        for out in &b {
            counts.entry((out[pos - 1], out[pos])).or_default().1 += 1.0;
        }
        // Equal sample sizes: χ² = Σ (x − y)² / (x + y), with k − 1 degrees of freedom.
        let chi2: f64 = counts.values().map(|(x, y)| (x - y) * (x - y) / (x + y)).sum();
        let df = (counts.len() - 1).max(1) as f64;
        let z = 3.09; // the 0.999 quantile of the standard normal
        let h = 2.0 / (9.0 * df);
        let critical = df * (1.0 - h + z * h.sqrt()).powi(3);
        assert!(chi2 < critical, "position {pos}: χ² {chi2:.1} ≥ {critical:.1} ({df} degrees of freedom)");
    }
    spec.check_integrity_blocking().unwrap();
}
