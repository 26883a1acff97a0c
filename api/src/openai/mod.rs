//! The OpenAI-compatible endpoints. Both completion endpoints turn their
//! body into token ids, then share [`execute`]: plan limits, the engine
//! request (scoped to the authenticated tenant, salted by `user`), the
//! ledger hook, and the answer — one JSON body, or server-sent events.

pub mod binding;
pub mod chat;
pub mod completions;
mod execute;
pub(crate) mod logprobs;
pub mod responses;
mod stream;
pub(crate) mod think;
pub mod tokenize;
pub(crate) mod tools;
pub mod types;

use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::{AppState, Served};
use actix_web::{get, web, HttpRequest, HttpResponse};
use cachet_engine::generate::GenerateParams;
use cachet_engine::radix::RetentionKey;
use cachet_engine::runtime::{PublicPrefix, RequestError, TokenSpan};
use cachet_engine::sampler::SamplingParams;
pub(crate) use cachet_tenants::Endpoint;
use cachet_tenants::{RequestId, SessionId};
use std::sync::Arc;
use std::time::Duration;
use types::{ModelCard, ModelList, Sampling};

pub(crate) use execute::execute;

/// Whether an endpoint's answers take the chat completion shape (a session's messages answer
/// like chat completions; the Responses API builds its own objects from the completion shape).
fn chat_shaped(endpoint: Endpoint) -> bool {
    matches!(endpoint, Endpoint::ChatCompletions | Endpoint::SessionMessages)
}

/// The models this server serves: the model, and the model bound to each of the tenant's
/// repositories that are ready (`<model>@<repository>`).
#[utoipa::path(get, path = "/v1/models", tag = "openai", responses((status = 200, body = ModelList)),
    security(("bearer" = [])))]
#[get("/v1/models")]
pub async fn list_models(state: web::Data<AppState>, auth: TenantAuth) -> Result<HttpResponse, ApiError> {
    let served = state.served()?;
    let card = |id: String| ModelCard {
        id,
        object: "model",
        created: served.created,
        owned_by: "cachet",
        max_model_len: served.engine.max_context(),
        context_length: served.engine.max_context(),
    };
    let mut data = vec![card(served.id.clone())];
    // The model bound to each of the tenant's ready repositories (see `binding`).
    let repos = state.store.repositories(auth.0.id).await?;
    let ready = repos.iter().filter(|r| crate::registration::ready(r).is_ok());
    data.extend(ready.map(|r| card(format!("{}@{}", served.id, r.name))));
    Ok(HttpResponse::Ok().json(ModelList { object: "list", data }))
}

/// The served model, if `model` names it (without a repository binding: see [`binding`] for the
/// endpoints that take one).
pub(crate) fn model<'a>(state: &'a AppState, model: &str) -> Result<&'a Served, ApiError> {
    if let (name, Some(_)) = binding::split_model(model) {
        model_named(state, name)?;
        return Err(ApiError::bad_param(
            "model",
            "a repository binding (`model@repository`) applies to /v1/chat/completions, /v1/responses and /tokenize \
             with messages",
        ));
    }
    model_named(state, model)
}

/// The served model, if `model` is its id or `default`.
fn model_named<'a>(state: &'a AppState, model: &str) -> Result<&'a Served, ApiError> {
    let served = state.served()?;
    if model == served.id || model == "default" {
        Ok(served)
    } else {
        Err(ApiError::ModelNotFound(model.to_string()))
    }
}

/// The cache salt of an end user (`user`): a digest, so that the engine's scope table holds a
/// few dozen bytes per end user whatever the client sends (2 MB `user` values stayed in memory
/// for good before).
fn user_salt(user: &str) -> Arc<str> {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(user.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect::<String>().into()
}

/// Bytes of prompt text per token of context beyond which a prompt cannot fit, whatever it says.
/// The served tokenizers average 3–5 bytes a token on code and prose; 32 leaves room for long runs
/// of whitespace or repeated characters.
pub(crate) const MAX_BYTES_PER_TOKEN: usize = 32;

/// Tokenizes a prompt (special tokens parsed) without holding an HTTP worker: a text longer than
/// the context could hold at [`MAX_BYTES_PER_TOKEN`] is refused (413) before any work, the rest is
/// encoded on the blocking pool, so a few megabyte-sized prompts cannot make `/healthz` or other
/// tenants' requests wait.
pub(crate) async fn encode(engine: &cachet_engine::runtime::EngineHandle, text: String) -> Result<Vec<u32>, ApiError> {
    let limit = engine.max_context();
    if text.len() > limit.saturating_mul(MAX_BYTES_PER_TOKEN) {
        return Err(ApiError::PromptTooLarge { bytes: text.len(), limit });
    }
    let engine = engine.clone();
    web::block(move || engine.tokenizer().encode(&text, true))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(|e| ApiError::bad_param("prompt", e.to_string()))
}

/// The most stop sequences a request may give (Continue's autocomplete sends 16).
const MAX_STOPS: usize = 32;
/// The most bytes they may hold together: each is matched against the held-back text on the
/// engine thread at every token.
const MAX_STOP_BYTES: usize = 8 << 10;

/// Checks the sampling fields (OpenAI's ranges) and builds the engine's.
pub(crate) fn params(s: &Sampling, prompt_tokens: usize, served: &Served) -> Result<GenerateParams, ApiError> {
    let engine = &served.engine;
    let defaults = &served.sampling;
    let max_context = engine.max_context();
    if s.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "only n = 1 is supported"));
    }
    let logprobs = logprobs::requested(s.logprobs.as_ref(), s.top_logprobs.as_ref())?;
    if s.store == Some(true) {
        return Err(ApiError::bad_param("store", "cachet does not store completions (store must be false)"));
    }
    if let Some(tier) = s.service_tier.as_deref().filter(|t| !matches!(*t, "auto" | "default")) {
        return Err(ApiError::bad_param("service_tier", format!("unknown service tier {tier:?} (auto, default)")));
    }
    let check = |ok: bool, param: &'static str, msg: &str| {
        if ok {
            Ok(())
        } else {
            Err(ApiError::bad_param(param, msg.to_string()))
        }
    };
    if let Some(t) = s.temperature {
        check(t.is_finite() && (0.0..=2.0).contains(&t), "temperature", "temperature must be between 0 and 2")?;
    }
    if let Some(p) = s.top_p {
        check(p.is_finite() && p > 0.0 && p <= 1.0, "top_p", "top_p must be in (0, 1]")?;
    }
    for (v, name) in [(s.presence_penalty, "presence_penalty"), (s.frequency_penalty, "frequency_penalty")] {
        if let Some(v) = v {
            check(v.is_finite() && (-2.0..=2.0).contains(&v), name, "penalties must be between -2 and 2")?;
        }
    }
    let stop = s.stop.clone().map(types::Stop::into_vec).unwrap_or_default();
    check(stop.len() <= MAX_STOPS, "stop", "at most 32 stop sequences")?;
    check(
        stop.iter().map(String::len).sum::<usize>() <= MAX_STOP_BYTES,
        "stop",
        "the stop sequences may hold at most 8192 bytes together",
    )?;
    // A stop spelled as a special token is that token (specials never reach the text).
    let tokenizer = engine.tokenizer();
    let (stop_token_ids, stop): (Vec<_>, Vec<_>) =
        stop.into_iter().partition(|s| tokenizer.token_id(s).is_some_and(|id| tokenizer.is_special(id)));
    let stop_token_ids = stop_token_ids.iter().filter_map(|s| tokenizer.token_id(s)).collect();
    let logit_bias = logit_bias(s.logit_bias.as_ref(), engine.vocab_size())?;
    if prompt_tokens >= max_context {
        return Err(ApiError::ContextTooLong { tokens: prompt_tokens, limit: max_context });
    }
    let room = max_context - prompt_tokens;
    let requested = s.max_completion_tokens.or(s.max_tokens).map(|m| m as usize);
    if requested == Some(0) {
        return Err(ApiError::bad_param("max_tokens", "max_tokens must be at least 1"));
    }
    let sampling = SamplingParams {
        temperature: s.temperature.unwrap_or(defaults.temperature),
        top_k: s.top_k.unwrap_or(defaults.top_k) as usize,
        top_p: s.top_p.unwrap_or(defaults.top_p),
        min_p: s.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: s.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(0.0),
        frequency_penalty: s.frequency_penalty.unwrap_or(0.0),
        seed: s.seed.map(|v| v as u64),
        logit_bias,
    };
    sampling.validate().map_err(|e| ApiError::bad(e.0))?;
    Ok(GenerateParams {
        sampling,
        // Without a limit of its own an answer gets `[model.sampling] max_tokens`; any answer ends at
        // the context window, with "length".
        max_tokens: requested
            .or((defaults.max_tokens > 0).then_some(defaults.max_tokens as usize))
            .unwrap_or(room)
            .min(room),
        stop,
        stop_token_ids,
        ignore_eos: s.ignore_eos.unwrap_or(false),
        logprobs,
    })
}

/// OpenAI's `logit_bias`: token ids (as strings) to biases in [-100, 100].
fn logit_bias(
    map: Option<&serde_json::Map<String, serde_json::Value>>,
    vocab: usize,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(map) = map else { return Ok(Vec::new()) };
    if map.len() > 1024 {
        return Err(ApiError::bad_param("logit_bias", "at most 1024 logit_bias entries"));
    }
    map.iter()
        .map(|(id, bias)| {
            let token = id.parse::<u32>().ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| {
                ApiError::bad_param("logit_bias", format!("{id:?} is not a token id of this model (0..{vocab})"))
            })?;
            let bias = bias.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                ApiError::bad_param("logit_bias", format!("the bias of token {id} must be a number in [-100, 100]"))
            })?;
            Ok((token, bias as f32))
        })
        .collect()
}

/// A session or task id from the body, else from its `X-Cachet-*` header.
fn id_from<T>(req: &HttpRequest, body: Option<T>, header: &str) -> Result<Option<T>, ApiError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    if body.is_some() {
        return Ok(body);
    }
    let Some(value) = req.headers().get(header) else { return Ok(None) };
    let text = value.to_str().map_err(|_| ApiError::bad(format!("the {header} header must be a UUID")))?;
    text.parse().map(Some).map_err(|e| ApiError::bad(format!("the {header} header: {e}")))
}

/// What [`execute`] needs beyond the body.
pub(crate) struct Job {
    /// The request id (the ledger row's).
    pub id: RequestId,
    pub endpoint: Endpoint,
    pub tokens: Vec<u32>,
    pub public: Option<PublicPrefix>,
    pub params: GenerateParams,
    /// A session the server manages (else one named by the body or header).
    pub session: Option<BoundSession>,
    /// Provenance of prompt spans (repository files).
    pub spans: Vec<TokenSpan>,
    /// Called with the whole answer before the response ends.
    pub answer: Option<AnswerSink>,
    /// Added to the response as `"cachet"` (the JSON body, and the first
    /// chunk of a stream) and as headers.
    pub extra: Option<serde_json::Value>,
    pub headers: Vec<(&'static str, String)>,
    /// The grammar the output must match (tools, response formats).
    pub grammar: Option<cachet_engine::constraint::Grammar>,
    /// Read tool calls out of the answer.
    pub calls: Option<tools::parse::ToolSet>,
    /// A thinking model's answer: its reasoning block is taken out (`Some(true)`: the prompt
    /// opened the block).
    pub think: Option<bool>,
    /// A Responses API request's settings, repeated in its response object.
    pub echo: Option<Box<serde_json::Map<String, serde_json::Value>>>,
    /// The replica a moved session's prefix is fetched from before the engine runs it
    /// (`crate::handoff`).
    pub handoff: Option<String>,
}

impl Job {
    /// A job with the request's id ([`crate::telemetry::request_id`]).
    pub fn new(
        id: RequestId,
        endpoint: Endpoint,
        tokens: Vec<u32>,
        public: Option<PublicPrefix>,
        params: GenerateParams,
    ) -> Job {
        Job {
            id,
            endpoint,
            tokens,
            public,
            params,
            session: None,
            spans: Vec::new(),
            answer: None,
            extra: None,
            headers: Vec::new(),
            grammar: None,
            calls: None,
            think: None,
            echo: None,
            handoff: None,
        }
    }
}

/// A server-managed session: its id and how long its prefix stays retained.
pub(crate) struct BoundSession {
    pub id: SessionId,
    pub retention: Duration,
}

/// A finished answer.
pub(crate) struct Answer {
    pub text: String,
    /// Every generated token, stop tokens included.
    pub tokens: Vec<u32>,
}

/// Receives the answer of a request that completed (not of one cancelled or failed).
pub(crate) type AnswerSink = Box<dyn FnOnce(Answer) -> futures_util::future::BoxFuture<'static, ()> + Send>;

/// The retention key of a tenant's session.
pub(crate) fn retention_key(tenant: cachet_tenants::TenantId, session: SessionId) -> RetentionKey {
    RetentionKey(format!("{tenant}:{session}").into())
}

/// Counts the tool calls answers returned (`cachet:tool_calls_total`).
pub(crate) fn count_calls(endpoint: Endpoint, n: usize) {
    if n > 0 {
        metrics::counter!("cachet:tool_calls_total", "endpoint" => endpoint.as_str()).increment(n as u64);
    }
}

/// Counts the tool results requests brought back (`cachet:tool_results_total`): the
/// results after the last assistant turn, not those of the history before it.
pub(crate) fn count_results(endpoint: Endpoint, n: usize) {
    if n > 0 {
        metrics::counter!("cachet:tool_results_total", "endpoint" => endpoint.as_str()).increment(n as u64);
    }
}

/// The engine's refusals as HTTP errors.
pub(crate) fn engine_error(e: RequestError) -> ApiError {
    match e {
        RequestError::Overloaded { retry_after } => ApiError::Overloaded { retry_after },
        RequestError::Invalid(m) => ApiError::bad(m),
        RequestError::TooLong { tokens, limit } => ApiError::ContextTooLong { tokens, limit },
        RequestError::Grammar(m) => {
            ApiError::bad(format!("the output cannot continue under the request's grammar: {m}"))
        }
        other => ApiError::Internal(other.to_string()),
    }
}
