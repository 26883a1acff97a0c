//! [`execute`]: the common path of every completion endpoint into the engine and out, as a short
//! composition of steps each testable alone — the request's labels and limits ([`admit`]), its
//! public prefix, its accounting ([`Billing`]), the engine request, the K/V moved here for it
//! ([`move_prompt_kv`]) and the answer ([`respond`]).

use super::{
    chat_shaped, engine_error, id_from, logprobs, responses, retention_key, stream, tools, user_salt, Answer, Endpoint,
    Job,
};
use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::{AppState, Served};
use actix_web::{HttpRequest, HttpResponse};
use cachet_engine::generate::FinishReason;
use cachet_engine::runtime::{
    Completion, EngineHandle, Event, OnComplete, OnProgress, Outcome, PublicPrefix, Request, RequestStream, SloClass,
    SloTargets,
};
use cachet_tenants::{RequestStatus, SessionId, TaskId, Tenant, UsageRecord};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::types::Sampling;

/// Runs a prepared request for the authenticated tenant.
pub(crate) async fn execute(
    state: &AppState,
    http: &HttpRequest,
    TenantAuth(tenant): TenantAuth,
    served: &Served,
    sampling: &Sampling,
    job: Job,
) -> Result<HttpResponse, ApiError> {
    let labels = admit(state, http, &tenant, served, sampling, &job).await?;
    let http_span = record_span(&tenant, &job, &labels);
    let engine_tenant = crate::state::engine_tenant(tenant.id);
    let public = public_prefix(served, &engine_tenant, &job);
    let billing = Billing {
        ledger: state.accounting.ledger.clone(),
        template: Arc::new(RowTemplate::new(&tenant, served, &job, &labels)),
        // The engine's own configuration, built once when it started.
        targets: served.engine.config().targets(labels.slo),
        public_tokens: public.as_ref().map_or(0, |p| p.tokens),
        public_labels: match state.settings.server.metrics_tenant_labels {
            true => vec![metrics::Label::new("tenant", tenant.id.to_string())],
            false => Vec::new(),
        },
    };
    let transfer = billing.template.transfer.clone();
    let watch = job.calls.clone().map(tools::CallWatch::new);
    let (progress, hook) = billing.hooks(watch.clone());
    let retention = labels.session.map(|s| {
        let ttl = match &job.session {
            Some(bound) => bound.retention,
            None => Duration::from_secs(state.settings.engine.session_retention_secs),
        };
        (retention_key(tenant.id, s), ttl)
    });
    let Job {
        id, endpoint, tokens, params, spans, answer, extra, headers, grammar, calls, think, echo, handoff, ..
    } = job;
    let lp_engine = params.logprobs.map(|_| served.engine.clone());
    let mut request = Request::new(engine_tenant, tokens, params);
    request.salt = sampling.user.as_deref().filter(|u| !u.is_empty()).map(user_salt);
    request.public = public;
    request.spans = spans;
    request.slo = labels.slo;
    request.retention = retention;
    request.on_complete = Some(hook);
    request.on_progress = Some(progress);
    request.stop_when = watch.as_ref().map(|w| w.stop_when());
    request.grammar = grammar;
    request.span = tracing::info_span!(parent: &http_span, "engine");
    move_prompt_kv(state, served, handoff.as_deref(), &mut request, &transfer).await;
    let mut events = served.engine.submit(request);
    // The first event decides the status: an error before any token is an HTTP error, not a
    // 200 stream.
    let first = events.next().await.ok_or_else(|| ApiError::Internal("the engine stopped".into()))?;
    if let Event::Error(e) = first {
        return Err(engine_error(e));
    }
    let reply = Reply { id, endpoint, answer, extra, headers, calls, think, echo, logprobs: lp_engine };
    respond(served, sampling, reply, first, events).await
}

/// What the answer is built from, besides the engine's events.
struct Reply {
    id: cachet_tenants::RequestId,
    endpoint: Endpoint,
    answer: Option<super::AnswerSink>,
    extra: Option<serde_json::Value>,
    headers: Vec<(&'static str, String)>,
    calls: Option<tools::parse::ToolSet>,
    think: Option<bool>,
    echo: Option<Box<serde_json::Map<String, serde_json::Value>>>,
    /// The engine, where the request asked for log-probabilities (their token texts).
    logprobs: Option<EngineHandle>,
}

/// The answer: a Responses API object or a completion, whole or streamed as it comes.
async fn respond(
    served: &Served,
    sampling: &Sampling,
    reply: Reply,
    first: Event,
    mut events: RequestStream,
) -> Result<HttpResponse, ApiError> {
    let Reply { id, endpoint, answer, extra, headers, calls, think, echo, logprobs: lp_engine } = reply;
    let stream = sampling.stream.unwrap_or(false);
    if let Some(echo) = echo {
        let builder = responses::answer::Builder::new(
            format!("resp_{}", id.simple()),
            chrono::Utc::now().timestamp(),
            served.id.clone(),
            *echo,
        );
        let mut response = match stream {
            true => responses::answer::respond(builder, (calls, think), first, events, lp_engine),
            false => {
                let ((text, _, entries), completion) = collect(first, &mut events, &served.engine).await?;
                responses::answer::whole(builder, (calls, think), &text, &entries, &completion)
            }
        };
        for (name, value) in &headers {
            if let Ok(value) = actix_web::http::header::HeaderValue::from_str(value) {
                response.headers_mut().insert(actix_web::http::header::HeaderName::from_static(name), value);
            }
        }
        return Ok(response);
    }
    let ctx = stream::Context {
        id: format!("{}-{}", if chat_shaped(endpoint) { "chatcmpl" } else { "cmpl" }, id.simple()),
        created: chrono::Utc::now().timestamp(),
        model: served.id.clone(),
        endpoint,
        extra,
        headers,
        calls,
        logprobs: lp_engine,
        think,
    };
    if stream {
        let include_usage = sampling.stream_options.as_ref().is_some_and(|o| o.include_usage);
        return Ok(stream::respond(ctx, first, events, include_usage, answer));
    }
    let ((text, tokens, entries), completion) = collect(first, &mut events, &served.engine).await?;
    let response = stream::whole(&ctx, text.clone(), &entries, &completion);
    if let Some(sink) = answer {
        sink(Answer { text, tokens }).await;
    }
    Ok(response)
}

/// What a request is labelled with, checked against its tenant.
#[derive(Clone, Copy, Debug)]
struct Labels {
    session: Option<SessionId>,
    task: Option<TaskId>,
    slo: SloClass,
}

/// Checks what the request names (its session label, its task — or the task of the client's own
/// run id — and its SLO class) and the tenant's rate limits, before anything runs.
async fn admit(
    state: &AppState,
    http: &HttpRequest,
    tenant: &Tenant,
    served: &Served,
    sampling: &Sampling,
    job: &Job,
) -> Result<Labels, ApiError> {
    let session = match &job.session {
        Some(bound) => Some(bound.id),
        None => id_from(http, sampling.session_id, "x-cachet-session")?,
    };
    if let (None, Some(id)) = (&job.session, session) {
        check_session_label(state, tenant.id, id).await?;
    }
    let task = match id_from(http, sampling.task_id, "x-cachet-task")? {
        Some(task) => {
            crate::routes::tasks::check_task(state, tenant.id, task).await?;
            Some(task)
        }
        None => crate::routes::tasks::client_session_task(state, http, tenant.id).await,
    };
    let slo = slo_class(sampling.slo.as_deref())?;
    state.sync_share(served, tenant);
    let budget = (job.tokens.len() + job.params.max_tokens) as u64;
    state
        .accounting
        .limiter
        .check(tenant.id, &tenant.plan.limits, budget)
        .map_err(|(message, retry_after)| ApiError::RateLimited { message, retry_after })?;
    Ok(Labels { session, task, slo })
}

/// The SLO class a request asks for (`interactive` unless it says `batch`).
fn slo_class(name: Option<&str>) -> Result<SloClass, ApiError> {
    name.map_or(Ok(SloClass::Interactive), |n| {
        n.parse().map_err(|e: cachet_tenants::UnknownWord| ApiError::bad_param("slo", e.to_string()))
    })
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

/// The request's `http` span, with who and what it is for.
fn record_span(tenant: &Tenant, job: &Job, labels: &Labels) -> tracing::Span {
    let span = tracing::Span::current();
    span.record("tenant", tracing::field::display(tenant.id));
    span.record("endpoint", job.endpoint.as_str());
    if let Some(s) = labels.session {
        span.record("session", tracing::field::display(s));
    }
    if let Some(t) = labels.task {
        span.record("task", tracing::field::display(t));
    }
    span
}

/// The public prefix the prompt opens with: a prompt the client wrote may open with a registered
/// one (an agent's preamble); a session's prompt is the server's own assembly (the system
/// prompt, then tenant data).
fn public_prefix(served: &Served, engine_tenant: &cachet_engine::radix::TenantKey, job: &Job) -> Option<PublicPrefix> {
    if job.endpoint == Endpoint::SessionMessages {
        return job.public.clone();
    }
    served.prefixes.observe(&engine_tenant.to_string(), &job.tokens);
    let (public, matched) = served.prefixes.public_for(&job.tokens, job.public.clone());
    if let Some(m) = &matched {
        metrics::counter!("cachet:public_prefix_requests_total", "prefix" => m.name.clone()).increment(1);
    }
    public
}

/// The K/V moved here for a request (a session's prefix from its last replica, a prompt a
/// prefill server computed): set once, read by its ledger row and SLO verdict.
#[derive(Default)]
struct Transfer {
    /// Milliseconds spent moving the prompt's K/V here, and of them those before the engine took
    /// the request (the engine's times do not include them; with `reserve = "early"` the rest
    /// was while the engine held the request: they do).
    ms: OnceLock<(f64, f64)>,
    /// Prompt tokens a prefill server computed for this request that the engine then loaded as
    /// cached (`reserve = "prefill_complete"`): billed as computed.
    remote_tokens: OnceLock<usize>,
}

/// Moves the prompt's K/V here before (or, with `reserve = "early"`, while) the engine runs the
/// request: a moved session's prefix from `handoff`, a long prompt from a prefill server.
async fn move_prompt_kv(
    state: &AppState,
    served: &Served,
    handoff: Option<&str>,
    request: &mut Request,
    transfer: &Arc<Transfer>,
) {
    let moving = std::time::Instant::now();
    let mut moved = false;
    if let Some(from) = handoff {
        crate::handoff::fetch(&served.engine, request, from, state.auth.operator_token.expose()).await;
        moved = true;
    }
    if state.settings.disagg.reserve == crate::config::Reserve::Early {
        let (told, handed_off) = (transfer.clone(), moving.elapsed());
        let done = move |d: Duration| {
            let _ = told.ms.set(((handed_off + d).as_secs_f64() * 1e3, handed_off.as_secs_f64() * 1e3));
        };
        if crate::disagg::remote_prefill_early(state, &served.engine, request, done).is_some() {
            // Into the slots the engine reserves at admission, as it arrives.
        } else if moved {
            let ms = handed_off.as_secs_f64() * 1e3;
            let _ = transfer.ms.set((ms, ms));
        }
        return;
    }
    if let Some(t) = crate::disagg::remote_prefill(state, &served.engine, request).await {
        tracing::debug!(chunks = t.chunks, bytes = t.bytes, ms = t.elapsed.as_millis() as u64, "kv transfer");
        let _ = transfer.remote_tokens.set(t.tokens);
        moved = true;
    }
    if moved {
        let ms = moving.elapsed().as_secs_f64() * 1e3;
        let _ = transfer.ms.set((ms, ms));
    }
}

/// What every ledger row of one request shares.
struct RowTemplate {
    id: cachet_tenants::RequestId,
    tenant: cachet_tenants::TenantId,
    plan: cachet_tenants::Plan,
    model: String,
    endpoint: Endpoint,
    labels: Labels,
    transfer: Arc<Transfer>,
}

impl RowTemplate {
    fn new(tenant: &Tenant, served: &Served, job: &Job, labels: &Labels) -> RowTemplate {
        RowTemplate {
            id: job.id,
            tenant: tenant.id,
            plan: tenant.plan.clone(),
            model: served.id.clone(),
            endpoint: job.endpoint,
            labels: *labels,
            transfer: Arc::default(),
        }
    }

    /// The request's ledger row as of `c`.
    fn row(
        &self,
        status: RequestStatus,
        finish: Option<FinishReason>,
        c: &Completion,
        slo_met: Option<bool>,
    ) -> UsageRecord {
        let cached = c.cached_tokens.saturating_sub(self.transfer.remote_tokens.get().copied().unwrap_or(0));
        let uncached = c.prompt_tokens.saturating_sub(cached) as u64;
        let moved = self.transfer.ms.get().map(|&(ms, _)| ms);
        let before = self.transfer.ms.get().map_or(0.0, |&(_, before)| before);
        UsageRecord {
            id: self.id,
            tenant: self.tenant,
            session_id: self.labels.session,
            task_id: self.labels.task,
            model: self.model.clone(),
            endpoint: self.endpoint,
            prompt_tokens: c.prompt_tokens as i64,
            cached_tokens: cached as i64,
            computed_tokens: c.computed_prefill_tokens as i64,
            output_tokens: c.output_tokens as i64,
            queue_ms: c.queue_time.as_secs_f64() * 1e3,
            ttft_ms: c.ttft.map(|t| t.as_secs_f64() * 1e3 + before),
            e2e_ms: c.e2e.as_secs_f64() * 1e3 + before,
            compute_seconds: c.compute_seconds,
            cost: self.plan.cost(uncached, cached as u64, c.output_tokens as u64, c.compute_seconds),
            status,
            finish_reason: finish,
            created_at: chrono::Utc::now(),
            slo_class: Some(self.labels.slo),
            slo_met,
            kv_transfer_ms: moved,
            drafted_tokens: c.drafted_tokens as i64,
            accepted_tokens: c.accepted_tokens as i64,
        }
    }
}

/// A request's accounting: its ledger row, opened at admission and kept current while it
/// streams (a crash leaves what was streamed billed), closed with its outcome and SLO verdict.
struct Billing {
    ledger: crate::ledger::Ledger,
    template: Arc<RowTemplate>,
    targets: SloTargets,
    /// Prompt tokens a public prefix covered, and the labels of their metrics.
    public_tokens: usize,
    public_labels: Vec<metrics::Label>,
}

impl Billing {
    /// The engine's progress and completion hooks; `watch` tells whether the answer ended with
    /// tool calls (the finish reason the client saw).
    fn hooks(self, watch: Option<Arc<tools::CallWatch>>) -> (OnProgress, OnComplete) {
        let progress: OnProgress = {
            let (row, ledger) = (self.template.clone(), self.ledger.clone());
            Arc::new(move |c: &Completion| ledger.record(row.row(RequestStatus::Running, None, c, None)))
        };
        let hook: OnComplete = Arc::new(move |outcome: Outcome, c: &Completion| {
            let status = match outcome {
                Outcome::Finished => RequestStatus::Ok,
                Outcome::Cancelled => RequestStatus::Cancelled,
                Outcome::Failed => RequestStatus::Error,
            };
            if self.public_tokens > 0 {
                // Prompt tokens a public prefix covered, and those of them read from the cache
                // (computed once for every tenant: the compute saved).
                metrics::counter!("cachet:public_prefix_tokens_total", self.public_labels.clone())
                    .increment(self.public_tokens as u64);
                metrics::counter!("cachet:public_prefix_cached_tokens_total", self.public_labels.clone())
                    .increment(c.cached_tokens.min(self.public_tokens) as u64);
            }
            // The finish reason the client saw: `tool_calls` for an answer that ended with calls.
            let finish = (outcome == Outcome::Finished).then(|| match (&watch, c.finish_reason) {
                (Some(w), FinishReason::Stop) if w.calls() > 0 => FinishReason::ToolCalls,
                (_, r) => r,
            });
            // The SLO counts the K/V transfer before the engine took the request: the client
            // waited.
            let mut seen = c.clone();
            if let Some(&(_, ms)) = self.template.transfer.ms.get() {
                let moved = Duration::from_secs_f64(ms / 1e3);
                seen.ttft = seen.ttft.map(|t| t + moved);
                seen.e2e += moved;
            }
            self.ledger.record(self.template.row(status, finish, c, slo_verdict(outcome, &seen, &self.targets)));
        });
        (progress, hook)
    }
}

/// What an answer collected: its text, its tokens, and their log-probabilities (if asked).
type Collected = (String, Vec<u32>, Vec<logprobs::Entry>);

/// The rest of a request's answer, and how it ended.
async fn collect(
    first: Event,
    events: &mut RequestStream,
    engine: &EngineHandle,
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
fn slo_verdict(outcome: Outcome, c: &Completion, targets: &SloTargets) -> Option<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
            drafted_tokens: 0,
            accepted_tokens: 0,
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

    #[test]
    fn slo_classes_are_interactive_unless_batch() {
        assert_eq!(slo_class(None).unwrap(), SloClass::Interactive);
        assert_eq!(slo_class(Some("interactive")).unwrap(), SloClass::Interactive);
        assert_eq!(slo_class(Some("batch")).unwrap(), SloClass::Batch);
        assert!(slo_class(Some("fast")).is_err());
    }
}
