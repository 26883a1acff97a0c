//! Operator endpoints and the operational ones.

use crate::helpers::*;
use serde_json::{json, Value};

#[tokio::test]
async fn operators_manage_tenants_and_tenants_cannot() {
    let app = spawn_app().await;
    let url = format!("{}/admin/tenants", app.address);
    let (_, tenant_token) = app.tenant("acme").await;
    let r = app.client.get(&url).bearer_auth(&tenant_token).send().await.unwrap();
    error(r, 403).await;
    error(app.client.get(&url).send().await.unwrap(), 401).await;
    let r = app
        .client
        .post(&url)
        .bearer_auth(OPERATOR)
        .json(&json!({ "name": "beta", "plan": "free" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let beta: Value = r.json().await.unwrap();
    assert_eq!(beta["plan"]["name"], "free");
    let r = app.client.post(&url).bearer_auth(OPERATOR).json(&json!({ "name": "beta" })).send().await.unwrap();
    error(r, 400).await;
    let r = app
        .client
        .post(&url)
        .bearer_auth(OPERATOR)
        .json(&json!({ "name": "x", "plan": "platinum" }))
        .send()
        .await
        .unwrap();
    assert_eq!(error(r, 400).await["param"], "plan");
    let list: Vec<Value> = app.client.get(&url).bearer_auth(OPERATOR).send().await.unwrap().json().await.unwrap();
    assert_eq!(list.len(), 2);
    // An operator JWT works too, and issues tenant tokens.
    let op = app.jwt.issue_operator(std::time::Duration::from_secs(60)).unwrap();
    let id = beta["id"].as_str().unwrap();
    let r = app.client.post(format!("{url}/{id}/tokens")).bearer_auth(&op).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let token = r.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_string();
    let r = app.client.get(format!("{}/v1/models", app.address)).bearer_auth(&token).send().await.unwrap();
    let models: Value = r.json().await.unwrap();
    assert_eq!(models["data"][0]["id"], app.model());
    // The context window, where clients look for it.
    let window = app.state.model.served.get().unwrap().engine.max_context();
    assert_eq!(
        (models["data"][0]["max_model_len"].as_u64(), models["data"][0]["context_length"].as_u64()),
        (Some(window as u64), Some(window as u64)),
        "{models}"
    );
    let r = app.client.delete(format!("{url}/{}", uuid::Uuid::new_v4())).bearer_auth(OPERATOR).send().await.unwrap();
    error(r, 404).await;
}

#[tokio::test]
async fn health_readiness_metrics_and_openapi() {
    let app = spawn_app().await;
    let get = |p: &str| app.client.get(format!("{}{p}", app.address)).send();
    assert_eq!(get("/healthz").await.unwrap().status(), 200);
    let ready: Value = get("/readyz").await.unwrap().json().await.unwrap();
    assert_eq!(ready["ready"], true);
    let (tenant, token) = app.tenant("acme").await;
    app.chat(&token, app.chat_body("count me", 2)).await;
    // Operator-only: nobody else learns the server's load or its tenants.
    assert_eq!(get("/metrics").await.unwrap().status(), 401);
    let as_tenant = app.client.get(format!("{}/metrics", app.address)).bearer_auth(&token).send().await.unwrap();
    assert_eq!(as_tenant.status(), 403);
    let r = app.client.get(format!("{}/metrics", app.address)).bearer_auth(OPERATOR).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let metrics = r.text().await.unwrap();
    assert!(!metrics.contains(&tenant.to_string()), "tenant labels are opt-in");
    for name in
        ["cachet:time_to_first_token_seconds", "cachet:prefix_cache_query_tokens_total", "cachet:kv_cache_usage_ratio"]
    {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    let doc: Value = get("/openapi.json").await.unwrap().json().await.unwrap();
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/models", "/admin/tenants", "/readyz"] {
        assert!(doc["paths"][path].is_object(), "{path} missing from the OpenAPI document");
    }
}

#[tokio::test]
async fn the_metrics_listener_answers_without_a_credential_and_tenant_labels_are_opt_in() {
    let app = spawn_with(|s| {
        s.server.metrics_bind = "127.0.0.1:0".into();
        s.server.metrics_tenant_labels = true;
    })
    .await;
    let (tenant, token) = app.tenant("labelled").await;
    app.chat(&token, app.chat_body("label me", 2)).await;
    let addr = app.state.ops.metrics_addr.expect("bound");
    let r = app.client.get(format!("http://{addr}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let metrics = r.text().await.unwrap();
    assert!(metrics.contains(&tenant.to_string()), "the operator asked for tenant labels");
    // The main address still wants the operator credential.
    assert_eq!(app.client.get(format!("{}/metrics", app.address)).send().await.unwrap().status(), 401);
}

#[tokio::test]
async fn deleting_a_tenant_purges_its_cache() {
    let app = spawn_app().await;
    let (a, token_a) = app.tenant("a").await;
    let (_, token_b) = app.tenant("b").await;
    app.chat(&token_a, app.chat_body(&"a's private context ".repeat(20), 2)).await;
    app.chat(&token_b, app.chat_body("b's question", 2)).await;
    let engine = &app.state.model.served.get().unwrap().engine;
    let before = engine.snapshot().await.unwrap().cached_slots;
    let r = app.client.delete(format!("{}/admin/tenants/{a}", app.address)).bearer_auth(OPERATOR).send().await.unwrap();
    assert_eq!(r.status(), 204);
    // Commands reach the engine in order: the snapshot comes after the purge.
    let after = engine.snapshot().await.unwrap();
    assert!(after.cached_slots > 0 && after.cached_slots < before / 2, "{before} → {after:?}");
    let r = app.chat(&token_b, app.chat_body("b's question", 2)).await;
    let v: Value = r.json().await.unwrap();
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "B's cache stays");
}
