//! `POST /v1/chat/completions`: the conversation is rendered with the
//! model's own chat template, behind the operator's public system prompt
//! (the prefix every tenant shares).

use super::types::{ChatCompletion, ChatCompletionRequest, Content};
use super::{execute, model, params, Endpoint, Job};
use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{post, web, HttpRequest, HttpResponse};
use cachet_engine::chat_template::ChatMessage;
use cachet_engine::runtime::PublicPrefix;

/// Converts OpenAI messages to the template's (text content only).
fn messages(body: &ChatCompletionRequest) -> Result<Vec<ChatMessage>, ApiError> {
    if body.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must not be empty"));
    }
    body.messages
        .iter()
        .map(|m| {
            if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
                return Err(ApiError::bad_param("messages", format!("unknown role {:?}", m.role)));
            }
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_param(
                                    "messages",
                                    format!("content parts of type {kind:?} are not supported (text only)"),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            let role = if m.role == "developer" { "system".to_string() } else { m.role.clone() };
            let mut msg = ChatMessage::new(role, content);
            msg.name = m.name.clone();
            msg.tool_calls = m.tool_calls.clone();
            msg.tool_call_id = m.tool_call_id.clone();
            Ok(msg)
        })
        .collect()
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
    let served = model(&state, &body.model)?;
    let template = served.engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
    let mut conversation = Vec::new();
    if let Some((public, _)) = &served.public {
        conversation.push(ChatMessage::system(public.clone()));
    }
    conversation.extend(messages(&body)?);
    let text = template
        .render(&conversation, true, body.tools.as_ref())
        .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
    let tokens = served.engine.tokenizer().encode(&text, true).map_err(|e| ApiError::bad(e.to_string()))?;
    let public = served
        .public
        .as_ref()
        .filter(|(_, ids)| tokens.starts_with(ids))
        .map(|(_, ids)| PublicPrefix { template: "chat".into(), tokens: ids.len() });
    let params = params(&body.sampling, tokens.len(), served.engine.max_context())?;
    execute(&state, &http, auth, served, &body.sampling, Job::new(Endpoint::Chat, tokens, public, params)).await
}
