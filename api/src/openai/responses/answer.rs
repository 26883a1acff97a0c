//! The answer of `POST /v1/responses`: a `response` object, or its stream of
//! events (`response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its text, arguments or custom tool input deltas and `…done`
//! events, `response.output_item.done`, and last `response.completed`, or
//! `response.incomplete` when the answer hit its token limit, or
//! `response.failed`). Both are built by one [`Builder`] from the same deltas
//! the chat endpoints stream, so a streamed answer and a whole one agree.

use super::super::logprobs;
use super::super::think::Think;
use super::super::tools::parse::{CallParser, Delta, ToolSet};
use super::super::types::Usage;
use crate::error::ApiError;
use actix_web::web::Bytes;
use actix_web::HttpResponse;
use cachet_engine::generate::FinishReason;
use cachet_engine::runtime::{Completion, EngineHandle, Event, RequestStream};
use serde_json::{json, Map, Value};
use uuid::Uuid;

/// The output item being written.
enum Open {
    Message {
        id: String,
        text: String,
        logprobs: Vec<Value>,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
    /// A custom tool's call; `input` is its free-form input.
    Custom {
        id: String,
        call_id: String,
        name: String,
        input: String,
    },
    /// A thinking model's reasoning.
    Reasoning {
        id: String,
        text: String,
    },
}

/// Turns an answer's deltas into output items and events.
pub(crate) struct Builder {
    id: String,
    created: i64,
    model: String,
    /// The request's settings the response repeats.
    echo: Map<String, Value>,
    seq: u64,
    /// Finished output items.
    items: Vec<Value>,
    open: Option<Open>,
    /// Whitespace not yet known to be content (dropped around calls, as chat's `content: null`).
    held: String,
    /// Events not yet taken.
    events: Vec<(&'static str, Value)>,
    /// Log-probabilities of tokens whose text has not been sent yet.
    logprobs: Vec<Value>,
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::new_v4().simple())
}

fn usage(c: &Completion) -> Value {
    let u = Usage::from(c);
    json!({"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
           "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": u.total_tokens})
}

impl Builder {
    pub(crate) fn new(id: String, created: i64, model: String, echo: Map<String, Value>) -> Builder {
        Builder {
            id,
            created,
            model,
            echo,
            seq: 0,
            items: Vec::new(),
            open: None,
            held: String::new(),
            events: Vec::new(),
            logprobs: Vec::new(),
        }
    }

    fn emit(&mut self, kind: &'static str, mut body: Value) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.events.push((kind, body));
    }

    /// The response object with this status, output and usage.
    fn response(&self, status: &str, usage: Value, incomplete: Option<&str>, error: Option<Value>) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "error": error, "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "model": self.model, "output": self.items, "usage": usage,
        });
        if let Value::Object(map) = &mut r {
            for (k, v) in &self.echo {
                map.insert(k.clone(), v.clone());
            }
        }
        r
    }

    /// `response.created` and `response.in_progress`.
    pub(crate) fn start(&mut self) {
        let r = self.response("in_progress", Value::Null, None, None);
        self.emit("response.created", json!({"response": r}));
        let r = self.response("in_progress", Value::Null, None, None);
        self.emit("response.in_progress", json!({"response": r}));
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    /// Notes a token's log-probabilities; they go out with the text that follows.
    pub(crate) fn logprob(&mut self, entry: &logprobs::Entry) {
        self.logprobs.push(logprobs::chat_token(entry));
    }

    /// Takes the next deltas of the answer.
    pub(crate) fn push(&mut self, deltas: Vec<Delta>) {
        for d in deltas {
            match d {
                Delta::Content(t) => self.content(&t),
                Delta::Start { id, name, custom, .. } => {
                    self.close("completed");
                    self.held.clear();
                    // A call's tokens are not text.
                    self.logprobs.clear();
                    let (item_id, item) = if custom {
                        let item_id = item_id("ctc");
                        (
                            item_id.clone(),
                            json!({"id": item_id, "type": "custom_tool_call", "status": "in_progress",
                                                 "call_id": id, "name": name, "input": ""}),
                        )
                    } else {
                        let item_id = item_id("fc");
                        (
                            item_id.clone(),
                            json!({"id": item_id, "type": "function_call", "status": "in_progress",
                                                 "call_id": id, "name": name, "arguments": ""}),
                        )
                    };
                    self.emit("response.output_item.added", json!({"output_index": self.index(), "item": item}));
                    self.open = Some(if custom {
                        Open::Custom { id: item_id, call_id: id, name, input: String::new() }
                    } else {
                        Open::Call { id: item_id, call_id: id, name, arguments: String::new() }
                    });
                }
                Delta::Args { text, .. } => {
                    let index = self.index();
                    let (kind, item_id) = match &mut self.open {
                        Some(Open::Call { id, arguments, .. }) => {
                            arguments.push_str(&text);
                            ("response.function_call_arguments.delta", id.clone())
                        }
                        Some(Open::Custom { id, input, .. }) => {
                            input.push_str(&text);
                            ("response.custom_tool_call_input.delta", id.clone())
                        }
                        _ => continue,
                    };
                    self.emit(kind, json!({"item_id": item_id, "output_index": index, "delta": text}));
                }
            }
        }
    }

    /// Takes the next piece of a thinking model's reasoning (a `reasoning` output item).
    pub(crate) fn reasoning(&mut self, t: &str) {
        if t.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close("completed");
            let id = item_id("rs");
            let item = json!({"id": id, "type": "reasoning", "status": "in_progress", "summary": [], "content": []});
            self.emit("response.output_item.added", json!({"output_index": self.index(), "item": item}));
            self.open = Some(Open::Reasoning { id, text: String::new() });
        }
        let index = self.index();
        // Reasoning tokens are not the answer's text.
        self.logprobs.clear();
        if let Some(Open::Reasoning { id, text }) = &mut self.open {
            text.push_str(t);
            let item_id = id.clone();
            self.emit(
                "response.reasoning_text.delta",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": t}),
            );
        }
    }

    fn content(&mut self, t: &str) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            if t.trim().is_empty() {
                self.held.push_str(t);
                return;
            }
            self.close("completed");
            self.open_message();
        }
        let piece = std::mem::take(&mut self.held) + t;
        let index = self.index();
        let lp = std::mem::take(&mut self.logprobs);
        if let Some(Open::Message { id, text, logprobs }) = &mut self.open {
            text.push_str(&piece);
            logprobs.extend(lp.iter().cloned());
            let item_id = id.clone();
            self.emit(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": piece, "logprobs": lp}),
            );
        }
    }

    fn open_message(&mut self) {
        let id = item_id("msg");
        let index = self.index();
        let item = json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
        self.emit("response.output_item.added", json!({"output_index": index, "item": item}));
        self.emit(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
        );
        self.open = Some(Open::Message { id, text: String::new(), logprobs: Vec::new() });
    }

    /// Ends the open item with `status`.
    fn close(&mut self, status: &str) {
        let index = self.index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Message { id, text, mut logprobs }) => {
                logprobs.append(&mut self.logprobs);
                let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs});
                self.emit(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                           "logprobs": logprobs}),
                );
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                );
                json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": [part]})
            }
            Some(Open::Call { id, call_id, name, arguments }) => {
                self.emit(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
                );
                json!({"id": id, "type": "function_call", "status": "completed", "call_id": call_id,
                       "name": name, "arguments": arguments})
            }
            Some(Open::Reasoning { id, text }) => {
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                json!({"id": id, "type": "reasoning", "status": "completed", "summary": [],
                       "content": [{"type": "reasoning_text", "text": text}]})
            }
            Some(Open::Custom { id, call_id, name, input }) => {
                self.emit(
                    "response.custom_tool_call_input.done",
                    json!({"item_id": id, "output_index": index, "input": input}),
                );
                json!({"id": id, "type": "custom_tool_call", "status": "completed", "call_id": call_id,
                       "name": name, "input": input})
            }
        };
        self.emit("response.output_item.done", json!({"output_index": index, "item": item}));
        self.items.push(item);
    }

    /// The answer is complete: the last item closes and `response.completed`
    /// (or `response.incomplete`) carries the whole response.
    pub(crate) fn finish(&mut self, c: &Completion) -> Value {
        let incomplete = c.finish_reason == FinishReason::Length;
        let status = if incomplete { "incomplete" } else { "completed" };
        if self.items.is_empty() && self.open.is_none() {
            // Every response has an output item: an empty answer is an empty message.
            self.open_message();
            let held = std::mem::take(&mut self.held);
            if let Some(Open::Message { text, .. }) = &mut self.open {
                text.push_str(&held);
            }
        }
        if matches!(self.open, Some(Open::Message { .. } | Open::Reasoning { .. })) {
            self.close(status);
        } else {
            self.close("completed");
        }
        let calls =
            self.items.iter().filter(|i| i["type"] == "function_call" || i["type"] == "custom_tool_call").count();
        super::super::count_calls(super::super::Endpoint::Responses, calls);
        let r = self.response(status, usage(c), incomplete.then_some("max_output_tokens"), None);
        let kind = if incomplete { "response.incomplete" } else { "response.completed" };
        self.emit(kind, json!({"response": r.clone()}));
        r
    }

    /// The request failed after it started.
    pub(crate) fn fail(&mut self, message: &str) {
        self.close("incomplete");
        let r = self.response("failed", Value::Null, None, Some(json!({"code": "server_error", "message": message})));
        self.emit("response.failed", json!({"response": r}));
    }

    /// The events so far, as server-sent event bytes.
    pub(crate) fn take(&mut self) -> Bytes {
        let mut out = String::new();
        for (kind, body) in self.events.drain(..) {
            out.push_str("event: ");
            out.push_str(kind);
            out.push_str("\ndata: ");
            out.push_str(&body.to_string());
            out.push_str("\n\n");
        }
        Bytes::from(out)
    }
}

/// What the answer's text becomes: a thinking model's reasoning is taken out first, the rest goes
/// through the call parser when the model may call tools.
pub(crate) struct Reader(Option<CallParser>, Option<Think>);

/// The request's tools (to read calls) and whether its model thinks (see `openai::think`).
pub(crate) type Reading = (Option<ToolSet>, Option<bool>);

impl Reader {
    pub(crate) fn new((calls, think): Reading) -> Reader {
        Reader(calls.map(CallParser::new), think.map(Think::new))
    }

    /// The next piece of text into `b`.
    pub(crate) fn push(&mut self, b: &mut Builder, text: &str) {
        let (reasoning, text) = match &mut self.1 {
            Some(t) => t.push(text),
            None => (String::new(), text.to_string()),
        };
        b.reasoning(&reasoning);
        b.push(self.deltas(&text));
    }

    /// The answer is complete: what was held back into `b`.
    pub(crate) fn finish(&mut self, b: &mut Builder) {
        let (reasoning, rest) = self.1.as_mut().map(Think::finish).unwrap_or_default();
        b.reasoning(&reasoning);
        let mut deltas = self.deltas(&rest);
        deltas.extend(self.0.as_mut().map(CallParser::finish).unwrap_or_default());
        b.push(deltas);
    }

    fn deltas(&mut self, text: &str) -> Vec<Delta> {
        match &mut self.0 {
            Some(p) => p.push(text),
            None if text.is_empty() => Vec::new(),
            None => vec![Delta::Content(text.to_string())],
        }
    }
}

/// The whole answer as one response object.
pub(crate) fn whole(
    mut builder: Builder,
    calls: Reading,
    text: &str,
    entries: &[logprobs::Entry],
    c: &Completion,
) -> HttpResponse {
    for e in entries {
        builder.logprob(e);
    }
    let mut reader = Reader::new(calls);
    reader.push(&mut builder, text);
    reader.finish(&mut builder);
    HttpResponse::Ok().json(builder.finish(c))
}

/// The answer as the Responses API's events; `first` is the request's first event (not an error).
/// `engine` is given when the request asked for log-probabilities (its tokenizer spells them).
pub(crate) fn respond(
    builder: Builder,
    calls: Reading,
    first: Event,
    events: RequestStream,
    engine: Option<EngineHandle>,
) -> HttpResponse {
    let state = (builder, Reader::new(calls), events, Some(Some(first)), false);
    let body = futures_util::stream::unfold(state, move |(mut b, mut reader, mut events, first, done)| {
        let engine = engine.clone();
        async move {
            if done {
                return None;
            }
            let event = match first {
                Some(first) => {
                    b.start();
                    first
                }
                None => events.next().await,
            };
            let done = match event {
                Some(Event::Token { id, text, logprobs: lp }) => {
                    if let (Some(engine), Some(lp)) = (&engine, lp) {
                        if let Some(e) = logprobs::entry(engine.tokenizer(), id, &lp) {
                            b.logprob(&e);
                        }
                    }
                    reader.push(&mut b, &text);
                    false
                }
                Some(Event::Done(c)) => {
                    reader.finish(&mut b);
                    b.finish(&c);
                    true
                }
                Some(Event::Error(e)) => {
                    let err: ApiError = super::super::engine_error(e);
                    b.fail(&err.to_string());
                    true
                }
                None => {
                    b.fail("the engine stopped");
                    true
                }
            };
            Some((Ok::<Bytes, actix_web::Error>(b.take()), (b, reader, events, None, done)))
        }
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body)
}
