//! Answers: one JSON body, or server-sent events in OpenAI's chunk format
//! (`data: {...}` per chunk, a final chunk with `finish_reason`, an optional
//! usage chunk, then `data: [DONE]`). When the client goes away, actix drops
//! the stream, which drops the engine's request stream and so cancels it.

use super::types::{ChatChoice, ChatCompletion, ChatMessageOut, CompletionChoice, TextCompletion, Usage};
use super::{finish_reason, Answer, AnswerSink, Endpoint};
use crate::error::error_body;
use actix_web::web::Bytes;
use actix_web::HttpResponse;
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
}

fn fingerprint() -> String {
    format!("cachet-{}", env!("CARGO_PKG_VERSION"))
}

/// The non-streaming answer.
pub(crate) fn whole(ctx: &Context, text: String, c: &Completion) -> HttpResponse {
    let usage = Usage::from(c);
    let reason = finish_reason(c.finish_reason);
    let mut body = if ctx.endpoint.is_chat() {
        serde_json::to_value(ChatCompletion {
            id: ctx.id.clone(),
            object: "chat.completion",
            created: ctx.created,
            model: ctx.model.clone(),
            system_fingerprint: fingerprint(),
            choices: vec![ChatChoice {
                index: 0,
                message: ChatMessageOut { role: "assistant", content: text },
                finish_reason: reason,
                logprobs: None,
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
            choices: vec![CompletionChoice { index: 0, text, finish_reason: reason, logprobs: None }],
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
        let base = |object: &str, choice: serde_json::Value| {
            json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
                   "system_fingerprint": fingerprint(), "choices": [choice]})
        };
        match self.endpoint {
            Endpoint::Chat | Endpoint::SessionMessage => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                base(
                    "chat.completion.chunk",
                    json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason}),
                )
            }
            Endpoint::Completions => base(
                "text_completion",
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason}),
            ),
        }
    }

    fn usage_chunk(&self, c: &Completion) -> serde_json::Value {
        let object = if self.endpoint.is_chat() { "chat.completion.chunk" } else { "text_completion" };
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
            Some(Event::Token { id, text }) => {
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
    let state = (ctx, events, collector, Phase::Start(Some(first)));
    let body = futures_util::stream::unfold(state, move |(ctx, mut events, mut collector, phase)| async move {
        let (bytes, next) = match phase {
            Phase::Start(first) => {
                let mut out = Vec::new();
                if ctx.endpoint.is_chat() {
                    let mut role = ctx.chunk(Some(""), true, None);
                    if let Some(extra) = &ctx.extra {
                        role["cachet"] = extra.clone();
                    }
                    out.extend_from_slice(&data(&role));
                }
                collector.see(&first).await;
                let (more, next) = handle(&ctx, first, include_usage);
                out.extend_from_slice(&more);
                (Bytes::from(out), next)
            }
            Phase::Events => {
                let event = events.next().await;
                collector.see(&event).await;
                let (bytes, next) = handle(&ctx, event, include_usage);
                (bytes, next)
            }
            Phase::Usage(c) => (data(&ctx.usage_chunk(&c)), Phase::Done),
            Phase::Done => (Bytes::from_static(b"data: [DONE]\n\n"), Phase::End),
            Phase::End => return None,
        };
        Some((Ok::<Bytes, actix_web::Error>(bytes), (ctx, events, collector, next)))
    });
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

/// The bytes for one engine event and the phase after it.
fn handle(ctx: &Context, event: Option<Event>, include_usage: bool) -> (Bytes, Phase) {
    match event {
        Some(Event::Token { text, .. }) => {
            if text.is_empty() {
                (Bytes::new(), Phase::Events)
            } else {
                (data(&ctx.chunk(Some(&text), false, None)), Phase::Events)
            }
        }
        Some(Event::Done(c)) => {
            let last = data(&ctx.chunk(None, false, Some(finish_reason(c.finish_reason))));
            (last, if include_usage { Phase::Usage(Box::new(c)) } else { Phase::Done })
        }
        Some(Event::Error(e)) => {
            let err = super::engine_error(e);
            (data(&error_body(&err.to_string(), "server_error", None, "stream_error")), Phase::Done)
        }
        None => (data(&error_body("the engine stopped", "server_error", None, "stream_error")), Phase::Done),
    }
}
