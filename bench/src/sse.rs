//! Server-sent events of OpenAI-style streaming chat completions,
//! completions and Responses.
//!
//! [`SseDecoder`] splits the byte stream into `data:` payloads;
//! [`parse_event`] reads one payload; [`StreamAccumulator`] folds the
//! timestamped events of one request into what the benchmark records.
//!
//! What counts as a token: every chunk whose `choices[0].delta.content` (or
//! `choices[0].text`, or the arguments of `choices[0].delta.tool_calls`) is a
//! non-empty string is one *token event* (a server that packs several tokens
//! into one chunk is seen as one event: the client cannot know); in a
//! Responses stream, every non-empty `response.output_text.delta` or
//! `response.function_call_arguments.delta`, and `response.completed` (or
//! `response.incomplete`) ends the stream as `[DONE]` does, its
//! `response.usage` read like a chat usage. Output
//! tokens are `usage.completion_tokens` when the server reports it, else the
//! number of token events. Cached prompt tokens are
//! `usage.prompt_tokens_details.cached_tokens` when present, else
//! llama-server's `timings.cache_n`, else unknown.

use serde_json::Value;

/// Splits a byte stream into the `data` payloads of its events.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of the line being received.
    line: Vec<u8>,
    /// `data` lines of the event being received.
    data: Option<String>,
}

impl SseDecoder {
    /// A decoder at the start of a stream.
    pub fn new() -> SseDecoder {
        SseDecoder::default()
    }

    /// Feeds `bytes`; returns the payloads of the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.line_done(&line, &mut out);
        }
        out
    }

    /// Ends the stream: returns the payload of an event not followed by a blank line.
    pub fn finish(&mut self) -> Option<String> {
        let line = std::mem::take(&mut self.line);
        let mut out = Vec::new();
        if !line.is_empty() {
            self.line_done(&line, &mut out);
        }
        out.pop().or_else(|| self.data.take())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<String>) {
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                out.push(d);
            }
            return;
        }
        let Some(rest) = line.strip_prefix(b"data:") else {
            return; // comments (`:`), `event:`, `id:`, `retry:`
        };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        let text = String::from_utf8_lossy(rest);
        match &mut self.data {
            Some(d) => {
                d.push('\n');
                d.push_str(&text);
            }
            None => self.data = Some(text.into_owned()),
        }
    }
}

/// Token counts a chunk reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UsageReport {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    pub completion_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: Option<u64>,
    /// `usage.completion_tokens_details.accepted_prediction_tokens` (cachet: drafted tokens the
    /// model confirmed).
    pub accepted_prediction_tokens: Option<u64>,
    /// `usage.completion_tokens_details.rejected_prediction_tokens`.
    pub rejected_prediction_tokens: Option<u64>,
}

/// One parsed event.
#[derive(Clone, Debug, PartialEq)]
pub enum SseEvent {
    /// `data: [DONE]`.
    Done,
    /// A JSON chunk.
    Chunk(Chunk),
}

/// What the benchmark reads from one JSON chunk.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    /// `choices[0].delta.content` (or `choices[0].text`) when non-empty.
    pub content: Option<String>,
    /// `usage`, when present and not null.
    pub usage: Option<UsageReport>,
    /// llama-server's `timings.cache_n`.
    pub cache_n: Option<u64>,
    /// llama-server's `timings.prompt_n` (prompt tokens it evaluated).
    pub prompt_n: Option<u64>,
    /// llama-server's `timings.draft_n` and `timings.draft_n_accepted` (speculative decoding).
    pub draft_n: Option<(u64, u64)>,
    /// The message of an in-stream `error` object.
    pub error: Option<String>,
    /// A Responses stream's last event (`response.completed` or `response.incomplete`).
    pub completes: bool,
}

/// Parses one `data` payload.
///
/// # Errors
/// A payload that is neither `[DONE]` nor a JSON object, described.
pub fn parse_event(data: &str) -> Result<SseEvent, String> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(SseEvent::Done);
    }
    let v: Value = serde_json::from_str(data).map_err(|e| format!("a stream chunk is not JSON ({e}): {data:.200}"))?;
    if !v.is_object() {
        return Err(format!("a stream chunk is not a JSON object: {data:.200}"));
    }
    if let Some(kind) = v["type"].as_str().filter(|k| k.starts_with("response.") || *k == "error") {
        return Ok(SseEvent::Chunk(responses_event(&v, kind)));
    }
    let choice = &v["choices"][0];
    let arguments: String = choice["delta"]["tool_calls"]
        .as_array()
        .map(|calls| calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect())
        .unwrap_or_default();
    let content = choice["delta"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .or_else(|| Some(arguments).filter(|a| !a.is_empty()));
    let usage = v.get("usage").filter(|u| u.is_object()).map(|u| UsageReport {
        prompt_tokens: u["prompt_tokens"].as_u64(),
        completion_tokens: u["completion_tokens"].as_u64(),
        cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64(),
        accepted_prediction_tokens: u["completion_tokens_details"]["accepted_prediction_tokens"].as_u64(),
        rejected_prediction_tokens: u["completion_tokens_details"]["rejected_prediction_tokens"].as_u64(),
    });
    let error = v.get("error").filter(|e| !e.is_null()).map(|e| match e["message"].as_str() {
        Some(m) => m.to_string(),
        None => e.to_string(),
    });
    Ok(SseEvent::Chunk(Chunk {
        content,
        usage,
        cache_n: v["timings"]["cache_n"].as_u64(),
        prompt_n: v["timings"]["prompt_n"].as_u64(),
        draft_n: v["timings"]["draft_n"].as_u64().map(|n| (n, v["timings"]["draft_n_accepted"].as_u64().unwrap_or(0))),
        error,
        completes: false,
    }))
}

/// One event of a Responses stream (`type` is `response.*` or `error`).
fn responses_event(v: &Value, kind: &str) -> Chunk {
    let mut chunk = Chunk::default();
    match kind {
        "response.output_text.delta" | "response.function_call_arguments.delta" => {
            chunk.content = v["delta"].as_str().filter(|s| !s.is_empty()).map(str::to_string);
        }
        "response.completed" | "response.incomplete" => {
            chunk.completes = true;
            let u = &v["response"]["usage"];
            if u.is_object() {
                chunk.usage = Some(UsageReport {
                    prompt_tokens: u["input_tokens"].as_u64(),
                    completion_tokens: u["output_tokens"].as_u64(),
                    cached_tokens: u["input_tokens_details"]["cached_tokens"].as_u64(),
                    accepted_prediction_tokens: None,
                    rejected_prediction_tokens: None,
                });
            }
        }
        "response.failed" => {
            let e = &v["response"]["error"];
            chunk.error = Some(e["message"].as_str().map_or_else(|| e.to_string(), str::to_string));
        }
        "error" => {
            let m = v["message"].as_str().or_else(|| v["error"]["message"].as_str());
            chunk.error = Some(m.map_or_else(|| v.to_string(), str::to_string));
        }
        _ => {}
    }
    chunk
}

/// The timestamped events of one request, folded.
#[derive(Clone, Debug, Default)]
pub struct StreamAccumulator {
    /// Milliseconds (from the request's scheduled time) of each token event.
    pub token_times_ms: Vec<f64>,
    /// The generated text.
    pub text: String,
    /// The last usage report seen.
    pub usage: Option<UsageReport>,
    /// The last `timings.cache_n` seen.
    pub cache_n: Option<u64>,
    /// The last `timings.prompt_n` seen.
    pub prompt_n: Option<u64>,
    /// The last `timings.draft_n` (and `draft_n_accepted`) seen.
    pub draft_n: Option<(u64, u64)>,
    /// Whether `[DONE]` (or a Responses stream's last event) arrived.
    pub done: bool,
    /// The first in-stream error or unparseable chunk.
    pub error: Option<String>,
}

impl StreamAccumulator {
    /// Notes the event `data` received at `at_ms`.
    pub fn observe(&mut self, data: &str, at_ms: f64) {
        match parse_event(data) {
            Ok(SseEvent::Done) => self.done = true,
            Ok(SseEvent::Chunk(c)) => {
                if let Some(t) = c.content {
                    self.token_times_ms.push(at_ms);
                    self.text.push_str(&t);
                }
                if c.usage.is_some() {
                    self.usage = c.usage;
                }
                self.cache_n = c.cache_n.or(self.cache_n);
                self.prompt_n = c.prompt_n.or(self.prompt_n);
                self.draft_n = c.draft_n.or(self.draft_n);
                if self.error.is_none() {
                    self.error = c.error;
                }
                self.done |= c.completes;
            }
            Err(e) => {
                if self.error.is_none() {
                    self.error = Some(e);
                }
            }
        }
    }

    /// Output tokens: the reported `completion_tokens`, else the token events.
    pub fn output_tokens(&self) -> u64 {
        self.usage.as_ref().and_then(|u| u.completion_tokens).unwrap_or(self.token_times_ms.len() as u64)
    }

    /// Prompt tokens as the server reports them (llama-server: cached + evaluated).
    pub fn prompt_tokens(&self) -> Option<u64> {
        self.usage.as_ref().and_then(|u| u.prompt_tokens).or(match (self.cache_n, self.prompt_n) {
            (Some(c), Some(p)) => Some(c + p),
            _ => None,
        })
    }

    /// Drafted and confirmed tokens (speculative decoding): the usage's accepted and rejected
    /// prediction tokens, else llama-server's `timings.draft_n` and `draft_n_accepted`, else
    /// unknown.
    pub fn drafts(&self) -> Option<(u64, u64)> {
        let from_usage = self.usage.as_ref().and_then(|u| {
            let accepted = u.accepted_prediction_tokens?;
            Some((accepted + u.rejected_prediction_tokens.unwrap_or(0), accepted))
        });
        from_usage.or(self.draft_n)
    }

    /// Cached prompt tokens: `cached_tokens`, else `timings.cache_n`, else unknown.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.usage.as_ref().and_then(|u| u.cached_tokens).or(self.cache_n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream as cachet writes it: role chunk, tokens, finish, usage, DONE.
    const CACHET: &str = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"cachet\":{\"x\":1}}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":3,\"total_tokens\":123,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n",
        "data: [DONE]\n\n",
    );

    fn fold(stream: &str, pieces: usize) -> StreamAccumulator {
        // Feed in uneven pieces so events straddle reads.
        let bytes = stream.as_bytes();
        let step = bytes.len().div_ceil(pieces);
        let mut dec = SseDecoder::new();
        let mut acc = StreamAccumulator::default();
        let mut t = 0.0;
        for piece in bytes.chunks(step) {
            for data in dec.push(piece) {
                t += 10.0;
                acc.observe(&data, t);
            }
        }
        if let Some(d) = dec.finish() {
            acc.observe(&d, t + 10.0);
        }
        acc
    }

    #[test]
    fn a_cachet_stream() {
        for pieces in [1, 3, 7, 50] {
            let acc = fold(CACHET, pieces);
            assert!(acc.done);
            assert_eq!(acc.error, None);
            assert_eq!(acc.text, "Hello!");
            assert_eq!(acc.token_times_ms, vec![20.0, 30.0, 40.0], "the role chunk is not a token");
            assert_eq!(acc.output_tokens(), 3);
            assert_eq!(acc.prompt_tokens(), Some(120));
            assert_eq!(acc.cached_tokens(), Some(96));
        }
    }

    #[test]
    fn a_llama_server_final_chunk_with_timings() {
        let stream = concat!(
            "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"a\"}}],\"object\":\"chat.completion.chunk\"}\r\n\r\n",
            "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"b\"}}],\"object\":\"chat.completion.chunk\"}\r\n\r\n",
            "data: {\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"delta\":{}}],\"object\":\"chat.completion.chunk\",",
            "\"timings\":{\"cache_n\":512,\"prompt_n\":88,\"prompt_ms\":40.1,\"predicted_n\":2}}\r\n\r\n",
            "data: [DONE]\r\n\r\n",
        );
        let acc = fold(stream, 4);
        assert!(acc.done);
        assert_eq!(acc.output_tokens(), 2, "no usage: the token events");
        assert_eq!(acc.cached_tokens(), Some(512));
        assert_eq!(acc.prompt_tokens(), Some(600));
    }

    #[test]
    fn usage_cached_tokens_win_over_timings_and_missing_is_unknown() {
        let mut acc = StreamAccumulator::default();
        acc.observe(r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}},"timings":{"cache_n":9,"prompt_n":1}}"#, 1.0);
        assert_eq!(acc.cached_tokens(), Some(4));
        assert_eq!(acc.prompt_tokens(), Some(10));
        let mut bare = StreamAccumulator::default();
        bare.observe(r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1}}"#, 1.0);
        assert_eq!(bare.cached_tokens(), None);
    }

    #[test]
    fn in_stream_errors_and_garbage_are_recorded() {
        let mut acc = StreamAccumulator::default();
        acc.observe(r#"{"error":{"message":"the engine stopped","type":"server_error"}}"#, 1.0);
        acc.observe("[DONE]", 2.0);
        assert_eq!(acc.error.as_deref(), Some("the engine stopped"));
        let mut bad = StreamAccumulator::default();
        bad.observe("not json", 1.0);
        assert!(bad.error.is_some());
    }

    #[test]
    fn tool_call_arguments_are_token_events() {
        let stream = concat!(
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"path\\\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\": 1}\"}}]}}]}\n\n",
            "data: [DONE]\n\n",
        );
        let acc = fold(stream, 3);
        assert!(acc.done);
        assert_eq!(acc.token_times_ms.len(), 2, "the call's header with empty arguments is not a token");
        assert_eq!(acc.text, "{\"path\": 1}");
    }

    #[test]
    fn a_responses_stream() {
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\"}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{}\"}\n\n",
            "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"Hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":900,\"output_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":640}}}}\n\n",
        );
        let acc = fold(stream, 5);
        assert!(acc.done, "response.completed ends the stream");
        assert_eq!(acc.error, None);
        assert_eq!(acc.token_times_ms.len(), 2);
        assert_eq!((acc.prompt_tokens(), acc.output_tokens(), acc.cached_tokens()), (Some(900), 5, Some(640)));

        let mut failed = StreamAccumulator::default();
        failed.observe(
            r#"{"type":"response.failed","response":{"error":{"code":"server_error","message":"boom"}}}"#,
            1.0,
        );
        assert_eq!((failed.error.as_deref(), failed.done), (Some("boom"), false));
        let mut error = StreamAccumulator::default();
        error.observe(r#"{"type":"error","code":"invalid_request","message":"bad input"}"#, 1.0);
        assert_eq!(error.error.as_deref(), Some("bad input"));
    }

    #[test]
    fn multi_line_data_and_comments() {
        let mut dec = SseDecoder::new();
        let out = dec.push(b": keep-alive\n\nevent: x\ndata: one\ndata: two\n\ndata:[DONE]\n\n");
        assert_eq!(out, vec!["one\ntwo".to_string(), "[DONE]".to_string()]);
        assert_eq!(dec.push(b"data: tail"), Vec::<String>::new());
        assert_eq!(dec.finish().as_deref(), Some("tail"));
    }

    #[test]
    fn drafts_from_cachet_usage_or_llama_server_timings() {
        let mut cachet = StreamAccumulator::default();
        cachet.observe(
            r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"accepted_prediction_tokens":6,"rejected_prediction_tokens":2}}}"#,
            1.0,
        );
        assert_eq!(cachet.drafts(), Some((8, 6)));
        let mut llama = StreamAccumulator::default();
        llama.observe(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"timings":{"cache_n":0,"prompt_n":10,"draft_n":12,"draft_n_accepted":7}}"#,
            1.0,
        );
        assert_eq!(llama.drafts(), Some((12, 7)));
        let mut neither = StreamAccumulator::default();
        neither.observe(r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":9}}"#, 1.0);
        assert_eq!(neither.drafts(), None, "a server that says nothing about drafts");
    }
}
