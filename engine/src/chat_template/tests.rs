//! Chat template tests: Qwen2.5's real template and small custom ones, with
//! expected output from transformers (see `data`).

mod data;

use super::*;
use data::*;

fn parse_messages(json: &str) -> Vec<ChatMessage> {
    serde_json::from_str(json).unwrap()
}

fn render_one(source: &str, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
    ChatTemplate::new(source, Some("<s>"), Some("</s>"))?.render(messages, false, None)
}

fn qwen() -> ChatTemplate {
    ChatTemplate::new(QWEN25_TEMPLATE, Some("<|endoftext|>"), Some("<|im_end|>")).unwrap()
}

#[test]
fn qwen25_plain_conversations() {
    let template = qwen();
    let text = template.render(&[ChatMessage::system("You are terse."), ChatMessage::user("Hi")], true, None).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let text = template.render(&[ChatMessage::user("Hi"), ChatMessage::assistant("Hello!")], false, None).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    );
}

#[test]
fn qwen25_with_tools_matches_transformers() {
    let tools: serde_json::Value = serde_json::from_str(QWEN25_TOOLS_JSON).unwrap();
    let text = qwen().render(&parse_messages(QWEN25_TOOLS_MESSAGES), true, Some(&tools)).unwrap();
    assert_eq!(text, QWEN25_TOOLS_EXPECTED);
}

#[test]
fn qwen25_tool_calls_match_transformers() {
    let tools: serde_json::Value = serde_json::from_str(QWEN25_TOOLS_JSON).unwrap();
    let messages = parse_messages(QWEN25_TOOL_CALLS_MESSAGES);
    assert!(messages[1].tool_calls.is_some() && messages[2].tool_call_id.is_some());
    let text = qwen().render(&messages, false, Some(&tools)).unwrap();
    assert_eq!(text, QWEN25_TOOL_CALLS_EXPECTED);
}

#[test]
fn whitespace_control_matches_jinja2() {
    let template = ChatTemplate::new(WS_TEMPLATE, None, None).unwrap();
    assert_eq!(template.render(&parse_messages(WS_MESSAGES), true, None).unwrap(), WS_EXPECTED);
}

#[test]
fn python_compatibility() {
    let messages = [ChatMessage::system("You are nice. "), ChatMessage::user("hi"), ChatMessage::user("bye")];
    let source = "{% set ns = namespace(count=0) %}{% for m in messages %}{% if m.role == 'system' %}{% continue %}\
        {% endif %}{% set ns.count = ns.count + 1 %}{% endfor %}count={{ ns.count }} none={{ none }} t={{ true }} \
        f={{ false }}\n{{ messages[0] | tojson }}\n{{ messages[0].content.split(' ') | tojson }} \
        {{ messages[0].content.startswith('You') }} {{ '  pad  '.lstrip() }}|{{ 'x' ~ 1.5 ~ 2 }}\n\
        {% for k, v in messages[1].items() %}{{ k }}={{ v }};{% endfor %}\
        {{ messages | selectattr('role', 'equalto', 'user') | list | length }}";
    // Expected: Jinja2 with transformers' environment.
    assert_eq!(
        render_one(source, &messages).unwrap(),
        "count=2 none=None t=True f=False\n{\"role\": \"system\", \"content\": \"You are nice. \"}\n\
         [\"You\", \"are\", \"nice.\", \"\"] True pad  |x1.52\nrole=user;content=hi;2"
    );
}

#[test]
fn tojson_options_like_json_dumps() {
    let tools = serde_json::json!([{"b": [1, {"c": null}], "a": "é"}]);
    let template = ChatTemplate::new(
        "{{ tools[0] | tojson(indent=2) }}|{{ tools[0] | tojson(separators=(',', ':')) }}|\
         {{ tools[0] | tojson(sort_keys=true) }}|{{ tools[0].a | tojson(ensure_ascii=true) }}|{{ tools | tojson(False, 1) }}",
        None,
        None,
    )
    .unwrap();
    // json.dumps with the same arguments.
    assert_eq!(
        template.render(&[], false, Some(&tools)).unwrap(),
        "{\n  \"b\": [\n    1,\n    {\n      \"c\": null\n    }\n  ],\n  \"a\": \"é\"\n}|{\"b\":[1,{\"c\":null}],\"a\":\"é\"}|\
         {\"a\": \"é\", \"b\": [1, {\"c\": null}]}|\"\\u00e9\"|[\n {\n  \"b\": [\n   1,\n   {\n    \"c\": null\n   }\n  ],\n  \"a\": \"é\"\n }\n]"
    );
}

#[test]
fn context_variables() {
    let source = "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|\
        {{ messages[0].tool_calls is defined }}|{{ messages[1].tool_calls[0].function.name }}|{{ enable_thinking }}";
    let mut call = ChatMessage::assistant("");
    call.tool_calls = Some(serde_json::json!([{"function": {"name": "f", "arguments": {}}}]));
    let messages = [ChatMessage::user("hi"), call];
    let template = ChatTemplate::new(source, Some("<s>"), Some("</s>")).unwrap();
    let extra = serde_json::json!({"enable_thinking": false});
    let text = template.render_with(&messages, false, None, extra.as_object().unwrap()).unwrap();
    assert_eq!(text, "<s>|</s>|True|True|False|f|False");
    // Unknown special tokens are undefined, and print as nothing.
    let template = ChatTemplate::new("[{{ bos_token }}]{{ bos_token is defined }}", None, None).unwrap();
    assert_eq!(template.render(&[], false, None).unwrap(), "[]False");
}

#[test]
fn strftime_now_is_available() {
    let template = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", None, None).unwrap();
    let date = template.render(&[], false, None).unwrap();
    assert_eq!(date.len(), 10, "{date}");
    assert!(matches!(render_one("{{ strftime_now('%Z') }}", &[]), Err(ChatTemplateError::Render(_))));
}

#[test]
fn raise_exception_is_a_raised_error() {
    let source =
        "{% for m in messages %}{% if m.role != 'user' %}{{ raise_exception('Only user messages, got ' + m.role) }}\
                  {% endif %}{{ m.content }}{% endfor %}";
    assert_eq!(render_one(source, &[ChatMessage::user("ok")]).unwrap(), "ok");
    match render_one(source, &[ChatMessage::assistant("no")]) {
        Err(ChatTemplateError::Raised(message)) => assert_eq!(message, "Only user messages, got assistant"),
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
fn bad_templates_are_errors() {
    for source in ["{% for m in messages %}", "{{ 'unclosed }}", "{% endif %}", "{{ x | }}"] {
        assert!(matches!(ChatTemplate::new(source, None, None), Err(ChatTemplateError::Syntax(_))), "{source}");
    }
    for source in
        ["{{ nosuch.attr.deeper }}", "{{ x | nosuchfilter }}", "{{ undefined_thing | tojson }}", "{{ 1 + 'a' }}"]
    {
        let result = render_one(source, &[]);
        assert!(matches!(result, Err(ChatTemplateError::Render(_))), "{source}: {result:?}");
    }
}

#[test]
fn hf_directory_sources() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(ChatTemplate::source_from_hf_dir(dir.path()).unwrap(), None);
    let config = dir.path().join("tokenizer_config.json");
    std::fs::write(&config, r#"{"eos_token": "</s>"}"#).unwrap();
    assert_eq!(ChatTemplate::source_from_hf_dir(dir.path()).unwrap(), None);
    std::fs::write(&config, r#"{"chat_template": "A"}"#).unwrap();
    assert_eq!(ChatTemplate::source_from_hf_dir(dir.path()).unwrap().as_deref(), Some("A"));
    std::fs::write(
        &config,
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
    )
    .unwrap();
    assert_eq!(ChatTemplate::source_from_hf_dir(dir.path()).unwrap().as_deref(), Some("D"));
    std::fs::write(dir.path().join("chat_template.jinja"), "J").unwrap();
    assert_eq!(ChatTemplate::source_from_hf_dir(dir.path()).unwrap().as_deref(), Some("J"));
    std::fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    std::fs::write(&config, "{ broken").unwrap();
    assert!(matches!(ChatTemplate::source_from_hf_dir(dir.path()), Err(ChatTemplateError::Load { .. })));
}
