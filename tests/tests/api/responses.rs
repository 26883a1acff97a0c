//! `POST /v1/responses` on a tiny random-weight model: function calls and their
//! outputs round-trip, streamed events agree with the whole response, the
//! ledger records the endpoint, and stateful features are clear 400s.

use crate::helpers::*;
use serde_json::{json, Value};

fn tools() -> Value {
    json!([{"type": "function", "name": "read_file", "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string", "pattern": "^[a-z]{1,8}\\.txt$"}},
                           "required": ["path"]}}])
}

async fn create(app: &TestApp, token: &str, body: Value) -> reqwest::Response {
    app.post(token, "/v1/responses", body).await
}

/// The `data:` payloads of a Responses stream, checking each `event:` name matches its type.
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (name, data) = e.split_once("\ndata: ").expect("event: then data:");
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(name.strip_prefix("event: ").unwrap(), v["type"], "{e}");
            v
        })
        .collect()
}

#[tokio::test]
async fn function_calls_round_trip_streamed_or_not() {
    let app = spawn_app().await;
    let (tenant, token) = app.tenant("acme").await;
    let body = json!({"model": app.model(), "instructions": "You read files.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "what is in notes.txt?"}]}],
        "tools": tools(), "tool_choice": "required", "parallel_tool_calls": false,
        "max_output_tokens": 120, "temperature": 0.7, "seed": 3, "store": false});
    let r = create(&app, &token, body.clone()).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!((v["object"].as_str(), v["status"].as_str()), (Some("response"), Some("completed")), "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{v}");
    let call = &output[0];
    assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("function_call"), Some("read_file")));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["path"].as_str().unwrap().ends_with(".txt"), "{args}");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert_eq!(v["tools"], tools(), "the request's settings are repeated");

    // Streamed: the same call (greedy), in the Responses API's events.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = create(&app, &token, streamed).await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let evs = events(&r.text().await.unwrap());
    let kinds: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..3], ["response.created", "response.in_progress", "response.output_item.added"]);
    assert_eq!(kinds.last(), Some(&"response.completed"));
    let args_delta: String = evs
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(args_delta, call["arguments"].as_str().unwrap());
    let done = evs.last().unwrap();
    assert_eq!(done["response"]["output"][0]["arguments"], call["arguments"]);
    let seq: Vec<u64> = evs.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(seq, (0..evs.len() as u64).collect::<Vec<_>>());

    // The follow-up carries the call and its output; the prefix is reused.
    let mut follow = body.clone();
    follow["tool_choice"] = json!("none");
    follow["input"] = json!([
        body["input"][0],
        {"type": "function_call", "call_id": call["call_id"], "name": "read_file", "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "The secret number is 4217."},
    ]);
    let r = create(&app, &token, follow).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["output"][0]["type"], "message", "{v}");
    assert!(v["output"][0]["content"][0]["text"].is_string());
    assert!(v["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{v}");

    let rows = app.ledger(tenant).await;
    assert_eq!(rows.iter().filter(|r| r.endpoint == cachet_tenants::Endpoint::Responses).count(), 3);
    assert!(rows.iter().all(|r| r.status == cachet_tenants::RequestStatus::Ok));
}

#[tokio::test]
async fn text_format_and_logprobs() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                        "required": ["n"], "additionalProperties": false});
    let body = json!({"model": app.model(), "input": "a number", "max_output_tokens": 40, "temperature": 0.7,
        "text": {"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": true}},
        "include": ["message.output_text.logprobs"], "top_logprobs": 3});
    let v: Value = create(&app, &token, body).await.json().await.unwrap();
    let part = &v["output"][0]["content"][0];
    let answer: Value = serde_json::from_str(part["text"].as_str().unwrap()).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(answer["n"].as_u64().unwrap() <= 99);
    let lps = part["logprobs"].as_array().unwrap();
    assert!(!lps.is_empty());
    let joined: String = lps.iter().map(|l| l["token"].as_str().unwrap()).collect();
    assert_eq!(joined, part["text"].as_str().unwrap(), "the listed tokens spell the text");
    for l in lps {
        assert_eq!(l["top_logprobs"].as_array().unwrap().len(), 3);
        assert!(l["logprob"].as_f64().unwrap() <= 0.0);
    }
}

#[tokio::test]
async fn bad_and_stateful_requests_are_400s_naming_the_field() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let cases = [
        (json!({"store": true}), "store"),
        (json!({"previous_response_id": "resp_123"}), "previous_response_id"),
        (json!({"background": true}), "background"),
        (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
        (json!({"tools": [{"type": "function", "name": "bad name!"}]}), "tools[0].name"),
        (json!({"tool_choice": {"type": "function", "name": "nope"}, "tools": tools()}), "tool_choice"),
        (json!({"input": [{"type": "item_reference", "id": "msg_1"}]}), "input[0].type"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (json!({"input": []}), "input"),
        (json!({"text": {"format": {"type": "json_schema", "schema": {}}}}), "text.format.name"),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
        (json!({"top_logprobs": 21}), "top_logprobs"),
        (json!({"include": ["file_search_call.results"]}), "include[0]"),
        (json!({"reasoning": {"effort": "high"}}), "reasoning.effort"),
        (json!({"truncation": "auto"}), "truncation"),
        (json!({"frobnicate": true}), "frobnicate"),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": app.model(), "input": "hi", "max_output_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let e = error(create(&app, &token, body.clone()).await, 400).await;
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    // Malformed JSON, another model, no token.
    let r = app
        .client
        .post(format!("{}/v1/responses", app.address))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    error(r, 400).await;
    error(create(&app, &token, json!({"model": "gpt-9", "input": "hi"})).await, 404).await;
    error(create(&app, "not-a-token", json!({"model": app.model(), "input": "hi"})).await, 401).await;
}

#[tokio::test]
async fn custom_tool_calls_round_trip_streamed_or_not() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let tools = json!([{"type": "custom", "name": "ticket", "description": "File a ticket",
                        "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{2,4}-[0-9]{1,3}"}}]);
    let body = json!({"model": app.model(), "input": "file a ticket", "tools": tools,
                      "tool_choice": {"type": "custom", "name": "ticket"}, "max_output_tokens": 40,
                      "temperature": 0.0, "store": false});
    let v: Value = create(&app, &token, body.clone()).await.json().await.unwrap();
    let call = &v["output"][0];
    assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("custom_tool_call"), Some("ticket")), "{v}");
    let input = call["input"].as_str().unwrap();
    let (a, n) = input.split_once('-').unwrap();
    assert!(a.bytes().all(|c| c.is_ascii_uppercase()) && n.bytes().all(|c| c.is_ascii_digit()), "{input}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let evs = events(&create(&app, &token, streamed).await.text().await.unwrap());
    let delta: String = evs
        .iter()
        .filter(|e| e["type"] == "response.custom_tool_call_input.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(delta, input, "greedy: the same input, streamed");
    let done = evs.iter().find(|e| e["type"] == "response.custom_tool_call_input.done").unwrap();
    assert_eq!(done["input"], input);

    // The call and its output go back as input items.
    let next = json!({"model": app.model(), "tools": body["tools"], "max_output_tokens": 4, "store": false,
        "input": [{"role": "user", "content": "file a ticket"},
                  {"type": "custom_tool_call", "call_id": call["call_id"], "name": "ticket", "input": input},
                  {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "filed"}]});
    let r = create(&app, &token, next).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}
