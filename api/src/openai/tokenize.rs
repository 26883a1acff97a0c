//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: the token ids
//! cachet would compute for a text prompt (as `/v1/completions` encodes it) or
//! a conversation (as `/v1/chat/completions` renders it: the operator's system
//! prompt, the model's chat template, tools, and the repository context of a
//! binding, with what each span of the prompt is), and the text of token ids.

use super::binding;
use super::chat::message;
use super::tools::{self, ToolFields};
use super::types::{reject_unknown, ChatMessageIn, ToolRequest, Unknown};
use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{post, web, HttpRequest, HttpResponse};
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
    http: HttpRequest,
    auth: TenantAuth,
    body: web::Json<TokenizeRequest>,
) -> Result<HttpResponse, ApiError> {
    reject_unknown(&body.unknown)?;
    let name = body.model.as_deref().unwrap_or("default");
    let (served, binding) = match &body.messages {
        Some(_) => binding::resolve(&state, &auth.0, &http, name).await?,
        None => (super::model(&state, name)?, None),
    };
    let tok = served.engine.tokenizer();
    let mut rendered = None;
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
            let plan = tools::plan(ToolFields::of(&body.tooling, None), template.source())?;
            let messages = messages.iter().enumerate().map(|(i, m)| message(m, i)).collect::<Result<Vec<_>, _>>()?;
            let mut request = binding::Request::new(served, messages, plan.template_tools, None);
            request.generation_prompt = body.add_generation_prompt.unwrap_or(true);
            let prompt = binding::prompt(&state, served, request, binding).await?;
            let tokens = prompt.tokens.clone();
            rendered = Some(prompt);
            tokens
        }
        _ => return Err(ApiError::bad_param("prompt", "give either prompt or messages")),
    };
    let token_strs = match body.return_token_strs {
        Some(true) => Some(tokens.iter().map(|&t| tok.token(t).unwrap_or_default()).collect::<Vec<_>>()),
        _ => None,
    };
    let mut out = json!({
        "count": tokens.len(),
        "max_model_len": served.engine.max_context(),
        "tokens": tokens,
        "token_strs": token_strs,
    });
    // Bound to a repository: the commit of its context, and what each span of the prompt is.
    if let Some(prompt) = rendered.filter(|p| p.commit.is_some()) {
        out["context_commit"] = json!(prompt.commit.map(|c| c.to_string()));
        // A watched working tree's snapshot: the commit its uncommitted changes are over.
        if let Some(head) = prompt.uncommitted_over {
            out["context_uncommitted_over"] = json!(head.to_string());
        }
        out["segments"] = json!(prompt.segments);
        out["prompt"] = json!(prompt.text);
    }
    Ok(HttpResponse::Ok().json(out))
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
