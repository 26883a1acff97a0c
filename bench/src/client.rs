//! The OpenAI-compatible streaming client: one chat completion, timed.

use crate::record::{gaps, RequestRecord};
use crate::sse::{SseDecoder, StreamAccumulator};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::fmt;
use std::time::{Duration, Instant};

/// A system under test.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// The name results are reported under ("cachet", "llama-server").
    pub name: String,
    /// Base URL, without `/v1` (`http://127.0.0.1:8080`).
    pub base_url: String,
    /// The `model` field to send.
    pub model: String,
    /// Bearer token, if the server wants one.
    #[serde(skip)]
    pub api_key: Option<String>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Target {
    /// The chat completions endpoint.
    pub fn chat_url(&self) -> String {
        format!("{}/v1/chat/completions", self.base_url.trim_end_matches('/'))
    }
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: impl Into<String>) -> Message {
        Message { role: role.to_string(), content: content.into() }
    }
}

/// What to ask: messages and output length.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// Send `"ignore_eos": true`, so the output is exactly `max_tokens` long.
    pub ignore_eos: bool,
}

impl ChatRequest {
    /// The JSON body for `model`.
    pub fn body(&self, model: &str) -> serde_json::Value {
        let mut body = json!({
            "model": model,
            "messages": self.messages,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        body
    }

    /// The client's prompt-size estimate: characters / 4.
    pub fn approx_prompt_tokens(&self) -> u64 {
        self.messages.iter().map(|m| crate::workload::approx_tokens(&m.content) as u64).sum()
    }
}

/// The outcome of one request: its record and the generated text (for the
/// next turn of a conversation).
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The measurements.
    pub record: RequestRecord,
    /// The generated text (empty on failure).
    pub text: String,
}

/// Milliseconds from `origin` to `t`.
pub(crate) fn ms_since(origin: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(origin).as_secs_f64() * 1000.0
}

/// Sends `req` to `target` and times it.
///
/// `origin` is the scenario's start and `scheduled` the instant the arrival
/// process wanted the request sent (TTFT and e2e count from it). Never fails:
/// HTTP errors, connection errors, timeouts, in-stream errors and streams
/// that end without `[DONE]` are recorded in the record's `error`.
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    req: &ChatRequest,
    origin: Instant,
    scheduled: Instant,
    timeout: Duration,
) -> Outcome {
    let sent = Instant::now();
    let mut record = RequestRecord {
        conversation: 0,
        turn: 0,
        scheduled_ms: ms_since(origin, scheduled),
        sent_ms: Some(ms_since(origin, sent)),
        end_ms: 0.0,
        ttft_ms: None,
        itl_ms: Vec::new(),
        e2e_ms: 0.0,
        output_tokens: 0,
        prompt_tokens: None,
        cached_tokens: None,
        approx_prompt_tokens: req.approx_prompt_tokens(),
        status: None,
        error: None,
    };
    let (acc, error) = match tokio::time::timeout(timeout, stream(client, target, req, scheduled, &mut record)).await {
        Ok(r) => r,
        Err(_) => (StreamAccumulator::default(), Some(format!("timed out after {} s", timeout.as_secs_f64()))),
    };
    let end = Instant::now();
    record.end_ms = ms_since(origin, end);
    record.e2e_ms = ms_since(scheduled, end);
    record.ttft_ms = acc.token_times_ms.first().copied();
    record.itl_ms = gaps(&acc.token_times_ms);
    record.output_tokens = acc.output_tokens();
    record.prompt_tokens = acc.prompt_tokens();
    record.cached_tokens = acc.cached_tokens();
    record.error = error;
    let text = if record.error.is_none() { acc.text } else { String::new() };
    Outcome { record, text }
}

/// The request and its stream; returns what was seen and the failure, if any.
async fn stream(
    client: &reqwest::Client,
    target: &Target,
    req: &ChatRequest,
    scheduled: Instant,
    record: &mut RequestRecord,
) -> (StreamAccumulator, Option<String>) {
    let mut acc = StreamAccumulator::default();
    let mut http = client.post(target.chat_url()).json(&req.body(&target.model));
    if let Some(key) = &target.api_key {
        http = http.bearer_auth(key);
    }
    let response = match http.send().await {
        Ok(r) => r,
        Err(e) => return (acc, Some(format!("request failed: {}", error_chain(&e)))),
    };
    let status = response.status();
    record.status = Some(status.as_u16());
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return (acc, Some(format!("HTTP {status}: {}", body.chars().take(300).collect::<String>())));
    }
    let mut decoder = SseDecoder::new();
    let mut bytes = response.bytes_stream();
    while let Some(piece) = bytes.next().await {
        let piece = match piece {
            Ok(p) => p,
            Err(e) => return (acc, Some(format!("the stream broke: {}", error_chain(&e)))),
        };
        let at = ms_since(scheduled, Instant::now());
        for data in decoder.push(&piece) {
            acc.observe(&data, at);
        }
    }
    if let Some(data) = decoder.finish() {
        acc.observe(&data, ms_since(scheduled, Instant::now()));
    }
    let error = match (&acc.error, acc.done) {
        (Some(e), _) => Some(format!("error in the stream: {e}")),
        (None, false) => Some("the stream ended without [DONE]".to_string()),
        (None, true) => None,
    };
    (acc, error)
}

/// An error and its sources, joined with ": ".
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_asks_for_a_stream_with_usage() {
        let req = ChatRequest { messages: vec![Message::new("user", "hi")], max_tokens: 8, ignore_eos: true };
        let b = req.body("m");
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["temperature"], 0);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["messages"][0]["content"], "hi");
        let plain = ChatRequest { ignore_eos: false, ..req }.body("m");
        assert!(plain.get("ignore_eos").is_none());
    }

    #[test]
    fn the_api_key_is_not_printed() {
        let t = Target {
            name: "a".into(),
            base_url: "http://x/".into(),
            model: "m".into(),
            api_key: Some("s3cret".into()),
        };
        assert!(!format!("{t:?}").contains("s3cret"));
        assert_eq!(t.chat_url(), "http://x/v1/chat/completions");
    }
}
