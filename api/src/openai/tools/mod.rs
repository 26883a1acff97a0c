//! Tool calls and structured output on the chat endpoints: the request's
//! `tools` (function and custom tools), `tool_choice`, `parallel_tool_calls` and `response_format` become
//! (1) the tools the chat template renders, (2) a grammar the engine enforces
//! while it generates, and (3) how the answer is read back into
//! `message.tool_calls` ([`parse`]). Every field is checked here, and what is
//! wrong is a 400 naming the field.

pub(crate) mod grammar;
pub(crate) mod parse;

use crate::error::ApiError;
use cachet_engine::constraint::{Grammar, GrammarError, GrammarSource};
use grammar::{CallFormat, Calls};
use parse::ToolSet;
use serde_json::{json, Value};

/// The request fields this module reads.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ToolFields<'a> {
    pub tools: Option<&'a Value>,
    pub tool_choice: Option<&'a Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<&'a Value>,
    /// cachet's `grammar` extension.
    pub grammar: Option<&'a Value>,
}

impl<'a> ToolFields<'a> {
    /// The fields of a request.
    pub(crate) fn of(t: &'a super::types::ToolRequest, grammar: Option<&'a Value>) -> ToolFields<'a> {
        ToolFields {
            tools: t.tools.as_ref(),
            tool_choice: t.tool_choice.as_ref(),
            parallel_tool_calls: t.parallel_tool_calls,
            response_format: t.response_format.as_ref(),
            grammar,
        }
    }
}

/// cachet's `grammar` extension: `{"regex": "…"}` or `{"lark": "…"}`.
pub(crate) fn custom_grammar(value: Option<&Value>) -> Result<Option<GrammarSource>, ApiError> {
    let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    let bad = || ApiError::bad_param("grammar", "grammar must be {\"regex\": \"…\"} or {\"lark\": \"…\"}");
    let map = v.as_object().filter(|m| m.len() == 1).ok_or_else(bad)?;
    match map.iter().next() {
        Some((k, Value::String(text))) if k == "regex" => Ok(Some(GrammarSource::Regex(text.clone()))),
        Some((k, Value::String(text))) if k == "lark" => Ok(Some(GrammarSource::Lark(text.clone()))),
        _ => Err(bad()),
    }
}

/// What a request's tools and response format mean for its prompt, its
/// generation and its answer.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    /// The tools the chat template renders (none with `tool_choice: "none"`).
    pub template_tools: Option<Value>,
    /// The grammar the output must match.
    pub grammar: Option<GrammarSource>,
    /// Read calls out of the answer (when the model may call tools).
    pub calls: Option<ToolSet>,
    /// The schema of the answer (`response_format`), if any.
    pub answer: Option<Value>,
    /// The custom tools (to name the one at fault when the grammar is refused).
    pub custom: Vec<CustomTool>,
}

/// A function name as OpenAI allows it.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A custom tool (`{"type": "custom", "custom": {"name", "description", "format"}}`): the model
/// writes its input as free text, held to the tool's grammar when it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CustomTool {
    pub name: String,
    pub description: String,
    pub format: CustomFormat,
}

/// What a custom tool's input must be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CustomFormat {
    /// Any text.
    Text,
    /// A sentence of this Lark grammar (llguidance's dialect).
    Lark(String),
    /// A match of this regular expression (Rust `regex` syntax).
    Regex(String),
}

/// The tools of a request.
#[derive(Clone, Debug, Default)]
struct Tools {
    /// Function tools: (name, parameters' schema) each.
    functions: Vec<(String, Value)>,
    custom: Vec<CustomTool>,
}

impl Tools {
    fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.custom.is_empty()
    }
}

/// The tools of a request, checked.
fn tools(value: &Value) -> Result<Tools, ApiError> {
    let list = value.as_array().ok_or_else(|| ApiError::bad_param("tools", "tools must be an array"))?;
    let mut out = Tools::default();
    let mut names: Vec<String> = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = |field: &str| format!("tools[{i}]{field}");
        let kind = tool.get("type").and_then(Value::as_str);
        let (body, field) = match kind {
            Some("function") => ("function", ".function"),
            Some("custom") => ("custom", ".custom"),
            _ => {
                return Err(ApiError::bad_param(
                    at(".type"),
                    format!("tools[{i}].type must be \"function\" or \"custom\", not {}", show(kind)),
                ))
            }
        };
        let f = tool
            .get(body)
            .and_then(Value::as_object)
            .ok_or_else(|| ApiError::bad_param(at(field), format!("tools[{i}]{field} must be an object")))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        if !valid_name(name) {
            return Err(ApiError::bad_param(
                at(&format!("{field}.name")),
                format!("tools[{i}]{field}.name must be 1 to 64 letters, digits, '_' or '-', not {name:?}"),
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err(ApiError::bad_param(at(&format!("{field}.name")), format!("two tools are named {name:?}")));
        }
        names.push(name.to_string());
        if body == "custom" {
            out.custom.push(custom_tool(f, name, i)?);
            continue;
        }
        let params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ApiError::bad_param(
                    at(".function.parameters"),
                    format!("tools[{i}].function.parameters must be a JSON Schema object"),
                ))
            }
        };
        out.functions.push((name.to_string(), params));
    }
    Ok(out)
}

/// A custom tool's `format`: `{"type": "text"}` (the default) or `{"type": "grammar", "syntax":
/// "lark" | "regex", "definition": "…"}` (also as `"grammar": {"syntax", "definition"}`).
fn custom_tool(f: &serde_json::Map<String, Value>, name: &str, i: usize) -> Result<CustomTool, ApiError> {
    let bad = |field: &str, m: String| ApiError::bad_param(format!("tools[{i}].custom{field}"), m);
    let description = match f.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(d)) => d.clone(),
        Some(_) => return Err(bad(".description", "the description must be a string".into())),
    };
    let format = match f.get("format") {
        None | Some(Value::Null) => CustomFormat::Text,
        Some(fmt) => match fmt.get("type").and_then(Value::as_str) {
            Some("text") => CustomFormat::Text,
            Some("grammar") => {
                let g = fmt.get("grammar").filter(|g| g.is_object()).unwrap_or(fmt);
                let definition = g.get("definition").and_then(Value::as_str).ok_or_else(|| {
                    bad(".format.definition", "a grammar format needs its definition (a string)".into())
                })?;
                if definition.trim().is_empty() {
                    return Err(bad(".format.definition", "the grammar's definition is empty".into()));
                }
                match g.get("syntax").and_then(Value::as_str) {
                    Some("lark") => CustomFormat::Lark(definition.to_string()),
                    Some("regex") => CustomFormat::Regex(definition.to_string()),
                    other => {
                        return Err(bad(
                            ".format.syntax",
                            format!("the grammar's syntax must be \"lark\" or \"regex\", not {}", show(other)),
                        ))
                    }
                }
            }
            other => {
                return Err(bad(
                    ".format.type",
                    format!("a custom tool's format type must be \"text\" or \"grammar\", not {}", show(other)),
                ))
            }
        },
    };
    Ok(CustomTool { name: name.to_string(), description, format })
}

/// How the chat template shows a custom tool: as a function whose description says how to call
/// it (templates render function tools only).
fn template_entry(tool: &CustomTool) -> Value {
    let name = &tool.name;
    let mut description = tool.description.trim().to_string();
    if !description.is_empty() {
        description.push_str("\n\n");
    }
    description.push_str(&format!(
        "This tool takes free-form text, not JSON. Call it like this:\n<tool_call>\n<function={name}>\n\
         the input, verbatim\n</function>\n</tool_call>"
    ));
    match &tool.format {
        CustomFormat::Text => {}
        CustomFormat::Lark(def) => description.push_str(&format!("\nThe input follows this Lark grammar:\n{def}")),
        CustomFormat::Regex(re) => description.push_str(&format!("\nThe input matches this regular expression: {re}")),
    }
    json!({"type": "function", "function": {"name": name, "description": description}})
}

/// The tools as the chat template renders them (function tools as sent, custom tools described).
fn template_tools(value: &Value, tools: &Tools) -> Value {
    let mut customs = tools.custom.iter();
    let list = value.as_array().map(Vec::as_slice).unwrap_or_default();
    Value::Array(
        list.iter()
            .map(|t| match t.get("type").and_then(Value::as_str) {
                Some("custom") => customs.next().map(template_entry).unwrap_or(Value::Null),
                _ => t.clone(),
            })
            .collect(),
    )
}

fn show(v: Option<&str>) -> String {
    v.map_or_else(|| "missing".to_string(), |s| format!("{s:?}"))
}

enum Choice {
    None,
    Calls(Calls),
}

fn choice(value: Option<&Value>, tools: &Tools) -> Result<Choice, ApiError> {
    let bad = |m: String| ApiError::bad_param("tool_choice", m);
    let choice = match value {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() { Choice::None } else { Choice::Calls(Calls::Auto) });
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Calls(Calls::Auto),
            "required" => Choice::Calls(Calls::Required),
            other => return Err(bad(format!("unknown tool_choice {other:?} (none, auto, required, or a function)"))),
        },
        Some(v @ Value::Object(_)) => {
            let kind = v.get("type").and_then(Value::as_str);
            let named = |field: &str| v.get(field).and_then(|f| f.get("name")).and_then(Value::as_str);
            match kind {
                Some("function") => {
                    let name = named("function").unwrap_or_default();
                    let i = tools.functions.iter().position(|(n, _)| n == name).ok_or_else(|| {
                        bad(format!("tool_choice names {name:?}, which is not one of the function tools"))
                    })?;
                    Choice::Calls(Calls::Named(i))
                }
                Some("custom") => {
                    let name = named("custom").unwrap_or_default();
                    let i = tools.custom.iter().position(|c| c.name == name).ok_or_else(|| {
                        bad(format!("tool_choice names {name:?}, which is not one of the custom tools"))
                    })?;
                    Choice::Calls(Calls::NamedCustom(i))
                }
                _ => {
                    return Err(bad(
                        "tool_choice objects must be {\"type\": \"function\", \"function\": {\"name\": …}} \
                         or {\"type\": \"custom\", \"custom\": {\"name\": …}}"
                            .into(),
                    ))
                }
            }
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object".into())),
    };
    if tools.is_empty() && !matches!(choice, Choice::None) {
        return Err(bad("tool_choice needs tools".into()));
    }
    Ok(choice)
}

/// The schema of a `response_format`, if it asks for JSON.
fn response_schema(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(v) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    let bad = |p: &'static str, m: &str| ApiError::bad_param(p, m.to_string());
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "object"}))),
        Some("json_schema") => {
            let spec = v
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("response_format.json_schema", "response_format.json_schema must be an object"))?;
            let name = spec.get("name").and_then(Value::as_str).unwrap_or_default();
            if !valid_name(name) {
                return Err(bad(
                    "response_format.json_schema.name",
                    "response_format.json_schema.name must be 1 to 64 letters, digits, '_' or '-'",
                ));
            }
            match spec.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(s.clone())),
                None => Ok(Some(json!({"type": "object"}))),
                Some(_) => Err(bad("response_format.json_schema.schema", "the schema must be a JSON object")),
            }
        }
        other => Err(bad(
            "response_format.type",
            &format!("response_format.type must be text, json_object or json_schema, not {}", show(other)),
        )),
    }
}

/// Checks the fields and plans the request. `template` is the chat template's source.
pub(crate) fn plan(fields: ToolFields<'_>, template: &str) -> Result<Plan, ApiError> {
    let plan = tool_plan(fields, template)?;
    match custom_grammar(fields.grammar)? {
        None => Ok(plan),
        Some(_) if plan.grammar.is_some() => {
            Err(ApiError::bad_param("grammar", "grammar cannot be combined with tools or response_format"))
        }
        Some(g) => Ok(Plan { grammar: Some(g), ..plan }),
    }
}

fn tool_plan(fields: ToolFields<'_>, template: &str) -> Result<Plan, ApiError> {
    let tools = match fields.tools {
        None | Some(Value::Null) => Tools::default(),
        Some(v) => tools(v)?,
    };
    let choice = choice(fields.tool_choice, &tools)?;
    let answer = response_schema(fields.response_format)?;
    let parallel = fields.parallel_tool_calls.unwrap_or(true);
    let calls = match choice {
        Choice::None => None,
        Choice::Calls(c) => Some(c),
    };
    let Some(calls) = calls else {
        // No calls: the tools stay out of the prompt, as the template renders a conversation without them.
        let grammar = answer.clone().map(|s| GrammarSource::JsonSchema(grammar::styled(s).to_string()));
        return Ok(Plan { template_tools: None, grammar, calls: None, answer, custom: Vec::new() });
    };
    let format = CallFormat::detect(template)
        .ok_or_else(|| ApiError::bad_param("tools", "the served model's chat template does not describe tool calls"))?;
    if !tools.custom.is_empty() && format == CallFormat::LlamaJson {
        return Err(ApiError::bad_param(
            "tools",
            "custom tools need a model whose chat template writes calls in <tool_call> tags (Qwen, Hermes)",
        ));
    }
    let text = grammar::grammar(format, &tools.functions, &tools.custom, calls, parallel, answer.as_ref());
    let custom = tools.custom.iter().map(|c| c.name.clone()).collect();
    Ok(Plan {
        template_tools: fields.tools.map(|v| template_tools(v, &tools)),
        grammar: Some(GrammarSource::Lark(text)),
        calls: Some(ToolSet { tools: tools.functions, custom }),
        answer,
        custom: tools.custom,
    })
}

/// Compiles a plan's grammar on a grammar thread (cached by its text). A grammar
/// llguidance refuses is a 400 naming the schema at fault: each tool's parameters
/// and the response format are compiled alone to find it.
pub(crate) async fn compile(
    engine: &cachet_engine::runtime::EngineHandle,
    plan: &Plan,
) -> Result<Option<Grammar>, ApiError> {
    let Some(source) = plan.grammar.clone() else { return Ok(None) };
    // Agents send the same tools every turn: a cached grammar needs no grammar thread.
    if engine.grammars().is_cached(&source) {
        if let Ok(g) = engine.grammars().compile(&source) {
            return Ok(Some(g));
        }
    }
    let (handle, plan) = (engine.clone(), plan.clone());
    // On the grammar threads, at a low priority: a costly grammar takes no CPU time the engine
    // and the other tenants' requests need.
    cachet_engine::constraint::in_background(move || {
        let grammars = handle.grammars();
        let err = match grammars.compile(&source) {
            Ok(g) => return Ok(Some(g)),
            Err(GrammarError::Invalid(m)) => m,
            Err(other) => return Err(ApiError::bad_param(param_of(&plan), other.to_string())),
        };
        let alone = |schema: &Value| match grammars
            .compile(&GrammarSource::JsonSchema(grammar::styled(schema.clone()).to_string()))
        {
            Err(GrammarError::Invalid(m)) => Some(m),
            _ => None,
        };
        for (i, (name, params)) in plan.calls.iter().flat_map(|c| c.tools.iter()).enumerate() {
            if let Some(m) = alone(params) {
                return Err(ApiError::bad_param(
                    format!("tools[{i}].function.parameters"),
                    format!("the parameters of {name:?} are not a schema cachet can enforce: {m}"),
                ));
            }
        }
        for tool in &plan.custom {
            let source = match &tool.format {
                CustomFormat::Text => continue,
                CustomFormat::Lark(def) => GrammarSource::Lark(def.clone()),
                CustomFormat::Regex(re) => GrammarSource::Regex(re.clone()),
            };
            if let Err(GrammarError::Invalid(m)) = grammars.compile(&source) {
                return Err(ApiError::bad_param(
                    "tools",
                    format!("the grammar of the custom tool {:?} is not one cachet can enforce: {m}", tool.name),
                ));
            }
        }
        if let Some(m) = plan.answer.as_ref().and_then(alone) {
            return Err(ApiError::bad_param("response_format", format!("response_format: {m}")));
        }
        Err(ApiError::bad_param(param_of(&plan), format!("{}: {err}", param_of(&plan))))
    })
    .await
    .ok_or_else(|| ApiError::Internal("compiling the grammar failed".into()))?
}

/// The answer's calls as the engine writes it, on the engine thread: ends the request at a call
/// repeated back to back (the repeat is left out of the answer, see [`parse`]), and tells the
/// ledger whether the answer ended with calls (its finish reason is then `tool_calls`, as the
/// client sees it).
pub(crate) struct CallWatch(std::sync::Mutex<parse::CallParser>);

impl CallWatch {
    pub(crate) fn new(tools: ToolSet) -> std::sync::Arc<CallWatch> {
        std::sync::Arc::new(CallWatch(std::sync::Mutex::new(parse::CallParser::new(tools))))
    }

    /// The engine's stop hook: true once the model repeated a call.
    pub(crate) fn stop_when(self: &std::sync::Arc<Self>) -> cachet_engine::runtime::StopWhen {
        let watch = self.clone();
        std::sync::Arc::new(move |piece: &str| {
            let mut parser = watch.0.lock().unwrap_or_else(|e| e.into_inner());
            parser.push(piece);
            parser.repeated()
        })
    }

    /// The calls of the whole answer (once it is complete).
    pub(crate) fn calls(&self) -> usize {
        let mut parser = self.0.lock().unwrap_or_else(|e| e.into_inner());
        parser.finish();
        parser.calls()
    }
}

fn param_of(plan: &Plan) -> &'static str {
    if plan.calls.is_some() {
        "tools"
    } else if plan.answer.is_some() {
        "response_format"
    } else {
        "grammar"
    }
}

#[cfg(test)]
mod tests;
