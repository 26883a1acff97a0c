//! `POST /v1/completions`: raw text (or token ids) in, text out; with
//! `suffix`, a fill-in-the-middle prompt in the model's FIM tokens.

use super::types::{reject_unknown, CompletionRequest, Prompt, TextCompletion};
use super::{execute, model, params, tools, Endpoint, Job};
use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{post, web, HttpRequest, HttpResponse};

/// Creates a completion for the given prompt.
#[utoipa::path(post, path = "/v1/completions", tag = "openai", request_body = CompletionRequest,
    responses((status = 200, description = "A completion, or `text/event-stream` chunks when `stream` is true", body = TextCompletion),
              (status = 400, description = "Invalid request"), (status = 401, description = "Missing or invalid token"),
              (status = 404, description = "Unknown model"), (status = 413, description = "Prompt longer than the context"),
              (status = 429, description = "Rate limited or overloaded (see Retry-After)"),
              (status = 503, description = "The model is loading")),
    security(("bearer" = [])))]
#[post("/v1/completions")]
pub async fn completions(
    state: web::Data<AppState>,
    http: HttpRequest,
    auth: TenantAuth,
    body: web::Json<CompletionRequest>,
) -> Result<HttpResponse, ApiError> {
    reject_unknown(&body.unknown)?;
    let served = model(&state, &body.model)?;
    if body.echo == Some(true) {
        return Err(ApiError::bad_param("echo", "echo is not supported"));
    }
    let tok = served.engine.tokenizer();
    let one =
        |n: usize| if n == 1 { Ok(()) } else { Err(ApiError::bad_param("prompt", "exactly one prompt is supported")) };
    let text = match (&body.prompt, &body.suffix) {
        (Prompt::Text(t), None) => Some(t.clone()),
        (Prompt::Texts(ts), None) => {
            one(ts.len())?;
            Some(ts[0].clone())
        }
        (Prompt::Text(t), Some(suffix)) => {
            let fim = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"];
            if fim.iter().any(|t| tok.token_id(t).is_none()) {
                return Err(ApiError::bad_param("suffix", "this model has no fill-in-the-middle tokens"));
            }
            Some(format!("{}{t}{}{suffix}{}", fim[0], fim[1], fim[2]))
        }
        (Prompt::Tokens(_), None) | (Prompt::TokenLists(_), None) => None,
        (_, Some(_)) => return Err(ApiError::bad_param("suffix", "suffix needs a single text prompt")),
    };
    let tokens = match (text, &body.prompt) {
        (Some(text), _) => super::encode(&served.engine, text).await?,
        (None, Prompt::Tokens(ids)) => ids.clone(),
        (None, Prompt::TokenLists(lists)) => {
            one(lists.len())?;
            lists[0].clone()
        }
        (None, _) => unreachable!("every text prompt was taken above"),
    };
    if tokens.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= served.engine.vocab_size()) {
        return Err(ApiError::bad_param("prompt", format!("token id {bad} is outside the vocabulary")));
    }
    let params = params(&body.sampling, tokens.len(), served)?;
    let mut job = Job::new(crate::telemetry::request_id(&http), Endpoint::Completions, tokens, None, params);
    let plan = tools::Plan { grammar: tools::custom_grammar(body.sampling.grammar.as_ref())?, ..Default::default() };
    job.grammar = tools::compile(&served.engine, &plan).await?;
    execute(&state, &http, auth, served, &body.sampling, job).await
}
