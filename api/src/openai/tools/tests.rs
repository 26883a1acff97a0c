use super::*;
use cachet_engine::constraint::Grammars;
use cachet_engine::tokenizer::{GgufTokenizerSpec, Tokenizer};
use std::sync::Arc;

const HERMES: &str = "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools> \
                      reply with <tool_call>{\"name\": …, \"arguments\": …}</tool_call>{% endif %}";
const XML: &str = "{% if tools %}<tool_call>\n<function=example>\n<parameter=p>\nv\n</parameter>{% endif %}";
const LLAMA: &str = "{% if tools %}{\"name\": function name, \"parameters\": dictionary}<|eot_id|>{% endif %}";

fn grammars() -> (Grammars, Arc<Tokenizer>) {
    let mut spec = GgufTokenizerSpec::byte_alphabet("gpt2", Some("qwen2"));
    spec.push_token("<tool_call>", GgufTokenizerSpec::TOKEN_USER_DEFINED);
    spec.push_token("</tool_call>", GgufTokenizerSpec::TOKEN_USER_DEFINED);
    let end = spec.push_token("<|im_end|>", GgufTokenizerSpec::TOKEN_CONTROL);
    spec.eos_token_id = Some(end);
    let tok = Arc::new(Tokenizer::from_gguf(spec).unwrap());
    (Grammars::new(tok.clone(), tok.vocab_size()), tok)
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "read_file", "description": "Read a file",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
        {"type": "function", "function": {"name": "run", "parameters": {"type": "object",
         "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer", "minimum": 1}}, "required": ["cmd"]}}},
    ])
}

fn fields<'a>(tools: &'a Value, choice: Option<&'a Value>) -> ToolFields<'a> {
    ToolFields { tools: Some(tools), tool_choice: choice, ..ToolFields::default() }
}

/// `Ok(true)`: a complete answer; `Ok(false)`: a valid start; `Err`: refused.
fn check(plan: &Plan, text: &str) -> Result<bool, String> {
    let (g, tok) = grammars();
    let grammar = g.compile(plan.grammar.as_ref().expect("a grammar")).map_err(|e| format!("compile: {e}"))?;
    grammar.check(&tok.encode(text, false).unwrap()).map_err(|e| e.0)
}

fn err_param(e: ApiError) -> String {
    match e {
        ApiError::BadRequest { param, message } => format!("{}: {message}", param.unwrap_or_default()),
        other => panic!("not a 400: {other}"),
    }
}

const CALL: &str = "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"ls\", \"timeout\": 5}}\n</tool_call>";

#[test]
fn auto_leaves_text_free_and_makes_started_calls_valid() {
    let t = tools();
    let plan = plan(fields(&t, None), HERMES).unwrap();
    assert_eq!(plan.template_tools.as_ref(), Some(&t));
    assert_eq!(plan.calls.as_ref().unwrap().tools.len(), 2);
    assert_eq!(check(&plan, "Just prose, {braces} and <tags>."), Ok(true));
    assert!(check(&plan, "<tools>\n{\"type\": \"function\"").is_err(), "the template's tool list is no answer");
    assert_eq!(check(&plan, "About <tools>: they help."), Ok(true));
    assert_eq!(check(&plan, &format!("Let me run it.\n{CALL}")), Ok(true));
    assert_eq!(check(&plan, &format!("{CALL}\n{CALL}")), Ok(true), "parallel calls");
    assert!(check(&plan, "<tool_call>\n{\"name\": \"rm\"").is_err(), "unknown tool");
    assert!(check(&plan, "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"timeout\": 5}}").is_err(), "cmd required");
    assert!(check(&plan, "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": 1").is_err(), "cmd is a string");
    assert!(check(&plan, &format!("{CALL} and then prose")).is_err(), "only calls after a call");
    let invented = "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"ls\", \"sudo\"";
    assert!(check(&plan, invented).is_err(), "no arguments the tool does not declare");
    assert_eq!(check(&plan, "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"ls\"}}"), Ok(false));
    // Bare and fenced calls, as small models write them, are held to the schema too.
    let bare = "{\"name\": \"run\", \"arguments\": {\"cmd\": \"ls\"}}";
    assert_eq!(check(&plan, bare), Ok(true));
    assert_eq!(check(&plan, &format!("```json\n{bare}\n```")), Ok(true));
    assert_eq!(check(&plan, &format!("\n```\n  {bare}\n```\n")), Ok(true));
    assert!(check(&plan, "```json\n{\"name\": \"rm\"").is_err());
    assert!(check(&plan, " {\"name\": \"rm\"").is_err());
    assert!(check(&plan, "{\"answer\": 42}").is_err(), "a leading object is a call");
    assert_eq!(check(&plan, "```python\nprint({\"name\": 1})\n```"), Ok(true), "other code is free");
    assert_eq!(check(&plan, "```json\n[1, 2]\n```"), Ok(true), "other JSON is free");
    // A call on its own line after prose (bare or fenced) is held to the schema once its name
    // and arguments key are written; other JSON lines stay free.
    assert_eq!(check(&plan, &format!("Got it. Here it is:\n\n{bare}")), Ok(true));
    assert_eq!(check(&plan, &format!("Running:\n```json\n{bare}\n```")), Ok(true));
    assert!(check(&plan, "Got it.\n{\"name\": \"run\", \"arguments\": {\"timeout\": 5}}").is_err(), "cmd required");
    assert!(check(&plan, "Got it.\n{\"name\": \"run\", \"parameters\": {\"cmd\": 1").is_err());
    assert!(check(&plan, &format!("Got it.\n{bare} and more prose")).is_err(), "only calls after a call");
    assert_eq!(check(&plan, "The config:\n{\"name\": \"cachet\", \"port\": 8080}\nThat is all."), Ok(true));
    let single = ToolFields { parallel_tool_calls: Some(false), ..fields(&t, None) };
    let plan = super::plan(single, HERMES).unwrap();
    assert_eq!(check(&plan, CALL), Ok(true));
    assert!(check(&plan, &format!("{CALL}\n{CALL}")).is_err(), "one call without parallel_tool_calls");
}

#[test]
fn required_and_named_choices_force_calls() {
    let t = tools();
    let required = json!("required");
    let plan = plan(fields(&t, Some(&required)), HERMES).unwrap();
    assert!(check(&plan, "Sure").is_err(), "no prose");
    assert_eq!(check(&plan, CALL), Ok(true));
    let named = json!({"type": "function", "function": {"name": "read_file"}});
    let plan = super::plan(fields(&t, Some(&named)), HERMES).unwrap();
    assert!(check(&plan, CALL).is_err(), "only the named function");
    let read = "<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"a\"}}\n</tool_call>";
    assert_eq!(check(&plan, read), Ok(true));
    assert!(check(&plan, &format!("{read}\n{read}")).is_err(), "one call");
    // After its last call an answer may not pad itself with whitespace to max_tokens.
    assert_eq!(check(&plan, &format!("{read}\n")), Ok(true));
    assert!(check(&plan, &format!("{read}{}", "\n".repeat(12))).is_err(), "bounded whitespace");
    let none = json!("none");
    let plan = super::plan(fields(&t, Some(&none)), HERMES).unwrap();
    assert!(plan.template_tools.is_none() && plan.grammar.is_none() && plan.calls.is_none());
}

#[test]
fn response_formats() {
    let schema = json!({"type": "json_schema", "json_schema": {"name": "Point", "strict": true,
        "schema": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                   "required": ["x", "y"], "additionalProperties": false}}});
    let plan = plan(ToolFields { response_format: Some(&schema), ..Default::default() }, HERMES).unwrap();
    assert!(matches!(plan.grammar, Some(GrammarSource::JsonSchema(_))));
    assert_eq!(check(&plan, r#"{"x": 1, "y": -2}"#), Ok(true));
    assert!(check(&plan, r#"{"x": 1}"#).is_err() || check(&plan, r#"{"x": 1}"#) == Ok(false));
    assert!(check(&plan, "Here is").is_err());
    let object = json!({"type": "json_object"});
    let plan = super::plan(ToolFields { response_format: Some(&object), ..Default::default() }, HERMES).unwrap();
    assert_eq!(check(&plan, r#"{"anything": [1, "two"]}"#), Ok(true));
    assert!(check(&plan, "[1]").is_err());
    // With tools on auto: a JSON answer or calls.
    let t = tools();
    let both = ToolFields { response_format: Some(&schema), ..fields(&t, None) };
    let plan = super::plan(both, HERMES).unwrap();
    assert_eq!(check(&plan, r#"{"x": 1, "y": 2}"#), Ok(true));
    assert_eq!(check(&plan, CALL), Ok(true));
    assert!(check(&plan, "prose").is_err());
    let text = json!({"type": "text"});
    assert!(super::plan(ToolFields { response_format: Some(&text), ..Default::default() }, HERMES)
        .unwrap()
        .grammar
        .is_none());
}

#[test]
fn qwen3_coder_and_llama_formats() {
    let t = tools();
    let plan = plan(fields(&t, None), XML).unwrap();
    let call = "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n<parameter=timeout>\n5\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(check(&plan, &format!("ok\n{call}")), Ok(true));
    assert!(check(&plan, "<tool_call>\n<function=run>\n<parameter=timeout>\nfive").is_err());
    let required = json!("required");
    let plan = super::plan(fields(&t, Some(&required)), LLAMA).unwrap();
    assert_eq!(check(&plan, r#"{"name": "read_file", "parameters": {"path": "x"}}"#), Ok(true));
    assert!(check(&plan, "prose").is_err());
    let plan = super::plan(fields(&t, None), LLAMA).unwrap();
    assert_eq!(check(&plan, "prose is fine"), Ok(true));
    assert!(check(&plan, r#"{"name": "nope""#).is_err());
}

#[test]
fn bad_fields_are_400s_naming_the_field() {
    let e = |f: ToolFields<'_>| err_param(plan(f, HERMES).unwrap_err());
    let bad_type = json!([{"type": "code_interpreter"}]);
    assert!(e(fields(&bad_type, None)).starts_with("tools[0].type: "));
    let no_body = json!([{"type": "custom", "name": "p"}]);
    assert!(e(fields(&no_body, None)).starts_with("tools[0].custom: "));
    let bad_name = json!([{"type": "function", "function": {"name": "has space"}}]);
    assert!(e(fields(&bad_name, None)).starts_with("tools[0].function.name: "));
    let dup = json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]);
    assert!(e(fields(&dup, None)).starts_with("tools[1].function.name: "));
    let bad_params = json!([{"type": "function", "function": {"name": "a", "parameters": "x"}}]);
    assert!(e(fields(&bad_params, None)).starts_with("tools[0].function.parameters: "));
    let t = tools();
    for choice in [json!("sometimes"), json!({"type": "function", "function": {"name": "nope"}}), json!(3)] {
        assert!(e(fields(&t, Some(&choice))).starts_with("tool_choice: "), "{choice}");
    }
    let required = json!("required");
    assert!(e(ToolFields { tool_choice: Some(&required), ..Default::default() }).starts_with("tool_choice: "));
    let rf = json!({"type": "xml"});
    assert!(e(ToolFields { response_format: Some(&rf), ..Default::default() }).starts_with("response_format.type: "));
    let rf = json!({"type": "json_schema", "json_schema": {"schema": {}}});
    assert!(e(ToolFields { response_format: Some(&rf), ..Default::default() })
        .starts_with("response_format.json_schema.name: "));
    let t = tools();
    let err = err_param(plan(fields(&t, None), "{{ messages }}").unwrap_err());
    assert!(err.starts_with("tools: ") && err.contains("does not describe tool calls"), "{err}");
}

#[test]
fn call_formats_come_from_the_template() {
    assert_eq!(CallFormat::detect(HERMES), Some(CallFormat::Hermes));
    assert_eq!(CallFormat::detect(XML), Some(CallFormat::Xml));
    assert_eq!(CallFormat::detect(LLAMA), Some(CallFormat::LlamaJson));
    assert_eq!(CallFormat::detect("{% for m in messages %}{{ m.content }}{% endfor %}"), None);
}

/// The patch grammar Codex CLI 0.171.0 sends with its freeform `apply_patch` tool (as it sends it).
const PATCH_LARK: &str = r#"start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"#;

fn custom_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "shell", "parameters": {"type": "object",
         "properties": {"command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]}}},
        {"type": "custom", "custom": {"name": "apply_patch", "description": "Edit files with a patch.",
         "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_LARK}}},
        {"type": "custom", "custom": {"name": "note", "description": "Leave a note."}},
        {"type": "custom", "custom": {"name": "ticket", "format": {"type": "grammar", "syntax": "regex",
         "definition": "^[A-Z]{2,5}-[0-9]+$"}}},
    ])
}

fn custom_call(name: &str, input: &str) -> String {
    format!("<tool_call>\n<function={name}>\n{input}\n</function>\n</tool_call>")
}

#[test]
fn custom_tools_are_held_to_their_grammars() {
    let t = custom_tools();
    for template in [HERMES, XML] {
        let plan = plan(fields(&t, None), template).unwrap();
        let set = plan.calls.as_ref().unwrap();
        assert_eq!(set.custom, ["apply_patch", "note", "ticket"]);
        assert_eq!(set.tools.len(), 1);
        let patch =
            "*** Begin Patch\n*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n*** End Patch";
        assert_eq!(check(&plan, &format!("Fixing it.\n{}", custom_call("apply_patch", patch))), Ok(true), "{template}");
        let bad = "*** Begin Patch\n*** Rename File: calc.py\n";
        assert!(check(&plan, &custom_call("apply_patch", bad)).is_err(), "not a hunk the grammar knows");
        assert!(check(&plan, &custom_call("apply_patch", "diff --git a/x b/x")).is_err());
        assert_eq!(check(&plan, &custom_call("note", "anything at all,\n{even: json}\n</functio")), Ok(true));
        assert_eq!(check(&plan, &custom_call("ticket", "CACHE-42")), Ok(true));
        assert!(check(&plan, &custom_call("ticket", "cache-42")).is_err());
        assert!(check(&plan, &custom_call("unknown", "x")).is_err(), "only the request's tools");
        let both = format!("{}\n{}", custom_call("note", "a"), custom_call("ticket", "AB-1"));
        assert_eq!(check(&plan, &both), Ok(true), "parallel custom calls");
    }
    // Without their `<tool_call>` tags (small models drop them), at the start of the answer: still
    // calls, held to their grammars; prose may not start like one.
    for template in [HERMES, XML] {
        let plan = plan(fields(&t, None), template).unwrap();
        let bare = |name: &str, input: &str| format!("<function={name}>\n{input}\n</function>");
        let patch = "*** Begin Patch\n*** Add File: sub.py\n+def subfactorial(n):\n+    return n\n*** End Patch";
        assert_eq!(check(&plan, &bare("apply_patch", patch)), Ok(true), "{template}");
        assert_eq!(check(&plan, &format!("\n{}", bare("ticket", "AB-3"))), Ok(true), "{template}");
        assert!(check(&plan, &bare("apply_patch", "newlines")).is_err(), "{template}: the patch grammar holds");
        assert!(check(&plan, &bare("launch", "x")).is_err(), "{template}: only the request's tools");
        assert_eq!(check(&plan, "Call <function=apply_patch> like this."), Ok(true), "{template}");
        assert_eq!(check(&plan, "<functional> programming"), Ok(true), "{template}");
        let then = format!("{}\n{}", bare("note", "a"), custom_call("ticket", "AB-1"));
        assert_eq!(check(&plan, &then), Ok(true), "{template}: a tagged call after it");
    }
    // The function tool keeps its JSON calls beside them.
    let plan = plan(fields(&t, None), HERMES).unwrap();
    let shell = "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": [\"ls\"]}}\n</tool_call>";
    assert_eq!(check(&plan, shell), Ok(true));
    // The template sees every tool as a function; a custom one says how to call it.
    let shown = plan.template_tools.as_ref().unwrap().as_array().unwrap().clone();
    assert_eq!(shown.len(), 4);
    let desc = shown[1]["function"]["description"].as_str().unwrap();
    assert!(desc.starts_with("Edit files with a patch.") && desc.contains("<function=apply_patch>"), "{desc}");
    assert!(desc.contains("*** Begin Patch"), "the grammar is shown: {desc}");
    // A named custom tool: only its call.
    let named = json!({"type": "custom", "custom": {"name": "ticket"}});
    let plan = super::plan(fields(&t, Some(&named)), HERMES).unwrap();
    assert_eq!(check(&plan, &custom_call("ticket", "AB-7")), Ok(true));
    assert!(check(&plan, "Sure").is_err());
    assert!(check(&plan, shell).is_err());
    // Custom tools only: prose may start with `{` (no JSON calls to recognise).
    let only = json!([t[2]]);
    let plan = super::plan(fields(&only, None), HERMES).unwrap();
    assert_eq!(check(&plan, "{\"just\": \"json\"}"), Ok(true));
    assert!(check(&plan, " <tools>").is_err());
    assert_eq!(check(&plan, &custom_call("note", "hi")), Ok(true));
}

#[test]
fn bad_custom_tools_are_400s() {
    let e = |t: Value| err_param(plan(fields(&t, None), HERMES).unwrap_err());
    let no_def = json!([{"type": "custom", "custom": {"name": "p", "format": {"type": "grammar", "syntax": "lark"}}}]);
    assert!(e(no_def).starts_with("tools[0].custom.format.definition: "));
    let syntax = json!([{"type": "custom", "custom": {"name": "p",
        "format": {"type": "grammar", "syntax": "peg", "definition": "x"}}}]);
    assert!(e(syntax).starts_with("tools[0].custom.format.syntax: "));
    let kind = json!([{"type": "custom", "custom": {"name": "p", "format": {"type": "binary"}}}]);
    assert!(e(kind).starts_with("tools[0].custom.format.type: "));
    let dup = json!([{"type": "function", "function": {"name": "p"}}, {"type": "custom", "custom": {"name": "p"}}]);
    assert!(e(dup).starts_with("tools[1].custom.name: "));
    let t = json!([{"type": "custom", "custom": {"name": "p"}}]);
    let err = err_param(plan(fields(&t, None), LLAMA).unwrap_err());
    assert!(err.starts_with("tools: ") && err.contains("<tool_call>"), "{err}");
    let choice = json!({"type": "custom", "custom": {"name": "q"}});
    assert!(err_param(plan(fields(&t, Some(&choice)), HERMES).unwrap_err()).starts_with("tool_choice: "));
}
