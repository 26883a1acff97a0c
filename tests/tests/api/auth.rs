//! The JWT negative suite and tenant isolation: every bad credential is a
//! 401, and nothing of another tenant's is visible or reusable.

use crate::helpers::*;
use base64::Engine as _;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn claims(tenant: &str) -> Value {
    json!({ "sub": format!("tenant:{tenant}"), "tenant": tenant, "role": "tenant", "iss": "cachet",
            "aud": "cachet-api", "iat": now(), "exp": now() + 3600 })
}

fn sign(claims: &Value, secret: &str) -> String {
    encode(&Header::default(), claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap()
}

#[tokio::test]
async fn bad_tokens_are_401() {
    let app = spawn_app().await;
    let (tenant, good) = app.tenant("acme").await;
    let t = tenant.to_string();
    assert_eq!(app.chat(&good, app.chat_body("x", 2)).await.status(), 200);

    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let none = format!("{}.{}.", b64(&json!({ "alg": "none", "typ": "JWT" })), b64(&claims(&t)));
    let mut expired = claims(&t);
    expired["exp"] = json!(now() - 3600);
    let mut wrong_aud = claims(&t);
    wrong_aud["aud"] = json!("someone-else");
    let mut wrong_iss = claims(&t);
    wrong_iss["iss"] = json!("evil");
    let mut no_tenant = claims(&t);
    no_tenant.as_object_mut().unwrap().remove("tenant");
    let cases = [
        ("alg none", none),
        ("wrong key", sign(&claims(&t), "another-secret-another-secret-another")),
        ("expired", sign(&expired, SECRET)),
        ("wrong aud", sign(&wrong_aud, SECRET)),
        ("wrong iss", sign(&wrong_iss, SECRET)),
        ("no tenant claim", sign(&no_tenant, SECRET)),
        ("garbage", "not.a.jwt".to_string()),
        ("unknown tenant", sign(&claims(&uuid::Uuid::new_v4().to_string()), SECRET)),
    ];
    for (what, token) in cases {
        let r = app.chat(&token, app.chat_body("x", 2)).await;
        assert_eq!(r.status(), 401, "{what}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["type"], "authentication_error", "{what}: {body}");
        assert!(!body.to_string().contains(&token), "{what}: the error echoes the token");
    }
    // A valid token for a tenant deleted since.
    let r = app.client.delete(format!("{}/admin/tenants/{t}", app.address)).bearer_auth(OPERATOR).send().await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(app.chat(&good, app.chat_body("x", 2)).await.status(), 401);
    let r = app.client.get(format!("{}/v1/models", app.address)).bearer_auth(&good).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn tenants_see_only_their_own_usage_and_cache() {
    let app = spawn_app().await;
    let (a, token_a) = app.tenant("a").await;
    let (b, token_b) = app.tenant("b").await;
    let prompt = app.chat_body(&"shared secret context ".repeat(30), 3);
    let first: Value = app.chat(&token_a, prompt.clone()).await.json().await.unwrap();
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    // B sending A's exact prompt reuses nothing (no public prompt is configured).
    let other: Value = app.chat(&token_b, prompt.clone()).await.json().await.unwrap();
    assert_eq!(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // A itself reuses it.
    let again: Value = app.chat(&token_a, prompt).await.json().await.unwrap();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), prompt_tokens - 1);
    // Each sees only its own rows.
    app.ledger(a).await;
    let rows = |token: String| {
        let (client, url) = (app.client.clone(), format!("{}/v1/usage", app.address));
        async move { client.get(url).bearer_auth(token).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let ra = rows(token_a.clone()).await;
    let rb = rows(token_b.clone()).await;
    assert_eq!(ra["data"].as_array().unwrap().len(), 2);
    assert_eq!(rb["data"].as_array().unwrap().len(), 1);
    assert!(ra["data"].as_array().unwrap().iter().all(|r| r["tenant"] == a.to_string()));
    assert!(rb["data"].as_array().unwrap().iter().all(|r| r["tenant"] == b.to_string()));
    // A body cannot choose the tenant: an extra field is ignored.
    let mut spoof = app.chat_body("x", 2);
    spoof["tenant"] = json!(b.to_string());
    app.chat(&token_a, spoof).await;
    assert_eq!(app.ledger(b).await.len(), 1);
}

#[tokio::test]
async fn a_user_salt_only_narrows_reuse() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let mut body = app.chat_body(&"common repository context ".repeat(20), 2);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let plain: Value = app.chat(&token, body.clone()).await.json().await.unwrap();
    body["user"] = json!("alice");
    let alice: Value = app.chat(&token, body.clone()).await.json().await.unwrap();
    assert_eq!(cached(&alice), 0, "a salt must not reach the unsalted namespace");
    let alice2: Value = app.chat(&token, body.clone()).await.json().await.unwrap();
    assert_eq!(cached(&alice2), plain["usage"]["prompt_tokens"].as_u64().unwrap() - 1);
    body["user"] = json!("bob");
    let bob: Value = app.chat(&token, body).await.json().await.unwrap();
    assert_eq!(cached(&bob), 0);
}

#[tokio::test]
async fn the_public_system_prompt_is_shared_by_every_tenant_and_nothing_else() {
    let app = spawn_with(|s| s.model.public_system_prompt = "You are a careful coding assistant. ".repeat(8)).await;
    let public = app.state.model.served.get().unwrap().public.clone().expect("a public prefix").1.len() as u64;
    let (_, a) = app.tenant("a").await;
    let (_, b) = app.tenant("b").await;
    let body = app.chat_body(&"tenant-specific repository context ".repeat(10), 2);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let first: Value = app.chat(&a, body.clone()).await.json().await.unwrap();
    assert_eq!(cached(&first), 0);
    let other: Value = app.chat(&b, body.clone()).await.json().await.unwrap();
    assert_eq!(cached(&other), public, "B reuses exactly the public system prompt");
    let again: Value = app.chat(&a, body).await.json().await.unwrap();
    assert_eq!(cached(&again), first["usage"]["prompt_tokens"].as_u64().unwrap() - 1);
}
