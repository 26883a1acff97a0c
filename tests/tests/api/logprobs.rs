//! `logprobs` and `top_logprobs` on chat and text completions, streamed and
//! not (their values are checked against the reference forward pass in
//! `engine/tests/logprobs.rs`; here, their shapes and their agreement).

use crate::helpers::*;
use serde_json::{json, Value};

/// (token, logprob, top tokens) of chat `logprobs.content` entries.
fn entries(content: &Value) -> Vec<(String, f64, Vec<String>)> {
    content
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let token = e["token"].as_str().unwrap().to_string();
            assert_eq!(e["bytes"], json!(token.as_bytes()), "{e}");
            let top: Vec<String> =
                e["top_logprobs"].as_array().unwrap().iter().map(|t| t["token"].as_str().unwrap().into()).collect();
            (token, e["logprob"].as_f64().unwrap(), top)
        })
        .collect()
}

#[tokio::test]
async fn chat_logprobs_streamed_and_not_agree() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let mut body = app.chat_body("hello there", 12);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(4);
    let v: Value = app.chat(&token, body.clone()).await.json().await.unwrap();
    let choice = &v["choices"][0];
    let whole = entries(&choice["logprobs"]["content"]);
    assert!(!whole.is_empty(), "{v}");
    let text: String = whole.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(text, choice["message"]["content"].as_str().unwrap(), "the tokens spell the answer");
    for (tok, lp, top) in &whole {
        assert!(*lp <= 0.0);
        assert_eq!(top.len(), 4);
        // Greedy: the drawn token is the most likely one.
        assert_eq!(&top[0], tok);
    }

    body["stream"] = json!(true);
    let r = app.chat(&token, body.clone()).await;
    let mut streamed = Vec::new();
    for e in sse_events(&r.text().await.unwrap()).iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        if let Some(content) = c["choices"][0]["logprobs"].get("content") {
            streamed.extend(entries(content));
        }
    }
    assert_eq!(streamed, whole, "the same entries, streamed");

    // Without logprobs: null.
    let v: Value = app.chat(&token, app.chat_body("hello there", 4)).await.json().await.unwrap();
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[tokio::test]
async fn completion_logprobs_and_bad_values() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let url = format!("{}/v1/completions", app.address);
    let body = json!({"model": app.model(), "prompt": "once upon", "max_tokens": 8, "temperature": 0,
                      "logprobs": 2, "ignore_eos": true});
    let v: Value = app.client.post(&url).bearer_auth(&token).json(&body).send().await.unwrap().json().await.unwrap();
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), 8, "{v}");
    assert_eq!(tokens.concat(), v["choices"][0]["text"].as_str().unwrap());
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 8);
    for top in lp["top_logprobs"].as_array().unwrap() {
        assert!(top.as_object().unwrap().len() <= 2, "{top}");
    }
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = app.client.post(&url).bearer_auth(&token).json(&streamed).send().await.unwrap();
    let mut stokens = Vec::new();
    for e in sse_events(&r.text().await.unwrap()).iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        for t in c["choices"][0]["logprobs"]["tokens"].as_array().into_iter().flatten() {
            stokens.push(t.as_str().unwrap().to_string());
        }
    }
    assert_eq!(stokens, tokens);

    for (extra, param) in [
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"logprobs": "yes"}), "logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
    ] {
        let mut b = app.chat_body("x", 2);
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let e = error(app.chat(&token, b).await, 400).await;
        assert_eq!(e["param"], param);
    }
    let e = error(
        app.client
            .post(&url)
            .bearer_auth(&token)
            .json(&json!({"model": app.model(), "prompt": "x", "logprobs": 99}))
            .send()
            .await
            .unwrap(),
        400,
    )
    .await;
    assert_eq!(e["param"], "logprobs");
}
