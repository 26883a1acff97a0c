//! What callers send the engine and what they get back.

use super::config::SloClass;
use crate::constraint::Grammar;
use crate::generate::{FinishReason, GenerateParams};
use crate::radix::{RetentionKey, Tag, TenantKey};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// The leading tokens of a prompt that are the operator's public system
/// prompt for a chat template: cached once for every tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicPrefix {
    pub template: Arc<str>,
    /// How many leading prompt tokens are public.
    pub tokens: usize,
}

/// Provenance of a span of prompt tokens (e.g. one file of a repository).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSpan {
    pub range: Range<usize>,
    pub tag: Tag,
}

/// How a request ended, for accounting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It ran to a stop token, a stop string or its limit.
    Finished,
    /// The caller dropped its stream.
    Cancelled,
    /// The engine failed it (or refused it: see the error event).
    Failed,
}

/// Called once, on the engine thread, when a request ends in any way —
/// even after its caller has gone (the ledger hook). Must not block.
pub type OnComplete = std::sync::Arc<dyn Fn(Outcome, &Completion) + Send + Sync>;

/// Called on the engine thread when a request is admitted and then every
/// [`PROGRESS_TOKENS`] output tokens, with its accounting so far (the ledger opens a row at
/// admission and keeps it current, so a crash leaves what was streamed billed). Must not block.
pub type OnProgress = std::sync::Arc<dyn Fn(&Completion) + Send + Sync>;

/// Called on the engine thread with each piece of final text of a request, in order (the
/// pieces its events carry); `true` ends the request there, with finish reason `stop`, as a
/// stop string would (the caller reads the answer so far and sees more is useless: a tool call
/// repeated back to back). Must be quick: it runs once per token.
pub type StopWhen = std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Output tokens between two progress reports.
pub const PROGRESS_TOKENS: usize = 32;

/// One generation request.
#[derive(Clone)]
pub struct Request {
    /// Whose request this is (from authentication, never from the body).
    pub tenant: TenantKey,
    /// Narrows cache reuse within the tenant (e.g. per end user).
    pub salt: Option<Arc<str>>,
    pub public: Option<PublicPrefix>,
    pub tokens: Vec<u32>,
    pub spans: Vec<TokenSpan>,
    pub params: GenerateParams,
    pub slo: SloClass,
    /// Higher first, among a tenant's requests of equal deadline.
    pub priority: i32,
    /// Keep this request's prefix warm (behind the tenant's unretained
    /// cache) for this long, under this key (a session id).
    pub retention: Option<(RetentionKey, Duration)>,
    /// Only fill the cache: no output, lowest priority.
    pub prewarm: bool,
    /// The disk tier also keeps the prompt's last partial chunk (up to its last token) when the
    /// prompt is computed: a prefill server's job, whose decode server then computes only the
    /// last token.
    pub kv_tail: bool,
    /// The prompt's K/V arrives from elsewhere (a prefill server, SGLang's `early` reservation):
    /// the engine reserves its slots at admission and fills them as the chunks arrive (see
    /// [`super::RemoteKv`]).
    pub remote_kv: Option<super::RemoteKv>,
    /// A grammar the output must match (compiled beforehand with
    /// [`crate::constraint::Grammars::compile`]).
    pub grammar: Option<Grammar>,
    /// Accounting hook (see [`OnComplete`]).
    pub on_complete: Option<OnComplete>,
    /// The progress hook (see [`OnProgress`]).
    pub on_progress: Option<OnProgress>,
    /// Ends the request when the text so far says so (see [`StopWhen`]).
    pub stop_when: Option<StopWhen>,
    /// The request's tracing span: the engine logs this request's events (queued, admitted,
    /// first token, finished, refused, retracted) and runs its hooks inside it, so they carry
    /// the caller's fields (the HTTP layer's request id, tenant, session). `Span::none()` by
    /// default.
    pub span: tracing::Span,
    /// What admission at the door counted this request as (see `admission`), given back when
    /// the engine takes it in.
    pub(crate) charge: Charge,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("tenant", &self.tenant)
            .field("tokens", &self.tokens.len())
            .field("slo", &self.slo)
            .field("prewarm", &self.prewarm)
            .field("grammar", &self.grammar.is_some())
            .finish_non_exhaustive()
    }
}

impl Request {
    /// A plain interactive request of `tenant` for `tokens`.
    pub fn new(tenant: TenantKey, tokens: Vec<u32>, params: GenerateParams) -> Request {
        Request {
            tenant,
            salt: None,
            public: None,
            tokens,
            spans: Vec::new(),
            params,
            slo: SloClass::Interactive,
            priority: 0,
            retention: None,
            prewarm: false,
            kv_tail: false,
            remote_kv: None,
            grammar: None,
            on_complete: None,
            on_progress: None,
            stop_when: None,
            span: tracing::Span::none(),
            charge: Default::default(),
        }
    }
}

/// Accounting of a finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache (at first admission).
    pub cached_tokens: usize,
    /// Prompt tokens computed (prefill work, including any recomputed after
    /// a retraction).
    pub computed_prefill_tokens: usize,
    pub output_tokens: usize,
    /// Arrival to first scheduling.
    pub queue_time: Duration,
    /// Arrival to first token (none for pre-warm requests).
    pub ttft: Option<Duration>,
    /// Arrival to the end.
    pub e2e: Duration,
    /// This request's share of the forward passes' time.
    pub compute_seconds: f64,
    /// Times it was pushed out of memory and resumed.
    pub retractions: u32,
    /// Speculative decoding: tokens drafted into its passes, and those the model confirmed
    /// (each one an output token that took no pass of its own; `output_tokens` counts it once).
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
}

/// The refusal of a request predicted to have its first token after `predicted` against a
/// `target`: come back when the excess has drained (at least a second from now).
pub(crate) fn overloaded(predicted: Duration, target: Duration) -> RequestError {
    RequestError::Overloaded { retry_after: predicted.saturating_sub(target).max(Duration::from_secs(1)) }
}

impl Completion {
    /// The accounting of a request that never ran (refused or invalid).
    pub(crate) fn refused(prompt_tokens: usize) -> Completion {
        Completion {
            finish_reason: FinishReason::Stop,
            prompt_tokens,
            cached_tokens: 0,
            computed_prefill_tokens: 0,
            output_tokens: 0,
            queue_time: Duration::ZERO,
            ttft: None,
            e2e: Duration::ZERO,
            compute_seconds: 0.0,
            retractions: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
        }
    }
}

/// Why a request was not served.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The engine cannot meet the request's latency target now.
    #[error("overloaded: retry after {retry_after:?}")]
    Overloaded { retry_after: Duration },
    /// Out-of-range parameters, bad token ids, an empty prompt.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The prompt does not fit the context window or the KV pool.
    #[error("{tokens} tokens do not fit (limit {limit})")]
    TooLong { tokens: usize, limit: usize },
    /// The output could not go on under the request's grammar (it allows no
    /// token here, or the grammar engine failed); the message says which.
    #[error("grammar: {0}")]
    Grammar(String),
    /// The engine failed or shut down.
    #[error("engine error: {0}")]
    Engine(String),
}

/// What the stream of a request yields.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A generated token (exactly one event per token, stop tokens
    /// included), the text that became final with it, and its log-probabilities
    /// when the request asked for them ([`crate::generate::GenerateParams::logprobs`]).
    Token { id: u32, text: String, logprobs: Option<Box<crate::sampler::TokenLogprobs>> },
    /// The request is complete.
    Done(Completion),
    /// The request failed; nothing follows.
    Error(RequestError),
}

/// What the door counted a request as; the engine notes the last `seq` it took in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Charge {
    pub seq: u64,
    pub tokens: usize,
    pub hopeful: bool,
}
