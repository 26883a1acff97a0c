//! Prefill/decode disaggregation between two servers on loopback: the decode server's answers are
//! the unified server's, token for token, with the prompt's K/V computed by the prefill server;
//! a prefill server that is gone or breaks off mid-transfer costs the request nothing but time.

use crate::helpers::*;
use cachet_api::config::{Reserve, Role};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 32-token chunks (the tiny model's prompts are short) on a disk tier.
fn tier(s: &mut cachet_api::config::Settings) {
    s.engine.kv_tier_gib = 1.0;
    s.engine.kv_tier_chunk_tokens = 32;
}

fn prefill_role(s: &mut cachet_api::config::Settings) {
    tier(s);
    s.disagg.role = Role::Prefill;
}

fn decode_from(urls: Vec<String>) -> impl FnOnce(&mut cachet_api::config::Settings) {
    move |s| {
        tier(s);
        s.disagg.role = Role::Decode;
        s.disagg.prefill_urls = urls;
        s.disagg.min_remote_tokens = 32;
        s.disagg.timeout_secs = 10;
    }
}

/// A prompt of about 300 tokens.
fn long_prompt(topic: &str) -> String {
    (0..60).map(|i| format!("{topic} line {i}: the cart sums prices.")).collect::<Vec<_>>().join(" ")
}

async fn answer(app: &TestApp, token: &str, content: &str) -> Value {
    let r = app.chat(token, app.chat_body(content, 12)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

fn text(v: &Value) -> &str {
    v["choices"][0]["message"]["content"].as_str().unwrap()
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn a_decode_server_answers_as_a_unified_one_with_the_prefill_done_elsewhere() {
    let unified = spawn_app().await;
    let prefill = spawn_with(prefill_role).await;
    let decode = spawn_with(decode_from(vec![prefill.address.clone()])).await;
    let (unified_tenant, on_unified) = unified.tenant("acme").await;
    let (decode_tenant, on_decode) = decode.tenant("acme").await;

    let prompt = long_prompt("disaggregated");
    let want = answer(&unified, &on_unified, &prompt).await;
    let got = answer(&decode, &on_decode, &prompt).await;
    assert_eq!(text(&got), text(&want), "greedy outputs differ: {got} vs {want}");
    let prompt_tokens = got["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 200, "{got}");
    // Everything before the last prompt token came from the prefill server (its whole chunks
    // and the partial one after them).
    let snap = decode.state.model.served.get().unwrap().engine.snapshot().await.unwrap();
    assert_eq!(snap.kv_tier_loaded_tokens, prompt_tokens - 1, "{snap:?}");
    assert_eq!(cached(&got), prompt_tokens - 1, "{got}");
    let computed_there = prefill.state.model.served.get().unwrap().engine.snapshot().await.unwrap();
    assert!(computed_there.kv_tier_saved_tokens >= prompt_tokens - 64, "{computed_there:?}");

    // The ledger splits the transfer out of the time to first token (which includes it).
    let rows = decode.ledger(decode_tenant).await;
    let row = rows.iter().find(|r| r.prompt_tokens as u64 == prompt_tokens).expect("the decode server's row");
    let moved = row.kv_transfer_ms.expect("a transfer time");
    assert!(moved > 0.0 && row.ttft_ms.unwrap() >= moved, "{row:?}");
    // The prompt was computed for this request (on the prefill server): billed as computed, not
    // as the cache hit the decode engine's load looks like.
    assert_eq!(row.cached_tokens, 0, "{row:?}");
    assert!(unified.ledger(unified_tenant).await.iter().all(|r| r.kv_transfer_ms.is_none()));

    // The prefill route is the operator's, and checks what it is sent.
    let job = json!({ "tenant": "t", "salt": null, "public": null, "tokens": [1, 2, 3], "spans": [],
                      "chunk_tokens": 32, "from_chunk": 0 });
    let r = prefill.post(&on_decode, "/v1/internal/prefill", job.clone()).await;
    assert!(r.status() == 401 || r.status() == 403, "a tenant ran a prefill job: {}", r.status());
    let mut bad = job.clone();
    bad["tokens"] = json!([1, 4_000_000_000u32]);
    assert_eq!(prefill.post(OPERATOR, "/v1/internal/prefill", bad).await.status(), 400);
    let mut bad = job.clone();
    bad["spans"] = json!([[0, 9, "a.rs", "v1"]]);
    assert_eq!(prefill.post(OPERATOR, "/v1/internal/prefill", bad).await.status(), 400);
    let mut bad = job.clone();
    bad["chunk_tokens"] = json!(64);
    assert_eq!(prefill.post(OPERATOR, "/v1/internal/prefill", bad).await.status(), 409);
    // A server without a disk tier cannot prefill for another.
    assert_eq!(unified.post(OPERATOR, "/v1/internal/prefill", job).await.status(), 404);
}

/// `reserve = "early"`: the request enters the decode engine at once, which holds its prompt's
/// slots and copies each chunk into them as it arrives; the answer is the unified server's.
#[tokio::test]
async fn an_early_reserving_decode_server_answers_as_a_unified_one() {
    let unified = spawn_app().await;
    let prefill = spawn_with(prefill_role).await;
    let decode = spawn_with(|s| {
        decode_from(vec![prefill.address.clone()])(s);
        s.disagg.reserve = Reserve::Early;
    })
    .await;
    let (_, on_unified) = unified.tenant("acme").await;
    let (decode_tenant, on_decode) = decode.tenant("acme").await;
    for topic in ["early", "reserved"] {
        let prompt = long_prompt(topic);
        let want = answer(&unified, &on_unified, &prompt).await;
        let got = answer(&decode, &on_decode, &prompt).await;
        assert_eq!(text(&got), text(&want), "greedy outputs differ: {got} vs {want}");
        // (The two prompts share the chat template's first few tokens.)
        assert!(cached(&got) < 32, "received, not found in a cache: {got}");
    }
    let engine = decode.state.model.served.get().unwrap().engine.clone();
    let snap = engine.snapshot().await.unwrap();
    assert_eq!(snap.kv_tier_loaded_tokens, 0, "nothing went through the disk: {snap:?}");
    // Only the last prompt token was computed on the decode server; the time to first token
    // includes the transfer (the engine held the request meanwhile).
    let rows = decode.ledger(decode_tenant).await;
    assert_eq!(rows.len(), 2);
    for row in &rows {
        assert!(row.computed_tokens == 1 && row.cached_tokens < 32, "{row:?}");
        let moved = row.kv_transfer_ms.expect("a transfer time");
        assert!(moved > 0.0 && row.ttft_ms.unwrap() >= moved * 0.9, "{row:?}");
    }
    // The prompt is cached on the decode server now: the next turn finds it in memory.
    let prompt = long_prompt("early");
    let again = answer(&decode, &on_decode, &prompt).await;
    assert!(cached(&again) > 200, "{again}");
    tokio::task::spawn_blocking(move || engine.check_integrity_blocking()).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_prefill_server_that_is_gone_or_breaks_off_leaves_the_prefill_to_the_decode_server() {
    let unified = spawn_app().await;
    let (_, on_unified) = unified.tenant("acme").await;
    // Nothing listens on port 9; the other "prefill server" answers 200 and half a chunk, then
    // closes the connection.
    let broken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let broken_url = format!("http://{}", broken.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut c, _)) = broken.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                let _ = tokio::time::timeout(Duration::from_millis(500), c.read(&mut buf)).await;
                let head =
                    "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let mut frame = 1_000_000u64.to_le_bytes().to_vec();
                frame.extend_from_slice(&[7u8; 1000]);
                let _ = c.write_all(head.as_bytes()).await;
                let _ = c.write_all(format!("{:x}\r\n", frame.len()).as_bytes()).await;
                let _ = c.write_all(&frame).await;
                let _ = c.write_all(b"\r\n").await;
                // No terminating chunk: the connection just ends.
            });
        }
    });
    let cases = [Reserve::PrefillComplete, Reserve::Early]
        .into_iter()
        .flat_map(|r| [("http://127.0.0.1:9".to_string(), r), (broken_url.clone(), r)]);
    for (url, reserve) in cases {
        let decode = spawn_with(|s| {
            decode_from(vec![url.clone()])(s);
            s.disagg.reserve = reserve;
        })
        .await;
        let (_, on_decode) = decode.tenant("acme").await;
        let prompt = long_prompt(&format!("fallback {} {reserve:?}", url.len()));
        let want = answer(&unified, &on_unified, &prompt).await;
        let got = answer(&decode, &on_decode, &prompt).await;
        assert_eq!(text(&got), text(&want), "{url} {reserve:?}: {got} vs {want}");
        assert_eq!(cached(&got), 0, "{url} {reserve:?}: nothing was transferred: {got}");
        let engine = decode.state.model.served.get().unwrap().engine.clone();
        tokio::task::spawn_blocking(move || engine.check_integrity_blocking()).await.unwrap().unwrap();
    }
}

#[test]
fn a_decode_role_needs_prefill_servers_and_a_disk_tier() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings("postgres://x", dir.path());
    s.disagg.role = Role::Decode;
    let e = s.check().unwrap_err();
    assert!(e.0.contains("kv_tier_gib"), "{e}");
    tier(&mut s);
    let e = s.check().unwrap_err();
    assert!(e.0.contains("prefill_urls"), "{e}");
    s.disagg.prefill_urls = vec!["ftp://x".into()];
    let e = s.check().unwrap_err();
    assert!(e.0.contains("ftp://x"), "{e}");
    s.disagg.prefill_urls = vec!["http://prefill-0:8080".into()];
    s.check().unwrap();
    assert_eq!("decode".parse::<Role>(), Ok(Role::Decode));
    assert!("both".parse::<Role>().unwrap_err().to_string().contains("unified prefill decode"));
}

/// A file of `n` small functions.
fn functions(prefix: &str, n: usize) -> String {
    (0..n).map(|i| format!("/// Adds {i}.\npub fn {prefix}_{i}(x: u32) -> u32 {{\n    x + {i}\n}}\n\n")).collect()
}

#[tokio::test]
async fn a_decode_servers_push_prewarm_is_computed_by_its_prefill_server() {
    let prefill = spawn_with(prefill_role).await;
    let decode = spawn_with(decode_from(vec![prefill.address.clone()])).await;
    let (_, token) = decode.tenant("acme").await;
    let (a, b) = (functions("add", 30), functions("sub", 30));
    let source = decode.source_repo("shop", &[("src/add.rs", Some(&a)), ("src/sub.rs", Some(&b))]);
    let repo = decode.register_with(&token, source, json!({ "after_push": "rebuild" })).await;
    let session = decode.session(&token, &repo).await;
    let turn = |content: &'static str| {
        let (decode, token, session) = (&decode, token.clone(), session.clone());
        async move {
            let r = decode
                .message(&token, &session, json!({ "content": content, "max_tokens": 2, "temperature": 0 }))
                .await;
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            r.json::<Value>().await.unwrap()
        }
    };
    turn("What does add_3 do?").await;
    let snap = |app: &TestApp| {
        let engine = app.state.model.served.get().unwrap().engine.clone();
        async move { engine.snapshot().await.unwrap() }
    };
    let (saved, loaded) = (snap(&prefill).await.kv_tier_saved_tokens, snap(&decode).await.kv_tier_loaded_tokens);

    let after = repo.source.commit(&[("src/add.rs", Some(&functions("plus", 31)))], "rename").unwrap().to_string();
    let pushed: Value = decode.push_hook(&repo, &repo.head, &after, None).await.json().await.unwrap();
    assert_eq!(pushed["prewarmed"], 1, "{pushed}");
    // The new context's changed part is computed on the prefill server (which has the unchanged
    // part cached from the first turn), then loaded by the decode server.
    let dry = decode.dry_run(&token, &session, "And now?").await;
    let context = dry["context_tokens"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while snap(&decode).await.kv_tier_loaded_tokens == loaded {
        assert!(std::time::Instant::now() < deadline, "the decode server never loaded the new context");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(snap(&prefill).await.kv_tier_saved_tokens > saved, "the prefill server computed nothing");
    decode.engine_idle().await;
    let mut v = turn("And now?").await;
    while cached(&v) < context && std::time::Instant::now() < deadline {
        // The pre-warm may still be on its way from the prefill server.
        tokio::time::sleep(Duration::from_millis(100)).await;
        decode.engine_idle().await;
        v = turn("And now, again?").await;
    }
    assert_eq!(v["cachet"]["commit"], after);
    assert!(cached(&v) >= context, "the new repository context was pre-warmed: {v}");
}
