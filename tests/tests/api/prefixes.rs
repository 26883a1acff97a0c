//! Public prefixes (issue "Agent preambles computed once for every tenant"): an agent's preamble
//! the operator registered is computed once for every tenant; nothing a tenant sent unregistered
//! is ever reused by another; discovery shows the operator what many tenants send, and only the
//! operator.

use crate::helpers::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// An agent client's preamble: a long system prompt and its tool schemas, the same for all users.
fn preamble() -> Value {
    let system = "You are Coder, an agent that edits repositories. Read before you write; run the tests. ".repeat(6);
    json!({
        "messages": [{"role": "system", "content": system}],
        "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                   "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}],
    })
}

/// A request of that agent: the preamble, then the user's task.
fn agent_request(app: &TestApp, preamble: &Value, task: &str) -> Value {
    let mut messages = preamble["messages"].as_array().unwrap().clone();
    messages.push(json!({"role": "user", "content": task}));
    json!({"model": app.model(), "messages": messages, "tools": preamble["tools"], "tool_choice": "auto",
           "max_tokens": 2, "temperature": 0})
}

fn usage(v: &Value) -> (u64, u64) {
    (
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test]
async fn a_registered_preamble_is_computed_once_for_every_tenant_and_nothing_else_is_shared() {
    let app = spawn_app().await;
    let (a, token_a) = app.tenant("a").await;
    let (b, token_b) = app.tenant("b").await;
    // Only the operator registers (a tenant gets 403), with a name of its own.
    let body = json!({"name": "coder", "source": preamble(), "prewarm": false});
    error(app.post(&token_a, "/admin/public-prefixes", body.clone()).await, 403).await;
    let r = app.post(OPERATOR, "/admin/public-prefixes", body.clone()).await;
    assert_eq!(r.status(), 201);
    let registered: Value = r.json().await.unwrap();
    let public = registered["tokens"].as_u64().unwrap();
    assert!(public > 400, "{registered}");
    assert!(registered["preview"].as_str().unwrap().contains("You are Coder"), "{registered}");
    error(app.post(OPERATOR, "/admin/public-prefixes", body).await, 409).await;

    // A's first request computes the preamble; B's first request reuses exactly it.
    let first: Value =
        app.chat(&token_a, agent_request(&app, &preamble(), "fix the build")).await.json().await.unwrap();
    assert_eq!(usage(&first).1, 0);
    let other: Value = app.chat(&token_b, agent_request(&app, &preamble(), "add a test")).await.json().await.unwrap();
    assert_eq!(usage(&other).1, public, "B reuses the whole preamble and nothing after it");
    let rows = app.ledger(b).await;
    assert_eq!(rows[0].computed_tokens as u64, usage(&other).0 - public, "B computed only its own part");

    // What A sent that is not registered (another system prompt) B never reuses.
    let mut secret = preamble();
    secret["messages"][0]["content"] = json!("Tenant A's private instructions: the launch code is 0000. ".repeat(8));
    let mine: Value = app.chat(&token_a, agent_request(&app, &secret, "go")).await.json().await.unwrap();
    assert_eq!(usage(&mine).1, 0);
    let probe: Value = app.chat(&token_b, agent_request(&app, &secret, "go")).await.json().await.unwrap();
    assert_eq!(usage(&probe).1, 0, "nothing of A's unregistered prompt reaches B");
    let again: Value = app.chat(&token_a, agent_request(&app, &secret, "go")).await.json().await.unwrap();
    assert_eq!(usage(&again).1, usage(&again).0 - 1, "A itself reuses it");
    assert!(app.ledger(a).await.len() >= 3);

    // The operator sees what was served from the prefix; removing it stops the sharing.
    let metrics = app.get(OPERATOR, "/metrics").await.text().await.unwrap();
    assert!(metrics.contains("cachet:public_prefix_cached_tokens_total"), "{metrics}");
    assert!(metrics.contains("cachet:public_prefix_requests_total{prefix=\"coder\"}"), "{metrics}");
    let id = registered["id"].as_str().unwrap();
    let path = format!("/admin/public-prefixes/{id}");
    error(app.delete(&token_b, &path).await, 403).await;
    assert_eq!(app.delete(OPERATOR, &path).await.status(), 204);
    let (_, token_c) = app.tenant("c").await;
    let after: Value = app.chat(&token_c, agent_request(&app, &preamble(), "add a test")).await.json().await.unwrap();
    assert_eq!(usage(&after).1, 0, "no longer public");
    assert_eq!(app.delete(OPERATOR, &path).await.status(), 404);
}

#[tokio::test]
async fn bad_sources_are_refused_with_the_reason() {
    let app = spawn_app().await;
    let add = |source: Value| app.post(OPERATOR, "/admin/public-prefixes", json!({"name": "x", "source": source}));
    error(add(json!({"text": "a", "tokens": [1]})).await, 400).await;
    error(add(json!({"tokens": [1, 99999999]})).await, 400).await;
    error(add(json!({"messages": [{"role": "wizard", "content": "x"}]})).await, 400).await;
    error(add(json!({"shell": "rm -rf /"})).await, 400).await;
    error(app.post(OPERATOR, "/admin/public-prefixes", json!({"name": "x", "candidate": "00ff"})).await, 404).await;
    error(app.post(OPERATOR, "/admin/public-prefixes", json!({"name": " ", "source": {"text": "a"}})).await, 400).await;
    assert_eq!(app.delete(OPERATOR, "/admin/public-prefixes/not-an-id").await.status(), 404);
}

#[tokio::test]
async fn discovery_shows_the_operator_what_several_tenants_send_and_the_operator_decides() {
    let app = spawn_app().await;
    let opening = "SHARED AGENT PREAMBLE: plan, then act, then check. ".repeat(14);
    let mut tokens = Vec::new();
    for name in ["a", "b", "c"] {
        let (_, token) = app.tenant(name).await;
        let r = app.chat(&token, app.chat_body(&format!("{opening}and now {name}'s own task"), 1)).await;
        assert_eq!(r.status(), 200);
        tokens.push(token);
    }
    // One tenant's long opening, sent twice, is no candidate.
    let lonely = "only tenant a ever says this. ".repeat(30);
    for _ in 0..2 {
        app.chat(&tokens[0], app.chat_body(&lonely, 1)).await;
    }
    // Tenants cannot see the list.
    error(app.get(&tokens[1], "/admin/public-prefixes/candidates").await, 403).await;
    let list: Value = app.get(OPERATOR, "/admin/public-prefixes/candidates").await.json().await.unwrap();
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "{list}");
    assert_eq!(data[0]["tenants"], 3);
    assert_eq!(data[0]["registered"], false);
    assert!(data[0]["tokens"].as_u64().unwrap() >= 256);
    assert!(data[0]["preview"].as_str().unwrap().contains("SHARED AGENT PREAMBLE"), "{list}");
    assert!(!list.to_string().contains("only tenant a"));
    let four: Value = app.get(OPERATOR, "/admin/public-prefixes/candidates?min_tenants=4").await.json().await.unwrap();
    assert!(four["data"].as_array().unwrap().is_empty());

    // Nothing became public by itself: a fourth tenant computes the opening.
    let (_, token_d) = app.tenant("d").await;
    let d: Value = app.chat(&token_d, app.chat_body(&format!("{opening}d's task"), 1)).await.json().await.unwrap();
    assert_eq!(usage(&d).1, 0);
    // The operator registers the candidate; a fifth tenant then reuses it (after a first computes it).
    let id = data[0]["id"].as_str().unwrap();
    let r =
        app.post(OPERATOR, "/admin/public-prefixes", json!({"name": "found", "candidate": id, "prewarm": true})).await;
    assert_eq!(r.status(), 201);
    let len = r.json::<Value>().await.unwrap()["tokens"].as_u64().unwrap();
    app.engine_idle().await;
    let (_, token_e) = app.tenant("e").await;
    let e: Value = app.chat(&token_e, app.chat_body(&format!("{opening}e's task"), 1)).await.json().await.unwrap();
    assert_eq!(usage(&e).1, len, "pre-warmed at registration");
    let list: Value = app.get(OPERATOR, "/admin/public-prefixes/candidates").await.json().await.unwrap();
    assert_eq!(list["data"][0]["registered"], true, "{list}");
}

#[tokio::test]
async fn prefixes_from_the_configuration_and_the_command_line_are_in_force_and_pre_warmed() {
    let source = preamble();
    let app = spawn_with(|s| {
        s.model.public_prefixes = vec![cachet_api::config::ConfiguredPrefix {
            name: "configured".into(),
            prewarm: true,
            source: source.as_object().unwrap().clone(),
        }]
    })
    .await;
    let listed = |app: &TestApp| {
        let (client, url) = (app.client.clone(), format!("{}/admin/public-prefixes", app.address));
        async move {
            client.get(url).bearer_auth(OPERATOR).send().await.unwrap().json::<Value>().await.unwrap()["data"]
                .as_array()
                .unwrap()
                .clone()
        }
    };
    // Loaded (and pre-warmed) once the model is.
    let deadline = Instant::now() + Duration::from_secs(30);
    let configured = loop {
        if let Some(p) = listed(&app).await.into_iter().find(|p| p["name"] == "configured") {
            break p;
        }
        assert!(Instant::now() < deadline, "the configured prefix was never loaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(configured["origin"], "config");
    app.engine_idle().await;
    let (_, token) = app.tenant("a").await;
    let first: Value = app.chat(&token, agent_request(&app, &preamble(), "task")).await.json().await.unwrap();
    assert_eq!(usage(&first).1, configured["tokens"].as_u64().unwrap(), "pre-warmed: even the first tenant reuses it");

    // What `cachet public-prefixes add` writes reaches the running server (a notice through Postgres).
    let row = app
        .state
        .store
        .add_public_prefix("from-cli", &json!({"text": "a text prefix ".repeat(20)}), false)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listed(&app).await.iter().any(|p| p["name"] == "from-cli" && p["tokens"].as_u64().unwrap() > 0) {
        assert!(Instant::now() < deadline, "the server never heard of the new prefix");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(app.state.store.remove_public_prefix(row.id).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed(&app).await.iter().any(|p| p["name"] == "from-cli") {
        assert!(Instant::now() < deadline, "the server never heard of the removal");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The security suite's timing probe with a registered preamble in force: tenant A's 1,500
/// private tokens after the preamble, guessed exactly by fresh tenants, reach them cold — each
/// probe reuses the preamble and nothing after it, and takes well over A's warm turn.
#[tokio::test]
async fn with_a_registered_preamble_another_tenants_copy_of_a_private_prompt_is_still_cold() {
    let app = spawn_with(|s| s.engine.pool_tokens = 16384).await;
    let source = json!({"messages": [{"role": "system", "content":
        "You are Coder, an agent that edits repositories. Read before you write; run the tests. ".repeat(6)}]});
    let r = app.post(OPERATOR, "/admin/public-prefixes", json!({"name": "coder", "source": source})).await;
    assert_eq!(r.status(), 201);
    let public = r.json::<Value>().await.unwrap()["tokens"].as_u64().unwrap();
    let (_, a) = app.tenant("victim").await;
    let secret: String = (0..1500).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect();
    let body = json!({"model": app.model(), "max_tokens": 1, "temperature": 0,
                      "messages": [source["messages"][0], {"role": "user", "content": secret}]});
    let (_, cold) = first_token(&app, &a, body.clone()).await;
    let prompt = cold["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt >= public + 1500, "{cold}");
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], public, "A's first turn reuses the preamble");
    let (warm, probe) = timing_probe(&app, &a, &body, prompt, public).await;
    assert!(probe > 2.0 * warm, "probe {probe:.1} ms vs the victim's warm turn {warm:.1} ms");
}
