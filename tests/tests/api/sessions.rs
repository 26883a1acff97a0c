//! Repositories, sessions and push webhooks: registration rules, the
//! assembled prompt (dry runs), never answering from a stale file, cache
//! reuse across pushes, pre-warm, and session-aware retention.

use crate::helpers::*;
use serde_json::{json, Value};
use std::time::Duration;

const LIB: &str = "pub mod cart;\npub mod price;\n\npub use cart::Cart;\n";
const PRICE: &str = "/// A price in cents.\n#[derive(Clone, Copy)]\npub struct Price(pub u64);\n\nimpl Price {\n    pub fn cents(self) -> u64 {\n        self.0\n    }\n}\n";
const CART_V1: &str = "use crate::price::Price;\n\npub struct Cart {\n    items: Vec<Price>,\n}\n\nimpl Cart {\n    pub fn total(&self) -> u64 {\n        self.items.iter().map(|p| p.cents()).sum()\n    }\n}\n";
const CART_V2: &str = "use crate::price::Price;\n\npub struct Cart {\n    items: Vec<Price>,\n}\n\nimpl Cart {\n    pub fn add(&mut self, p: Price) {\n        self.items.push(p);\n    }\n\n    pub fn total(&self) -> u64 {\n        self.items.iter().map(|p| p.cents()).sum()\n    }\n}\n";
const CART_V3: &str = "use crate::price::Price;\n\npub struct Cart {\n    items: Vec<Price>,\n}\n\nimpl Cart {\n    pub fn add(&mut self, p: Price) {\n        self.items.push(p);\n    }\n\n    pub fn total_cents(&self) -> u64 {\n        self.items.iter().map(|p| p.cents()).sum()\n    }\n}\n";

/// A small crate whose `src/cart.rs` has changed most often.
fn shop(app: &TestApp, name: &str) -> cachet_context::testing::TestRepo {
    let repo = app.source_repo(
        name,
        &[
            ("Cargo.toml", Some("[package]\nname = \"shop\"\nversion = \"0.1.0\"\n")),
            ("src/lib.rs", Some(LIB)),
            ("src/price.rs", Some(PRICE)),
            ("src/cart.rs", Some(CART_V1)),
        ],
    );
    repo.commit(&[("src/cart.rs", Some(CART_V2))], "cart: add").unwrap();
    repo
}

fn segment<'a>(dry: &'a Value, path: &str) -> &'a Value {
    dry["segments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"] == path && ["outline", "file"].contains(&s["kind"].as_str().unwrap()))
        .unwrap_or_else(|| panic!("no context block for {path}: {dry}"))
}

async fn ask(app: &TestApp, token: &str, session: &str, content: &str) -> Value {
    let r = app.message(token, session, json!({ "content": content, "max_tokens": 2, "temperature": 0 })).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    r.json().await.unwrap()
}

fn cached(v: &Value) -> u64 {
    v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn a_dry_run_shows_the_prompt_its_segments_and_the_commit() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let repo = app.register(&token, shop(&app, "shop")).await;
    let session = app.session(&token, &repo).await;
    let r = app
        .message(
            &token,
            &session,
            json!({ "content": "Why is total wrong?", "files": ["src/price.rs"],
                                              "tool_output": { "name": "cargo test", "content": "1 failed" },
                                              "dry_run": true }),
        )
        .await;
    assert_eq!(r.status(), 200);
    let dry: Value = r.json().await.unwrap();
    assert_eq!(dry["commit"], repo.head);
    let prompt = dry["prompt"].as_str().unwrap();
    assert!(prompt.contains("struct Cart") && prompt.contains("Why is total wrong?") && prompt.contains("1 failed"));
    // Context, then this turn: the named file, tool output, the question.
    let kinds: Vec<&str> = dry["segments"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
    let at = |k: &str| kinds.iter().position(|x| *x == k).unwrap_or_else(|| panic!("no {k} in {kinds:?}"));
    assert!(at("context_header") < at("turn_file") && at("turn_file") < at("tool_output"));
    assert!(at("tool_output") < at("question"));
    // Segments tile the prompt, in text and in tokens.
    let (mut text_end, mut token_end) = (0, 0);
    for s in dry["segments"].as_array().unwrap() {
        assert_eq!(s["text"]["start"].as_u64().unwrap(), text_end, "{s}");
        assert_eq!(s["tokens"]["start"].as_u64().unwrap(), token_end, "{s}");
        text_end = s["text"]["end"].as_u64().unwrap();
        token_end = s["tokens"]["end"].as_u64().unwrap();
    }
    assert_eq!(text_end as usize, prompt.len());
    assert_eq!(token_end, dry["prompt_tokens"].as_u64().unwrap());
    assert_eq!(dry["token_ids"].as_array().unwrap().len() as u64, token_end);
    let cart = segment(&dry, "src/cart.rs");
    assert_eq!(cart["blob"].as_str().unwrap().len(), 40);
    // Nothing was stored.
    let s: Value = app.get(&token, &format!("/v1/sessions/{session}")).await.json().await.unwrap();
    assert_eq!(s["turns"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn after_a_push_the_prompt_has_the_new_file_and_reuses_the_prefix_before_it() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let repo = app.register(&token, shop(&app, "shop")).await;
    let first = app.session(&token, &repo).await;
    let v = ask(&app, &token, &first, "What does Cart do?").await;
    assert_eq!(v["cachet"]["commit"], repo.head);
    // Closed, so the push below pre-warms nothing: what the next session
    // reuses is what survived the invalidation.
    assert_eq!(
        app.client
            .delete(format!("{}/v1/sessions/{first}", app.address))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    let after = repo.source.commit(&[("src/cart.rs", Some(CART_V3))], "cart: rename total").unwrap().to_string();
    let r = app.push_hook(&repo, &repo.head, &after, Some("delivery-1")).await;
    assert_eq!(r.status(), 200);
    let pushed: Value = r.json().await.unwrap();
    assert_eq!(pushed["changed_paths"], json!(["src/cart.rs"]));
    assert_eq!(pushed["prewarmed"], 0);

    let second = app.session(&token, &repo).await;
    let dry = app.dry_run(&token, &second, "What does Cart do?").await;
    assert_eq!(dry["commit"], after);
    let prompt = dry["prompt"].as_str().unwrap();
    assert!(prompt.contains("total_cents"), "the new content is in the prompt");
    assert!(!prompt.contains("fn total(&self)"), "the old content is not");
    let block_start = segment(&dry, "src/cart.rs")["tokens"]["start"].as_u64().unwrap();
    let v = ask(&app, &token, &second, "What does Cart do?").await;
    assert_eq!(v["cachet"]["commit"], after);
    // Everything before the changed file's block came from the cache, and
    // nothing from the old block (its heading tokens match, but it was invalidated).
    assert_eq!(cached(&v), block_start);
}

/// With `after_push = "rebuild"` (a repository's choice here), the turn after a push starts
/// from the new head's context, which the push pre-warmed.
#[tokio::test]
async fn a_push_prewarms_the_context_of_active_sessions() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let repo = app.register_with(&token, shop(&app, "shop"), json!({"after_push": "rebuild"})).await;
    let session = app.session(&token, &repo).await;
    ask(&app, &token, &session, "What does Cart do?").await;
    let after = repo.source.commit(&[("src/cart.rs", Some(CART_V3))], "cart: rename total").unwrap().to_string();
    let pushed: Value = app.push_hook(&repo, &repo.head, &after, None).await.json().await.unwrap();
    assert_eq!(pushed["prewarmed"], 1, "{pushed}");
    app.engine_idle().await;
    let dry = app.dry_run(&token, &session, "And now?").await;
    let context = dry["context_tokens"].as_u64().unwrap();
    assert!(context > segment(&dry, "src/cart.rs")["tokens"]["end"].as_u64().unwrap());
    let v = ask(&app, &token, &session, "And now?").await;
    assert_eq!(v["cachet"]["commit"], after);
    assert_eq!(cached(&v), context, "the whole new repository context was pre-warmed");
}

fn history_end(dry: &Value) -> u64 {
    dry["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"].as_str().unwrap().starts_with("history"))
        .map(|s| s["tokens"]["end"].as_u64().unwrap())
        .max()
        .unwrap()
}

fn context_blocks(dry: &Value) -> Vec<(String, String)> {
    let blocks = dry["segments"].as_array().unwrap().iter();
    blocks
        .filter(|s| ["outline", "file"].contains(&s["kind"].as_str().unwrap()))
        .map(|s| (s["path"].as_str().unwrap().to_string(), s["version"].as_str().unwrap().to_string()))
        .collect()
}

/// Overlay after a push (the default): a warm session's next turn, sent at once after the
/// webhook, keeps its warm context and history (all cached) and carries the changed file's new
/// version after them; it is not refused. Once the background rebase is warm, turns start from
/// the new head's context, in the order a new session gets, fully cached again.
#[tokio::test]
async fn after_a_push_the_next_turn_keeps_its_warm_prefix_and_carries_the_change_in_an_overlay() {
    let app = spawn_with(|s| s.context.rebase_delay_ms = 3000).await;
    let (_, token) = app.tenant("acme").await;
    let repo = app.register(&token, shop(&app, "shop")).await;
    let session = app.session(&token, &repo).await;
    ask(&app, &token, &session, "What does Cart do?").await;
    ask(&app, &token, &session, "And Price?").await;
    let after = repo.source.commit(&[("src/cart.rs", Some(CART_V3))], "cart: rename total").unwrap().to_string();
    let pushed: Value = app.push_hook(&repo, &repo.head, &after, None).await.json().await.unwrap();
    assert_eq!(pushed["changed_paths"], json!(["src/cart.rs"]), "{pushed}");
    // The webhook answered once the session's next prefix, its overlay included, was computed.
    assert_eq!(pushed["overlays_prewarmed"], 1, "{pushed}");

    // At once: the warm base, then the history, then the overlay with the new version.
    let dry = app.dry_run(&token, &session, "Which methods does Cart have?").await;
    assert_eq!((&dry["commit"], &dry["context_commit"]), (&json!(after), &json!(repo.head)), "{}", dry["prompt"]);
    let overlay = dry["segments"].as_array().unwrap().iter().find(|s| s["kind"] == "overlay").expect("an overlay");
    let text = &dry["prompt"].as_str().unwrap()
        [overlay["text"]["start"].as_u64().unwrap() as usize..overlay["text"]["end"].as_u64().unwrap() as usize];
    assert!(text.starts_with("### Repository changes since commit") && text.contains("total_cents"), "{text}");
    assert!(overlay["tokens"]["start"].as_u64().unwrap() > history_end(&dry));
    let v = ask(&app, &token, &session, "Which methods does Cart have?").await;
    assert_eq!(v["cachet"]["context_commit"], repo.head);
    let overlay_end = overlay["tokens"]["end"].as_u64().unwrap();
    assert!(cached(&v) >= overlay_end, "the overlay was not pre-warmed: {} cached of {overlay_end}", cached(&v));
    // The overlay is the turn's: stored with it, repeated (cached) by the next turn, not shown twice.
    let next = app.dry_run(&token, &session, "And now?").await;
    assert_eq!(next["context_commit"], repo.head);
    assert!(!next["segments"].as_array().unwrap().iter().any(|s| s["kind"] == "overlay"));
    assert!(next["prompt"].as_str().unwrap().contains("total_cents"));

    // The rebase: the context at the new head and the history, pre-warmed in the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let rebased = loop {
        let dry = app.dry_run(&token, &session, "And now?").await;
        if dry["context_commit"] == after {
            break dry;
        }
        assert!(std::time::Instant::now() < deadline, "the session was never rebased");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let fresh = app.session(&token, &repo).await;
    assert_eq!(context_blocks(&rebased), context_blocks(&app.dry_run(&token, &fresh, "?").await));
    let v = ask(&app, &token, &session, "And now?").await;
    assert_eq!(v["cachet"]["context_commit"], after);
    assert!(cached(&v) >= history_end(&rebased), "the rebase left {} of {} cached", cached(&v), history_end(&rebased));
}

#[tokio::test]
async fn webhooks_are_verified_deduplicated_and_scoped() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let repo = app.register(&token, shop(&app, "shop")).await;
    let session = app.session(&token, &repo).await;
    let after = repo.source.commit(&[("src/cart.rs", Some(CART_V3))], "cart: rename total").unwrap().to_string();
    let body = serde_json::to_vec(&json!({ "ref": "refs/heads/main", "before": repo.head, "after": after })).unwrap();
    let hook = |signature: Option<String>, event: &str, delivery: &str| {
        let mut req = app
            .client
            .post(format!("{}/v1/webhooks/git/{}", app.address, repo.id))
            .header("x-github-event", event)
            .header("x-github-delivery", delivery)
            .body(body.clone());
        if let Some(s) = signature {
            req = req.header("x-hub-signature-256", s);
        }
        req.send()
    };
    // Bad or missing signatures: 401, and no fetch (the session still sees the old head).
    error(hook(Some(sign("not-the-secret", &body)), "push", "d1").await.unwrap(), 401).await;
    error(hook(None, "push", "d1").await.unwrap(), 401).await;
    error(hook(Some("sha256=zz".into()), "push", "d1").await.unwrap(), 401).await;
    assert_eq!(app.dry_run(&token, &session, "q").await["commit"], repo.head);
    // Other events are acknowledged and ignored.
    let ping: Value = hook(Some(sign(&repo.secret, &body)), "ping", "d0").await.unwrap().json().await.unwrap();
    assert_eq!(ping["ignored"], true);
    // A good delivery applies once; its redelivery is acknowledged only.
    let r = hook(Some(sign(&repo.secret, &body)), "push", "d1").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(app.dry_run(&token, &session, "q").await["commit"], after);
    let again = hook(Some(sign(&repo.secret, &body)), "push", "d1").await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Value>().await.unwrap()["duplicate"], true);
    // The delivery header is not signed: a captured body replayed under a new one is the same push.
    let replay = hook(Some(sign(&repo.secret, &body)), "push", "d2-forged").await.unwrap();
    assert_eq!(replay.json::<Value>().await.unwrap()["duplicate"], true);
    let info: Value = app.get(&token, &format!("/v1/repos/{}", repo.id)).await.json().await.unwrap();
    let invalidations = info["invalidations"].as_array().unwrap();
    assert_eq!(invalidations.len(), 1, "{info}");
    assert_eq!(invalidations[0]["paths"], json!(["src/cart.rs"]));
    assert!(info.get("webhook").is_none() && !info.to_string().contains(&repo.secret), "the secret is shown once");
    // Unregistered repositories answer as a bad signature does: nobody learns which ids exist.
    for id in [uuid::Uuid::new_v4().to_string(), "not-a-uuid".to_string()] {
        let r = app
            .client
            .post(format!("{}/v1/webhooks/git/{id}", app.address))
            .header("x-hub-signature-256", sign(&repo.secret, &body))
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let e = error(r, 401).await;
        assert_eq!(e["message"], "missing or invalid X-Hub-Signature-256");
    }
}

#[tokio::test]
async fn registration_and_file_paths_are_confined() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let (_, other) = app.tenant("globex").await;
    let outside = tempfile::tempdir().unwrap();
    let stray = cachet_context::testing::TestRepo::init(outside.path().join("stray")).unwrap();
    stray.commit(&[("a.txt", Some("a\n"))], "a").unwrap();
    let sources = app.sources();
    for url in [
        stray.path().display().to_string(),
        format!("file://{}", stray.path().display()),
        format!("{}/../{}", sources.display(), outside.path().display()),
        format!("{}/../../../../../../etc", sources.display()),
        "ext::sh -c touch% /tmp/pwned".to_string(),
        "-uhttps://example.invalid/x".to_string(),
        "".to_string(),
        app.state.settings.server.data_dir.join("mirrors").display().to_string(),
    ] {
        let r = app.post(&token, "/v1/repos", json!({ "url": url })).await;
        let e = error(r, 400).await;
        assert_eq!(e["param"], "url", "{url}: {e}");
    }
    // A file:// URL under the root works.
    let src = shop(&app, "shop");
    let r = app.post(&token, "/v1/repos", json!({ "url": format!("file://{}", src.path().display()) })).await;
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert!(v["webhook"]["secret"].as_str().unwrap().starts_with("whsec_"));
    let id = v["id"].as_str().unwrap();
    // Another tenant cannot see it or open a session on it.
    error(app.get(&other, &format!("/v1/repos/{id}")).await, 404).await;
    error(app.post(&other, "/v1/sessions", json!({ "repo": id })).await, 404).await;
    let listed: Value = app.get(&other, "/v1/repos").await.json().await.unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 0);
    // An unknown branch is a 400.
    error(app.post(&token, "/v1/sessions", json!({ "repo": id, "branch": "nope" })).await, 400).await;
    // Files a message names stay inside the repository.
    let r = app.post(&token, "/v1/sessions", json!({ "repo": id })).await;
    let session: Value = r.json().await.unwrap();
    let session = session["id"].as_str().unwrap();
    for path in ["../shop/src/lib.rs", "/etc/passwd", "src/../../x", "nope.rs", "src"] {
        let r = app.message(&token, session, json!({ "content": "q", "files": [path], "dry_run": true })).await;
        error(r, 400).await;
    }
    // Another tenant's session is unknown to it.
    error(app.message(&other, session, json!({ "content": "q" })).await, 404).await;
}

#[tokio::test]
async fn a_live_session_keeps_its_history_cached_under_pressure() {
    let app = spawn_with(|s| {
        s.engine.pool_tokens = 2048;
        s.context.budget_tokens = 400;
    })
    .await;
    let (tenant, token) = app.tenant("acme").await;
    let repo = app.register(&token, shop(&app, "shop")).await;
    let session = app.session(&token, &repo).await;
    ask(&app, &token, &session, &"Explain how the cart sums prices, step by step. ".repeat(4)).await;
    let flood = || async {
        for i in 0..12 {
            let body = app.chat_body(&format!("{i} unrelated {}", "noise words here ".repeat(18)), 1);
            assert_eq!(app.chat(&token, body).await.status(), 200);
        }
    };
    flood().await;
    let dry = app.dry_run(&token, &session, "And the tax?").await;
    let history_end = dry["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"].as_str().unwrap().starts_with("history"))
        .map(|s| s["tokens"]["end"].as_u64().unwrap())
        .max()
        .unwrap();
    let v = ask(&app, &token, &session, "And the tax?").await;
    // The last answer stopped at its length limit: its last token was never
    // fed back, so it has no KV; everything before it is cached.
    let history_cached = history_end - 1;
    assert!(cached(&v) >= history_cached, "a live session's history stays cached: {} < {history_cached}", cached(&v));

    // Closed, its prefix is ordinary cache and goes under pressure.
    let dry = app.dry_run(&token, &session, "One more?").await;
    let ids: Vec<u32> = dry["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    assert_eq!(
        app.client
            .delete(format!("{}/v1/sessions/{session}", app.address))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    error(app.message(&token, &session, json!({ "content": "q" })).await, 409).await;
    flood().await;
    let engine = app.state.model.served.get().unwrap().engine.clone();
    let mut probe = cachet_engine::runtime::Request::new(
        cachet_engine::radix::TenantKey::new(tenant.to_string()),
        ids,
        cachet_engine::generate::GenerateParams { max_tokens: 1, ..Default::default() },
    );
    probe.prewarm = true;
    let done = tokio::task::spawn_blocking(move || engine.submit(probe).collect_blocking()).await.unwrap();
    let done = done.result.unwrap();
    assert!(done.cached_tokens < history_cached as usize, "{} >= {history_cached}", done.cached_tokens);
}

#[tokio::test]
async fn sessions_and_their_prompts_survive_a_restart() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let repo = app.register(&token, shop(&app, "shop")).await;
    let session = app.session(&token, &repo).await;
    ask(&app, &token, &session, "What does Cart do?").await;
    let before = app.dry_run(&token, &session, "And Price?").await;
    let history: Value = app.get(&token, &format!("/v1/sessions/{session}")).await.json().await.unwrap();
    assert_eq!(history["turns"].as_array().unwrap().len(), 2);

    // The same data folder and database, a new process.
    let settings = app.state.settings.clone();
    app.handle.stop(true).await;
    // The old process has finished stopping (leases given back, ledger flushed).
    let run = app.run.lock().unwrap().take().unwrap();
    run.await.unwrap().unwrap();
    let TestApp { data_dir, database_url, .. } = app;
    let again = spawn_settings(settings, data_dir, database_url).await;
    let after = again.dry_run(&token, &session, "And Price?").await;
    assert_eq!(before["prompt"], after["prompt"], "byte-identical prompt after a restart");
    assert_eq!(before["token_ids"], after["token_ids"]);
    let history_after: Value = again.get(&token, &format!("/v1/sessions/{session}")).await.json().await.unwrap();
    assert_eq!(history["turns"], history_after["turns"]);
    let v = ask(&again, &token, &session, "And Price?").await;
    assert_eq!(v["cachet"]["turn"], 2);
}

#[tokio::test]
async fn a_push_to_one_replica_reaches_the_cache_of_another() {
    // Two replicas on one database (as behind a proxy), each with its own engine and mirrors,
    // reading the same repository source.
    let a = spawn_app().await;
    let b = spawn_replica(&a).await;
    // A third replica that never serves this repository.
    let c = spawn_replica(&a).await;
    assert_ne!(a.state.replica.id, b.state.replica.id);
    for (app, replica) in [(&a, a.state.replica.id), (&b, b.state.replica.id), (&c, c.state.replica.id)] {
        let r = app.client.get(format!("{}/healthz", app.address)).send().await.unwrap();
        assert_eq!(r.headers()["x-cachet-replica"].to_str().unwrap(), replica.to_string());
    }

    let (tenant, token) = a.tenant("acme").await;
    // The turn after the push starts from the new head's context (no overlay).
    let repo = a.register_with(&token, shop(&a, "shop"), json!({"after_push": "rebuild"})).await;
    let session = a.session(&token, &repo).await;
    // The session's turns run on B, so B's cache holds the repository context.
    ask(&b, &token, &session, "What does Cart do?").await;
    let engine_b = b.state.model.served.get().unwrap().engine.clone();
    let invalidated_before = engine_b.snapshot().await.unwrap().invalidated_slots;

    // The push webhook reaches A.
    let after = repo.source.commit(&[("src/cart.rs", Some(CART_V3))], "cart: rename total").unwrap().to_string();
    let pushed: Value = a.push_hook(&repo, &repo.head, &after, None).await.json().await.unwrap();
    assert_eq!(pushed["changed_paths"], json!(["src/cart.rs"]), "{pushed}");

    // B hears of it through Postgres: its stale span of src/cart.rs is freed …
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while engine_b.snapshot().await.unwrap().invalidated_slots == invalidated_before {
        assert!(std::time::Instant::now() < deadline, "replica B never invalidated the changed file");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // … and the new context is pre-warmed in B's cache: the next turn on B reuses all of it.
    b.engine_idle().await;
    let dry = b.dry_run(&token, &session, "And now?").await;
    let context = dry["context_tokens"].as_u64().unwrap();
    let v = ask(&b, &token, &session, "And now?").await;
    assert_eq!(v["cachet"]["commit"], after);
    assert_eq!(cached(&v), context, "B pre-warmed the whole new repository context");

    // C applied the push too (its mirror has the new commit) but computed nothing for it: it
    // serves no session on the branch.
    let applied = |app: &TestApp| app.state.replica.changes_applied.load(std::sync::atomic::Ordering::Relaxed);
    let wait_applied = |app: &TestApp, n: u64, what: &str| {
        let what = what.to_string();
        let state = app.state.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while state.replica.changes_applied.load(std::sync::atomic::Ordering::Relaxed) < n {
                assert!(std::time::Instant::now() < deadline, "{what}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_applied(&c, 1, "replica C never applied the push").await;
    assert_eq!((applied(&a), applied(&b), applied(&c)), (0, 1, 1), "the push is not applied twice on A");
    let id = cachet_api::context::mirror_id(repo.id.parse().unwrap());
    c.state.repos.store.mirror(&id).unwrap().resolve(&after).unwrap();
    c.engine_idle().await;
    let snapshot = c.state.model.served.get().unwrap().engine.snapshot().await.unwrap();
    assert_eq!((snapshot.cached_slots, snapshot.finished), (0, 0), "C pre-warmed nothing: {snapshot:?}");

    // Deleting the repository (through A) removes every replica's mirror.
    let before = [applied(&a), applied(&b), applied(&c)];
    let r = a.client.delete(format!("{}/v1/repos/{}", a.address, repo.id)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(r.status(), 200);
    for ((app, name), n) in [(&a, "A"), (&b, "B"), (&c, "C")].into_iter().zip(before) {
        wait_applied(app, n + 1, &format!("replica {name} never heard of the deleted repository")).await;
        assert!(app.state.repos.store.mirror(&id).is_err(), "replica {name} still has the mirror");
    }
    // Deleting the tenant purges its cache namespace on every replica.
    assert!(engine_b.snapshot().await.unwrap().cached_slots > 0);
    let before = applied(&b);
    let r =
        a.client.delete(format!("{}/admin/tenants/{tenant}", a.address)).bearer_auth(OPERATOR).send().await.unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
    wait_applied(&b, before + 1, "replica B never heard of the deleted tenant").await;
    assert_eq!(engine_b.snapshot().await.unwrap().cached_slots, 0, "B purged the tenant's cache");
}

#[tokio::test]
async fn one_turn_at_a_time_per_session_across_replicas() {
    let a = spawn_app().await;
    let b = spawn_replica(&a).await;
    let (tenant, token) = a.tenant("acme").await;
    let repo = a.register(&token, shop(&a, "shop")).await;
    let session = a.session(&token, &repo).await;
    let id: cachet_tenants::SessionId = session.parse().unwrap();
    // The store's handle to the session: only a session it found for the tenant gives one.
    let owned = a.state.store.session(tenant, id).await.unwrap().expect("the tenant's session").owned();

    // Turns one after another on one replica never wait for the last one's lease release.
    for _ in 0..5 {
        drop(a.state.begin_turn(owned).await.unwrap().expect("the last turn ended"));
    }
    // A turn runs on A (held here as its guard): B refuses a second one, A too.
    let guard = a.state.begin_turn(owned).await.unwrap().expect("no turn in progress");
    let refused = error(b.message(&token, &session, json!({ "content": "q" })).await, 409).await;
    assert!(refused.to_string().contains("in progress"), "{refused}");
    assert!(a.state.begin_turn(owned).await.unwrap().is_none());
    // A dry run only looks: allowed meanwhile.
    b.dry_run(&token, &session, "q").await;

    // The turn ends: B may take the next one (the lease is given back in the background).
    drop(guard);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = b.message(&token, &session, json!({ "content": "q", "max_tokens": 2 })).await;
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 409, "{}", r.text().await.unwrap());
        assert!(std::time::Instant::now() < deadline, "the lease was never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And the lease B took for that turn is gone again.
    let mut taken = None;
    for _ in 0..250 {
        taken = a.state.begin_turn(owned).await.unwrap();
        if taken.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(taken.is_some(), "B's lease was never given back");
}

/// Binds a free loopback port, advertises it to the other replicas and turns the disk tier on
/// (32-token chunks: the tiny model's prompts are short).
fn tiered(s: &mut cachet_api::config::Settings) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    s.server.bind = format!("127.0.0.1:{port}");
    s.server.advertise_url = format!("http://127.0.0.1:{port}");
    s.engine.kv_tier_gib = 1.0;
    s.engine.kv_tier_chunk_tokens = 32;
}

#[tokio::test]
async fn a_session_that_moves_to_another_replica_brings_its_prefix_along() {
    let a = spawn_with(tiered).await;
    let data = tempfile::tempdir().unwrap();
    let mut s = settings(&a.database_url, data.path());
    s.context.allowed_root = a.sources();
    tiered(&mut s);
    let b = spawn_settings(s, data, a.database_url.clone()).await;
    let (tenant, token) = a.tenant("acme").await;
    let repo = a.register(&token, shop(&a, "shop")).await;
    let session = a.session(&token, &repo).await;
    let first = ask(&a, &token, &session, "What does cart.rs do?").await;
    let first_prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    a.state.model.served.get().unwrap().engine.flush_kv_tier().await;
    // A announces itself once its model is loaded.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while announced(&a).await == 0 {
        assert!(std::time::Instant::now() < deadline, "replica A never announced its KV tier");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The session's next turn lands on B, which never saw this tenant: everything of the first
    // turn's prompt but its last partial chunk comes from A's tier.
    let second = ask_when_free(&b, &token, &session, "And price.rs?").await;
    let got = cached(&second);
    assert!(got >= first_prompt - 32, "B had {got} tokens cached of A's {first_prompt}: {second}");
    let snap = b.state.model.served.get().unwrap().engine.snapshot().await.unwrap();
    assert!(snap.kv_tier_loaded_tokens >= first_prompt - 32 - 64, "{snap:?}");

    // A last replica that is gone costs the turn nothing but the fetch attempt.
    let id: cachet_tenants::SessionId = session.parse().unwrap();
    let owned = a.state.store.session(tenant, id).await.unwrap().expect("the tenant's session").owned();
    let ghost = uuid::Uuid::new_v4();
    a.state.store.announce_replica(ghost, "http://127.0.0.1:9").await.unwrap();
    a.state.store.move_session(owned, ghost, Duration::from_secs(60)).await.unwrap();
    let third = ask_when_free(&a, &token, &session, "And lib.rs?").await;
    assert!(cached(&third) > 0, "{third}");
    // The chunk route is the operator's, and refuses a key that is not one.
    let r = a.get(&token, &format!("/v1/internal/kv/{}", "0".repeat(64))).await;
    assert!(r.status() == 401 || r.status() == 403, "a tenant read a chunk: {}", r.status());
    let op = a.state.auth.operator_token.expose().to_string();
    assert_eq!(a.get(&op, "/v1/internal/kv/..%2F..%2Fetc%2Fpasswd").await.status(), 400);
    assert_eq!(a.get(&op, &format!("/v1/internal/kv/{}", "0".repeat(64))).await.status(), 404);
}

/// [`ask`] once the session's last turn, on another replica, has given its lease back (that
/// happens in the background: 409 until then).
async fn ask_when_free(app: &TestApp, token: &str, session: &str, content: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = app.message(token, session, json!({ "content": content, "max_tokens": 2, "temperature": 0 })).await;
        if r.status() != 409 || std::time::Instant::now() > deadline {
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            return r.json().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows of `app`'s replica in `replicas`.
async fn announced(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM replicas WHERE id = $1")
        .bind(app.state.replica.id)
        .fetch_one(app.state.store.pool())
        .await
        .unwrap()
}
