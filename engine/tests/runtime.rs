//! The engine loop end to end on a tiny random-weight model: batching
//! invariance, prefix reuse, tenant isolation, shares, invalidation,
//! retention, retraction, cancellation and overload.

use crate::common;
use common::{pool, tiny_engine, tokens};

use cachet_engine::generate::GenerateParams;
use cachet_engine::kv_pool::PoolSize;
use cachet_engine::radix::{RetentionKey, Tag, TenantKey};
use cachet_engine::runtime::{
    self, Completion, EngineConfig, EngineHandle, PublicPrefix, Request, RequestError, TokenSpan,
};
use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::backend::KvFormat;
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::quant::DType;
use std::time::Duration;

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams { max_tokens, ignore_eos: true, ..Default::default() }
}

fn request(tenant: &str, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(TenantKey::new(tenant), prompt, greedy(max_tokens))
}

fn run(h: &EngineHandle, req: Request) -> (Vec<u32>, Completion) {
    let out = h.submit(req).collect_blocking();
    let done = out.result.unwrap_or_else(|e| panic!("request failed: {e}"));
    (out.tokens, done)
}

fn no_leaks(h: &EngineHandle) {
    h.check_integrity_blocking().unwrap();
    let s = h.snapshot_blocking().unwrap();
    assert_eq!(s.kv_used, s.cached_slots, "slots held outside the cache with nothing running: {s:?}");
}

#[test]
fn concurrent_requests_match_running_alone() {
    // With K/V in f16 and in 8 bits (each row quantized on its own: batching changes nothing).
    for kv_format in KvFormat::ALL {
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| tokens(i, 5 + 37 * i as usize)).collect();
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                let h = tiny_engine(EngineConfig { kv_format: Some(kv_format), ..pool(4096) });
                run(&h, request("t", p.clone(), 16)).0
            })
            .collect();
        let h = tiny_engine(EngineConfig { token_budget: 96, kv_format: Some(kv_format), ..pool(4096) });
        let streams: Vec<_> = prompts.iter().map(|p| h.submit(request("t", p.clone(), 16))).collect();
        for (i, s) in streams.into_iter().enumerate() {
            let out = s.collect_blocking();
            assert!(out.result.is_ok(), "{:?}", out.result);
            assert_eq!(out.tokens, alone[i], "{kv_format:?}: request {i} changed when batched");
        }
        no_leaks(&h);
    }
}

#[test]
fn a_shared_prefix_is_computed_once() {
    for kv_format in KvFormat::ALL {
        a_shared_prefix_is_computed_once_in(EngineConfig { kv_format: Some(kv_format), ..pool(4096) });
    }
}

fn a_shared_prefix_is_computed_once_in(config: EngineConfig) {
    let prefix = tokens(1, 1000);
    let with = |suffix: &[u32]| [prefix.clone(), suffix.to_vec()].concat();
    let (first, second) = (with(&tokens(2, 20)), with(&tokens(3, 30)));
    let cold = run(&tiny_engine(config.clone()), request("t", second.clone(), 12)).0;

    let h = tiny_engine(config);
    let (_, a) = run(&h, request("t", first, 12));
    assert_eq!(a.cached_tokens, 0);
    assert_eq!(a.computed_prefill_tokens, 1020);
    let (out, b) = run(&h, request("t", second, 12));
    assert!(b.cached_tokens >= 1000, "{b:?}");
    assert_eq!(b.computed_prefill_tokens, 1030 - b.cached_tokens);
    assert_eq!(out, cold, "a cache hit changed the output");
    no_leaks(&h);
}

#[test]
fn tenants_share_only_the_public_system_prompt() {
    let h = tiny_engine(pool(4096));
    let system = tokens(10, 50);
    let prompt = [system.clone(), tokens(11, 200)].concat();
    let with_public = |tenant: &str, salt: Option<&str>| {
        let mut r = request(tenant, prompt.clone(), 4);
        r.public = Some(PublicPrefix { template: "chatml".into(), tokens: system.len() });
        r.salt = salt.map(Into::into);
        r
    };
    let (_, a) = run(&h, with_public("a", None));
    assert_eq!(a.cached_tokens, 0);
    // B sends A's exact prompt: only the public system prompt is reused.
    let (_, b) = run(&h, with_public("b", None));
    assert_eq!(b.cached_tokens, 50);
    // A salt narrows A's own reuse to the public part…
    let (_, salted) = run(&h, with_public("a", Some("user-1")));
    assert_eq!(salted.cached_tokens, 50);
    // …and reuse inside the salted namespace works.
    let (_, again) = run(&h, with_public("a", Some("user-1")));
    assert_eq!(again.cached_tokens, 249);
    // A without a salt still gets its whole prompt.
    let (_, full) = run(&h, with_public("a", None));
    assert_eq!(full.cached_tokens, 249);
    no_leaks(&h);
}

#[test]
fn a_flooding_tenant_cannot_evict_another_within_its_share() {
    let h = tiny_engine(pool(1200));
    h.set_share(TenantKey::new("a"), 0.5);
    h.set_share(TenantKey::new("b"), 0.5);
    let a_prompt = tokens(20, 300);
    run(&h, request("a", a_prompt.clone(), 4));
    for i in 0..12 {
        run(&h, request("b", tokens(100 + i, 250), 4));
    }
    let s = h.snapshot_blocking().unwrap();
    assert!(s.evicted_slots > 0, "the flood must have needed evictions: {s:?}");
    let (_, again) = run(&h, request("a", a_prompt, 4));
    assert_eq!(again.cached_tokens, 299, "A's prefix was evicted by B's flood");
    no_leaks(&h);
}

#[test]
fn invalidation_stops_reuse_at_the_span_start() {
    let h = tiny_engine(pool(4096));
    let prompt = tokens(30, 400);
    let span = |version: &str| TokenSpan {
        range: 150..250,
        tag: Tag { source: "src/lib.rs".into(), version: version.into() },
    };
    let mut r = request("t", prompt.clone(), 4);
    r.spans = vec![span("v1")];
    run(&h, r.clone());
    assert_eq!(run(&h, request("t", prompt.clone(), 4)).1.cached_tokens, 399);
    assert!(h.invalidate_blocking("src/lib.rs", Some("v1")).unwrap() == 0, "keeping v1 frees nothing");
    assert!(h.invalidate_blocking("src/lib.rs", None).unwrap() > 0);
    h.check_integrity_blocking().unwrap();
    assert_eq!(run(&h, request("t", prompt.clone(), 4)).1.cached_tokens, 150);

    // A request running over the span holds it: invalidated now, freed when it ends.
    let mut long = request("t", prompt.clone(), 400);
    long.spans = vec![span("v2")];
    let mut stream = h.submit(long);
    stream.blocking_next().expect("first token");
    h.invalidate_blocking("src/lib.rs", None).unwrap();
    h.check_integrity_blocking().unwrap();
    let (_, hit) = run(&h, request("t", prompt.clone(), 4));
    assert_eq!(hit.cached_tokens, 150, "no hit past the span start while the holder runs");
    drop(stream);
    // The holder is cancelled; what it held past the cut is not re-cached.
    let (_, after) = run(&h, request("t", prompt, 4));
    assert_eq!(after.cached_tokens, 399, "the previous request re-cached the prompt");
    no_leaks(&h);
}

#[test]
fn retained_sessions_survive_pressure_until_released() {
    let h = tiny_engine(pool(700));
    let session = RetentionKey("session-1".into());
    let retained = tokens(40, 200);
    let mut r = request("a", retained.clone(), 4);
    r.retention = Some((session.clone(), Duration::from_secs(600)));
    run(&h, r);
    let other = tokens(41, 200);
    run(&h, request("a", other.clone(), 4));
    // A big request needs room: the unretained prefix goes, though the
    // retained one is older.
    run(&h, request("a", tokens(42, 350), 4));
    assert_eq!(run(&h, request("a", retained.clone(), 4)).1.cached_tokens, 199);
    assert!(run(&h, request("a", other, 4)).1.cached_tokens < 199);
    // Released: evictable like anything else (and now least recently used).
    h.release(session);
    run(&h, request("a", tokens(43, 350), 4));
    run(&h, request("a", tokens(44, 350), 4));
    assert!(run(&h, request("a", retained, 4)).1.cached_tokens < 199);
    no_leaks(&h);
}

#[test]
fn retraction_keeps_outputs_identical_and_leaks_nothing() {
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| tokens(50 + i, 40 + 7 * i as usize)).collect();
    let big = tiny_engine(pool(4096));
    let expected: Vec<Vec<u32>> = prompts.iter().map(|p| run(&big, request("t", p.clone(), 60)).0).collect();

    // Six requests needing ~100 slots each in a pool of 260.
    let h = tiny_engine(EngineConfig { token_budget: 64, ..pool(260) });
    let streams: Vec<_> = prompts.iter().map(|p| h.submit(request("t", p.clone(), 60))).collect();
    for (i, s) in streams.into_iter().enumerate() {
        let out = s.collect_blocking();
        assert_eq!(out.tokens, expected[i], "request {i} changed after retraction");
        h.check_integrity_blocking().unwrap();
    }
    let s = h.snapshot_blocking().unwrap();
    assert!(s.retractions > 0, "the pool was meant to be too small: {s:?}");
    no_leaks(&h);

    // Cancellations mid-flight free everything too.
    let mut streams: Vec<_> = prompts.iter().map(|p| h.submit(request("t", p.clone(), 200))).collect();
    for s in &mut streams {
        s.blocking_next();
    }
    drop(streams);
    let done = run(&h, request("t", tokens(99, 10), 2)); // the engine processed the cancellations
    assert_eq!(done.1.output_tokens, 2);
    no_leaks(&h);
}

#[test]
fn bad_requests_are_refused_with_reasons() {
    let h = tiny_engine(pool(512));
    let err = |r: Request| h.submit(r).collect_blocking().result.unwrap_err();
    assert!(matches!(err(request("t", vec![], 4)), RequestError::Invalid(_)));
    assert!(matches!(err(request("t", vec![1, 999], 4)), RequestError::Invalid(m) if m.contains("999")));
    assert!(matches!(err(request("t", tokens(1, 600), 4)), RequestError::TooLong { .. }));
    let mut bad = request("t", tokens(1, 10), 4);
    bad.params.sampling.top_p = 0.0;
    assert!(matches!(err(bad), RequestError::Invalid(m) if m.contains("top_p")));
    no_leaks(&h);
}

#[test]
fn a_pool_that_does_not_fit_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    Tiny::random(TinyArch::from_env(), 77, false).write_gguf(DType::Q8_0, &path).unwrap();
    let backend = CpuBackend::new(1).unwrap();
    let loaded = cachet_engine::loader::load(&path, &backend).unwrap();
    let cfg = EngineConfig { pool: PoolSize::Bytes(1 << 50), ..Default::default() };
    let err = runtime::start(backend, loaded, cfg).unwrap_err().to_string();
    assert!(err.contains("does not fit") && err.contains("MiB"), "{err}");
}

#[test]
fn prewarm_fills_the_cache_without_output() {
    let h = tiny_engine(pool(4096));
    let context = tokens(60, 300);
    let mut warm = request("t", context.clone(), 50);
    warm.prewarm = true;
    let (out, done) = run(&h, warm);
    assert!(out.is_empty());
    assert_eq!((done.output_tokens, done.ttft), (0, None));
    assert_eq!(done.computed_prefill_tokens, 300);
    // The next question over the same context only computes its own tokens.
    let (_, next) = run(&h, request("t", [context, tokens(61, 10)].concat(), 4));
    assert_eq!(next.cached_tokens, 300);
    no_leaks(&h);
}

#[test]
fn requests_arriving_together_on_one_long_prefix_compute_it_once() {
    // An agent's main request and its side request: the same 600-token history, then each its
    // own tail, sent at the same moment. The second waits for the first's prompt (published to
    // the cache as it completes, while the first still decodes) instead of computing it again.
    let history = tokens(21, 600);
    let with = |tail: u64| {
        let mut p = history.clone();
        p.extend(tokens(tail, 20));
        p
    };
    let alone: Vec<Vec<u32>> =
        [31, 32].iter().map(|&t| run(&tiny_engine(pool(4096)), request("t", with(t), 40)).0).collect();
    let h = tiny_engine(EngineConfig { token_budget: 128, ..pool(4096) });
    let first = h.submit(request("t", with(31), 40));
    let second = h.submit(request("t", with(32), 40));
    let (a, b) = (first.collect_blocking(), second.collect_blocking());
    let (ca, cb) = (a.result.unwrap(), b.result.unwrap());
    assert_eq!(a.tokens, alone[0], "the first answer is unchanged");
    assert_eq!(b.tokens, alone[1], "the second answer, on the first's K/V, is unchanged");
    assert_eq!(ca.cached_tokens, 0);
    assert!(cb.cached_tokens >= 600, "the second reused the shared history: {cb:?}");
    assert!(ca.output_tokens == 40 && cb.output_tokens == 40);
    no_leaks(&h);
    // Another tenant's request on the same tokens does not wait for (nor reuse) it.
    let h = tiny_engine(EngineConfig { token_budget: 128, ..pool(4096) });
    let first = h.submit(request("t", with(31), 8));
    let other = h.submit(request("u", with(31), 8));
    let (a, b) = (first.collect_blocking(), other.collect_blocking());
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(b.result.unwrap().cached_tokens, 0);
    no_leaks(&h);
}

#[test]
fn a_caller_can_end_a_request_from_its_text() {
    // The caller's hook sees every piece of text in order and ends the request at the fifth:
    // it finishes as a stop would, with what it generated so far, and batch-mates go on.
    let h = tiny_engine(pool(4096));
    let (whole, _) = run(&h, request("t", tokens(1, 40), 24));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut req = request("t", tokens(1, 40), 24);
    let log = seen.clone();
    req.stop_when = Some(std::sync::Arc::new(move |piece: &str| {
        let mut log = log.lock().unwrap();
        log.push(piece.to_string());
        log.len() == 5
    }));
    let other = h.submit(request("u", tokens(2, 30), 24));
    let out = h.submit(req).collect_blocking();
    let done = out.result.unwrap();
    assert_eq!(done.finish_reason, cachet_engine::generate::FinishReason::Stop);
    assert_eq!(out.tokens, whole[..5], "the same tokens, up to where the hook said stop");
    assert_eq!(seen.lock().unwrap().concat(), out.text, "the hook saw exactly the text the caller got");
    assert_eq!(other.collect_blocking().tokens.len(), 24);
    no_leaks(&h);
}
