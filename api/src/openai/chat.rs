//! `POST /v1/chat/completions`: the conversation is rendered with the
//! model's own chat template, behind the operator's public system prompt
//! (the prefix every tenant shares). Tools and response formats become a
//! grammar the engine enforces, and calls in the answer become `tool_calls`
//! (see [`super::tools`]).

use super::binding::{self, Binding};
use super::tools::{self, ToolFields};
use super::types::{reject_unknown, ChatCompletion, ChatCompletionRequest, ChatMessageIn, Content, Sampling};
use super::{execute, params, Endpoint, Job};
use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::{AppState, Served};
use actix_web::{post, web, HttpRequest, HttpResponse};
use cachet_engine::chat_template::ChatMessage;
use cachet_engine::runtime::PublicPrefix;
use serde_json::Value;

/// The text of a message's content: a string, or text parts joined.
fn text_of(content: &Option<Content>, at: usize) -> Result<String, ApiError> {
    Ok(match content {
        None => String::new(),
        Some(Content::Text(t)) => t.clone(),
        // Text parts are joined with newlines, as vLLM joins them.
        Some(Content::Parts(parts)) => parts
            .iter()
            .map(|p| match (p.kind.as_str(), &p.text) {
                ("text", Some(t)) => Ok(t.as_str()),
                (kind, _) => Err(ApiError::bad_param(
                    format!("messages[{at}].content"),
                    format!("content parts of type {kind:?} are not supported (text only)"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?
            .join("\n"),
    })
}

/// An assistant message's `tool_calls` as templates expect them: each call's
/// `function.arguments` (a JSON string on the wire) parsed into an object, so
/// the template does not render it double-encoded. Custom tools' calls (`{"type": "custom",
/// "custom": {"name", "input"}}`) come back as text, the way the model writes them
/// ([`custom_call_text`]), to be appended to the message's content: templates render function
/// calls only.
pub(crate) fn history_calls(calls: &Value, at: usize) -> Result<(Value, String), ApiError> {
    let bad = |m: String| ApiError::bad_param(format!("messages[{at}].tool_calls"), m);
    let list = calls.as_array().ok_or_else(|| bad(format!("messages[{at}].tool_calls must be an array")))?;
    let mut out = Vec::with_capacity(list.len());
    let mut text = String::new();
    for (j, call) in list.iter().enumerate() {
        if call.get("type").and_then(Value::as_str) == Some("custom") {
            let custom = call.get("custom");
            let field = |k: &str| custom.and_then(|c| c.get(k)).and_then(Value::as_str);
            let (Some(name), Some(input)) = (field("name"), field("input")) else {
                return Err(bad(format!("messages[{at}].tool_calls[{j}].custom needs a name and an input (strings)")));
            };
            push_custom_call(&mut text, name, input);
            continue;
        }
        let mut call = call.clone();
        let function = call
            .get_mut("function")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| bad(format!("messages[{at}].tool_calls[{j}].function must be an object")))?;
        if !function.get("name").is_some_and(Value::is_string) {
            return Err(bad(format!("messages[{at}].tool_calls[{j}].function.name must be a string")));
        }
        if let Some(Value::String(args)) = function.get("arguments") {
            // A string that is not JSON stays a string (as vLLM does).
            if let Ok(parsed) = serde_json::from_str::<Value>(args) {
                function.insert("arguments".into(), parsed);
            }
        }
        out.push(call);
    }
    Ok((Value::Array(out), text))
}

/// Appends a custom tool's call to an assistant message's text, as the model writes it (see
/// `tools::grammar`), on a line of its own.
pub(crate) fn push_custom_call(content: &mut String, name: &str, input: &str) {
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    content.push_str(&format!("<tool_call>\n<function={name}>\n{input}\n</function>\n</tool_call>"));
}

/// Converts one OpenAI message to the template's.
pub(crate) fn message(m: &ChatMessageIn, at: usize) -> Result<ChatMessage, ApiError> {
    if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
        return Err(ApiError::bad_param(format!("messages[{at}].role"), format!("unknown role {:?}", m.role)));
    }
    let role = if m.role == "developer" { "system".to_string() } else { m.role.clone() };
    let mut msg = ChatMessage::new(role, text_of(&m.content, at)?);
    msg.name = m.name.clone();
    msg.tool_calls = match &m.tool_calls {
        Some(calls) if !calls.is_null() && m.role == "assistant" => {
            let (calls, custom) = history_calls(calls, at)?;
            if !custom.is_empty() && !msg.content.is_empty() && !msg.content.ends_with('\n') {
                msg.content.push('\n');
            }
            msg.content.push_str(&custom);
            calls.as_array().is_some_and(|c| !c.is_empty()).then_some(calls)
        }
        Some(calls) if !calls.is_null() => {
            return Err(ApiError::bad_param(
                format!("messages[{at}].tool_calls"),
                "only assistant messages carry tool_calls",
            ))
        }
        _ => None,
    };
    msg.tool_call_id = m.tool_call_id.clone();
    Ok(msg)
}

/// Converts OpenAI messages to the template's.
pub(crate) fn messages(body: &ChatCompletionRequest) -> Result<Vec<ChatMessage>, ApiError> {
    if body.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must not be empty"));
    }
    body.messages.iter().enumerate().map(|(i, m)| message(m, i)).collect()
}

/// Creates a model response for the given chat conversation.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai", request_body = ChatCompletionRequest,
    responses((status = 200, description = "A completion, or `text/event-stream` chunks when `stream` is true", body = ChatCompletion),
              (status = 400, description = "Invalid request"), (status = 401, description = "Missing or invalid token"),
              (status = 404, description = "Unknown model"), (status = 413, description = "Prompt longer than the context"),
              (status = 429, description = "Rate limited or overloaded (see Retry-After)"),
              (status = 503, description = "The model is loading")),
    security(("bearer" = [])))]
#[post("/v1/chat/completions")]
pub async fn chat_completions(
    state: web::Data<AppState>,
    http: HttpRequest,
    auth: TenantAuth,
    body: web::Json<ChatCompletionRequest>,
) -> Result<HttpResponse, ApiError> {
    reject_unknown(&body.unknown)?;
    let (served, binding) = binding::resolve(&state, &auth.0, &http, &body.model).await?;
    let fields = ToolFields::of(&body.tooling, body.sampling.grammar.as_ref());
    let id = crate::telemetry::request_id(&http);
    let kwargs = body.chat_template_kwargs.as_ref();
    let conversation = Conversation { messages: messages(&body)?, fields, kwargs, binding };
    let job = job(id, &state, served, conversation, &body.sampling, Endpoint::ChatCompletions).await?;
    execute(&state, &http, auth, served, &body.sampling, job).await
}

/// A conversation to render, and what shapes its prompt.
pub(crate) struct Conversation<'a> {
    /// The client's messages.
    pub messages: Vec<ChatMessage>,
    pub fields: ToolFields<'a>,
    /// `chat_template_kwargs`.
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
    /// The repository whose context the prompt holds.
    pub binding: Option<Binding>,
}

/// Renders a conversation behind the public system prompt (and, bound to a repository, with its
/// context: see [`binding`]), plans its tools and grammar, and builds the request (chat
/// completions and the Responses API).
pub(crate) async fn job(
    id: cachet_tenants::RequestId,
    state: &AppState,
    served: &Served,
    conversation: Conversation<'_>,
    sampling: &Sampling,
    endpoint: Endpoint,
) -> Result<Job, ApiError> {
    let Conversation { messages, fields, kwargs, binding } = conversation;
    super::think::check_kwargs(kwargs)?;
    let template = served.engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
    let plan = tools::plan(fields, template.source())?;
    super::count_results(endpoint, messages.iter().rev().take_while(|m| m.role == "tool").count());
    let request = binding::Request::new(served, messages, plan.template_tools.clone(), kwargs.cloned());
    let rendered = binding::prompt(state, served, request, binding).await?;
    let think =
        super::think::template_thinks(template.source()).then(|| super::think::prompt_opens_block(&rendered.text));
    let public = served
        .public
        .as_ref()
        .filter(|(_, ids)| rendered.tokens.starts_with(ids))
        .map(|(_, ids)| PublicPrefix { template: "chat".into(), tokens: ids.len() });
    let params = params(sampling, rendered.tokens.len(), served)?;
    let mut job = Job::new(id, endpoint, rendered.tokens, public, params);
    job.spans = rendered.spans;
    if let Some(commit) = rendered.commit {
        job.headers.push(("x-cachet-context-commit", commit.to_string()));
    }
    job.grammar = tools::compile(&served.engine, &plan).await?;
    job.calls = plan.calls;
    job.think = think;
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachet_engine::chat_template::ChatTemplate;
    use serde_json::json;

    #[test]
    fn history_arguments_are_rendered_as_objects_not_strings() {
        let template = ChatTemplate::new(cachet_engine::testing::TINY_CHAT_TEMPLATE, None, None).unwrap();
        let calls = json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": [1, \"x\"]}"}},
                           {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]);
        let render = |calls: Value| {
            let mut m = ChatMessage::assistant("");
            m.tool_calls = Some(calls);
            template.render(&[ChatMessage::user("x"), m], false, None).unwrap()
        };
        let text = render(history_calls(&calls, 0).unwrap().0);
        assert!(text.contains(r#"{"name": "f", "arguments": {"a": [1, "x"]}}"#), "{text}");
        assert!(text.contains(r#"{"name": "g", "arguments": "not json"}"#), "{text}");
        // As sent (a JSON string), it would be double-encoded.
        assert!(render(calls).contains(r#""arguments": "{\"a\""#));
        let bad = json!([{"id": "c", "type": "function", "function": {"arguments": "{}"}}]);
        assert!(history_calls(&bad, 3).is_err());
    }
}
