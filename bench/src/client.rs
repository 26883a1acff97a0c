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
    /// Bearer tokens of several tenants: conversation `i` sends key `i` mod their number instead
    /// of `api_key` (a multi-tenant run; empty: every conversation sends `api_key`).
    #[serde(skip)]
    pub tenant_keys: Vec<String>,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("tenant_keys", &self.tenant_keys.len())
            .finish()
    }
}

impl Target {
    /// The target as conversation `i` calls it: with its tenant's key when there are several.
    pub fn for_conversation(&self, i: usize) -> Target {
        let mut t = self.clone();
        if !self.tenant_keys.is_empty() {
            t.api_key = Some(self.tenant_keys[i % self.tenant_keys.len()].clone());
        }
        t
    }

    /// The chat completions endpoint.
    pub fn chat_url(&self) -> String {
        self.url(CHAT_PATH)
    }

    /// The URL of `path` (`/v1/...`) on this target.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url.trim_end_matches('/'))
    }
}

/// The chat completions path.
pub const CHAT_PATH: &str = "/v1/chat/completions";

/// One HTTP request of a workload: where it goes and its JSON body. The body's `model` is
/// set to the target's when it is sent; the body must ask for a stream.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpRequest {
    /// The path (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`).
    pub path: String,
    /// The JSON body (its `model` is replaced).
    pub body: serde_json::Value,
    /// The client's estimate of the prompt's size in tokens.
    pub approx_prompt_tokens: u64,
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

    /// The HTTP request to `/v1/chat/completions`.
    pub fn http(&self) -> HttpRequest {
        HttpRequest {
            path: CHAT_PATH.to_string(),
            body: self.body(""),
            approx_prompt_tokens: self.approx_prompt_tokens(),
        }
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
/// process wanted the request sent (TTFT and e2e count from it, across
/// retries). A 429 or 503 is retried up to `retries` times, after what its
/// `Retry-After` says (1 s when it says nothing, at most 60 s), as a
/// well-behaved client would, while the timeout allows. Never fails: HTTP
/// errors, connection errors, timeouts, in-stream errors and streams that end
/// without `[DONE]` are recorded in the record's `error`.
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    req: &HttpRequest,
    origin: Instant,
    scheduled: Instant,
    timeout: Duration,
    retries: u32,
) -> Outcome {
    let sent = Instant::now();
    let deadline = sent + timeout;
    let mut record = RequestRecord::new(0, 0, ms_since(origin, scheduled), req.approx_prompt_tokens);
    record.sent_ms = Some(ms_since(origin, sent));
    let (acc, error) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (acc, error, retry_after) =
            match tokio::time::timeout(left, stream(client, target, req, scheduled, &mut record)).await {
                Ok(r) => r,
                Err(_) => {
                    (StreamAccumulator::default(), Some(format!("timed out after {} s", timeout.as_secs_f64())), None)
                }
            };
        match retry_after {
            Some(wait) if record.retries < retries && Instant::now() + wait < deadline => {
                record.retries += 1;
                tokio::time::sleep(wait).await;
            }
            _ => break (acc, error),
        }
    };
    let end = Instant::now();
    record.end_ms = ms_since(origin, end);
    record.e2e_ms = ms_since(scheduled, end);
    record.ttft_ms = acc.token_times_ms.first().copied();
    record.itl_ms = gaps(&acc.token_times_ms);
    record.output_tokens = acc.output_tokens();
    record.prompt_tokens = acc.prompt_tokens();
    record.cached_tokens = acc.cached_tokens();
    (record.drafted_tokens, record.accepted_tokens) = acc.drafts().unzip();
    record.error = error;
    let text = if record.error.is_none() { acc.text } else { String::new() };
    Outcome { record, text }
}

/// How long a 429 or 503 response asks the client to wait: its `Retry-After` in seconds
/// (1 s when absent or not a number of seconds), at most 60 s. `None` for other statuses.
pub fn retry_after(status: u16, header: Option<&str>) -> Option<Duration> {
    if status != 429 && status != 503 {
        return None;
    }
    let secs = header.and_then(|h| h.trim().parse::<f64>().ok()).filter(|s| s.is_finite() && *s >= 0.0).unwrap_or(1.0);
    Some(Duration::from_secs_f64(secs.min(60.0)))
}

/// The request and its stream; returns what was seen, the failure, if any, and for a 429 or
/// 503 how long to wait before trying again.
async fn stream(
    client: &reqwest::Client,
    target: &Target,
    req: &HttpRequest,
    scheduled: Instant,
    record: &mut RequestRecord,
) -> (StreamAccumulator, Option<String>, Option<Duration>) {
    let mut acc = StreamAccumulator::default();
    let mut body = req.body.clone();
    body["model"] = json!(target.model);
    let mut http = client.post(target.url(&req.path)).json(&body);
    if let Some(key) = &target.api_key {
        http = http.bearer_auth(key);
    }
    let response = match http.send().await {
        Ok(r) => r,
        Err(e) => return (acc, Some(format!("request failed: {}", error_chain(&e))), None),
    };
    let status = response.status();
    record.status = Some(status.as_u16());
    if !status.is_success() {
        let wait = retry_after(
            status.as_u16(),
            response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()),
        );
        let body = response.text().await.unwrap_or_default();
        return (acc, Some(format!("HTTP {status}: {}", body.chars().take(300).collect::<String>())), wait);
    }
    let mut decoder = SseDecoder::new();
    let mut bytes = response.bytes_stream();
    while let Some(piece) = bytes.next().await {
        let piece = match piece {
            Ok(p) => p,
            Err(e) => return (acc, Some(format!("the stream broke: {}", error_chain(&e))), None),
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
    (acc, error, None)
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
            tenant_keys: vec!["other".into()],
        };
        assert!(!format!("{t:?}").contains("s3cret"));
        assert_eq!(t.chat_url(), "http://x/v1/chat/completions");
    }

    #[test]
    fn retry_after_reads_seconds_and_caps_them() {
        assert_eq!(retry_after(429, Some("3")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(503, Some(" 0.5 ")), Some(Duration::from_millis(500)));
        assert_eq!(retry_after(429, None), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(429, Some("Wed, 21 Oct 2026 07:28:00 GMT")), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(429, Some("-4")), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(429, Some("3600")), Some(Duration::from_secs(60)));
        assert_eq!(retry_after(500, Some("3")), None);
        assert_eq!(retry_after(400, None), None);
    }

    /// A server that refuses the first `refusals` requests with 429 (`Retry-After: 0`) and then
    /// streams one token; returns its address and how many requests it saw.
    async fn refusing_server(refusals: usize) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { return };
                let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // Read the head and the body (the client sends a Content-Length).
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(k) = sock.read(&mut chunk).await {
                    if k == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..k]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(head_end) = text.find("\r\n\r\n") {
                        let length = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                            })
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= head_end + 4 + length {
                            break;
                        }
                    }
                }
                let reply = if n < refusals {
                    "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 0\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                        .to_string()
                } else {
                    let body = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                };
                let _ = sock.write_all(reply.as_bytes()).await;
                let _ = sock.shutdown().await;
            }
        });
        (addr, seen)
    }

    #[tokio::test]
    async fn a_refused_request_is_retried_and_timed_from_its_first_schedule() {
        let req = ChatRequest { messages: vec![Message::new("user", "hi")], max_tokens: 1, ignore_eos: false }.http();
        let client = reqwest::Client::new();
        let origin = Instant::now();
        let t = |base_url: String| Target {
            name: "s".into(),
            base_url,
            model: "m".into(),
            api_key: None,
            tenant_keys: Vec::new(),
        };

        // Two refusals, two retries allowed: it completes on the third attempt.
        let (addr, seen) = refusing_server(2).await;
        let scheduled = Instant::now();
        let out = send(&client, &t(addr), &req, origin, scheduled, Duration::from_secs(10), 2).await;
        assert_eq!(out.record.error, None);
        assert_eq!((out.record.retries, out.record.status), (2, Some(200)));
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(out.text, "hi");
        assert!(out.record.ttft_ms.unwrap() <= out.record.e2e_ms);

        // One retry allowed: the second refusal is the answer.
        let (addr, seen) = refusing_server(2).await;
        let out = send(&client, &t(addr), &req, origin, Instant::now(), Duration::from_secs(10), 1).await;
        assert_eq!((out.record.retries, out.record.status), (1, Some(429)));
        assert!(out.record.error.as_deref().unwrap().starts_with("HTTP 429"), "{:?}", out.record.error);
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 2);

        // Without retries, as before.
        let (addr, _) = refusing_server(1).await;
        let out = send(&client, &t(addr), &req, origin, Instant::now(), Duration::from_secs(10), 0).await;
        assert_eq!((out.record.retries, out.record.status), (0, Some(429)));
    }
}
