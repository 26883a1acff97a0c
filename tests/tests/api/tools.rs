//! Tool calls and structured output on a tiny random-weight model: whatever
//! the model's weights, the grammar makes every call well formed, and the
//! answers come back in OpenAI's shapes (streamed and not, the same).

use crate::helpers::*;
use serde_json::{json, Value};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "read_file", "description": "Read a file",
         "parameters": {"type": "object", "properties": {"path": {"type": "string", "pattern": "^[a-z]{1,8}\\.rs$"}},
                        "required": ["path"]}}},
        {"type": "function", "function": {"name": "run", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"cmd": {"enum": ["ls", "make", "cargo test"]},
                                                          "n": {"type": "integer", "minimum": 1, "maximum": 9}},
                        "required": ["cmd", "n"]}}},
    ])
}

fn body(app: &TestApp, extra: Value) -> Value {
    let mut b = json!({"model": app.model(), "messages": [{"role": "user", "content": "list the files"}],
                       "tools": tools(), "max_tokens": 120, "temperature": 0.7, "seed": 3});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// Checks a call against the tools above; returns (name, arguments).
fn check_call(call: &Value) -> (String, Value) {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    let name = call["function"]["name"].as_str().unwrap().to_string();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    let keys: Vec<&String> = args.as_object().unwrap().keys().collect();
    match name.as_str() {
        "read_file" => {
            assert_eq!(keys, ["path"]);
            let path = args["path"].as_str().unwrap();
            assert!(path.ends_with(".rs") && path.len() <= 11, "{path}");
        }
        "run" => {
            assert_eq!(keys, ["cmd", "n"]);
            assert!(["ls", "make", "cargo test"].contains(&args["cmd"].as_str().unwrap()));
            assert!((1..=9).contains(&args["n"].as_u64().unwrap()));
        }
        other => panic!("unknown tool {other}"),
    }
    (name, args)
}

/// The chunks of a streamed answer: (content, calls as (id, name, arguments), finish reason).
fn reassemble(events: &[String]) -> (String, Vec<(String, String, String)>, String) {
    let (mut content, mut calls, mut finish) = (String::new(), Vec::<(String, String, String)>::new(), String::new());
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        let Some(choice) = c["choices"].get(0) else { continue };
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        for tc in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                // A call's first delta: id, type and name, arguments empty.
                assert_eq!(tc["type"], "function", "{tc}");
                assert_eq!(tc["function"]["arguments"], "", "{tc}");
                calls.push((
                    tc["id"].as_str().unwrap().into(),
                    tc["function"]["name"].as_str().unwrap().into(),
                    String::new(),
                ));
            } else {
                assert!(tc.get("id").is_none() && tc["function"].get("name").is_none(), "{tc}");
                calls[i].2.push_str(tc["function"]["arguments"].as_str().unwrap());
            }
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.into();
        }
    }
    (content, calls, finish)
}

#[tokio::test]
async fn required_calls_are_well_formed_streamed_or_not() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    for seed in 1..=4 {
        let b = body(&app, json!({"tool_choice": "required", "parallel_tool_calls": false, "seed": seed}));
        let v: Value = app.chat(&token, b.clone()).await.json().await.unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        assert!(choice["message"]["content"].is_null(), "{v}");
        let calls = choice["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{v}");
        let (name, args) = check_call(&calls[0]);

        let mut streamed = b.clone();
        streamed["stream"] = json!(true);
        let r = app.chat(&token, streamed).await;
        let (content, scalls, finish) = reassemble(&sse_events(&r.text().await.unwrap()));
        assert_eq!(finish, "tool_calls");
        assert_eq!(content, "", "no markup or whitespace leaks into content");
        assert_eq!(scalls.len(), 1);
        assert_eq!(scalls[0].1, name);
        assert_eq!(serde_json::from_str::<Value>(&scalls[0].2).unwrap(), args);
        assert_eq!(scalls[0].2, calls[0]["function"]["arguments"].as_str().unwrap(), "the same text streamed");
    }
}

#[tokio::test]
async fn named_auto_and_none_tool_choices() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    for seed in 1..=3 {
        let named = body(&app, json!({"tool_choice": {"type": "function", "function": {"name": "run"}}, "seed": seed}));
        let v: Value = app.chat(&token, named).await.json().await.unwrap();
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("no tool calls: {v}"));
        assert_eq!(calls.len(), 1, "{v}");
        assert_eq!(check_call(&calls[0]).0, "run");
    }
    // Auto: whatever the model says, a call it starts is valid.
    for seed in 1..=3 {
        let v: Value = app.chat(&token, body(&app, json!({"seed": seed}))).await.json().await.unwrap();
        for call in v["choices"][0]["message"]["tool_calls"].as_array().into_iter().flatten() {
            check_call(call);
        }
    }
    // None: the tools are not in the prompt, and nothing is parsed as a call.
    let with: Value = app.chat(&token, body(&app, json!({"max_tokens": 1}))).await.json().await.unwrap();
    let none: Value =
        app.chat(&token, body(&app, json!({"tool_choice": "none", "max_tokens": 8}))).await.json().await.unwrap();
    assert!(
        none["choices"][0]["message"]["tool_calls"].is_null() && none["choices"][0]["message"]["content"].is_string()
    );
    assert!(
        none["usage"]["prompt_tokens"].as_u64().unwrap() + 100 < with["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{none} {with}"
    );
}

#[tokio::test]
async fn json_schema_answers_validate() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let schema = json!({"type": "object", "properties": {
        "level": {"enum": ["low", "high"]}, "count": {"type": "integer", "minimum": 0, "maximum": 50},
        "ok": {"type": "boolean"}}, "required": ["level", "count", "ok"], "additionalProperties": false});
    for seed in 1..=4 {
        let b = json!({"model": app.model(), "messages": [{"role": "user", "content": "status?"}], "max_tokens": 80,
                       "temperature": 1.0, "seed": seed,
                       "response_format": {"type": "json_schema", "json_schema": {"name": "status", "schema": schema, "strict": true}}});
        let v: Value = app.chat(&token, b).await.json().await.unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
        let doc: Value = serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
        assert!(["low", "high"].contains(&doc["level"].as_str().unwrap()), "{doc}");
        assert!(doc["count"].as_u64().unwrap() <= 50 && doc["ok"].is_boolean(), "{doc}");
        assert_eq!(doc.as_object().unwrap().len(), 3);
    }
    let b = json!({"model": app.model(), "messages": [{"role": "user", "content": "anything"}], "max_tokens": 60,
                   "temperature": 1.0, "seed": 9, "response_format": {"type": "json_object"}});
    let v: Value = app.chat(&token, b).await.json().await.unwrap();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text}");
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
}

#[tokio::test]
async fn a_history_with_calls_and_results_is_accepted() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let messages = json!([
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "read_file", "arguments": "{\"path\": \"a.rs\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "fn main() {}"},
    ]);
    let b = json!({"model": app.model(), "messages": messages, "tools": tools(), "max_tokens": 4});
    let r = app.chat(&token, b).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let bad = json!({"model": app.model(), "tools": tools(), "messages": [{"role": "user", "content": "x",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}]});
    let e = error(app.chat(&token, bad).await, 400).await;
    assert_eq!(e["param"], "messages[0].tool_calls");
}

#[tokio::test]
async fn bad_tools_schemas_and_unknown_fields_are_400s_naming_them() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let cases = [
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"a": {"type": "string", "pattern": "("}}}}}]}),
            "tools[0].function.parameters",
        ),
        (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
        (json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "frob"}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "s",
            "schema": {"type": "string", "minLength": 5, "maxLength": 2}}}}),
            "response_format",
        ),
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (json!({"frobnicate": true}), "frobnicate"),
        (json!({"logit_bias": {"999999": 1}}), "logit_bias"),
        (json!({"store": true}), "store"),
    ];
    for (extra, param) in cases {
        let mut b = body(&app, json!({}));
        if extra.get("tools").is_some() {
            b.as_object_mut().unwrap().remove("tool_choice");
        }
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let e = error(app.chat(&token, b).await, 400).await;
        assert_eq!(e["param"], param, "{e}");
    }
    // The completions endpoint refuses unknown fields too; honoured ones work.
    let url = format!("{}/v1/completions", app.address);
    let r = app
        .client
        .post(&url)
        .bearer_auth(&token)
        .json(&json!({"model": app.model(), "prompt": "a", "max_tokens": 1, "best_of": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(error(r, 400).await["param"], "best_of");
    let ok = body(
        &app,
        json!({"store": false, "metadata": {"a": "b"}, "service_tier": "auto", "max_tokens": 1,
                               "logit_bias": {"42": -100}, "prompt_cache_key": "k", "tool_choice": "none"}),
    );
    assert_eq!(app.chat(&token, ok).await.status(), 200);
}

#[tokio::test]
async fn a_session_turn_calls_tools_and_the_next_takes_their_results() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let source = app.source_repo(
        "shop",
        &[
            ("src/lib.rs", Some("pub mod cart;\n")),
            (
                "src/cart.rs",
                Some("pub struct Cart;\n\nimpl Cart {\n    pub fn total(&self) -> u64 {\n        0\n    }\n}\n"),
            ),
        ],
    );
    let repo = app.register(&token, source).await;
    let session = app.session(&token, &repo).await;
    let turn = |extra: Value| {
        let mut b = json!({"tools": tools(), "max_tokens": 120, "temperature": 0.7, "seed": 5});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    // Turn 1: the answer is a call.
    let r = app
        .message(
            &token,
            &session,
            turn(json!({"content": "Read the cart.", "tool_choice": "required",
                                                       "parallel_tool_calls": false})),
        )
        .await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    check_call(call);
    let first_prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();

    // Turn 2: its result (and no question). The prompt: repository context first, then the
    // tools, the history with the call as the model wrote it, then the result.
    let results = json!([{"tool_call_id": call["id"], "content": "  3 items, total 0\n"}]);
    let r = app.message(&token, &session, turn(json!({"tool_results": results, "dry_run": true}))).await;
    let dry: Value = r.json().await.unwrap();
    let prompt = dry["prompt"].as_str().unwrap();
    let at = |needle: &str| prompt.find(needle).unwrap_or_else(|| panic!("no {needle:?} in {prompt}"));
    assert!(at("pub struct Cart") < at("# Tools") && at("# Tools") < at("Read the cart."), "{prompt}");
    let call_at = prompt.rfind("<tool_call>\n{\"name\": ").unwrap();
    assert!(at("Read the cart.") < call_at && call_at < at("<tool_response>\n  3 items"), "{prompt}");
    assert!(prompt.ends_with("</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{prompt}");

    let r = app.message(&token, &session, turn(json!({"tool_results": results, "max_tokens": 2}))).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let v: Value = r.json().await.unwrap();
    // The first turn's prompt and answer are reused from the cache.
    assert!(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > first_prompt, "{v}");
    let history: Value = app.get(&token, &format!("/v1/sessions/{session}")).await.json().await.unwrap();
    let roles: Vec<&str> = history["turns"].as_array().unwrap().iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(history["turns"][2]["tool_call_id"], call["id"]);
    assert!(history["turns"][1]["content"].as_str().unwrap().contains("<tool_call>"), "{history}");
    // Unknown fields are refused here too.
    let e = error(app.message(&token, &session, json!({"content": "x", "frobnicate": 1})).await, 400).await;
    assert_eq!(e["param"], "frobnicate");
}

#[tokio::test]
async fn regex_and_lark_grammars_as_a_cachet_extension() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let url = format!("{}/v1/completions", app.address);
    for seed in 1..=3 {
        let b = json!({"model": app.model(), "prompt": "version:", "max_tokens": 30, "temperature": 1.0, "seed": seed,
                       "grammar": {"regex": "v[0-9]\\.[0-9]{1,2}\\.[0-9]"}});
        let v: Value = app.client.post(&url).bearer_auth(&token).json(&b).send().await.unwrap().json().await.unwrap();
        let text = v["choices"][0]["text"].as_str().unwrap();
        let ok = text.len() >= 6
            && text.starts_with('v')
            && text[1..].split('.').all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()));
        assert!(ok && v["choices"][0]["finish_reason"] == "stop", "{v}");
    }
    let b = json!({"model": app.model(), "messages": [{"role": "user", "content": "yes or no?"}], "max_tokens": 10,
                   "temperature": 1.0, "grammar": {"lark": "start: ANSWER \"!\"\nANSWER: \"yes\" | \"no\""}});
    let v: Value = app.chat(&token, b).await.json().await.unwrap();
    assert!(["yes!", "no!"].contains(&v["choices"][0]["message"]["content"].as_str().unwrap()), "{v}");
    for (grammar, extra) in [
        (json!({"lark": "start: nope"}), json!({})),
        (json!({"pcre": "x"}), json!({})),
        (json!({"regex": "a"}), json!({"response_format": {"type": "json_object"}})),
    ] {
        let mut b = json!({"model": app.model(), "messages": [{"role": "user", "content": "x"}], "grammar": grammar});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        assert_eq!(error(app.chat(&token, b).await, 400).await["param"], "grammar");
    }
}

#[tokio::test]
async fn required_parallel_calls_end_at_a_repeat_and_at_most_sixteen() {
    // One tool whose only call is `ping {"host": "a"}`: under `required` with parallel calls, the
    // model may only call it again and again. It once did until the context was full. Now the
    // repeat ends the answer (and is left out of it): one call, finish reason `tool_calls`,
    // streamed or not, and the ledger says `tool_calls` too.
    let app = spawn_app().await;
    let (tenant, token) = app.tenant("repeat").await;
    let ping = json!([{"type": "function", "function": {"name": "ping", "parameters": {"type": "object",
        "properties": {"host": {"enum": ["a"]}}, "required": ["host"]}}}]);
    let mut b = json!({"model": app.model(), "messages": [{"role": "user", "content": "ping"}],
                       "tools": ping, "tool_choice": "required", "temperature": 0.7, "seed": 5});
    let v: Value = app.chat(&token, b.clone()).await.json().await.unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["arguments"], "{\"host\": \"a\"}");
    // A call is ~35 tokens of the tiny model's byte-level vocabulary: two, not sixteen.
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 150, "ended at the repeat: {v}");
    b["stream"] = json!(true);
    let r = app.chat(&token, b).await;
    let (content, scalls, finish) = reassemble(&sse_events(&r.text().await.unwrap()));
    assert_eq!((content.as_str(), scalls.len(), finish.as_str()), ("", 1, "tool_calls"));
    let rows = app.ledger(tenant).await;
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row.finish_reason, Some(cachet_tenants::FinishReason::ToolCalls), "{row:?}");
    }

    // Distinct calls: at most sixteen in one answer, whatever the model would write.
    let many = json!([{"type": "function", "function": {"name": "read", "parameters": {"type": "object",
        "properties": {"line": {"type": "integer", "minimum": 1, "maximum": 99999}}, "required": ["line"]}}}]);
    let b = json!({"model": app.model(), "messages": [{"role": "user", "content": "read"}],
                   "tools": many, "tool_choice": "required", "temperature": 1.0, "seed": 7, "max_tokens": 2000});
    let v: Value = app.chat(&token, b).await.json().await.unwrap();
    let n = v["choices"][0]["message"]["tool_calls"].as_array().unwrap().len();
    assert!((1..=16).contains(&n), "{n} calls: {v}");
}

/// A small patch grammar (the shape of Codex's `apply_patch`), for custom tools.
const PATCH_LARK: &str = "start: \"*** Begin Patch\" LF hunk+ \"*** End Patch\"\n\
    hunk: \"*** Add File: \" NAME LF (\"+\" LINE LF)+\n\
    NAME: /[a-z]{1,8}\\.py/\nLINE: /[a-z =0-9]{0,20}/\n%import common.LF\n";

fn custom_tools() -> Value {
    json!([
        {"type": "custom", "custom": {"name": "apply_patch", "description": "Edit files",
         "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_LARK}}},
        {"type": "custom", "custom": {"name": "ticket",
         "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{2,4}-[0-9]{1,3}"}}},
        {"type": "function", "function": {"name": "run", "parameters": {"type": "object",
         "properties": {"cmd": {"enum": ["ls"]}}, "required": ["cmd"]}}},
    ])
}

/// Whether `input` is a patch of [`PATCH_LARK`].
fn is_patch(input: &str) -> bool {
    let Some(body) = input.strip_prefix("*** Begin Patch\n").and_then(|b| b.strip_suffix("*** End Patch")) else {
        return false;
    };
    let mut lines = body.lines().peekable();
    let mut hunks = 0;
    while let Some(head) = lines.next() {
        let Some(name) = head.strip_prefix("*** Add File: ") else { return false };
        if !name.ends_with(".py") || lines.peek().is_none_or(|l| !l.starts_with('+')) {
            return false;
        }
        while lines.peek().is_some_and(|l| l.starts_with('+')) {
            lines.next();
        }
        hunks += 1;
    }
    hunks > 0
}

#[tokio::test]
async fn custom_tools_take_free_form_input_held_to_their_grammar() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    for (name, seed) in [("apply_patch", 1), ("ticket", 2), ("apply_patch", 3)] {
        let b = body(
            &app,
            json!({"tools": custom_tools(), "tool_choice": {"type": "custom", "custom": {"name": name}},
                   "seed": seed, "max_tokens": 300, "temperature": 1.0}),
        );
        let v: Value = app.chat(&token, b.clone()).await.json().await.unwrap();
        let choice = &v["choices"][0];
        let calls = choice["message"]["tool_calls"].as_array().expect("a call");
        assert_eq!(calls.len(), 1, "{v}");
        let call = &calls[0];
        assert_eq!((call["type"].as_str(), call["custom"]["name"].as_str()), (Some("custom"), Some(name)), "{v}");
        assert!(call.get("function").is_none() && call["id"].as_str().unwrap().starts_with("call_"), "{call}");
        let input = call["custom"]["input"].as_str().unwrap();
        if choice["finish_reason"] == "tool_calls" {
            match name {
                "ticket" => {
                    let (a, n) = input.split_once('-').unwrap();
                    assert!((2..=4).contains(&a.len()) && a.bytes().all(|c| c.is_ascii_uppercase()), "{input}");
                    assert!((1..=3).contains(&n.len()) && n.bytes().all(|c| c.is_ascii_digit()), "{input}");
                }
                _ => assert!(is_patch(input), "{input:?}"),
            }
        } else {
            assert_eq!(choice["finish_reason"], "length", "{v}");
        }
        // Streamed: the same call (same seed), as custom deltas.
        let mut streamed = b;
        streamed["stream"] = json!(true);
        let text = app.chat(&token, streamed).await.text().await.unwrap();
        let (mut sname, mut sinput) = (String::new(), String::new());
        for e in sse_events(&text).iter().filter(|e| *e != "[DONE]") {
            let c: Value = serde_json::from_str(e).unwrap();
            for tc in c["choices"][0]["delta"]["tool_calls"].as_array().into_iter().flatten() {
                assert!(tc.get("function").is_none(), "{tc}");
                if let Some(n) = tc["custom"]["name"].as_str() {
                    assert_eq!(tc["type"], "custom");
                    sname.push_str(n);
                }
                sinput.push_str(tc["custom"]["input"].as_str().unwrap_or(""));
            }
        }
        assert_eq!((sname.as_str(), sinput.as_str()), (name, input));
    }
    // A history with a custom call and its output is accepted (the call is rendered as the model
    // writes it).
    let history = json!({"model": app.model(), "max_tokens": 4, "tools": custom_tools(), "messages": [
        {"role": "user", "content": "add a file"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "custom",
            "custom": {"name": "apply_patch", "input": "*** Begin Patch\n*** Add File: a.py\n+x = 1\n*** End Patch"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Done!"}]});
    assert_eq!(app.chat(&token, history).await.status(), 200);
    // A grammar llguidance refuses is a 400 naming the tool.
    let bad = json!([{"type": "custom", "custom": {"name": "p",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: undefined_rule"}}}]);
    let e = error(app.chat(&token, body(&app, json!({"tools": bad}))).await, 400).await;
    assert_eq!(e["param"], "tools", "{e}");
    assert!(e["message"].as_str().unwrap().contains("\"p\""), "{e}");
}
