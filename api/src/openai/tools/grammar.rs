//! The grammars that enforce tool calls and structured answers, in the
//! model's own call format, as llguidance Lark grammars (with `%json {…}`
//! for every JSON part).
//!
//! - `auto`: free text, until the model writes the call trigger (`<tool_call>`);
//!   from there the call must be well formed: a known name and arguments that
//!   validate against that tool's `parameters`. After a call, only more calls
//!   (with `parallel_tool_calls`) or the end. In the Hermes format, an answer
//!   that starts with a bare or fenced (```` ```json ````) JSON object is a
//!   call too, as small models often write one (so a prose answer may not
//!   start with `{`); so is such an object on a line of its own after prose,
//!   once its first key names a known tool and its arguments key follows
//!   (`\n{"name": "read_file", "arguments": ` — a trigger per tool, as llama.cpp's
//!   Hermes grammar has): from there the call is held to the schema.
//! - `required` and a named function: the answer is calls only (one with a named
//!   function or without `parallel_tool_calls`).
//! - `response_format`: the answer (when it is not a call) is one JSON document
//!   of the schema.
//! - A tool's `parameters` that list `properties` without saying anything of
//!   `additionalProperties` are taken as closed (no other arguments).
//!
//! JSON is written compactly, with `", "` and `": "` as separators (what the
//! templates show the model, and never an endless run of whitespace).

use super::{CustomFormat, CustomTool};
use serde_json::{json, Value};

/// The most calls one answer may make (with `parallel_tool_calls`): the grammar ends the
/// answer after them.
pub(crate) const MAX_CALLS: usize = 16;

/// How the model writes a call, as its chat template shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallFormat {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` (Qwen2.5, Qwen3, Hermes).
    Hermes,
    /// `<tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n</function>\n</tool_call>` (Qwen3-Coder).
    Xml,
    /// A bare `{"name": …, "parameters": {…}}` (Llama 3.1+).
    LlamaJson,
}

impl CallFormat {
    /// The format a chat template's source describes, if it renders tools at all.
    pub(crate) fn detect(template: &str) -> Option<CallFormat> {
        if !template.contains("tools") {
            return None;
        }
        if template.contains("<function=") && template.contains("<parameter=") {
            Some(CallFormat::Xml)
        } else if template.contains("<tool_call>") {
            Some(CallFormat::Hermes)
        } else if template.contains("parameters") && template.contains("<|eot_id|>") {
            Some(CallFormat::LlamaJson)
        } else {
            None
        }
    }
}

/// Which calls the answer may or must make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Calls {
    /// Text, or calls once the model starts one.
    Auto,
    /// Only calls, to any tool.
    Required,
    /// Exactly one call, to this function tool (an index into the function tools).
    Named(usize),
    /// Exactly one call, to this custom tool (an index into the custom tools).
    NamedCustom(usize),
}

/// llguidance's JSON options for every schema cachet compiles: compact, with
/// the separators Python's `json.dumps` writes.
pub(crate) fn styled(mut schema: Value) -> Value {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance")
            .or_insert_with(|| json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}));
    }
    schema
}

/// `s` with the characters a regex gives meaning to escaped (tool names are `[A-Za-z0-9_-]`).
fn regex_escape(s: &str) -> String {
    s.chars().flat_map(|c| if c.is_ascii_alphanumeric() || c == '_' { vec![c] } else { vec!['\\', c] }).collect()
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// A tool's parameters as the grammar enforces them: an object that declares its
/// properties and says nothing of others takes no others (as OpenAI's strict
/// mode demands), so a small model cannot invent arguments the tool does not have.
fn closed(params: &Value) -> Value {
    let mut params = params.clone();
    if let Value::Object(map) = &mut params {
        if map.contains_key("properties") && !map.contains_key("additionalProperties") {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    params
}

/// The JSON Schema of one call of `name` in a JSON call format.
fn call_schema(name: &str, params: &Value, args_key: &str) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, args_key: closed(params)},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// The grammar of an answer: calls of `tools` (name, parameters' schema) as `calls`
/// says, in `format`; `answer` is the schema of a non-call answer, if the request
/// has a `response_format`.
pub(crate) fn grammar(
    format: CallFormat,
    tools: &[(String, Value)],
    custom: &[CustomTool],
    calls: Calls,
    parallel: bool,
    answer: Option<&Value>,
) -> String {
    let (chosen, customs): (Vec<&(String, Value)>, Vec<&CustomTool>) = match calls {
        Calls::Named(i) => (tools.get(i).into_iter().collect(), Vec::new()),
        Calls::NamedCustom(i) => (Vec::new(), custom.get(i).into_iter().collect()),
        _ => (tools.iter().collect(), custom.iter().collect()),
    };
    // Without function tools there is no JSON call to recognise in free text.
    let has_fn = !chosen.is_empty();
    let parallel = parallel && !matches!(calls, Calls::Named(_) | Calls::NamedCustom(_));
    let mut g = String::from("%llguidance {}\n");
    let auto = calls == Calls::Auto;
    let free = if answer.is_some() { "answer" } else { "TEXT" };
    match format {
        CallFormat::Hermes | CallFormat::Xml => {
            // At most MAX_CALLS calls: a small model that keeps calling (the same call, under
            // `required`) must end.
            let more =
                if parallel { format!(" (WS \"<tool_call>\" call){{0,{}}}", MAX_CALLS - 1) } else { String::new() };
            let hermes = format == CallFormat::Hermes;
            // Small models also drop the tags around a `<function=NAME>` call (a custom tool's in
            // every format, any tool's in the XML one): an answer starting with one is a call
            // too (and free text may not begin like one).
            let bare: Vec<String> = if auto && answer.is_none() {
                let fns = if hermes { 0 } else { chosen.len() };
                (0..fns)
                    .map(|i| format!("bare_fn_{i}"))
                    .chain((0..customs.len()).map(|j| format!("bare_{j}")))
                    .collect()
            } else {
                Vec::new()
            };
            let has_bare = !bare.is_empty();
            let bare_calls = if has_bare { format!(" | ({}){more} WS", bare.join(" | ")) } else { String::new() };
            let start = match (auto, answer) {
                // Small models often write the call as a bare or fenced JSON object instead of in
                // its tags: those starts are calls too (and free text may not begin like one).
                (true, None) if hermes && has_fn => {
                    let lines: String = (0..chosen.len()).map(|i| format!(" | line{i}")).collect();
                    format!(
                        "TEXT | call_hd call{more} WS | FENCE jcall FENCE_END WS | LEAD? jcall WS{lines}{bare_calls}"
                    )
                }
                (true, None) => format!("TEXT | call_hd call{more} WS{bare_calls}"),
                (true, Some(_)) => format!("answer | \"<tool_call>\" call{more} WS"),
                (false, _) => format!("\"<tool_call>\" call{more} WS"),
            };
            g.push_str(&format!("start: {start}\n"));
            text_lexemes(&mut g, hermes && has_fn, has_bare);
            // Whitespace between and after calls is bounded: a model that would rather write
            // another call than end (with parallel_tool_calls false) must end, not pad to max_tokens.
            g.push_str("WS: /[ \\t\\r\\n]{0,4}/\ncall_hd[lazy]: TEXT \"<tool_call>\"\n");
            if hermes && auto && answer.is_none() && has_fn {
                line_calls(&mut g, &chosen, has_bare);
            }
            if hermes {
                hermes_calls(&mut g, &chosen, customs.len());
            } else {
                xml_calls(&mut g, &chosen, customs.len(), has_bare);
            }
            custom_calls(&mut g, &customs, has_bare);
        }
        CallFormat::LlamaJson => {
            let any: Vec<Value> = chosen.iter().map(|(n, p)| call_schema(n, p, "parameters")).collect();
            let body = if any.len() == 1 { any[0].clone() } else { json!({"anyOf": any}) };
            // Prose may not start with `{`: a `{` starts a call.
            let start = if auto { format!("{free} | call") } else { "call".to_string() };
            g.push_str(&format!("start: {start}\nTEXT: /([^{{ \\t\\r\\n](.|\\n)*)?/\n"));
            g.push_str(&format!("call: %json {}\n", styled(body)));
        }
    }
    if let (true, Some(schema)) = (auto, answer) {
        g.push_str(&format!("answer: %json {}\n", styled(schema.clone())));
    }
    g
}

/// The free-text lexeme and, where a bare or fenced JSON call (`json_calls`) or a call's
/// `<function=` without its tags (`bare_calls`, [`bare_open`]) is recognised, the lexemes
/// around one.
fn text_lexemes(g: &mut String, json_calls: bool, bare_calls: bool) {
    // Free text may not start with `<tools>`: small models copy the template's list of tools
    // (which the prompt shows in those tags) as their answer. Nor with `{` (alone or in a JSON
    // fence) or `<function=` where those start a call. (Each way out of TEXT ends one byte
    // before TEXT dies, as llguidance's lexer needs.)
    g.push_str("TEXT: /(.|\\n)*/");
    if json_calls {
        g.push_str(" & ~/[ \\t\\r\\n]*(```(json)?[ \\t]*\\n[ \\t\\r\\n]*)?\\{(.|\\n)*/");
    }
    if bare_calls {
        g.push_str(" & ~/[ \\t\\r\\n]*<function=(.|\\n)*/");
    }
    g.push_str(" & ~/[ \\t\\r\\n]*<tools>(.|\\n)*/\n");
    if json_calls {
        g.push_str("FENCE: /[ \\t\\r\\n]*```(json)?[ \\t]*\\n[ \\t\\r\\n]*/\nFENCE_END: /[ \\t\\r\\n]*```/\n");
        g.push_str("LEAD: /[ \\t\\r\\n]+/\n");
    }
}

/// Hermes calls after prose, each on its own line (`line{i}` for tool `i`).
fn line_calls(g: &mut String, chosen: &[&(String, Value)], bare_calls: bool) {
    // A call on its own line after prose: the trigger runs from the prose to the
    // arguments' value, whose schema then holds (the name is in the trigger). It ends
    // on a fixed character (`": "`): a lazy lexeme ends at its shortest match.
    // Prose: something other than whitespace, not starting like a leading call.
    let bare = if bare_calls { "|<function=" } else { "" };
    g.push_str(&format!("PROSE: /(.|\\n)*[^ \\t\\r\\n](.|\\n)*/ & ~/[ \\t\\r\\n]*(```|\\{{|<tools>{bare})(.|\\n)*/\n"));
    for (i, (name, params)) in chosen.iter().enumerate() {
        g.push_str(&format!(
            "line{i}: line_hd{i} args{i} /[ \\t\\r\\n]*\\}}/ FENCE_END? WS\n\
             line_hd{i}[lazy]: PROSE /\\n[ \\t]*(```(json)?[ \\t]*\\n[ \\t]*)?\\{{[ \\t\\r\\n]*\"name\"[ \\t]*:[ \\t]*\"{}\"[ \\t\\r\\n]*,[ \\t\\r\\n]*\"(arguments|parameters)\"[ \\t]*: /\n\
             args{i}: %json {}\n",
            regex_escape(name),
            styled(closed(params))
        ));
    }
}

/// Hermes calls: a JSON object of one of `tools`, or one of `customs` custom tools' calls.
fn hermes_calls(g: &mut String, tools: &[&(String, Value)], customs: usize) {
    let has_fn = !tools.is_empty();
    let mut bodies: Vec<String> = Vec::new();
    if has_fn {
        let any: Vec<Value> = tools.iter().map(|(n, p)| call_schema(n, p, "arguments")).collect();
        let body = if any.len() == 1 { any[0].clone() } else { json!({"anyOf": any}) };
        g.push_str(&format!("jcall: %json {}\n", styled(body)));
        bodies.push("jcall".into());
    }
    bodies.extend((0..customs).map(|j| format!("custom_{j}")));
    g.push_str(&format!("call: \"\\n\" ({}) \"\\n</tool_call>\"\n", bodies.join(" | ")));
}

/// Qwen3-Coder's calls: `<function=NAME>` then the parameters in their declared
/// order (required ones always), string values verbatim, others as JSON.
fn xml_calls(g: &mut String, tools: &[&(String, Value)], customs: usize, bare: bool) {
    let mut fns: Vec<String> = (0..tools.len()).map(|i| format!("fn_{i}")).collect();
    fns.extend((0..customs).map(|j| format!("custom_{j}")));
    g.push_str(&format!("call: \"\\n\" ({}) \"\\n</tool_call>\"\n", fns.join(" | ")));
    g.push_str("strval[lazy]: /(.|\\n)*\\n<\\/parameter>\\n/\n");
    for (i, (name, params)) in tools.iter().enumerate() {
        let props = params.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
        let required: Vec<&str> = params
            .get("required")
            .and_then(Value::as_array)
            .map_or(Vec::new(), |r| r.iter().filter_map(Value::as_str).collect());
        let mut parts = Vec::new();
        for (j, (param, schema)) in props.iter().enumerate() {
            let rule = format!("p_{i}_{j}");
            let open = lit(&format!("<parameter={param}>\n"));
            let is_string = schema.get("type").and_then(Value::as_str) == Some("string");
            if is_string {
                g.push_str(&format!("{rule}: {open} strval\n"));
            } else {
                g.push_str(&format!("{rule}: {open} %json {} \"\\n</parameter>\\n\"\n", styled(schema.clone())));
            }
            parts.push(if required.contains(&param.as_str()) { rule } else { format!("{rule}?") });
        }
        let open = lit(&format!("<function={name}>\n"));
        g.push_str(&format!("fn_{i}: {open} fnbody_{i}\nfnbody_{i}: {} \"</function>\"\n", parts.join(" ")));
        if bare {
            g.push_str(&format!("bare_fn_{i}: {} fnbody_{i}\n", bare_open(name)));
        }
    }
}

/// The opening of a call without its `<tool_call>` tags, at the start of an answer: one lexeme
/// with the blank space before it (free text, which may not start like it, lives as long as that
/// space does).
fn bare_open(name: &str) -> String {
    format!("/[ \\t\\r\\n]*<function={}>\\n/", regex_escape(name))
}

/// Custom tools' calls, `custom_J`: `<function=NAME>`, a newline, the input, `\n</function>`.
/// Text is anything up to the first `\n</function>`; a regex is matched the same way (one lazy
/// lexeme: it ends at the first place the expression and the closing tag both can); a Lark
/// grammar is nested whole (`%lark { … }`, its own rules and lexer).
fn custom_calls(g: &mut String, customs: &[&CustomTool], bare: bool) {
    for (j, tool) in customs.iter().enumerate() {
        let open = lit(&format!("<function={}>\n", tool.name));
        g.push_str(&format!("custom_{j}: {open} cbody_{j}\n"));
        if bare {
            g.push_str(&format!("bare_{j}: {} cbody_{j}\n", bare_open(&tool.name)));
        }
        match &tool.format {
            CustomFormat::Text => {
                g.push_str(&format!("cbody_{j}: ctext_{j}\nctext_{j}[lazy]: /(.|\\n)*\\n<\\/function>/\n"));
            }
            CustomFormat::Regex(re) => {
                g.push_str(&format!(
                    "cbody_{j}: cregex_{j}\ncregex_{j}[lazy]: /(?:{})\\n<\\/function>/\n",
                    lark_regex(re)
                ));
            }
            CustomFormat::Lark(def) => {
                g.push_str(&format!("cbody_{j}: %lark {{\n{def}\n}} \"\\n</function>\"\n"));
            }
        }
    }
}

/// A regular expression as the body of a Lark `/…/` literal: `/` escaped, line breaks written as
/// escapes, and the anchors a whole-input expression may carry (`^…$`, `\A…\z`) left out (a
/// lexeme is matched whole anyway).
fn lark_regex(re: &str) -> String {
    let re = re.strip_prefix('^').or_else(|| re.strip_prefix("\\A")).unwrap_or(re);
    let mut out = String::with_capacity(re.len() + 8);
    let mut chars = re.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                // A trailing `\z` is an anchor.
                Some('z') if chars.peek().is_none() => {}
                Some(next) => {
                    out.push('\\');
                    out.push(next);
                }
                None => out.push_str("\\\\"),
            },
            '$' if chars.peek().is_none() => {}
            '/' => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}
