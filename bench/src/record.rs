//! What is measured for one request.

use serde::{Deserialize, Serialize};

/// Service-level objective of one request: its time to first token and the
/// mean of its inter-token gaps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Queue-inclusive time to first token, at most (ms).
    pub ttft_ms: f64,
    /// Mean inter-token latency of the request, at most (ms).
    pub itl_ms: f64,
}

impl Default for Slo {
    /// 3 s to the first token, 250 ms per later token.
    fn default() -> Slo {
        Slo { ttft_ms: 3000.0, itl_ms: 250.0 }
    }
}

/// One request of a scenario run.
///
/// Times are milliseconds. `*_ms` offsets (`scheduled_ms`, `sent_ms`,
/// `end_ms`) count from the scenario's start; `ttft_ms` and `e2e_ms` count
/// from `scheduled_ms`, the moment the arrival process wanted the request
/// sent, so a wait in the client (for a free user, a connection, an
/// in-flight slot) is part of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Index of the conversation in the workload.
    pub conversation: usize,
    /// Turn within the conversation (from 0).
    pub turn: usize,
    /// When the arrival process scheduled it.
    pub scheduled_ms: f64,
    /// When the HTTP request went out; `None` if it never did (an earlier
    /// turn of its conversation failed).
    pub sent_ms: Option<f64>,
    /// When it finished (the last byte, or the failure).
    pub end_ms: f64,
    /// Scheduled time to the first token event; `None` when there was none.
    pub ttft_ms: Option<f64>,
    /// Gaps between consecutive token events.
    pub itl_ms: Vec<f64>,
    /// Scheduled time to the end of the stream.
    pub e2e_ms: f64,
    /// Output tokens (reported `completion_tokens`, else token events).
    pub output_tokens: u64,
    /// Prompt tokens as the server reports them.
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens served from the server's cache, when it says.
    pub cached_tokens: Option<u64>,
    /// Speculative decoding, when the server says: the tokens it drafted for this request and
    /// those the model confirmed (cachet: `usage.completion_tokens_details`' accepted and
    /// rejected prediction tokens; llama-server: `timings.draft_n` and `draft_n_accepted`).
    #[serde(default)]
    pub drafted_tokens: Option<u64>,
    #[serde(default)]
    pub accepted_tokens: Option<u64>,
    /// The client's estimate of the prompt's size (characters / 4).
    pub approx_prompt_tokens: u64,
    /// HTTP status, when a response arrived (of the last attempt).
    pub status: Option<u16>,
    /// Attempts repeated after a 429 or 503 (with `--retries`), waiting what `Retry-After` said.
    #[serde(default)]
    pub retries: u32,
    /// Why it failed; `None` for a completed request.
    pub error: Option<String>,
}

impl RequestRecord {
    /// A request scheduled at `scheduled_ms` that has not been sent (yet): nothing measured.
    pub fn new(conversation: usize, turn: usize, scheduled_ms: f64, approx_prompt_tokens: u64) -> RequestRecord {
        RequestRecord {
            conversation,
            turn,
            scheduled_ms,
            sent_ms: None,
            end_ms: scheduled_ms,
            ttft_ms: None,
            itl_ms: Vec::new(),
            e2e_ms: 0.0,
            output_tokens: 0,
            prompt_tokens: None,
            cached_tokens: None,
            drafted_tokens: None,
            accepted_tokens: None,
            approx_prompt_tokens,
            status: None,
            retries: 0,
            error: None,
        }
    }

    /// Whether the request completed (a success status and a stream ending in `[DONE]`).
    pub fn completed(&self) -> bool {
        self.error.is_none()
    }

    /// The mean inter-token gap; `Some(0.0)` for a request with a single token
    /// event, `None` for a failed request or one without tokens.
    pub fn mean_itl_ms(&self) -> Option<f64> {
        if !self.completed() || self.ttft_ms.is_none() {
            return None;
        }
        if self.itl_ms.is_empty() {
            return Some(0.0);
        }
        Some(self.itl_ms.iter().sum::<f64>() / self.itl_ms.len() as f64)
    }

    /// Whether the request completed within both objectives. Failed requests
    /// and requests without any token never meet it.
    pub fn meets(&self, slo: &Slo) -> bool {
        match (self.ttft_ms, self.mean_itl_ms()) {
            (Some(ttft), Some(itl)) => self.completed() && ttft <= slo.ttft_ms && itl <= slo.itl_ms,
            _ => false,
        }
    }
}

/// Gaps between consecutive event times (`times[i + 1] - times[i]`).
pub fn gaps(times: &[f64]) -> Vec<f64> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}
