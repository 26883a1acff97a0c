use super::answer::{Builder, Reader};
use super::*;
use crate::openai::tools::parse::ToolSet;
use cachet_engine::runtime::Completion;
use std::time::Duration;

fn param(e: ApiError) -> String {
    match e {
        ApiError::BadRequest { param: Some(p), .. } => p.to_string(),
        other => panic!("not a 400 naming a field: {other:?}"),
    }
}

fn items(v: Value) -> Input {
    serde_json::from_value(v).unwrap()
}

#[test]
fn input_items_become_a_conversation() {
    let input = items(json!([
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "looking"}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{\"path\": \"x\"}"},
        {"type": "function_call", "call_id": "c2", "name": "read", "arguments": "{\"path\": \"y\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "X"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "Y"}]},
    ]));
    let conv = conversation(Some("sys"), &input).unwrap();
    let roles: Vec<_> = conv.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "system", "user", "assistant", "tool", "tool"]);
    assert_eq!(conv[0].content, "sys");
    assert_eq!(conv[2].content, "a\nb", "text parts are joined with newlines");
    // Both calls join the assistant message, their arguments parsed for the template.
    let calls = conv[3].tool_calls.as_ref().unwrap();
    assert_eq!(calls[0]["id"], "c1");
    assert_eq!(calls[1]["function"]["arguments"], json!({"path": "y"}));
    assert_eq!((conv[4].tool_call_id.as_deref(), conv[4].content.as_str()), (Some("c1"), "X"));
    assert_eq!(conv[5].content, "Y");
    // A call without a message before it makes an assistant message of its own.
    let conv = conversation(
        None,
        &items(json!([{"role": "user", "content": "q"},
                      {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])),
    )
    .unwrap();
    assert_eq!((conv[1].role.as_str(), conv[1].content.as_str()), ("assistant", ""));
    let text = conversation(None, &Input::Text("hi".into())).unwrap();
    assert_eq!((text.len(), text[0].role.as_str()), (1, "user"));
}

#[test]
fn bad_input_items_name_the_field() {
    let bad = |v: Value| param(conversation(None, &items(v)).unwrap_err());
    assert_eq!(bad(json!([])), "input");
    assert_eq!(bad(json!([{"type": "message", "role": "robot", "content": "x"}])), "input[0].role");
    assert_eq!(
        bad(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])),
        "input[0].content[0].type"
    );
    assert_eq!(bad(json!([{"role": "user", "content": "x"}, {"type": "item_reference", "id": "m"}])), "input[1].type");
    assert_eq!(bad(json!([{"type": "web_search_call"}])), "input[0].type");
    assert_eq!(bad(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])), "input[0].call_id");
    assert_eq!(bad(json!([{"type": "function_call_output", "call_id": "c", "output": 5}])), "input[0].output");
    assert_eq!(bad(json!([{"role": "system", "content": "only rules"}])), "input");
    assert_eq!(bad(json!([3])), "input[0]");
}

#[test]
fn tools_choices_and_formats_take_chat_shapes() {
    let tools = chat_tools(Some(&json!([{"type": "function", "name": "f", "description": "d",
        "parameters": {"type": "object"}, "strict": false}])))
    .unwrap()
    .unwrap();
    assert_eq!(
        tools,
        json!([{"type": "function", "function": {"name": "f", "description": "d",
                "parameters": {"type": "object"}, "strict": false}}])
    );
    assert_eq!(param(chat_tools(Some(&json!([{"type": "web_search"}]))).unwrap_err()), "tools[0].type");
    assert_eq!(param(chat_tools(Some(&json!([{"type": "function", "name": "f", "x": 1}]))).unwrap_err()), "tools[0].x");
    assert_eq!(param(chat_tools(Some(&json!({}))).unwrap_err()), "tools");
    assert_eq!(
        chat_tool_choice(Some(&json!({"type": "function", "name": "f"}))).unwrap(),
        Some(json!({"type": "function", "function": {"name": "f"}}))
    );
    assert_eq!(chat_tool_choice(Some(&json!("required"))).unwrap(), Some(json!("required")));
    assert_eq!(param(chat_tool_choice(Some(&json!({"type": "allowed_tools"}))).unwrap_err()), "tool_choice");
    let f = response_format(Some(&json!({"format": {"type": "json_schema", "name": "n",
        "schema": {"type": "object"}, "strict": true}, "verbosity": "low"})))
    .unwrap()
    .unwrap();
    assert_eq!(f["json_schema"]["schema"], json!({"type": "object"}));
    assert_eq!(response_format(Some(&json!({"format": {"type": "text"}}))).unwrap(), None);
    let bad = |v: Value| param(response_format(Some(&v)).unwrap_err());
    assert_eq!(bad(json!({"format": {"type": "json_schema", "schema": {}}})), "text.format.name");
    assert_eq!(bad(json!({"format": {"type": "json_schema", "name": "n", "schema": 1}})), "text.format.schema");
    assert_eq!(bad(json!({"format": {"type": "yaml"}})), "text.format.type");
    assert_eq!(bad(json!({"colour": 1})), "text.colour");
    assert_eq!(bad(json!({"verbosity": "loud"})), "text.verbosity");
}

fn request(extra: Value) -> ResponseRequest {
    let mut body = json!({"model": "m", "input": "hi"});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    serde_json::from_value(body).unwrap()
}

#[test]
fn stateful_features_are_refused_by_name() {
    let refused = |v: Value| param(refuse_stateful(&request(v)).unwrap_err());
    assert_eq!(refused(json!({"store": true})), "store");
    assert_eq!(refused(json!({"previous_response_id": "resp_1"})), "previous_response_id");
    assert_eq!(refused(json!({"conversation": "conv_1"})), "conversation");
    assert_eq!(refused(json!({"background": true})), "background");
    assert_eq!(refused(json!({"truncation": "auto"})), "truncation");
    assert_eq!(refused(json!({"include": ["file_search_call.results"]})), "include[0]");
    assert_eq!(refused(json!({"reasoning": {"effort": "high"}})), "reasoning.effort");
    // What Codex CLI sends passes.
    refuse_stateful(&request(json!({"store": false, "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"], "truncation": "disabled"})))
    .unwrap();
    assert_eq!(param(sampling(&request(json!({"max_output_tokens": 0}))).unwrap_err()), "max_output_tokens");
    assert_eq!(param(sampling(&request(json!({"top_logprobs": 21}))).unwrap_err()), "top_logprobs");
    let r = request(json!({"frobnicate": 1}));
    assert_eq!(param(reject_unknown(&r.unknown).unwrap_err()), "frobnicate");
}

fn completion(reason: FinishReason) -> Completion {
    Completion {
        finish_reason: reason,
        prompt_tokens: 20,
        cached_tokens: 8,
        computed_prefill_tokens: 12,
        output_tokens: 5,
        queue_time: Duration::ZERO,
        ttft: None,
        e2e: Duration::ZERO,
        compute_seconds: 0.0,
        retractions: 0,
        drafted_tokens: 0,
        accepted_tokens: 0,
    }
}
use cachet_engine::generate::FinishReason;

/// The events of an answer streamed in `pieces`, and the final response.
fn run(pieces: &[&str], tools: Option<ToolSet>, reason: FinishReason) -> (Vec<Value>, Value) {
    run_with(pieces, (tools, None), reason)
}

/// [`run`], for a model that may think.
fn run_with(pieces: &[&str], reading: answer::Reading, reason: FinishReason) -> (Vec<Value>, Value) {
    let defaults = crate::config::SamplingDefaults::default();
    let echoed = echo(&request(json!({})), &defaults);
    assert_eq!((echoed["temperature"].as_f64(), echoed["top_p"].as_f64()), (Some(0.7f32 as f64), Some(0.8f32 as f64)));
    let own = echo(&request(json!({"temperature": 0.2})), &defaults);
    assert_eq!(own["temperature"].as_f64(), Some(0.2f32 as f64));
    let mut b = Builder::new("resp_1".into(), 1, "m".into(), echoed);
    b.start();
    let mut reader = Reader::new(reading);
    for p in pieces {
        reader.push(&mut b, p);
    }
    reader.finish(&mut b);
    let last = b.finish(&completion(reason));
    let bytes = b.take();
    let text = std::str::from_utf8(&bytes).unwrap();
    let events = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once("\ndata: ").unwrap();
            let v: Value = serde_json::from_str(data).unwrap();
            assert_eq!(name.strip_prefix("event: ").unwrap(), v["type"], "event name and type agree");
            v
        })
        .collect();
    (events, last)
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

#[test]
fn text_answers_stream_as_one_message_item() {
    let (events, r) = run(&["Hel", "lo", " there"], None, FinishReason::Stop);
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let seq: Vec<_> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(r["status"], "completed");
    assert_eq!(r["output"][0]["content"][0]["text"], "Hello there");
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 20, "input_tokens_details": {"cached_tokens": 8},
        "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 25})
    );
    assert_eq!(events.last().unwrap()["response"], r);
    assert_eq!(r["tool_choice"], "auto");
    assert_eq!(events[0]["response"]["status"], "in_progress");
}

#[test]
fn calls_stream_as_function_call_items() {
    let tools = ToolSet { tools: vec![("read".into(), json!({"type": "object"}))], custom: Vec::new() };
    let answer = "<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"notes.txt\"}}\n</tool_call>";
    let (mid, _) = answer.split_at(30);
    let (events, r) = run(&[mid, &answer[30..]], Some(tools), FinishReason::Stop);
    let ks = kinds(&events);
    assert!(!ks.contains(&"response.output_text.delta"), "{ks:?}");
    assert!(ks.contains(&"response.function_call_arguments.delta"));
    assert_eq!(r["output"].as_array().unwrap().len(), 1);
    let call = &r["output"][0];
    assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("function_call"), Some("read")));
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap(),
        json!({"path": "notes.txt"})
    );
    let done = events.iter().find(|e| e["type"] == "response.function_call_arguments.done").unwrap();
    assert_eq!(done["arguments"], call["arguments"]);
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, call["arguments"].as_str().unwrap());
}

#[test]
fn a_length_cut_answer_is_incomplete_and_an_empty_one_is_an_empty_message() {
    let (events, r) = run(&["abc"], None, FinishReason::Length);
    assert_eq!(events.last().unwrap()["type"], "response.incomplete");
    assert_eq!(
        (r["status"].as_str(), &r["incomplete_details"]),
        (Some("incomplete"), &json!({"reason": "max_output_tokens"}))
    );
    assert_eq!(r["output"][0]["status"], "incomplete");
    let (_, r) = run(&[], None, FinishReason::Stop);
    assert_eq!(r["output"][0]["content"][0]["text"], "");
}

#[test]
fn custom_tool_calls_stream_as_custom_tool_call_items() {
    let tools = ToolSet { tools: vec![("read".into(), json!({"type": "object"}))], custom: vec!["apply_patch".into()] };
    let patch = "*** Begin Patch\n*** Add File: a.py\n+x = 1\n*** End Patch";
    let answer = format!("<tool_call>\n<function=apply_patch>\n{patch}\n</function>\n</tool_call>");
    let pieces: Vec<&str> = answer.as_bytes().chunks(9).map(|c| std::str::from_utf8(c).unwrap()).collect();
    let (events, r) = run(&pieces, Some(tools), FinishReason::Stop);
    let ks = kinds(&events);
    assert!(!ks.contains(&"response.output_text.delta") && !ks.contains(&"response.function_call_arguments.delta"));
    let call = &r["output"][0];
    assert_eq!((call["type"].as_str(), call["name"].as_str()), (Some("custom_tool_call"), Some("apply_patch")));
    assert_eq!(call["input"], patch);
    assert!(call["id"].as_str().unwrap().starts_with("ctc_") && call["call_id"].as_str().unwrap().starts_with("call_"));
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.custom_tool_call_input.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, patch);
    let done = events.iter().find(|e| e["type"] == "response.custom_tool_call_input.done").unwrap();
    assert_eq!((done["input"].as_str(), done["item_id"].as_str()), (Some(patch), call["id"].as_str()));
}

#[test]
fn custom_tools_and_their_calls_come_back_as_input() {
    let tools = json!([{"type": "custom", "name": "apply_patch", "description": "patch",
                        "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"x\""}},
                       {"type": "function", "name": "read", "parameters": {"type": "object"}}]);
    let chat = chat_tools(Some(&tools)).unwrap().unwrap();
    assert_eq!(
        chat[0],
        json!({"type": "custom", "custom": {"name": "apply_patch", "description": "patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"x\""}}})
    );
    assert_eq!(chat[1]["type"], "function");
    let bad = json!([{"type": "custom", "name": "p", "parameters": {}}]);
    assert_eq!(param(chat_tools(Some(&bad)).unwrap_err()), "tools[0].parameters");
    let choice = chat_tool_choice(Some(&json!({"type": "custom", "name": "apply_patch"}))).unwrap();
    assert_eq!(choice, Some(json!({"type": "custom", "custom": {"name": "apply_patch"}})));
    let input = items(json!([
        {"role": "user", "content": "fix it"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it."}]},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch\n*** End Patch"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
    ]));
    let conv = conversation(None, &input).unwrap();
    let roles: Vec<_> = conv.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool"]);
    assert_eq!(
        conv[1].content,
        "On it.\n<tool_call>\n<function=apply_patch>\n*** Begin Patch\n*** End Patch\n</function>\n</tool_call>"
    );
    assert_eq!((conv[2].tool_call_id.as_deref(), conv[2].content.as_str()), (Some("c1"), "Done!"));
    let missing = items(json!([{"type": "custom_tool_call", "call_id": "c1", "name": "p"}]));
    assert_eq!(param(conversation(None, &missing).unwrap_err()), "input[0].input");
}

#[test]
fn a_thinking_models_reasoning_is_a_reasoning_item() {
    let tools = ToolSet { tools: vec![("read".into(), json!({"type": "object"}))], custom: Vec::new() };
    let answer =
        "<think>\nI should read it.\n</think>\n\n<tool_call>\n{\"name\": \"read\", \"arguments\": {}}\n</tool_call>";
    let pieces: Vec<&str> = answer.as_bytes().chunks(5).map(|c| std::str::from_utf8(c).unwrap()).collect();
    let (events, r) = run_with(&pieces, (Some(tools), Some(false)), FinishReason::Stop);
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{r}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["text"], "I should read it.");
    assert_eq!((output[1]["type"].as_str(), output[1]["name"].as_str()), (Some("function_call"), Some("read")));
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, "I should read it.");
    assert!(!kinds(&events).contains(&"response.output_text.delta"), "no reasoning or markup in the text");
    // Without tools: reasoning, then the message.
    let (_, r) = run_with(&["<think>x</think>", "\n\nHello"], (None, Some(false)), FinishReason::Stop);
    assert_eq!(
        (r["output"][0]["type"].as_str(), r["output"][1]["content"][0]["text"].as_str()),
        (Some("reasoning"), Some("Hello"))
    );
}
