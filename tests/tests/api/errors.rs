//! Every error status, in OpenAI's shape, and the server keeps serving.

use crate::helpers::*;
use serde_json::json;

#[tokio::test]
async fn bad_input_gets_clear_4xx_and_the_server_keeps_serving() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let url = format!("{}/v1/chat/completions", app.address);
    let raw = |body: Vec<u8>| {
        app.client.post(&url).bearer_auth(&token).header("content-type", "application/json").body(body).send()
    };
    // Malformed JSON, wrong types, invalid UTF-8.
    error(raw(b"{\"model\": ".to_vec()).await.unwrap(), 400).await;
    error(raw(br#"{"model": 5, "messages": "nope"}"#.to_vec()).await.unwrap(), 400).await;
    let mut utf8 = br#"{"model": "tiny", "messages": [{"role": "user", "content": ""#.to_vec();
    utf8.extend_from_slice(&[0xff, 0xfe, 0xfd]);
    utf8.extend_from_slice(br#""}]}"#);
    error(raw(utf8).await.unwrap(), 400).await;
    // A 10 MB body.
    let big =
        format!(r#"{{"model": "tiny", "messages": [{{"role": "user", "content": "{}"}}]}}"#, "a".repeat(10 << 20));
    error(raw(big.into_bytes()).await.unwrap(), 413).await;
    // Out-of-range and unsupported parameters name the parameter.
    let mut b = app.chat_body("x", 4);
    b["temperature"] = json!(7.5);
    assert_eq!(error(app.chat(&token, b).await, 400).await["param"], "temperature");
    let mut b = app.chat_body("x", 4);
    b["n"] = json!(3);
    assert_eq!(error(app.chat(&token, b).await, 400).await["param"], "n");
    error(app.chat(&token, json!({ "model": app.model(), "messages": [] })).await, 400).await;
    // Unknown model.
    let mut b = app.chat_body("x", 4);
    b["model"] = json!("gpt-17");
    assert_eq!(error(app.chat(&token, b).await, 404).await["code"], "model_not_found");
    // A prompt longer than the context (the pool here is 4096 tokens).
    let e = error(app.chat(&token, app.chat_body(&"word ".repeat(5000), 4)).await, 413).await;
    assert_eq!(e["code"], "context_length_exceeded");
    // No token.
    let r = app.client.post(&url).json(&app.chat_body("x", 4)).send().await.unwrap();
    error(r, 401).await;
    // Unknown endpoint.
    error(app.client.get(format!("{}/v1/nope", app.address)).send().await.unwrap(), 404).await;
    // Still serving.
    assert_eq!(app.chat(&token, app.chat_body("still there?", 4)).await.status(), 200);
}

#[tokio::test]
async fn plan_limits_answer_429_with_retry_after() {
    let (app, token) = spawn_tight("acme", 2).await;
    for _ in 0..2 {
        assert_eq!(app.chat(&token, app.chat_body("x", 2)).await.status(), 200);
    }
    let r = app.chat(&token, app.chat_body("x", 2)).await;
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry));
    assert_eq!(error(r, 429).await["code"], "rate_limit_exceeded");
}

#[tokio::test]
async fn overload_answers_429_with_retry_after() {
    // How long one long prompt takes alone here (the second try: the first warms up).
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let long = |i: usize| app.chat_body(&format!("{i} {}", "long prompt ".repeat(300)), 1);
    let mut lone = std::time::Duration::ZERO;
    for i in 0..2 {
        let t = std::time::Instant::now();
        assert_eq!(app.chat(&token, long(i)).await.status(), 200);
        lone = t.elapsed();
    }
    // A target one such prompt meets alone but not behind several others: the queue makes the
    // later ones late, which waiting would fix, so they are refused with Retry-After.
    let ttft_ms = (lone.as_millis() as u64 * 2).max(5);
    let app = spawn_with(|s| {
        s.engine.overload_factor = 1.0;
        s.engine.interactive_ttft_ms = ttft_ms;
    })
    .await;
    let (_, token) = app.tenant("acme").await;
    let burst: Vec<_> = (0..8)
        .map(|i| {
            let (client, token) = (app.client.clone(), token.clone());
            let url = format!("{}/v1/chat/completions", app.address);
            let body = app.chat_body(&format!("{i} {}", "long prompt ".repeat(300)), 1);
            tokio::spawn(async move { client.post(url).bearer_auth(token).json(&body).send().await.unwrap() })
        })
        .collect();
    let mut refused = 0;
    for r in burst {
        let r = r.await.unwrap();
        if r.status() == 429 {
            assert!(r.headers().contains_key("retry-after"));
            assert_eq!(error(r, 429).await["code"], "overloaded");
            refused += 1;
        } else {
            assert_eq!(r.status(), 200);
        }
    }
    assert!((1..8).contains(&refused), "{refused} of 8 refused (target {ttft_ms} ms, one alone {lone:?})");

    // A target no request can meet even alone: refusing would not help, so a request behind
    // running work is admitted and served (an SLO miss), not refused.
    let app = spawn_with(|s| {
        s.engine.overload_factor = 1.0;
        s.engine.interactive_ttft_ms = 1;
    })
    .await;
    let (_, token) = app.tenant("acme").await;
    let mut busy = app.chat_body("keep the engine busy", 400);
    busy["stream"] = json!(true);
    busy["ignore_eos"] = json!(true);
    let running = app.chat(&token, busy).await;
    assert_eq!(running.status(), 200, "the first request runs");
    let r = app.chat(&token, app.chat_body(&"long prompt ".repeat(300), 4)).await;
    assert_eq!(r.status(), 200, "a request beyond reach is served");
    drop(running);
}

#[tokio::test]
async fn not_ready_is_503() {
    let url = fresh_database();
    let data_dir = tempfile::tempdir().unwrap();
    let mut s = settings(&url, data_dir.path());
    s.model.path = "/nonexistent/model.gguf".into();
    let jwt = cachet_tenants::jwt::Jwt::new(&s.auth.jwt).unwrap();
    let app = cachet_api::startup::Application::build(s).await.unwrap();
    let address = format!("http://127.0.0.1:{}", app.port());
    let state = app.state();
    tokio::spawn(app.run_until_stopped());
    let client = reqwest::Client::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while state.model.load_error.lock().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let r = client.get(format!("{address}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let tenant = state.store.create_tenant("acme", &cachet_tenants::Plan::builtin()[0]).await.unwrap();
    let token = jwt.issue(tenant.id, std::time::Duration::from_secs(60)).unwrap();
    let r = client
        .post(format!("{address}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&json!({ "model": "tiny", "messages": [{ "role": "user", "content": "x" }] }))
        .send()
        .await
        .unwrap();
    let e = error(r, 503).await;
    assert!(e["message"].as_str().unwrap().contains("/nonexistent/model.gguf"), "{e}");
    // A probe's 503 is the probe working, not a fault: not a warning in the operator's log.
    let logs = logs();
    let warned = |path: &str| logs.lines().any(|l| l.contains(" WARN ") && l.contains(&format!("path={path} ")));
    assert!(warned("/v1/chat/completions"), "other 5xx answers are warnings:\n{logs}");
    assert!(!warned("/readyz"), "a /readyz 503 is logged below WARN");
}
