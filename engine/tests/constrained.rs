//! Constrained decoding in the engine loop, on a tiny random-weight model: a
//! constrained request's output follows its grammar and does not depend on its
//! batch, survives retraction unchanged, and a grammar that allows nothing ends
//! the request with a clear error.

use crate::common;
use common::{pool, tiny_engine, tokens};

use cachet_engine::constraint::{Grammar, GrammarSource};
use cachet_engine::generate::{FinishReason, GenerateParams};
use cachet_engine::radix::TenantKey;
use cachet_engine::runtime::{EngineConfig, EngineHandle, Request, RequestError};

/// A bounded JSON document: every output under it ends by itself.
const SCHEMA: &str = r#"{"type": "object", "properties": {
    "kind": {"enum": ["file", "dir", "link"]},
    "size": {"type": "integer", "minimum": 0, "maximum": 99999},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "maxItems": 3}},
    "required": ["kind", "size", "tags"], "additionalProperties": false,
    "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}}"#;

fn grammar(h: &EngineHandle, source: GrammarSource) -> Grammar {
    h.grammars().compile(&source).unwrap()
}

/// Request `i`: constrained by `g` when given (sampled, seeded), else greedy and unconstrained.
fn request(i: u64, g: Option<&Grammar>) -> Request {
    let params = GenerateParams {
        max_tokens: 160,
        ignore_eos: g.is_none(),
        sampling: cachet_engine::sampler::SamplingParams {
            temperature: if g.is_some() { 0.8 } else { 0.0 },
            seed: Some(i),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut r = Request::new(TenantKey::new("t"), tokens(i, 30 + 11 * i as usize), params);
    r.grammar = g.cloned();
    r
}

#[test]
fn constrained_outputs_follow_the_grammar_and_do_not_depend_on_the_batch() {
    let h = tiny_engine(pool(8192));
    let schema = grammar(&h, GrammarSource::JsonSchema(SCHEMA.into()));
    let regex = grammar(&h, GrammarSource::Regex("(yes|no): [0-9]{1,4}".into()));
    let pick = |i: u64| match i % 3 {
        0 => Some(&schema),
        1 => Some(&regex),
        _ => None,
    };
    let alone: Vec<_> = (0..9).map(|i| h.submit(request(i, pick(i))).collect_blocking()).collect();
    for (i, out) in alone.iter().enumerate() {
        let done = out.result.as_ref().unwrap_or_else(|e| panic!("request {i}: {e}"));
        let Some(g) = pick(i as u64) else { continue };
        assert_eq!(done.finish_reason, FinishReason::Stop, "request {i} ended by its grammar: {:?}", out.text);
        assert_eq!(g.check(&out.tokens), Ok(true), "request {i}: {:?}", out.text);
        if i % 3 == 0 {
            let v: serde_json::Value = serde_json::from_str(&out.text).unwrap();
            assert!(["file", "dir", "link"].contains(&v["kind"].as_str().unwrap()), "{v}");
            assert!(v["size"].as_u64().unwrap() <= 99999);
        } else {
            assert!(out.text.starts_with("yes: ") || out.text.starts_with("no: "), "{:?}", out.text);
        }
    }
    // The same nine at once, with a small token budget so that prefill chunks and decode mix.
    let h = tiny_engine(EngineConfig { token_budget: 48, ..pool(8192) });
    let (schema, regex) = (
        grammar(&h, GrammarSource::JsonSchema(SCHEMA.into())),
        grammar(&h, GrammarSource::Regex("(yes|no): [0-9]{1,4}".into())),
    );
    let pick = |i: u64| match i % 3 {
        0 => Some(&schema),
        1 => Some(&regex),
        _ => None,
    };
    let streams: Vec<_> = (0..9).map(|i| h.submit(request(i, pick(i)))).collect();
    for (i, s) in streams.into_iter().enumerate() {
        let out = s.collect_blocking();
        assert_eq!(out.tokens, alone[i].tokens, "request {i} changed when batched");
    }
    h.check_integrity_blocking().unwrap();
}

#[test]
fn a_constrained_request_survives_retraction_unchanged() {
    let big = tiny_engine(pool(8192));
    let g = grammar(&big, GrammarSource::JsonSchema(SCHEMA.into()));
    let expected: Vec<_> = (0..6).map(|i| big.submit(request(i * 3, Some(&g))).collect_blocking().tokens).collect();

    let h = tiny_engine(EngineConfig { token_budget: 64, ..pool(300) });
    let g = grammar(&h, GrammarSource::JsonSchema(SCHEMA.into()));
    let streams: Vec<_> = (0..6).map(|i| h.submit(request(i * 3, Some(&g)))).collect();
    for (i, s) in streams.into_iter().enumerate() {
        let out = s.collect_blocking();
        assert!(out.result.is_ok(), "{:?}", out.result);
        assert_eq!(out.tokens, expected[i], "request {i} changed after retraction");
    }
    let s = h.snapshot_blocking().unwrap();
    assert!(s.retractions > 0, "the pool was meant to be too small: {s:?}");
    h.check_integrity_blocking().unwrap();
}

#[test]
fn a_grammar_that_allows_nothing_ends_the_request_with_a_clear_error() {
    let h = tiny_engine(pool(4096));
    // After "x", a word that is all letters and all digits: no token can follow.
    let g = grammar(&h, GrammarSource::Lark("start: \"x\" A\nA: /[a-z]+/ & /[0-9]+/".into()));
    let out = h.submit(request(1, Some(&g))).collect_blocking();
    match out.result {
        Err(RequestError::Grammar(m)) => assert_eq!(m, "the grammar allows no token here"),
        other => panic!("expected a grammar error, got {other:?} after {:?}", out.text),
    }
    assert_eq!(out.text, "x", "the output stops where the grammar does");
    // The engine goes on serving, and nothing leaked.
    assert!(h.submit(request(2, None)).collect_blocking().result.is_ok());
    h.check_integrity_blocking().unwrap();
    // ignore_eos cannot be combined with a grammar.
    let mut r = request(3, Some(&g));
    r.params.ignore_eos = true;
    assert!(matches!(h.submit(r).collect_blocking().result, Err(RequestError::Invalid(_))));
}
