//! Answers: one JSON body, or server-sent events in OpenAI's chunk format
//! (`data: {...}` per chunk, a final chunk with `finish_reason`, an optional
//! usage chunk, then `data: [DONE]`). When the client goes away, actix drops
//! the stream, which drops the engine's request stream and so cancels it.

use super::logprobs::{self, Entry};
use super::tools::parse::{parse_all, CallParser, Delta, ToolSet};
use super::types::{
    ChatChoice, ChatCompletion, ChatMessageOut, CompletionChoice, CustomCall, FunctionCall, TextCompletion, ToolCall,
    Usage,
};
use super::{Answer, AnswerSink, Endpoint};
use crate::error::error_body;
use actix_web::web::Bytes;
use actix_web::HttpResponse;
use cachet_engine::generate::FinishReason;
use cachet_engine::runtime::{Completion, Event, RequestStream};
use serde_json::json;

pub(crate) struct Context {
    pub id: String,
    pub created: i64,
    pub model: String,
    pub endpoint: Endpoint,
    /// cachet's additions (`"cachet"`): in the body, or the first chunk.
    pub extra: Option<serde_json::Value>,
    pub headers: Vec<(&'static str, String)>,
    /// Read tool calls out of the answer (chat answers of requests with tools).
    pub calls: Option<ToolSet>,
    /// The engine, when the request asked for log-probabilities (its tokenizer spells them).
    pub logprobs: Option<cachet_engine::runtime::EngineHandle>,
    /// A thinking model's answer (see [`super::think`]).
    pub think: Option<bool>,
}

/// `tool_calls` when the answer made calls and ended by itself.
fn reason(calls: usize, r: FinishReason) -> &'static str {
    if calls > 0 && r == FinishReason::Stop {
        FinishReason::ToolCalls.as_str()
    } else {
        r.as_str()
    }
}

/// A whole answer's content and calls.
fn split(tools: &ToolSet, text: &str) -> (String, Vec<ToolCall>) {
    let (content, calls) = parse_all(tools, text);
    let calls = calls
        .into_iter()
        .map(|c| match c.custom {
            true => ToolCall {
                id: c.id,
                kind: "custom",
                function: None,
                custom: Some(CustomCall { name: c.name, input: c.arguments }),
            },
            false => ToolCall {
                id: c.id,
                kind: "function",
                function: Some(FunctionCall { name: c.name, arguments: c.arguments }),
                custom: None,
            },
        })
        .collect();
    (content, calls)
}

fn fingerprint() -> String {
    format!("cachet-{}", env!("CARGO_PKG_VERSION"))
}

/// The non-streaming answer.
pub(crate) fn whole(ctx: &Context, text: String, entries: &[Entry], c: &Completion) -> HttpResponse {
    let lp = ctx.logprobs.as_ref().map(|_| entries);
    let usage = Usage::from(c);
    let mut body = if super::chat_shaped(ctx.endpoint) {
        let (reasoning, text) = match ctx.think {
            Some(inside) => super::think::split(inside, &text),
            None => (String::new(), text),
        };
        let (content, tool_calls) = match &ctx.calls {
            Some(tools) => split(tools, &text),
            None => (text, Vec::new()),
        };
        super::count_calls(ctx.endpoint, tool_calls.len());
        let finish = reason(tool_calls.len(), c.finish_reason);
        let content = if content.is_empty() && !tool_calls.is_empty() { None } else { Some(content) };
        serde_json::to_value(ChatCompletion {
            id: ctx.id.clone(),
            object: "chat.completion",
            created: ctx.created,
            model: ctx.model.clone(),
            system_fingerprint: fingerprint(),
            choices: vec![ChatChoice {
                index: 0,
                message: ChatMessageOut {
                    role: "assistant",
                    content,
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls,
                    refusal: None,
                },
                finish_reason: finish,
                logprobs: lp.map(logprobs::chat),
            }],
            usage,
        })
        .unwrap_or_default()
    } else {
        serde_json::to_value(TextCompletion {
            id: ctx.id.clone(),
            object: "text_completion",
            created: ctx.created,
            model: ctx.model.clone(),
            system_fingerprint: fingerprint(),
            choices: vec![CompletionChoice {
                index: 0,
                text,
                finish_reason: c.finish_reason.as_str(),
                logprobs: lp.map(|e| logprobs::completion(e, 0)),
            }],
            usage,
        })
        .unwrap_or_default()
    };
    if let Some(extra) = &ctx.extra {
        body["cachet"] = extra.clone();
    }
    let mut response = HttpResponse::Ok();
    for (name, value) in &ctx.headers {
        response.insert_header((*name, value.as_str()));
    }
    response.json(body)
}

impl Context {
    /// One chunk carrying `text` (and, at the end, a finish reason).
    fn chunk(&self, text: Option<&str>, role: bool, reason: Option<&str>) -> serde_json::Value {
        let mut delta = serde_json::Map::new();
        if role {
            delta.insert("role".into(), json!("assistant"));
        }
        if let Some(t) = text {
            delta.insert("content".into(), json!(t));
        }
        self.chunk_with(delta, text, reason)
    }

    /// A chat chunk with a piece of a thinking model's reasoning.
    fn reasoning_chunk(&self, text: &str) -> serde_json::Value {
        let mut delta = serde_json::Map::new();
        delta.insert("reasoning_content".into(), json!(text));
        self.chunk_with(delta, None, None)
    }

    /// A chat chunk for one piece of a parsed answer, as OpenAI streams calls:
    /// index, id, type and name first, then the arguments in pieces.
    fn delta_chunk(&self, parser: &CallParser, d: &Delta) -> serde_json::Value {
        let mut delta = serde_json::Map::new();
        let call = match d {
            Delta::Content(t) => {
                delta.insert("content".into(), json!(t));
                None
            }
            Delta::Start { index, id, name, custom: false } => Some(json!({"index": index, "id": id,
                "type": "function", "function": {"name": name, "arguments": ""}})),
            Delta::Start { index, id, name, custom: true } => {
                Some(json!({"index": index, "id": id, "type": "custom", "custom": {"name": name, "input": ""}}))
            }
            Delta::Args { index, text } if parser.is_custom(*index) => {
                Some(json!({"index": index, "custom": {"input": text}}))
            }
            Delta::Args { index, text } => Some(json!({"index": index, "function": {"arguments": text}})),
        };
        if let Some(call) = call {
            delta.insert("tool_calls".into(), json!([call]));
        }
        self.chunk_with(delta, None, None)
    }

    fn chunk_with(
        &self,
        delta: serde_json::Map<String, serde_json::Value>,
        text: Option<&str>,
        reason: Option<&str>,
    ) -> serde_json::Value {
        let base = |object: &str, choice: serde_json::Value| {
            json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
                   "system_fingerprint": fingerprint(), "choices": [choice]})
        };
        match self.endpoint {
            Endpoint::ChatCompletions | Endpoint::SessionMessages => base(
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason}),
            ),
            Endpoint::Completions | Endpoint::Responses => base(
                "text_completion",
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason}),
            ),
        }
    }

    fn usage_chunk(&self, c: &Completion) -> serde_json::Value {
        let object = if super::chat_shaped(self.endpoint) { "chat.completion.chunk" } else { "text_completion" };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "system_fingerprint": fingerprint(), "choices": [], "usage": Usage::from(c)})
    }
}

fn data(v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

enum Phase {
    /// The role chunk (chat), then the first event.
    Start(Option<Event>),
    Events,
    Usage(Box<Completion>),
    Done,
    End,
}

/// What the stream collects for the answer sink.
struct Collector {
    sink: Option<AnswerSink>,
    text: String,
    tokens: Vec<u32>,
}

impl Collector {
    /// Notes an event; hands the answer to the sink when it is complete.
    async fn see(&mut self, event: &Option<Event>) {
        match event {
            Some(Event::Token { id, text, .. }) => {
                self.text.push_str(text);
                self.tokens.push(*id);
            }
            Some(Event::Done(_)) => {
                if let Some(sink) = self.sink.take() {
                    let (text, tokens) = (std::mem::take(&mut self.text), std::mem::take(&mut self.tokens));
                    sink(Answer { text, tokens }).await;
                }
            }
            _ => {}
        }
    }
}

/// The streaming answer; `first` is the request's first event (not an error).
pub(crate) fn respond(
    ctx: Context,
    first: Event,
    events: RequestStream,
    include_usage: bool,
    sink: Option<AnswerSink>,
) -> HttpResponse {
    let headers = ctx.headers.clone();
    let collector = Collector { sink, text: String::new(), tokens: Vec::new() };
    let parser = ctx.calls.clone().map(CallParser::new);
    let pending = Pending { think: ctx.think.map(super::think::Think::new), ..Pending::default() };
    let state = (ctx, events, collector, parser, pending, Phase::Start(Some(first)));
    let body = futures_util::stream::unfold(
        state,
        move |(ctx, mut events, mut collector, mut parser, mut pending, phase)| async move {
            let (bytes, next) = match phase {
                Phase::Start(first) => {
                    let mut out = Vec::new();
                    if super::chat_shaped(ctx.endpoint) {
                        let mut role = ctx.chunk(Some(""), true, None);
                        if let Some(extra) = &ctx.extra {
                            role["cachet"] = extra.clone();
                        }
                        out.extend_from_slice(&data(&role));
                    }
                    collector.see(&first).await;
                    let (more, next) = handle(&ctx, parser.as_mut(), &mut pending, first, include_usage);
                    out.extend_from_slice(&more);
                    (Bytes::from(out), next)
                }
                Phase::Events => {
                    let event = events.next().await;
                    collector.see(&event).await;
                    handle(&ctx, parser.as_mut(), &mut pending, event, include_usage)
                }
                Phase::Usage(c) => (data(&ctx.usage_chunk(&c)), Phase::Done),
                Phase::Done => (Bytes::from_static(b"data: [DONE]\n\n"), Phase::End),
                Phase::End => return None,
            };
            Some((Ok::<Bytes, actix_web::Error>(bytes), (ctx, events, collector, parser, pending, next)))
        },
    );
    let mut response = HttpResponse::Ok();
    response
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"));
    for (name, value) in &headers {
        response.insert_header((*name, value.as_str()));
    }
    response.streaming(body)
}

/// Log-probabilities not yet sent: they ride on the next chunk.
#[derive(Default)]
pub(crate) struct Pending {
    entries: Vec<Entry>,
    /// Where the next token's text starts (completions' `text_offset`).
    offset: usize,
    /// Takes a thinking model's reasoning out of the text.
    think: Option<super::think::Think>,
}

impl Pending {
    /// Puts the pending entries on `chunk` (the first of an event's chunks).
    fn attach(&mut self, ctx: &Context, chunk: &mut serde_json::Value) {
        if ctx.logprobs.is_none() || self.entries.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut self.entries);
        chunk["choices"][0]["logprobs"] = match ctx.endpoint {
            Endpoint::Completions => logprobs::completion(&entries, self.offset),
            _ => json!({"content": entries.iter().map(logprobs::chat_token).collect::<Vec<_>>()}),
        };
        self.offset += entries.iter().map(|e| e.token.chars().count()).sum::<usize>();
    }
}

/// The bytes for one engine event and the phase after it; with a call parser, the
/// text goes through it and comes out as content and `tool_calls` deltas.
fn handle(
    ctx: &Context,
    parser: Option<&mut CallParser>,
    pending: &mut Pending,
    event: Option<Event>,
    include_usage: bool,
) -> (Bytes, Phase) {
    match event {
        Some(Event::Token { id, text, logprobs: lp }) => {
            if let (Some(engine), Some(lp)) = (&ctx.logprobs, lp) {
                pending.entries.extend(logprobs::entry(engine.tokenizer(), id, &lp));
            }
            let (reasoning, text) = match pending.think.as_mut() {
                Some(t) => t.push(&text),
                None => (String::new(), text),
            };
            let mut chunks: Vec<serde_json::Value> = Vec::new();
            if !reasoning.is_empty() {
                chunks.push(ctx.reasoning_chunk(&reasoning));
            }
            match parser {
                Some(p) => {
                    let deltas = p.push(&text);
                    chunks.extend(deltas.iter().map(|d| ctx.delta_chunk(p, d)));
                }
                None if text.is_empty() => {}
                None => chunks.push(ctx.chunk(Some(&text), false, None)),
            }
            if let Some(first) = chunks.first_mut() {
                pending.attach(ctx, first);
            }
            (join(&chunks), Phase::Events)
        }
        Some(Event::Done(c)) => {
            let (reasoning, rest) = pending.think.as_mut().map(super::think::Think::finish).unwrap_or_default();
            let mut chunks: Vec<serde_json::Value> = Vec::new();
            if !reasoning.is_empty() {
                chunks.push(ctx.reasoning_chunk(&reasoning));
            }
            let calls = match parser {
                Some(p) => {
                    let mut deltas = p.push(&rest);
                    deltas.extend(p.finish());
                    chunks.extend(deltas.iter().map(|d| ctx.delta_chunk(p, d)));
                    p.calls()
                }
                None => {
                    if !rest.is_empty() {
                        chunks.push(ctx.chunk(Some(&rest), false, None));
                    }
                    0
                }
            };
            super::count_calls(ctx.endpoint, calls);
            chunks.push(ctx.chunk(None, false, Some(reason(calls, c.finish_reason))));
            if let Some(first) = chunks.first_mut() {
                pending.attach(ctx, first);
            }
            (join(&chunks), if include_usage { Phase::Usage(Box::new(c)) } else { Phase::Done })
        }
        Some(Event::Error(e)) => {
            let err = super::engine_error(e);
            (data(&error_body(&err.to_string(), "server_error", None, "stream_error")), Phase::Done)
        }
        None => (data(&error_body("the engine stopped", "server_error", None, "stream_error")), Phase::Done),
    }
}

/// Chunks as server-sent events.
fn join(chunks: &[serde_json::Value]) -> Bytes {
    let mut out = Vec::new();
    for c in chunks {
        out.extend_from_slice(&data(c));
    }
    Bytes::from(out)
}
