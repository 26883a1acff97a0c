//! Chat and text completions, streaming and not; usage and cached tokens.

use crate::helpers::*;
use cachet_tenants::RequestStatus;
use serde_json::{json, Value};

#[tokio::test]
async fn chat_completion_with_usage() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let r = app.chat(&token, app.chat_body("hello there", 8)).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], app.model());
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &v["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    let u = &v["usage"];
    assert!(u["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(u["completion_tokens"].as_u64().unwrap() <= 8);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn a_repeated_prompt_is_served_from_the_cache() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let body = app.chat_body(&"fn main() { println!(\"hi\"); } ".repeat(20), 4);
    let first: Value = app.chat(&token, body.clone()).await.json().await.unwrap();
    let second: Value = app.chat(&token, body).await.json().await.unwrap();
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), prompt - 1);
    assert_eq!(first["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"]);
}

#[tokio::test]
async fn streaming_chat_sends_chunks_usage_and_done() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let mut body = app.chat_body("stream please", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let r = app.chat(&token, body.clone()).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    let finish = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str()).unwrap();
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(chunks.last().unwrap()["choices"].as_array().unwrap().len(), 0);
    // The same request, not streamed, gives the same text and usage.
    body["stream"] = json!(false);
    let whole: Value = app.chat(&token, body).await.json().await.unwrap();
    assert_eq!(whole["choices"][0]["message"]["content"].as_str().unwrap(), text);
    assert_eq!(whole["choices"][0]["finish_reason"], finish);
    assert_eq!(whole["usage"]["completion_tokens"], usage["completion_tokens"]);
    assert_eq!(whole["usage"]["prompt_tokens"], usage["prompt_tokens"]);
}

#[tokio::test]
async fn text_completions_streaming_and_not() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let url = format!("{}/v1/completions", app.address);
    let body = json!({ "model": app.model(), "prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0 });
    let v: Value = app.client.post(&url).bearer_auth(&token).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let r = app.client.post(&url).bearer_auth(&token).json(&stream).send().await.unwrap();
    let events = sse_events(&r.text().await.unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(streamed, text);
    // Token ids as the prompt.
    let ids = json!({ "model": app.model(), "prompt": [5, 6, 7], "max_tokens": 2 });
    let r = app.client.post(&url).bearer_auth(&token).json(&ids).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_client_disconnect_cancels_the_request() {
    let app = spawn_app().await;
    let (tenant, token) = app.tenant("acme").await;
    let mut body = app.chat_body("a long answer please", 3000);
    body["stream"] = json!(true);
    let mut r = app.chat(&token, body).await;
    assert_eq!(r.status(), 200);
    r.chunk().await.unwrap().expect("a first chunk");
    drop(r);
    // The engine notices within a step or two; the request's row (open since admission) says so.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let rows = app.ledger(tenant).await;
        if let Some(row) = rows.first().filter(|r| r.status != RequestStatus::Running) {
            assert_eq!(row.status, RequestStatus::Cancelled);
            assert!(row.output_tokens < 3000);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the request was not cancelled");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let snap = app.state.model.served.get().unwrap().engine.snapshot().await.unwrap();
    assert_eq!((snap.running, snap.waiting), (0, 0));
}

#[tokio::test]
async fn stops_special_token_stops_and_text_parts() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let url = format!("{}/v1/completions", app.address);
    let post = |body: Value| app.client.post(&url).bearer_auth(&token).json(&body).send();
    // Up to 32 stop strings (Continue's autocomplete sends 16); more is a 400 naming `stop`.
    let stops: Vec<String> = (0..32).map(|i| format!("stop{i}")).collect();
    let r = post(json!({"model": app.model(), "prompt": "a", "max_tokens": 2, "stop": stops})).await.unwrap();
    assert_eq!(r.status(), 200);
    let too_many: Vec<String> = (0..33).map(|i| format!("stop{i}")).collect();
    let r = post(json!({"model": app.model(), "prompt": "a", "max_tokens": 2, "stop": too_many})).await.unwrap();
    assert_eq!(error(r, 400).await["param"], "stop");
    // A stop spelled as a special token stops at that token (forced here with logit_bias), though
    // special tokens never reach the text.
    let tok = app.state.model.served.get().unwrap().engine.tokenizer().clone();
    let start = tok.token_id("<|im_start|>").unwrap();
    let forced = |stop: Value| {
        json!({"model": app.model(), "prompt": "a", "max_tokens": 4, "temperature": 0, "stop": stop,
               "logit_bias": {start.to_string(): 100}})
    };
    let v: Value = post(forced(json!(["<|im_start|>"]))).await.unwrap().json().await.unwrap();
    assert_eq!(
        (v["choices"][0]["finish_reason"].as_str(), v["usage"]["completion_tokens"].as_u64()),
        (Some("stop"), Some(1)),
        "{v}"
    );
    let v: Value = post(forced(json!(["nothing"]))).await.unwrap().json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    // Text content parts are joined with newlines.
    let (app, token) = (&app, &token);
    let usage = |content: Value| async move {
        let b = json!({"model": app.model(), "messages": [{"role": "user", "content": content}], "max_tokens": 1});
        let v: Value = app.chat(token, b).await.json().await.unwrap();
        v["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let parts = usage(json!([{"type": "text", "text": "first part"}, {"type": "text", "text": "second"}])).await;
    assert_eq!(parts, usage(json!("first part\nsecond")).await);
}

#[tokio::test]
async fn tokenize_and_detokenize_match_what_the_endpoints_compute() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let post = |path: &str, body: Value| {
        app.client.post(format!("{}{path}", app.address)).bearer_auth(&token).json(&body).send()
    };
    let v: Value = post("/tokenize", json!({"prompt": "<|im_start|>user\nhi", "return_token_strs": true}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tok = app.state.model.served.get().unwrap().engine.tokenizer().clone();
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, tok.encode("<|im_start|>user\nhi", true).unwrap());
    assert_eq!(v["count"].as_u64().unwrap() as usize, ids.len());
    assert_eq!(v["token_strs"][0], "<|im_start|>");
    assert!(v["max_model_len"].as_u64().unwrap() > 0);
    let back: Value = post("/detokenize", json!({"tokens": ids})).await.unwrap().json().await.unwrap();
    assert_eq!(back["prompt"], "<|im_start|>user\nhi");
    // A conversation (with tools) counts what chat completions count.
    let messages = json!([{"role": "user", "content": "list the files"}]);
    let tools = json!([{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]);
    let counted: Value =
        post("/tokenize", json!({"messages": messages, "tools": tools})).await.unwrap().json().await.unwrap();
    let chat: Value = app
        .chat(&token, json!({"model": app.model(), "messages": messages, "tools": tools, "max_tokens": 1}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(counted["count"], chat["usage"]["prompt_tokens"]);
    // Bad input: a 400 naming the field.
    for (path, body, param) in [
        ("/tokenize", json!({"prompt": "a", "messages": messages}), "prompt"),
        ("/tokenize", json!({}), "prompt"),
        ("/tokenize", json!({"prompt": "a", "frob": 1}), "frob"),
        ("/tokenize", json!({"messages": messages, "add_special_tokens": true}), "add_special_tokens"),
        ("/detokenize", json!({"tokens": [999999]}), "tokens"),
    ] {
        assert_eq!(error(post(path, body).await.unwrap(), 400).await["param"], param, "{path}");
    }
    let anonymous = app.client.post(format!("{}/tokenize", app.address)).json(&json!({"prompt": "a"})).send();
    assert_eq!(anonymous.await.unwrap().status(), 401);
}

#[tokio::test]
async fn sampling_fields_left_out_take_the_configured_defaults() {
    // Greedy by configuration: a request without sampling fields answers as one asking for
    // temperature 0, every time; its own temperature still wins.
    let app = spawn_with(|s| s.model.sampling.temperature = 0.0).await;
    let (_, token) = app.tenant("acme").await;
    let url = format!("{}/v1/completions", app.address);
    let text = |body: Value| {
        let (app, url, token) = (&app, &url, &token);
        async move {
            let v: Value =
                app.client.post(url).bearer_auth(token).json(&body).send().await.unwrap().json().await.unwrap();
            v["choices"][0]["text"].as_str().expect("a completion").to_string()
        }
    };
    let plain = json!({"model": app.model(), "prompt": "fn main() {", "max_tokens": 12});
    let mut greedy = plain.clone();
    greedy["temperature"] = json!(0);
    let want = text(greedy).await;
    for _ in 0..3 {
        assert_eq!(text(plain.clone()).await, want);
    }
    let mut hot = plain.clone();
    hot["temperature"] = json!(2.0);
    hot["top_k"] = json!(0);
    hot["top_p"] = json!(1.0);
    let mut differ = false;
    for seed in 0..6 {
        hot["seed"] = json!(seed);
        differ |= text(hot.clone()).await != want;
    }
    assert!(differ, "the request's own temperature wins over the default");
}

#[tokio::test]
async fn an_answer_without_a_limit_gets_the_configured_default() {
    let app = spawn_with(|s| s.model.sampling.max_tokens = 7).await;
    let (_, token) = app.tenant("acme").await;
    let body = json!({"model": app.model(), "messages": [{"role": "user", "content": "count"}], "ignore_eos": true});
    let v: Value = app.chat(&token, body.clone()).await.json().await.unwrap();
    assert_eq!(
        (v["usage"]["completion_tokens"].as_u64(), v["choices"][0]["finish_reason"].as_str()),
        (Some(7), Some("length")),
        "{v}"
    );
    // The request's own limit wins, above or below the default.
    let mut own = body;
    own["max_tokens"] = json!(9);
    let v: Value = app.chat(&token, own).await.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 9, "{v}");
    let r: Value = app
        .post(
            &token,
            "/v1/responses",
            json!({"model": app.model(), "input": "count", "store": false, "max_output_tokens": 3}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(r["usage"]["output_tokens"], 3, "{r}");
}

#[tokio::test]
async fn chat_template_kwargs_reach_the_template_and_reserved_names_are_refused() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let mut body = app.chat_body("hi", 2);
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let r = app.chat(&token, body.clone()).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["choices"][0]["message"].get("reasoning_content").is_none(),
        "the tiny model's template does not think: {v}"
    );
    body["chat_template_kwargs"] = json!({"add_generation_prompt": false});
    assert_eq!(
        error(app.chat(&token, body.clone()).await, 400).await["param"],
        "chat_template_kwargs.add_generation_prompt"
    );
    body["chat_template_kwargs"] = json!(["not", "an", "object"]);
    error(app.chat(&token, body).await, 400).await;
}
