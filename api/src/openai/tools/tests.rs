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
    grammar.check(&tok.encode(text, false).unwrap())
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
