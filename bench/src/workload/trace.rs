//! Agent traces: the requests real agent clients sent, recorded by
//! `scripts/agents-check.sh` with `AGENTS_RECORD` (through
//! `scripts/record_proxy.py`), replayed by the `agent-trace` scenario.
//!
//! A trace is JSON Lines, one request a line:
//! `{"t": seconds, "client": "qwen", "session": "qwen/1", "path": "/v1/chat/completions", "body": {...}}`.
//! Requests of one session (the same `session`, or without one the same
//! `client` while `t` does not go back) form one agent's tool loop, replayed in
//! order: each request is sent as the client sent it (system prompt, tool
//! list, earlier tool calls and results), once the one before it has ended.
//! Only what a replay must change is changed ([`prepare`]): the model, a
//! stream with usage, temperature 0, `max_tokens` capped, and a mark that
//! makes each replaying agent a different user of the same client.

use crate::client::HttpRequest;
use crate::error::BenchError;
use serde_json::{json, Value};

/// The trace committed with the benchmark: Qwen Code, Codex CLI, opencode, aider and
/// Continue's autocomplete, each driving cachet through the task of `scripts/agents-check.sh`.
pub const EMBEDDED: &str = include_str!("../../traces/agents-2026-12-01.jsonl");

/// The paths a replay sends.
pub const PATHS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/responses"];

/// One recorded request.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    /// The client that sent it (`qwen`, `codex`, ...).
    pub client: String,
    /// One of [`PATHS`].
    pub path: String,
    /// The JSON body as the client sent it.
    pub body: Value,
}

/// One client run: its requests in the order they were sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    /// The client.
    pub client: String,
    /// Its requests.
    pub requests: Vec<TraceRequest>,
}

/// A parsed trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The sessions, in the order they first appear.
    pub sessions: Vec<Session>,
    /// Recorded requests to other paths, left out.
    pub skipped: usize,
}

impl Trace {
    /// [`EMBEDDED`], parsed.
    ///
    /// # Errors
    /// As [`Trace::parse`] (not for the committed trace, which a test parses).
    pub fn embedded() -> Result<Trace, BenchError> {
        Trace::parse(EMBEDDED)
    }

    /// Parses a JSON Lines trace; blank lines are ignored.
    ///
    /// # Errors
    /// [`BenchError::InvalidArgument`] naming the line of a record that is not JSON, lacks
    /// `client`, `path` or an object `body`, or whose `t` is not a number.
    pub fn parse(text: &str) -> Result<Trace, BenchError> {
        let mut sessions: Vec<Session> = Vec::new();
        let mut skipped = 0;
        // The open session's key and last time.
        let mut open: Option<(String, f64)> = None;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = |m: &str| BenchError::InvalidArgument(format!("agent trace line {}: {m}", n + 1));
            let v: Value = serde_json::from_str(line).map_err(|e| bad(&format!("not JSON ({e})")))?;
            let client = v["client"].as_str().ok_or_else(|| bad("no \"client\""))?.to_string();
            let path = v["path"].as_str().ok_or_else(|| bad("no \"path\""))?;
            let t = match v.get("t") {
                None => 0.0,
                Some(t) => t.as_f64().ok_or_else(|| bad("\"t\" is not a number"))?,
            };
            if !v["body"].is_object() {
                return Err(bad("\"body\" is not a JSON object"));
            }
            if !PATHS.contains(&path) {
                skipped += 1;
                continue;
            }
            let key = v["session"].as_str().map_or_else(|| client.clone(), str::to_string);
            let same = matches!(&open, Some((k, last)) if *k == key && (v.get("session").is_some() || t >= *last));
            if !same {
                sessions.push(Session { client: client.clone(), requests: Vec::new() });
            }
            open = Some((key, t));
            let request = TraceRequest { client, path: path.to_string(), body: v["body"].clone() };
            sessions.last_mut().expect("a session was opened").requests.push(request);
        }
        Ok(Trace { sessions, skipped })
    }
}

/// The request agent `agent` sends for `req`: the recorded body with a stream (and usage, on
/// the chat and completions paths), temperature 0, its output limit at most `max_tokens`
/// (`max_tokens`, `max_completion_tokens` or `max_output_tokens`, whichever the client used;
/// `max_tokens` / `max_output_tokens` when it set none), and the agent's mark: `[agent N]` and a
/// newline before the text of the first user message (or at the start of a completion prompt,
/// after a leading fill-in-the-middle token), so agents replaying the same session share the
/// client's system prompt and tools, as users of one client do, but not their tasks.
pub fn prepare(req: &TraceRequest, agent: usize, max_tokens: u32) -> HttpRequest {
    let mut body = req.body.clone();
    let mark = format!("[agent {agent}]\n");
    let responses = req.path == "/v1/responses";
    body["stream"] = json!(true);
    if !responses {
        body["stream_options"] = json!({"include_usage": true});
    }
    body["temperature"] = json!(0);
    let limits: &[&str] = if responses { &["max_output_tokens"] } else { &["max_tokens", "max_completion_tokens"] };
    let mut capped = false;
    for key in limits {
        if let Some(v) = body.get(*key).and_then(Value::as_u64) {
            body[*key] = json!(v.min(u64::from(max_tokens)));
            capped = true;
        }
    }
    if !capped {
        body[limits[0]] = json!(max_tokens);
    }
    match req.path.as_str() {
        "/v1/completions" => mark_prompt(&mut body["prompt"], &mark),
        "/v1/responses" => mark_input(&mut body["input"], &mark),
        _ => mark_messages(&mut body["messages"], &mark),
    }
    HttpRequest { path: req.path.clone(), approx_prompt_tokens: approx_prompt_tokens(&body), body }
}

/// Puts `mark` before the text of the first user message of chat `messages`.
fn mark_messages(messages: &mut Value, mark: &str) {
    if let Some(m) = messages.as_array_mut().and_then(|ms| ms.iter_mut().find(|m| m["role"] == "user")) {
        mark_content(&mut m["content"], mark, "text");
    }
}

/// Puts `mark` before the text of the first user message of a Responses `input`.
fn mark_input(input: &mut Value, mark: &str) {
    match input {
        Value::String(s) => s.insert_str(0, mark),
        Value::Array(items) => {
            if let Some(m) = items.iter_mut().find(|m| m["role"] == "user") {
                mark_content(&mut m["content"], mark, "input_text");
            }
        }
        _ => {}
    }
}

/// Puts `mark` before a string content, or before the first text part of a list of parts.
fn mark_content(content: &mut Value, mark: &str, text_type: &str) {
    match content {
        Value::String(s) => s.insert_str(0, mark),
        Value::Array(parts) => {
            if let Some(Value::String(s)) = parts.iter_mut().find(|p| p["type"] == text_type).map(|p| &mut p["text"]) {
                s.insert_str(0, mark);
            }
        }
        _ => {}
    }
}

/// Puts `mark` at the start of a completion prompt, after a leading `<|fim_prefix|>`.
fn mark_prompt(prompt: &mut Value, mark: &str) {
    const FIM: &str = "<|fim_prefix|>";
    if let Value::String(s) = prompt {
        let at = if s.starts_with(FIM) { FIM.len() } else { 0 };
        s.insert_str(at, mark);
    }
}

/// Characters of what the model reads (messages, input, instructions, prompt, tools) / 4.
pub(crate) fn approx_prompt_tokens(body: &Value) -> u64 {
    let chars: usize = ["messages", "input", "instructions", "prompt", "suffix", "tools"]
        .iter()
        .filter_map(|k| body.get(*k))
        .map(|v| match v {
            Value::String(s) => s.chars().count(),
            other => other.to_string().chars().count(),
        })
        .sum();
    chars.div_ceil(super::CHARS_PER_TOKEN) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = concat!(
        r#"{"t": 1.0, "client": "continue", "path": "/v1/completions", "body": {"prompt": "<|fim_prefix|>def f():<|fim_suffix|><|fim_middle|>", "max_tokens": 64, "stop": ["\n\n"]}}"#,
        "\n",
        r#"{"t": 2.0, "client": "continue", "path": "/v1/completions", "body": {"prompt": "x = ", "max_tokens": 8}}"#,
        "\n\n",
        r#"{"t": 0.5, "client": "opencode", "path": "/v1/chat/completions", "body": {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "task"}]}], "tools": [{"type": "function"}], "max_completion_tokens": 32000}}"#,
        "\n",
        r#"{"t": 9.0, "client": "opencode", "path": "/v1/models", "body": {}}"#,
        "\n",
        r#"{"t": 0.1, "client": "opencode", "path": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "again"}]}}"#,
        "\n",
        r#"{"t": 5.0, "client": "codex", "session": "codex/1", "path": "/v1/responses", "body": {"instructions": "I", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run it"}]}]}}"#,
        "\n",
        r#"{"t": 1.0, "client": "codex", "session": "codex/1", "path": "/v1/responses", "body": {"input": "go on", "max_output_tokens": 10}}"#,
        "\n",
    );

    #[test]
    fn sessions_follow_the_client_and_the_clock_or_the_recorded_session() {
        let trace = Trace::parse(TRACE).unwrap();
        let shape: Vec<(&str, usize)> = trace.sessions.iter().map(|s| (s.client.as_str(), s.requests.len())).collect();
        // opencode's clock went back: a second run. codex's did too, but within one named session.
        assert_eq!(shape, vec![("continue", 2), ("opencode", 1), ("opencode", 1), ("codex", 2)]);
        assert_eq!(trace.skipped, 1, "GET-like paths are left out");
    }

    #[test]
    fn a_replayed_request_streams_with_capped_output_and_the_agents_mark() {
        let trace = Trace::parse(TRACE).unwrap();
        let fim = prepare(&trace.sessions[0].requests[0], 3, 16);
        assert_eq!(fim.path, "/v1/completions");
        assert_eq!(fim.body["prompt"], "<|fim_prefix|>[agent 3]\ndef f():<|fim_suffix|><|fim_middle|>");
        assert_eq!((fim.body["max_tokens"].as_u64(), fim.body["stream"].as_bool()), (Some(16), Some(true)));
        assert_eq!(fim.body["stream_options"]["include_usage"], true);
        assert_eq!(fim.body["stop"][0], "\n\n", "the rest as recorded");
        assert_eq!(prepare(&trace.sessions[0].requests[1], 0, 16).body["max_tokens"], 8, "a lower limit stays");

        let chat = prepare(&trace.sessions[1].requests[0], 1, 64);
        assert_eq!(chat.body["messages"][0]["content"], "S", "the system prompt is shared");
        assert_eq!(chat.body["messages"][1]["content"][0]["text"], "[agent 1]\ntask");
        assert_eq!(chat.body["max_completion_tokens"], 64);
        assert!(chat.body.get("max_tokens").is_none());
        assert_eq!(chat.body["temperature"], 0);
        assert!(chat.approx_prompt_tokens > 0);
        assert_eq!(prepare(&trace.sessions[2].requests[0], 0, 64).body["max_tokens"], 64, "set when absent");

        let first = prepare(&trace.sessions[3].requests[0], 2, 64);
        assert_eq!(first.body["input"][0]["content"][0]["text"], "[agent 2]\nrun it");
        assert_eq!(first.body["max_output_tokens"], 64);
        assert!(first.body.get("stream_options").is_none(), "the Responses API has no stream_options");
        let next = prepare(&trace.sessions[3].requests[1], 2, 64);
        assert_eq!(
            (next.body["input"].as_str(), next.body["max_output_tokens"].as_u64()),
            (Some("[agent 2]\ngo on"), Some(10))
        );
    }

    #[test]
    fn bad_records_name_their_line() {
        for (text, needle) in [
            ("{\"client\": \"a\", \"path\": \"/v1/completions\", \"body\": {}}\nnot json", "line 2: not JSON"),
            ("{\"path\": \"/v1/completions\", \"body\": {}}", "line 1: no \"client\""),
            ("{\"client\": \"a\", \"body\": {}}", "no \"path\""),
            ("{\"client\": \"a\", \"path\": \"/v1/completions\", \"body\": []}", "not a JSON object"),
            ("{\"t\": \"soon\", \"client\": \"a\", \"path\": \"/v1/completions\", \"body\": {}}", "not a number"),
        ] {
            let e = Trace::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        assert!(Trace::parse("\n\n").unwrap().sessions.is_empty());
    }

    #[test]
    fn the_committed_trace_has_a_tool_loop_of_each_client() {
        let trace = Trace::embedded().unwrap();
        for client in ["qwen", "codex", "opencode", "aider", "continue"] {
            assert!(trace.sessions.iter().any(|s| s.client == client), "{client} is missing from the trace");
        }
        // Tool calls went out and their results came back within a session.
        let round_trip = |s: &Session| {
            s.requests.iter().any(|r| {
                let text = r.body.to_string();
                text.contains("\"role\":\"tool\"") || text.contains("function_call_output")
            })
        };
        for client in ["qwen", "codex", "opencode"] {
            assert!(
                trace.sessions.iter().any(|s| s.client == client && round_trip(s)),
                "no {client} session sends a tool result back"
            );
        }
    }
}
