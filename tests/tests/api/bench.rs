//! cachet-bench against a live cachet: a small repeated-context run (closed
//! loop) and a tiny open-loop peak, through the library API.

use crate::helpers::spawn_app;
use cachet_bench::{run_scenario, Arrival, Burst, RunOptions, Scenario, ScenarioResult, ScenarioSpec, Slo, Target};
use std::path::PathBuf;
use std::time::Duration;

/// The workspace repository (prompts are cut from its source).
fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn options(seed: u64) -> RunOptions {
    RunOptions {
        seed,
        slo: Slo { ttft_ms: 60_000.0, itl_ms: 10_000.0 },
        timeout: Duration::from_secs(120),
        source_repo: workspace(),
        warmup: true,
        label: Some("test".into()),
        retries: 0,
    }
}

/// Every request completed with `max_tokens` tokens, TTFT within e2e, and
/// the summary's counts match the records.
fn check_complete(r: &ScenarioResult, max_tokens: u64) {
    let s = &r.summary;
    assert_eq!(r.records.len(), r.spec.requests(), "one record per planned request");
    assert_eq!((s.requests, s.completed, s.failed), (r.records.len(), r.records.len(), 0), "{:#?}", r.records);
    for rec in &r.records {
        assert!(rec.completed(), "{rec:?}");
        assert_eq!(rec.status, Some(200));
        assert_eq!(rec.output_tokens, max_tokens, "ignore_eos gives exact lengths: {rec:?}");
        let ttft = rec.ttft_ms.expect("a first token");
        assert!(ttft > 0.0 && ttft <= rec.e2e_ms, "{rec:?}");
        assert!(rec.prompt_tokens.is_some_and(|p| p > 0), "{rec:?}");
        assert!(rec.cached_tokens.is_some(), "cachet reports cached_tokens: {rec:?}");
        assert!(rec.itl_ms.len() as u64 <= max_tokens, "{rec:?}");
    }
    assert_eq!(s.output_tokens, max_tokens * r.records.len() as u64);
    assert_eq!(s.slo_met, r.records.len(), "the test SLO is loose");
    assert!(s.wall_s > 0.0 && s.requests_per_s > 0.0 && s.goodput_per_s > 0.0);
    assert_eq!(s.ttft_ms.map(|p| p.n), Some(r.records.len()));
}

#[tokio::test]
async fn bench_repeated_context_and_peak_against_cachet() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let target = Target {
        name: "cachet".into(),
        base_url: app.address.clone(),
        model: app.model(),
        api_key: Some(token),
        tenant_keys: Vec::new(),
    };

    // 2 sessions x 2 turns over a shared repository context. The tiny model's
    // byte-level vocabulary makes a token about one character, so "120
    // tokens" of context is ~480 real tokens: the prompts stay well under 1,000.
    let spec = ScenarioSpec {
        scenario: Scenario::RepeatedContext,
        conversations: 2,
        turns: 2,
        shared_tokens: 120,
        prompt_tokens: 25,
        max_tokens: 6,
        ignore_eos: true,
        arrival: Arrival::Closed { users: 2 },
    };
    let r = run_scenario(&target, &spec, &options(3)).await.expect("the scenario runs");
    check_complete(&r, 6);
    assert_eq!(r.scenario, Scenario::RepeatedContext);
    for rec in r.records.iter().filter(|x| x.turn > 0) {
        assert!(rec.cached_tokens.is_some_and(|c| c > 0), "a follow-up reuses the shared prefix: {rec:?}");
        let first = r.records.iter().find(|x| x.conversation == rec.conversation && x.turn == 0).unwrap();
        assert!(rec.prompt_tokens > first.prompt_tokens, "the conversation grows");
    }
    assert!(r.summary.cached_ratio.is_some_and(|c| c > 0.0));

    // Open loop: 2 Poisson arrivals plus a burst of 3 at 0.1 s.
    let spec = ScenarioSpec {
        scenario: Scenario::Peak,
        conversations: 2,
        turns: 1,
        shared_tokens: 0,
        prompt_tokens: 100,
        max_tokens: 4,
        ignore_eos: true,
        arrival: Arrival::Open { rate_per_s: 20.0, bursts: vec![Burst { at_s: 0.1, count: 3 }], max_in_flight: None },
    };
    let r = run_scenario(&target, &spec, &options(4)).await.expect("the scenario runs");
    check_complete(&r, 4);
    assert_eq!(r.records.len(), 5);
    // The burst's three requests were all scheduled at 100 ms.
    assert_eq!(r.records.iter().filter(|x| (x.scheduled_ms - 100.0).abs() < 1e-6).count(), 3);
    for rec in &r.records {
        assert!(rec.sent_ms.is_some_and(|s| s >= rec.scheduled_ms), "{rec:?}");
    }
}
