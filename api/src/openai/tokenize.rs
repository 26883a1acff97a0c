//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: the token ids
//! cachet would compute for a text prompt (as `/v1/completions` encodes it) or
//! a conversation (as `/v1/chat/completions` renders it: the operator's system
//! prompt, the model's chat template, tools), and the text of token ids.

use super::chat::message;
use super::tools::{self, ToolFields};
use super::types::{reject_unknown, ChatMessageIn, ToolRequest, Unknown};
use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{post, web, HttpResponse};
use cachet_engine::chat_template::ChatMessage;
use serde::Deserialize;
use serde_json::json;

/// `POST /tokenize`: `prompt`, or `messages` (with `tools`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessageIn>>,
    /// With `prompt`: start with the model's BOS token when it wants one (default true).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
    /// With `messages`: end with the opening of the assistant's turn (default true).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Also return each token's text.
    #[serde(default)]
    pub return_token_strs: Option<bool>,
    #[serde(flatten)]
    pub tooling: ToolRequest,
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: Unknown,
}

/// `POST /detokenize`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
pub struct DetokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub tokens: Vec<u32>,
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: Unknown,
}

/// The token ids of a prompt or a conversation.
#[utoipa::path(post, path = "/tokenize", tag = "openai", request_body = TokenizeRequest,
    responses((status = 200, description = "`{count, max_model_len, tokens, token_strs}`"),
              (status = 400, description = "Neither or both of prompt and messages; a bad field")),
    security(("bearer" = [])))]
#[post("/tokenize")]
pub async fn tokenize(
    state: web::Data<AppState>,
    _auth: TenantAuth,
    body: web::Json<TokenizeRequest>,
) -> Result<HttpResponse, ApiError> {
    reject_unknown(&body.unknown)?;
    let served = super::model(&state, body.model.as_deref().unwrap_or("default"))?;
    let tok = served.engine.tokenizer();
    let tokens = match (&body.prompt, &body.messages) {
        (Some(prompt), None) => {
            if body.add_generation_prompt.is_some() || body.tooling.tools.is_some() {
                return Err(ApiError::bad_param("prompt", "add_generation_prompt and tools go with messages"));
            }
            let mut ids = super::encode(&served.engine, prompt.clone()).await?;
            if body.add_special_tokens.unwrap_or(true) && tok.add_bos_token() {
                ids.splice(0..0, tok.bos_id());
            }
            ids
        }
        (None, Some(messages)) => {
            if body.add_special_tokens.is_some() {
                return Err(ApiError::bad_param("add_special_tokens", "the chat template writes the special tokens"));
            }
            let template =
                served.engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
            let fields = ToolFields::of(&body.tooling, None);
            let plan = tools::plan(fields, template.source())?;
            let mut conversation = Vec::new();
            if let Some((public, _)) = &served.public {
                conversation.push(ChatMessage::system(public.clone()));
            }
            for (i, m) in messages.iter().enumerate() {
                conversation.push(message(m, i)?);
            }
            let text = template
                .render(&conversation, body.add_generation_prompt.unwrap_or(true), plan.template_tools.as_ref())
                .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
            super::encode(&served.engine, text).await?
        }
        _ => return Err(ApiError::bad_param("prompt", "give either prompt or messages")),
    };
    let token_strs = match body.return_token_strs {
        Some(true) => Some(tokens.iter().map(|&t| tok.token(t).unwrap_or_default()).collect::<Vec<_>>()),
        _ => None,
    };
    Ok(HttpResponse::Ok().json(json!({
        "count": tokens.len(),
        "max_model_len": served.engine.max_context(),
        "tokens": tokens,
        "token_strs": token_strs,
    })))
}

/// The text of token ids (special tokens included).
#[utoipa::path(post, path = "/detokenize", tag = "openai", request_body = DetokenizeRequest,
    responses((status = 200, description = "`{prompt}`"), (status = 400, description = "A token id outside the vocabulary")),
    security(("bearer" = [])))]
#[post("/detokenize")]
pub async fn detokenize(
    state: web::Data<AppState>,
    _auth: TenantAuth,
    body: web::Json<DetokenizeRequest>,
) -> Result<HttpResponse, ApiError> {
    reject_unknown(&body.unknown)?;
    let served = super::model(&state, body.model.as_deref().unwrap_or("default"))?;
    let text = served
        .engine
        .tokenizer()
        .decode(&body.tokens, false)
        .map_err(|e| ApiError::bad_param("tokens", e.to_string()))?;
    Ok(HttpResponse::Ok().json(json!({ "prompt": text })))
}
