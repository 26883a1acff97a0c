//! `POST /v1/responses`: OpenAI's Responses API, stateless. The request's
//! `instructions` and `input` items (messages, `function_call`s and `custom_tool_call`s and
//! their outputs) become a chat conversation, its function and custom tools and
//! `text.format` the same plan as a chat completion's `tools` and
//! `response_format`, and it runs through the same engine path, tenant scope,
//! ledger (endpoint `responses`), rate limits and SLO classes. The answer is a
//! `response` object, or the Responses API's server-sent events ([`answer`]).
//!
//! Nothing is stored: `store: true`, `previous_response_id`, `background` and
//! item references are refused with a 400 naming the field.

pub(crate) mod answer;
#[cfg(test)]
mod tests;

use super::chat::{self, history_calls, push_custom_call};
use super::tools::{valid_name, ToolFields};
use super::types::{reject_unknown, Sampling, ToolRequest, Unknown};
use super::{binding, execute, Endpoint};
use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{post, web, HttpRequest, HttpResponse};
use cachet_engine::chat_template::ChatMessage;
use cachet_tenants::{SessionId, TaskId};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

/// `input`: a user message's text, or a list of items.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    #[schema(value_type = Vec<Object>)]
    Items(Vec<Value>),
}

/// `POST /v1/responses`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
pub struct ResponseRequest {
    pub model: String,
    pub input: Input,
    /// A system message before the input.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Function tools `{"type": "function", "name", "description", "parameters", "strict"}` and
    /// custom tools `{"type": "custom", "name", "description", "format"}`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    /// `none`, `auto`, `required`, or `{"type": "function", "name": …}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", …}, "verbosity": …}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Alternatives per output token (0 to 20); with `include: ["message.output_text.logprobs"]`.
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// `{"include_obfuscation": …}`: cachet pads nothing, so this has no effect.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub stream_options: Option<Value>,
    /// Only `false`: cachet keeps no responses.
    #[serde(default)]
    pub store: Option<bool>,
    /// Refused: cachet keeps no responses (send the whole input).
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Refused: a conversation object is stored state.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub conversation: Option<Value>,
    /// Refused when true.
    #[serde(default)]
    pub background: Option<bool>,
    /// `{"effort", "summary"}`: the served model does not reason, so no reasoning items are produced.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    /// Extra output: `message.output_text.logprobs`, or `reasoning.encrypted_content` (there is none).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// `disabled` (the default; an input longer than the context is a 413).
    #[serde(default)]
    pub truncation: Option<String>,
    /// Narrows prefix-cache reuse to this end user (as `safety_identifier`).
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub safety_identifier: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// Codex CLI's per-turn tags (accepted, not stored).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub client_metadata: Option<Value>,
    /// A prompt-cache routing hint: cachet's prefix cache needs none.
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    #[serde(default)]
    pub service_tier: Option<String>,
    /// cachet extension: the session (or `X-Cachet-Session`).
    #[serde(default)]
    #[schema(value_type = Option<Uuid>)]
    pub session_id: Option<SessionId>,
    /// cachet extension: the task (or `X-Cachet-Task`).
    #[serde(default)]
    #[schema(value_type = Option<Uuid>)]
    pub task_id: Option<TaskId>,
    /// cachet extension: `interactive` (default) or `batch`.
    #[serde(default)]
    pub slo: Option<String>,
    /// cachet extension (as chat's): the sampler's seed.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Extra variables for the chat template (vLLM's field), such as Qwen3's `enable_thinking`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: Unknown,
}

/// Fields of the Responses API that a stateless server cannot honour, with what to do instead.
fn refuse_stateful(r: &ResponseRequest) -> Result<(), ApiError> {
    let refuse = |p: &'static str, m: &str| Err(ApiError::bad_param(p, m.to_string()));
    if r.store == Some(true) {
        return refuse("store", "cachet keeps no responses: set store to false and send the whole input each turn");
    }
    if r.previous_response_id.is_some() {
        return refuse("previous_response_id", "cachet keeps no responses: send the whole input each turn");
    }
    if r.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return refuse("conversation", "cachet keeps no conversations: send the whole input each turn");
    }
    if r.background == Some(true) {
        return refuse("background", "background responses are not supported");
    }
    if let Some(t) = r.truncation.as_deref().filter(|t| *t != "disabled") {
        return refuse("truncation", &format!("truncation {t:?} is not supported (disabled)"));
    }
    for (i, inc) in r.include.iter().flatten().enumerate() {
        if !matches!(inc.as_str(), "reasoning.encrypted_content" | "message.output_text.logprobs") {
            return Err(ApiError::bad_param(
                format!("include[{i}]"),
                format!("include {inc:?} is not supported (message.output_text.logprobs, reasoning.encrypted_content)"),
            ));
        }
    }
    if let Some(reasoning) = r.reasoning.as_ref().filter(|v| !v.is_null()) {
        let map =
            reasoning.as_object().ok_or_else(|| ApiError::bad_param("reasoning", "reasoning must be an object"))?;
        for (k, v) in map {
            match (k.as_str(), v) {
                ("summary" | "generate_summary", _) => {}
                ("effort", Value::Null) => {}
                ("effort", Value::String(e)) if matches!(e.as_str(), "none" | "minimal") => {}
                ("effort", _) => {
                    return refuse("reasoning.effort", "the served model does not reason (effort none or minimal)")
                }
                _ => return Err(ApiError::bad_param(format!("reasoning.{k}"), format!("unknown field reasoning.{k}"))),
            }
        }
    }
    Ok(())
}

/// The text of a message's or an output's content: a string, or text parts joined with newlines.
fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
                let text = match kind {
                    "input_text" | "output_text" | "text" | "summary_text" => part.get("text"),
                    "refusal" => part.get("refusal"),
                    _ => {
                        return Err(ApiError::bad_param(
                            format!("{at}[{j}].type"),
                            format!("content parts of type {kind:?} are not supported (input_text, output_text)"),
                        ))
                    }
                };
                let text = text
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad_param(format!("{at}[{j}].text"), format!("{at}[{j}] has no text")))?;
                texts.push(text);
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::bad_param(at.to_string(), format!("{at} must be a string or a list of parts"))),
    }
}

fn string_field<'a>(item: &'a Value, field: &str, at: &str) -> Result<&'a str, ApiError> {
    item.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_param(format!("{at}.{field}"), format!("{at}.{field} must be a string")))
}

/// The conversation of a request: `instructions` as a system message, then the input items.
pub(crate) fn conversation(instructions: Option<&str>, input: &Input) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out = Vec::new();
    if let Some(i) = instructions.filter(|i| !i.is_empty()) {
        out.push(ChatMessage::system(i));
    }
    let items = match input {
        Input::Text(t) => {
            out.push(ChatMessage::user(t.clone()));
            return Ok(out);
        }
        Input::Items(items) => items,
    };
    if items.is_empty() {
        return Err(ApiError::bad_param("input", "input must not be empty"));
    }
    for (i, item) in items.iter().enumerate() {
        push_item(&mut out, item, i)?;
    }
    if out.iter().all(|m| m.role == "system") {
        return Err(ApiError::bad_param("input", "input has no message for the model to answer"));
    }
    Ok(out)
}

/// Input item `i` added to the conversation.
fn push_item(out: &mut Vec<ChatMessage>, item: &Value, i: usize) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    if !item.is_object() {
        return Err(ApiError::bad_param(at.clone(), format!("{at} must be an object")));
    }
    // An item without a type is a message (the "easy input message").
    let kind = match item.get("type") {
        None | Some(Value::Null) => "message",
        Some(Value::String(k)) => k.as_str(),
        Some(_) => return Err(ApiError::bad_param(format!("{at}.type"), format!("{at}.type must be a string"))),
    };
    match kind {
        "message" => out.push(message_item(item, &at)?),
        "function_call" => {
            let call_id = string_field(item, "call_id", &at)?;
            let name = string_field(item, "name", &at)?;
            let arguments = string_field(item, "arguments", &at)?;
            let call = json!([{"id": call_id, "type": "function",
                               "function": {"name": name, "arguments": arguments}}]);
            let (call, _) = history_calls(&call, i)?;
            // Calls join the assistant message they follow (as chat's `tool_calls`).
            let last = assistant_turn(out);
            let calls = last.tool_calls.get_or_insert_with(|| Value::Array(Vec::new()));
            if let (Value::Array(list), Value::Array(new)) = (calls, call) {
                list.extend(new);
            }
        }
        "custom_tool_call" => {
            let name = string_field(item, "name", &at)?;
            let input = string_field(item, "input", &at)?;
            string_field(item, "call_id", &at)?;
            // The call is text in the assistant message it follows, as the model wrote it.
            push_custom_call(&mut assistant_turn(out).content, name, input);
        }
        "function_call_output" | "custom_tool_call_output" => {
            let call_id = string_field(item, "call_id", &at)?;
            let output = text_of(item.get("output").unwrap_or(&Value::Null), &format!("{at}.output"))?;
            let mut m = ChatMessage::new("tool", output);
            m.tool_call_id = Some(call_id.to_string());
            out.push(m);
        }
        // A model's reasoning: the served model neither reads nor writes it.
        "reasoning" => {}
        "item_reference" => {
            return Err(ApiError::bad_param(
                format!("{at}.type"),
                "cachet keeps no items to reference: send the item itself",
            ))
        }
        other => {
            return Err(ApiError::bad_param(
                format!("{at}.type"),
                format!(
                    "input items of type {other:?} are not supported (message, function_call, \
                     function_call_output, custom_tool_call, custom_tool_call_output)"
                ),
            ))
        }
    }
    Ok(())
}

/// A `message` item (`developer` is the system role).
fn message_item(item: &Value, at: &str) -> Result<ChatMessage, ApiError> {
    let role = match string_field(item, "role", at)? {
        role @ ("user" | "assistant" | "system") => role,
        "developer" => "system",
        other => {
            return Err(ApiError::bad_param(
                format!("{at}.role"),
                format!("unknown role {other:?} (user, assistant, system, developer)"),
            ))
        }
    };
    let content = text_of(item.get("content").unwrap_or(&Value::Null), &format!("{at}.content"))?;
    Ok(ChatMessage::new(role, content))
}

/// The assistant message a call joins: the last message if it is the assistant's, else a new,
/// empty one.
fn assistant_turn(out: &mut Vec<ChatMessage>) -> &mut ChatMessage {
    if out.last().is_none_or(|m| m.role != "assistant") {
        out.push(ChatMessage::assistant(""));
    }
    let last = out.len() - 1;
    &mut out[last]
}

/// The request's function tools in chat's shape (`{"type": "function", "function": {…}}`).
pub(crate) fn chat_tools(tools: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(tools) = tools.filter(|t| !t.is_null()) else { return Ok(None) };
    let list = tools.as_array().ok_or_else(|| ApiError::bad_param("tools", "tools must be an array"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or_default();
        if kind != "function" && kind != "custom" {
            return Err(ApiError::bad_param(
                format!("tools[{i}].type"),
                format!("tools of type {kind:?} are not supported: cachet serves function and custom tools"),
            ));
        }
        let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
        if !valid_name(name) {
            return Err(ApiError::bad_param(
                format!("tools[{i}].name"),
                format!("tools[{i}].name must be 1 to 64 letters, digits, '_' or '-', not {name:?}"),
            ));
        }
        let map = tool.as_object().cloned().unwrap_or_default();
        let mut function = Map::new();
        for (k, v) in map {
            match k.as_str() {
                "type" => {}
                "name" | "description" => {
                    function.insert(k, v);
                }
                "parameters" | "strict" if kind == "function" => {
                    function.insert(k, v);
                }
                "format" if kind == "custom" => {
                    function.insert(k, v);
                }
                _ => {
                    return Err(ApiError::bad_param(format!("tools[{i}].{k}"), format!("unknown field tools[{i}].{k}")))
                }
            }
        }
        out.push(if kind == "custom" {
            json!({"type": "custom", "custom": function})
        } else {
            json!({"type": "function", "function": function})
        });
    }
    Ok(Some(Value::Array(out)))
}

/// `tool_choice` in chat's shape.
pub(crate) fn chat_tool_choice(choice: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match choice {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(Value::String(s.clone()))),
        Some(v @ Value::Object(_)) if v.get("type").and_then(Value::as_str) == Some("function") => {
            let name = v.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_param("tool_choice.name", "tool_choice {\"type\": \"function\"} needs a name")
            })?;
            Ok(Some(json!({"type": "function", "function": {"name": name}})))
        }
        Some(v @ Value::Object(_)) if v.get("type").and_then(Value::as_str) == Some("custom") => {
            let name = v.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::bad_param("tool_choice.name", "tool_choice {\"type\": \"custom\"} needs a name")
            })?;
            Ok(Some(json!({"type": "custom", "custom": {"name": name}})))
        }
        Some(_) => Err(ApiError::bad_param(
            "tool_choice",
            "tool_choice must be none, auto, required or {\"type\": \"function\" | \"custom\", \"name\": …}",
        )),
    }
}

/// `text.format` as chat's `response_format`.
pub(crate) fn response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(text) = text.filter(|t| !t.is_null()) else { return Ok(None) };
    let map = text.as_object().ok_or_else(|| ApiError::bad_param("text", "text must be an object"))?;
    let mut format = None;
    for (k, v) in map {
        match k.as_str() {
            "format" => format = Some(v),
            // A hint to the model about length: no effect here.
            "verbosity" if v.is_null() || matches!(v.as_str(), Some("low" | "medium" | "high")) => {}
            "verbosity" => return Err(ApiError::bad_param("text.verbosity", "text.verbosity is low, medium or high")),
            _ => return Err(ApiError::bad_param(format!("text.{k}"), format!("unknown field text.{k}"))),
        }
    }
    let Some(format) = format.filter(|f| !f.is_null()) else { return Ok(None) };
    let kind = format.get("type").and_then(Value::as_str).unwrap_or_default();
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(json!({"type": "json_object"}))),
        "json_schema" => {
            let name = format.get("name").and_then(Value::as_str).unwrap_or_default();
            if !valid_name(name) {
                return Err(ApiError::bad_param(
                    "text.format.name",
                    "text.format.name must be 1 to 64 letters, digits, '_' or '-'",
                ));
            }
            let schema = match format.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                None => json!({"type": "object"}),
                Some(_) => {
                    return Err(ApiError::bad_param("text.format.schema", "text.format.schema must be an object"))
                }
            };
            Ok(Some(json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                "strict": format.get("strict").cloned().unwrap_or(Value::Null)}})))
        }
        other => Err(ApiError::bad_param(
            "text.format.type",
            format!("text.format.type must be text, json_object or json_schema, not {other:?}"),
        )),
    }
}

/// The sampling fields the shared path reads.
fn sampling(r: &ResponseRequest) -> Result<Sampling, ApiError> {
    if r.max_output_tokens == Some(0) {
        return Err(ApiError::bad_param("max_output_tokens", "max_output_tokens must be at least 1"));
    }
    let logprobs = r.include.iter().flatten().any(|i| i == "message.output_text.logprobs");
    if r.top_logprobs.is_some_and(|n| n > 20) {
        return Err(ApiError::bad_param("top_logprobs", "top_logprobs must be between 0 and 20"));
    }
    Ok(Sampling {
        max_tokens: r.max_output_tokens,
        temperature: r.temperature,
        top_p: r.top_p,
        user: r.user.clone().or_else(|| r.safety_identifier.clone()),
        stream: r.stream,
        store: r.store,
        service_tier: r.service_tier.clone(),
        prompt_cache_key: r.prompt_cache_key.clone(),
        session_id: r.session_id,
        task_id: r.task_id,
        slo: r.slo.clone(),
        seed: r.seed,
        logprobs: (logprobs || r.top_logprobs.is_some_and(|n| n > 0)).then_some(Value::Bool(true)),
        top_logprobs: r.top_logprobs.filter(|&n| n > 0).map(Value::from),
        ..Sampling::default()
    })
}

/// The request's settings a response object repeats back (the sampling it left out as the
/// served defaults it got).
fn echo(r: &ResponseRequest, defaults: &crate::config::SamplingDefaults) -> Map<String, Value> {
    let text = match r.text.as_ref().and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        Some(f) => json!({"format": f}),
        None => json!({"format": {"type": "text"}}),
    };
    let fields = json!({
        "instructions": r.instructions,
        "max_output_tokens": r.max_output_tokens,
        "parallel_tool_calls": r.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": null,
        "reasoning": {"effort": null, "summary": null},
        "store": false,
        "temperature": r.temperature.unwrap_or(defaults.temperature),
        "text": text,
        "tool_choice": r.tool_choice.clone().unwrap_or_else(|| json!("auto")),
        "tools": r.tools.clone().unwrap_or_else(|| json!([])),
        "top_p": r.top_p.unwrap_or(defaults.top_p),
        "top_logprobs": r.top_logprobs.unwrap_or(0),
        "truncation": "disabled",
        "user": r.user,
        "metadata": r.metadata.clone().unwrap_or_else(|| json!({})),
        "service_tier": "default",
    });
    match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// Creates a model response (OpenAI's Responses API, stateless).
#[utoipa::path(post, path = "/v1/responses", tag = "openai", request_body = ResponseRequest,
    responses((status = 200, description = "A `response` object, or `text/event-stream` Responses events when `stream` is true"),
              (status = 400, description = "Invalid request, or a stateful feature"), (status = 401, description = "Missing or invalid token"),
              (status = 404, description = "Unknown model"), (status = 413, description = "Input longer than the context"),
              (status = 429, description = "Rate limited or overloaded (see Retry-After)")),
    security(("bearer" = [])))]
#[post("/v1/responses")]
pub async fn create_response(
    state: web::Data<AppState>,
    http: HttpRequest,
    auth: TenantAuth,
    body: web::Json<ResponseRequest>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    reject_unknown(&body.unknown)?;
    refuse_stateful(&body)?;
    let (served, binding) = binding::resolve(&state, &auth.0, &http, &body.model).await?;
    let messages = conversation(body.instructions.as_deref(), &body.input)?;
    let tooling = ToolRequest {
        tools: chat_tools(body.tools.as_ref())?,
        tool_choice: chat_tool_choice(body.tool_choice.as_ref())?,
        parallel_tool_calls: body.parallel_tool_calls,
        response_format: response_format(body.text.as_ref())?,
    };
    let sampling = sampling(&body)?;
    let fields = ToolFields::of(&tooling, None);
    let id = crate::telemetry::request_id(&http);
    let kwargs = body.chat_template_kwargs.as_ref();
    let conversation = chat::Conversation { messages, fields, kwargs, binding };
    let mut job = chat::job(id, &state, served, conversation, &sampling, Endpoint::Responses).await?;
    job.echo = Some(Box::new(echo(&body, &served.sampling)));
    execute(&state, &http, auth, served, &sampling, job).await
}
