//! The OpenAI-compatible endpoints. Both completion endpoints turn their
//! body into token ids, then share [`execute`]: plan limits, the engine
//! request (scoped to the authenticated tenant, salted by `user`), the
//! ledger hook, and the answer — one JSON body, or server-sent events.

pub mod chat;
pub mod completions;
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
use cachet_engine::generate::{FinishReason, GenerateParams};
use cachet_engine::radix::RetentionKey;
use cachet_engine::runtime::{
    Completion, Event, OnComplete, OnProgress, Outcome, PublicPrefix, Request, RequestError, RequestStream, SloClass,
    TokenSpan,
};
use cachet_engine::sampler::SamplingParams;
pub(crate) use cachet_tenants::Endpoint;
use cachet_tenants::{RequestId, RequestStatus, SessionId, UsageRecord};
use std::sync::Arc;
use std::time::Duration;
use types::{ModelCard, ModelList, Sampling};

/// Whether an endpoint's answers take the chat completion shape (a session's messages answer
/// like chat completions; the Responses API builds its own objects from the completion shape).
fn chat_shaped(endpoint: Endpoint) -> bool {
    matches!(endpoint, Endpoint::ChatCompletions | Endpoint::SessionMessages)
}

/// The models this server serves.
#[utoipa::path(get, path = "/v1/models", tag = "openai", responses((status = 200, body = ModelList)),
    security(("bearer" = [])))]
#[get("/v1/models")]
pub async fn list_models(state: web::Data<AppState>, _auth: TenantAuth) -> Result<HttpResponse, ApiError> {
    let served = state.served()?;
    Ok(HttpResponse::Ok().json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: served.id.clone(),
            object: "model",
            created: served.created,
            owned_by: "cachet",
            max_model_len: served.engine.max_context(),
            context_length: served.engine.max_context(),
        }],
    }))
}

/// The served model, if `model` names it.
pub(crate) fn model<'a>(state: &'a AppState, model: &str) -> Result<&'a Served, ApiError> {
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
const MAX_BYTES_PER_TOKEN: usize = 32;

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
    sampling.validate().map_err(ApiError::bad)?;
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

fn finish_reason(r: FinishReason) -> &'static str {
    ledger_finish(r).as_str()
}

/// The ledger's word for why generation stopped.
fn ledger_finish(r: FinishReason) -> cachet_tenants::FinishReason {
    match r {
        FinishReason::Stop => cachet_tenants::FinishReason::Stop,
        FinishReason::Length => cachet_tenants::FinishReason::Length,
    }
}

/// A session id a request labels itself with (not a session the server runs for it): any id of
/// the client's choosing, except another tenant's session (404, as for an unknown task). While
/// the database is unreachable the label is taken as it is: it only groups the tenant's own
/// ledger rows.
async fn check_session_label(
    state: &AppState,
    tenant: cachet_tenants::TenantId,
    id: SessionId,
) -> Result<(), ApiError> {
    match state.store.is_foreign_session(tenant, id).await {
        Ok(true) => Err(ApiError::NotFound(format!("session {id}"))),
        Ok(false) => Ok(()),
        Err(e) if e.is_unavailable() => {
            tracing::warn!(session = %id, "cannot check the session label, the database is unreachable: {e}");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs a prepared request for the authenticated tenant.
pub(crate) async fn execute(
    state: &AppState,
    http: &HttpRequest,
    TenantAuth(tenant): TenantAuth,
    served: &Served,
    sampling: &Sampling,
    job: Job,
) -> Result<HttpResponse, ApiError> {
    let session = match &job.session {
        Some(bound) => Some(bound.id),
        None => id_from(http, sampling.session_id, "x-cachet-session")?,
    };
    if let (None, Some(id)) = (&job.session, session) {
        check_session_label(state, tenant.id, id).await?;
    }
    let task = id_from(http, sampling.task_id, "x-cachet-task")?;
    if let Some(task) = task {
        crate::routes::tasks::check_task(state, tenant.id, task).await?;
    }
    let slo = match sampling.slo.as_deref() {
        None | Some("interactive") => SloClass::Interactive,
        Some("batch") => SloClass::Batch,
        Some(other) => {
            return Err(ApiError::bad_param("slo", format!("unknown SLO class {other:?} (interactive, batch)")))
        }
    };
    state.sync_share(served, &tenant);
    let budget = (job.tokens.len() + job.params.max_tokens) as u64;
    state
        .limiter
        .check(tenant.id, &tenant.plan.limits, budget)
        .map_err(|(message, retry_after)| ApiError::RateLimited { message, retry_after })?;

    let id = job.id;
    let http_span = tracing::Span::current();
    http_span.record("tenant", tracing::field::display(tenant.id));
    http_span.record("endpoint", job.endpoint.as_str());
    if let Some(s) = session {
        http_span.record("session", tracing::field::display(s));
    }
    if let Some(t) = task {
        http_span.record("task", tracing::field::display(t));
    }
    let engine_tenant = crate::state::engine_tenant(tenant.id);
    // A prompt the client wrote may open with a registered public prefix (an agent's preamble);
    // a session's prompt is the server's own assembly (the system prompt, then tenant data).
    let (public, matched) = match job.endpoint {
        Endpoint::SessionMessages => (job.public.clone(), None),
        _ => {
            served.prefixes.observe(&engine_tenant.to_string(), &job.tokens);
            served.prefixes.public_for(&job.tokens, job.public.clone())
        }
    };
    let public_tokens = public.as_ref().map_or(0, |p| p.tokens);
    if let Some(m) = &matched {
        metrics::counter!("cachet:public_prefix_requests_total", "prefix" => m.name.clone()).increment(1);
    }
    let public_labels: Vec<metrics::Label> = match state.settings.server.metrics_tenant_labels {
        true => vec![metrics::Label::new("tenant", tenant.id.to_string())],
        false => Vec::new(),
    };
    let retention = session.map(|s| {
        let ttl = match &job.session {
            Some(bound) => bound.retention,
            None => Duration::from_secs(state.settings.engine.session_retention_secs),
        };
        (retention_key(tenant.id, s), ttl)
    });
    let ledger = state.ledger.clone();
    let targets = state.settings.engine_config().map_err(ApiError::Internal)?;
    let targets = match slo {
        SloClass::Interactive => targets.interactive,
        SloClass::Batch => targets.batch,
    };
    let slo_class = match slo {
        SloClass::Interactive => cachet_tenants::SloClass::Interactive,
        SloClass::Batch => cachet_tenants::SloClass::Batch,
    };
    let (tenant_id, plan, model_id, endpoint) = (tenant.id, tenant.plan.clone(), served.id.clone(), job.endpoint);
    // Milliseconds spent moving the prompt's K/V here (set once, below), and of them those before
    // the engine took the request (the engine's times do not include them; with
    // `reserve = "early"` the rest was while the engine held the request: they do); and the
    // prompt tokens a prefill server computed for this request that the engine then loaded as
    // cached (`reserve = "prefill_complete"`): billed as computed.
    let transfer: Arc<std::sync::OnceLock<(f64, f64)>> = Arc::default();
    let remote_tokens: Arc<std::sync::OnceLock<usize>> = Arc::default();
    let remote_cached = remote_tokens.clone();
    let (transfer_ms, transfer_hook) = (transfer.clone(), transfer.clone());
    let row = move |status: RequestStatus,
                    finish: Option<cachet_tenants::FinishReason>,
                    c: &Completion,
                    slo_met: Option<bool>| {
        let cached = c.cached_tokens.saturating_sub(remote_cached.get().copied().unwrap_or(0));
        let uncached = c.prompt_tokens.saturating_sub(cached) as u64;
        let moved = transfer_ms.get().map(|&(ms, _)| ms);
        let before = transfer_ms.get().map_or(0.0, |&(_, before)| before);
        UsageRecord {
            id,
            tenant: tenant_id,
            session_id: session,
            task_id: task,
            model: model_id.clone(),
            endpoint,
            prompt_tokens: c.prompt_tokens as i64,
            cached_tokens: cached as i64,
            computed_tokens: c.computed_prefill_tokens as i64,
            output_tokens: c.output_tokens as i64,
            queue_ms: c.queue_time.as_secs_f64() * 1e3,
            ttft_ms: c.ttft.map(|t| t.as_secs_f64() * 1e3 + before),
            e2e_ms: c.e2e.as_secs_f64() * 1e3 + before,
            compute_seconds: c.compute_seconds,
            cost: plan.cost(uncached, cached as u64, c.output_tokens as u64, c.compute_seconds),
            status,
            finish_reason: finish,
            created_at: chrono::Utc::now(),
            slo_class: Some(slo_class),
            slo_met,
            kv_transfer_ms: moved,
        }
    };
    let row = Arc::new(row);
    // The row opens at admission and follows the stream (a crash leaves what was streamed billed);
    // the end replaces it.
    let progress: OnProgress = {
        let (row, ledger) = (row.clone(), ledger.clone());
        Arc::new(move |c: &Completion| ledger.record(row(RequestStatus::Running, None, c, None)))
    };
    let watch = job.calls.clone().map(tools::CallWatch::new);
    let answered = watch.clone();
    let hook: OnComplete = Arc::new(move |outcome: Outcome, c: &Completion| {
        let status = match outcome {
            Outcome::Finished => RequestStatus::Ok,
            Outcome::Cancelled => RequestStatus::Cancelled,
            Outcome::Failed => RequestStatus::Error,
        };
        if public_tokens > 0 {
            // Prompt tokens a public prefix covered, and those of them read from the cache
            // (computed once for every tenant: the compute saved).
            metrics::counter!("cachet:public_prefix_tokens_total", public_labels.clone())
                .increment(public_tokens as u64);
            metrics::counter!("cachet:public_prefix_cached_tokens_total", public_labels.clone())
                .increment(c.cached_tokens.min(public_tokens) as u64);
        }
        // The finish reason the client saw: `tool_calls` for an answer that ended with calls.
        let finish = (outcome == Outcome::Finished).then(|| match (&answered, c.finish_reason) {
            (Some(w), FinishReason::Stop) if w.calls() > 0 => cachet_tenants::FinishReason::ToolCalls,
            (_, r) => ledger_finish(r),
        });
        // The SLO counts the K/V transfer before the engine took the request: the client waited.
        let mut seen = c.clone();
        if let Some(&(_, ms)) = transfer_hook.get() {
            let moved = Duration::from_secs_f64(ms / 1e3);
            seen.ttft = seen.ttft.map(|t| t + moved);
            seen.e2e += moved;
        }
        ledger.record(row(status, finish, c, slo_verdict(outcome, &seen, &targets)));
    });
    let lp_engine = job.params.logprobs.map(|_| served.engine.clone());
    let mut request = Request::new(engine_tenant, job.tokens, job.params);
    request.salt = sampling.user.as_deref().filter(|u| !u.is_empty()).map(user_salt);
    request.public = public;
    request.spans = job.spans;
    request.slo = slo;
    request.retention = retention;
    request.on_complete = Some(hook);
    request.on_progress = Some(progress);
    request.stop_when = watch.as_ref().map(|w| w.stop_when());
    request.grammar = job.grammar;
    request.span = tracing::info_span!(parent: &http_span, "engine");
    let moving = std::time::Instant::now();
    let mut moved = false;
    if let Some(from) = &job.handoff {
        crate::handoff::fetch(&served.engine, &request, from, state.operator_token.expose()).await;
        moved = true;
    }
    if state.settings.disagg.reserve == crate::config::Reserve::Early {
        let (told, handed_off) = (transfer.clone(), moving.elapsed());
        let done = move |d: Duration| {
            let _ = told.set(((handed_off + d).as_secs_f64() * 1e3, handed_off.as_secs_f64() * 1e3));
        };
        if crate::disagg::remote_prefill_early(state, &served.engine, &mut request, done).is_some() {
            // Into the slots the engine reserves at admission, as it arrives.
        } else if moved {
            let ms = handed_off.as_secs_f64() * 1e3;
            let _ = transfer.set((ms, ms));
        }
    } else {
        if let Some(t) = crate::disagg::remote_prefill(state, &served.engine, &request).await {
            tracing::debug!(chunks = t.chunks, bytes = t.bytes, ms = t.elapsed.as_millis() as u64, "kv transfer");
            let _ = remote_tokens.set(t.tokens);
            moved = true;
        }
        if moved {
            let ms = moving.elapsed().as_secs_f64() * 1e3;
            let _ = transfer.set((ms, ms));
        }
    }
    let mut events = served.engine.submit(request);
    // The first event decides the status: an error before any token is an
    // HTTP error, not a 200 stream.
    let first = events.next().await.ok_or_else(|| ApiError::Internal("the engine stopped".into()))?;
    if let Event::Error(e) = first {
        return Err(engine_error(e));
    }
    let stream = sampling.stream.unwrap_or(false);
    if let Some(echo) = job.echo {
        let builder = responses::answer::Builder::new(
            format!("resp_{}", id.simple()),
            chrono::Utc::now().timestamp(),
            served.id.clone(),
            *echo,
        );
        if stream {
            return Ok(responses::answer::respond(builder, (job.calls, job.think), first, events, lp_engine));
        }
        let ((text, _, entries), completion) = collect(first, &mut events, &served.engine).await?;
        return Ok(responses::answer::whole(builder, (job.calls, job.think), &text, &entries, &completion));
    }
    let ctx = stream::Context {
        id: format!("{}-{}", if chat_shaped(job.endpoint) { "chatcmpl" } else { "cmpl" }, id.simple()),
        created: chrono::Utc::now().timestamp(),
        model: served.id.clone(),
        endpoint: job.endpoint,
        extra: job.extra,
        headers: job.headers,
        calls: job.calls,
        logprobs: lp_engine,
        think: job.think,
    };
    if stream {
        let include_usage = sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
        return Ok(stream::respond(ctx, first, events, include_usage, job.answer));
    }
    let ((text, tokens, entries), completion) = collect(first, &mut events, &served.engine).await?;
    let response = stream::whole(&ctx, text.clone(), &entries, &completion);
    if let Some(sink) = job.answer {
        sink(Answer { text, tokens }).await;
    }
    Ok(response)
}

/// What an answer collected: its text, its tokens, and their log-probabilities (if asked).
type Collected = (String, Vec<u32>, Vec<logprobs::Entry>);

/// The rest of a request's answer, and how it ended.
async fn collect(
    first: Event,
    events: &mut RequestStream,
    engine: &cachet_engine::runtime::EngineHandle,
) -> Result<(Collected, Completion), ApiError> {
    let (mut text, mut tokens, mut entries) = (String::new(), Vec::new(), Vec::new());
    let mut event = Some(first);
    loop {
        match event {
            Some(Event::Token { id, text: piece, logprobs: lp }) => {
                text.push_str(&piece);
                tokens.push(id);
                if let Some(lp) = lp {
                    entries.extend(logprobs::entry(engine.tokenizer(), id, &lp));
                }
            }
            Some(Event::Done(completion)) => return Ok(((text, tokens, entries), completion)),
            Some(Event::Error(e)) => return Err(engine_error(e)),
            None => return Err(ApiError::Internal("the engine stopped".into())),
        }
        event = events.next().await;
    }
}

/// Whether a request met its SLO: it finished, its first token came within the TTFT target and
/// its mean inter-token latency within the ITL target. No verdict for a cancelled request.
fn slo_verdict(outcome: Outcome, c: &Completion, targets: &cachet_engine::runtime::SloTargets) -> Option<bool> {
    match outcome {
        Outcome::Cancelled => None,
        Outcome::Failed => Some(false),
        Outcome::Finished => {
            let Some(ttft) = c.ttft else { return Some(false) };
            let itl_ok = match c.output_tokens {
                0 | 1 => true,
                n => (c.e2e.saturating_sub(ttft)).as_secs_f64() / (n - 1) as f64 <= targets.itl.as_secs_f64(),
            };
            Some(ttft <= targets.ttft && itl_ok)
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use cachet_engine::runtime::SloTargets;

    fn completion(ttft_ms: Option<u64>, e2e_ms: u64, output_tokens: usize) -> Completion {
        Completion {
            finish_reason: FinishReason::Length,
            prompt_tokens: 10,
            cached_tokens: 0,
            computed_prefill_tokens: 10,
            output_tokens,
            queue_time: Duration::ZERO,
            ttft: ttft_ms.map(Duration::from_millis),
            e2e: Duration::from_millis(e2e_ms),
            compute_seconds: 0.0,
            retractions: 0,
        }
    }

    #[test]
    fn slo_verdicts_follow_ttft_and_mean_itl() {
        let t = SloTargets { ttft: Duration::from_millis(500), itl: Duration::from_millis(50) };
        // 500 ms to the first token, then 9 gaps of exactly 50 ms: met (targets are inclusive).
        assert_eq!(slo_verdict(Outcome::Finished, &completion(Some(500), 950, 10), &t), Some(true));
        assert_eq!(
            slo_verdict(Outcome::Finished, &completion(Some(501), 951, 10), &t),
            Some(false),
            "late first token"
        );
        assert_eq!(slo_verdict(Outcome::Finished, &completion(Some(100), 560, 10), &t), Some(false), "slow tokens");
        assert_eq!(
            slo_verdict(Outcome::Finished, &completion(Some(100), 9_000, 1), &t),
            Some(true),
            "one token: no gap"
        );
        assert_eq!(slo_verdict(Outcome::Finished, &completion(None, 10, 0), &t), Some(false), "no first token");
        assert_eq!(slo_verdict(Outcome::Failed, &completion(Some(1), 2, 2), &t), Some(false));
        assert_eq!(slo_verdict(Outcome::Cancelled, &completion(Some(1), 2, 2), &t), None);
    }
}
