//! Turning a model's text into OpenAI tool calls, as the text streams in.
//!
//! [`CallParser`] takes the generated text piece by piece and gives back
//! [`Delta`]s in the order OpenAI streams them: content, then for each call
//! its start (index, id, name) followed by pieces of its arguments. The whole
//! (non-streaming) answer is the same deltas folded together ([`parse_all`]),
//! so streamed and non-streamed answers always agree.
//!
//! Recognised (see `docs/agents.md`):
//! - `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes; Qwen2.5, Qwen3),
//!   also with `"parameters"` for `"arguments"`, arguments sent as a JSON string,
//!   the closing tag missing at the end of the output, and several calls;
//! - `<tool_call><function=NAME><parameter=P>value</parameter>…</function></tool_call>`
//!   (Qwen3-Coder's XML form; values are JSON when the parameter's schema is not a string);
//! - `<tool_call>\n<function=NAME>\nINPUT\n</function>\n</tool_call>` for a custom tool (in
//!   every tagged format): INPUT is the call's free-form input, streamed as it comes;
//! - an output that starts with such a `<function=NAME>` call without its `<tool_call>` tags,
//!   NAME one of the request's tools (small models drop the tags: the Qwen2.5-Coder 1.5B
//!   answered Codex that way in 7 of 24 repository tasks), and more of them after it;
//! - an output that starts with a bare `{"name": …, "arguments"|"parameters": …}`
//!   object (Llama 3's format, and what small models often write), or with
//!   such an object (or a list of them) in a ```` ```json ```` fence — only
//!   when the name is one of the request's tools, otherwise it stays content;
//! - such an object, bare or fenced, on a line of its own after some prose
//!   ("Let me read it:\n{\"name\": \"read_file\", …}", as small models write
//!   under long agent prompts; llama.cpp's Hermes parser takes these too):
//!   the prose is content, the object a call when it is whole, valid JSON naming
//!   a known tool (it is held back until then, and stays content otherwise).
//!
//! Text the parser is not sure about yet (a possible start of `<tool_call>`, the
//! first key of a leading `{`, the first line of a leading fence) is held back,
//! never sent as content and then taken back. Markup never reaches content: a fence
//! around a tagged call, and after the calls the start of another one that the token
//! limit cut off (`\n<tool_`), are dropped. A call identical to the one before it (the
//! same name and arguments) is left out ([`CallParser::repeated`] says it happened).

use json::{probe_name, whole_calls, JsonCall, Probe};
use repeats::Repeats;
use serde_json::Value;

mod json;
mod repeats;

/// One piece of an answer, in stream order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Delta {
    Content(String),
    /// A call begins: its index among the answer's calls, its id and the tool's name;
    /// `custom` for a custom tool (its "arguments" are then the free-form input).
    Start {
        index: usize,
        id: String,
        name: String,
        custom: bool,
    },
    /// The next piece of the arguments (a JSON text; a custom tool's input) of call `index`.
    Args {
        index: usize,
        text: String,
    },
}

/// A whole answer's calls: id, name, arguments (a custom tool's input when `custom`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub id: String,
    pub name: String,
    pub arguments: String,
    pub custom: bool,
}

/// A whole answer: its content and its calls (the deltas of [`CallParser`] folded together).
pub(crate) fn parse_all(tools: &ToolSet, text: &str) -> (String, Vec<Call>) {
    let mut parser = CallParser::new(tools.clone());
    let mut deltas = parser.push(text);
    deltas.extend(parser.finish());
    let (mut content, mut calls) = (String::new(), Vec::<Call>::new());
    for d in deltas {
        match d {
            Delta::Content(t) => content.push_str(&t),
            Delta::Start { id, name, custom, .. } => calls.push(Call { id, name, arguments: String::new(), custom }),
            Delta::Args { index, text } => calls[index].arguments.push_str(&text),
        }
    }
    (content, calls)
}

/// What the parser needs to know of the request's tools.
#[derive(Clone, Debug, Default)]
pub(crate) struct ToolSet {
    /// Each function tool's name and its parameters' JSON Schema.
    pub tools: Vec<(String, Value)>,
    /// The custom tools' names: called as `<function=NAME>\nINPUT\n</function>` in the call tags.
    pub custom: Vec<String>,
}

impl ToolSet {
    /// Whether `name` is one of the custom tools.
    pub(crate) fn is_custom(&self, name: &str) -> bool {
        self.custom.iter().any(|n| n == name)
    }

    fn knows(&self, name: &str) -> bool {
        self.tools.iter().any(|(n, _)| n == name)
    }

    /// Whether parameter `param` of `tool` is declared a string (XML values are then taken verbatim).
    fn is_string_param(&self, tool: &str, param: &str) -> bool {
        let schema = self.tools.iter().find(|(n, _)| n == tool).map(|(_, s)| s);
        let ty = schema.and_then(|s| s.get("properties")).and_then(|p| p.get(param)).and_then(|p| p.get("type"));
        match ty {
            Some(Value::String(t)) => t == "string",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
            _ => false,
        }
    }
}

const OPEN: &str = "<tool_call>";
/// A call's body in the XML forms (and a custom tool's in every tagged one).
const FUNCTION: &str = "<function=";
/// The longest tool name a bare `<function=` waits for before it is taken as content.
const MAX_NAME: usize = 128;
/// Where a custom tool's input ends.
const RAW_END: &str = "\n</function>";
const CLOSE: &str = "</tool_call>";

enum State {
    /// Plain content; `fresh` until something other than whitespace was seen.
    Text { fresh: bool },
    /// The output began with `{` or `[`: buffering until the first key (and name) tell.
    BareProbe,
    /// The output began with a fence: buffering its first line (and the rest, if JSON).
    FenceProbe,
    /// After prose, a line starting with `{` or a fence: buffering until it is a whole call or not.
    LineProbe,
    /// Inside a JSON call; `tagged` when it opened with `<tool_call>`.
    Json { call: JsonCall, tagged: bool },
    /// Inside `<tool_call>`, before its body shows whether it is JSON or XML.
    TagBody,
    /// Inside `<tool_call><function=…>`.
    Xml(XmlCall),
    /// A call's body is complete: skipping to `</tool_call>`.
    AfterCall,
    /// After a call: whitespace is held (and dropped if only calls follow).
    Between,
}

/// Turns generated text into content and tool calls, incrementally.
pub(crate) struct CallParser {
    tools: ToolSet,
    state: State,
    /// Text received but not yet consumed by the state machine.
    buf: String,
    calls: usize,
    out: Vec<Delta>,
    /// The last call was in a ```` ``` ```` fence that is still to close.
    fenced: bool,
    repeats: Repeats,
    /// The answer's calls (as numbered in the deltas) that are custom tools'.
    custom_calls: Vec<usize>,
}

impl CallParser {
    pub(crate) fn new(tools: ToolSet) -> CallParser {
        CallParser {
            tools,
            state: State::Text { fresh: true },
            buf: String::new(),
            calls: 0,
            out: Vec::new(),
            fenced: false,
            repeats: Repeats::default(),
            custom_calls: Vec::new(),
        }
    }

    /// Number of calls in the answer so far (repeats left out).
    pub(crate) fn calls(&self) -> usize {
        self.repeats.emitted
    }

    /// Whether the model repeated a call (the same name and arguments as the call before it):
    /// the repeat is left out of the answer, and the output may as well end there.
    pub(crate) fn repeated(&self) -> bool {
        self.repeats.repeated
    }

    /// Takes the next piece of text.
    pub(crate) fn push(&mut self, text: &str) -> Vec<Delta> {
        self.buf.push_str(text);
        self.advance(false);
        self.emit(false)
    }

    /// The output is complete: whatever was held back.
    pub(crate) fn finish(&mut self) -> Vec<Delta> {
        self.advance(true);
        self.emit(true)
    }

    /// Whether the answer's call `index` (as numbered in the deltas) is a custom tool's.
    pub(crate) fn is_custom(&self, index: usize) -> bool {
        self.custom_calls.contains(&index)
    }

    fn emit(&mut self, end: bool) -> Vec<Delta> {
        let out = std::mem::take(&mut self.out);
        let out = self.repeats.filter(out, end);
        for d in &out {
            if let Delta::Start { index, custom: true, .. } = d {
                self.custom_calls.push(*index);
            }
        }
        out
    }

    fn content(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if let Some(Delta::Content(last)) = self.out.last_mut() {
            last.push_str(text);
        } else {
            self.out.push(Delta::Content(text.to_string()));
        }
    }

    fn start_call(&mut self, name: String) -> usize {
        let index = self.calls;
        self.calls += 1;
        let id = format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
        let custom = self.tools.is_custom(&name);
        self.out.push(Delta::Start { index, id, name, custom });
        index
    }

    fn args(&mut self, index: usize, text: &str) {
        if text.is_empty() {
            return;
        }
        if let Some(Delta::Args { index: i, text: last }) = self.out.last_mut() {
            if *i == index {
                last.push_str(text);
                return;
            }
        }
        self.out.push(Delta::Args { index, text: text.to_string() });
    }

    /// Runs the state machine over `buf` as far as it can go.
    fn advance(&mut self, end: bool) {
        loop {
            let state = std::mem::replace(&mut self.state, State::AfterCall);
            let (next, progressed) = self.step(state, end);
            self.state = next;
            if !progressed {
                break;
            }
        }
    }

    /// One transition; false when it needs more text.
    fn step(&mut self, state: State, end: bool) -> (State, bool) {
        match state {
            State::Text { fresh } => self.text(fresh, end),
            State::BareProbe => self.bare_probe(end),
            State::FenceProbe => self.fence_probe(end),
            State::LineProbe => self.line_probe(end),
            State::Json { call, tagged } => self.json(call, tagged, end),
            State::TagBody => self.tag_body(end),
            State::Xml(call) => self.xml(call, end),
            State::AfterCall => self.after_call(end),
            State::Between => self.between(end),
        }
    }

    fn text(&mut self, fresh: bool, end: bool) -> (State, bool) {
        if fresh {
            let trimmed = self.buf.trim_start();
            if trimmed.starts_with('{') || trimmed.starts_with('[') {
                return (State::BareProbe, true);
            }
            if trimmed.starts_with(FUNCTION) || (!trimmed.is_empty() && FUNCTION.starts_with(trimmed)) {
                return self.bare_function(end);
            }
            if trimmed.starts_with("```") {
                return (State::FenceProbe, true);
            }
            if trimmed.is_empty() || (trimmed.starts_with('`') && "```".starts_with(trimmed)) {
                if end {
                    let rest = std::mem::take(&mut self.buf);
                    self.content(&rest);
                }
                return (State::Text { fresh: true }, false);
            }
        }
        let line = line_start(&self.buf);
        if let Some(at) = self.buf.find(OPEN).filter(|&at| line.is_none_or(|l| at < l)) {
            // A tagged call in a fence: the fence is markup, not content.
            let (before, fenced) = match opening_fence(&self.buf[..at]) {
                Some(f) => (self.buf[..f].to_string(), true),
                None => (self.buf[..at].to_string(), false),
            };
            self.content(&before);
            self.fenced = fenced;
            self.buf.drain(..at + OPEN.len());
            return (State::TagBody, true);
        }
        if let Some(at) = line {
            let before: String = self.buf.drain(..at).collect();
            self.content(&before);
            return (State::LineProbe, true);
        }
        let keep = if end {
            0
        } else {
            let fence = opening_fence(&self.buf).map_or(0, |f| self.buf.len() - f);
            held_back(&self.buf, OPEN).max(open_line(&self.buf)).max(fence)
        };
        let emit: String = self.buf.drain(..self.buf.len() - keep).collect();
        self.content(&emit);
        (State::Text { fresh: false }, false)
    }

    /// A leading `<function=`: a call without its `<tool_call>` tags when the name that follows is
    /// one of the request's tools; otherwise content.
    fn bare_function(&mut self, end: bool) -> (State, bool) {
        let trimmed = self.buf.trim_start();
        let lead = self.buf.len() - trimmed.len();
        let name = trimmed.strip_prefix(FUNCTION).and_then(|rest| rest.find('>').map(|gt| rest[..gt].trim()));
        match name {
            None if !end && trimmed.len() < FUNCTION.len() + MAX_NAME => (State::Text { fresh: true }, false),
            Some(name) if self.tools.is_custom(name) || self.tools.knows(name) => {
                self.buf.drain(..lead);
                (State::Xml(XmlCall { bare: true, ..XmlCall::default() }), true)
            }
            _ => (State::Text { fresh: false }, true),
        }
    }

    /// A leading `{`/`[`: a call when its first key is `"name"` naming a known tool.
    fn bare_probe(&mut self, end: bool) -> (State, bool) {
        let trimmed = self.buf.trim_start();
        let lead = self.buf.len() - trimmed.len();
        let list = trimmed.starts_with('[');
        let object = if list { trimmed[1..].trim_start() } else { trimmed };
        match probe_name(object) {
            Probe::NeedMore if !end => (State::BareProbe, false),
            Probe::Name(name) if self.tools.knows(&name) => {
                let skip = lead + (trimmed.len() - object.len());
                self.buf.drain(..skip);
                (State::Json { call: JsonCall::new(list), tagged: false }, true)
            }
            _ => (State::Text { fresh: false }, true),
        }
    }

    /// A leading fence: a call only when it is a JSON fence holding calls of known tools.
    fn fence_probe(&mut self, end: bool) -> (State, bool) {
        let trimmed = self.buf.trim_start();
        let Some(nl) = trimmed.find('\n') else {
            return if end { (State::Text { fresh: false }, true) } else { (State::FenceProbe, false) };
        };
        let lang = trimmed[3..nl].trim();
        let body = trimmed[nl + 1..].trim_start();
        if !json_fence(lang) || (!body.is_empty() && !body.starts_with('{') && !body.starts_with('[')) {
            return (State::Text { fresh: false }, true);
        }
        // Wait for the closing fence (or the end), then decide on the whole block.
        let Some(close) = trimmed[nl + 1..].find("```") else {
            return if end { (State::Text { fresh: false }, true) } else { (State::FenceProbe, false) };
        };
        let inner = trimmed[nl + 1..nl + 1 + close].to_string();
        let after = nl + 1 + close + 3;
        match whole_calls(&inner, &self.tools) {
            Some(calls) => {
                let consumed = self.buf.len() - trimmed.len() + after;
                self.buf.drain(..consumed);
                for (name, args) in calls {
                    let i = self.start_call(name);
                    self.args(i, &args);
                }
                (State::Between, true)
            }
            None => (State::Text { fresh: false }, true),
        }
    }

    /// A line after prose that starts with `{` or a fence: a call when it holds one whole JSON
    /// object (or list) of calls of known tools; otherwise the line is content.
    fn line_probe(&mut self, end: bool) -> (State, bool) {
        let plain = (State::Text { fresh: false }, true);
        let wait = (State::LineProbe, false);
        let t = self.buf.trim_start_matches([' ', '\t']);
        let mut at = self.buf.len() - t.len();
        let fenced = t.starts_with("```");
        if fenced {
            let Some(nl) = t.find('\n') else { return if end { plain } else { wait } };
            if !json_fence(t[3..nl].trim()) {
                return plain;
            }
            at += nl + 1;
        }
        let body = self.buf[at..].trim_start();
        at = self.buf.len() - body.len();
        if body.is_empty() {
            return if end { plain } else { wait };
        }
        let list = body.starts_with('[');
        let object = if list { body[1..].trim_start() } else { body };
        if !(object.starts_with('{') || (object.is_empty() && list)) {
            return plain;
        }
        match probe_name(object) {
            Probe::NeedMore if !end => return wait,
            Probe::Name(name) if self.tools.knows(&name) => {}
            _ => return plain,
        }
        let mut values = serde_json::Deserializer::from_str(body).into_iter::<Value>();
        let used = match values.next() {
            Some(Ok(_)) => values.byte_offset(),
            Some(Err(e)) if e.is_eof() && !end => return wait,
            _ => return plain,
        };
        let Some(calls) = whole_calls(&body[..used], &self.tools) else { return plain };
        let mut consumed = at + used;
        if fenced {
            let rest = self.buf[consumed..].trim_start();
            if rest.starts_with("```") {
                consumed = self.buf.len() - rest.len() + 3;
            } else if !end && "```".starts_with(rest) {
                return wait;
            }
        }
        self.buf.drain(..consumed);
        for (name, args) in calls {
            let i = self.start_call(name);
            self.args(i, &args);
        }
        (State::Between, true)
    }

    fn tag_body(&mut self, end: bool) -> (State, bool) {
        let trimmed = self.buf.trim_start();
        if trimmed.starts_with('{') || trimmed.starts_with('[') {
            let lead = self.buf.len() - trimmed.len();
            let list = trimmed.starts_with('[');
            self.buf.drain(..lead + usize::from(list));
            return (State::Json { call: JsonCall::new(list), tagged: true }, true);
        }
        if trimmed.starts_with(FUNCTION) {
            let lead = self.buf.len() - trimmed.len();
            self.buf.drain(..lead);
            return (State::Xml(XmlCall::default()), true);
        }
        let undecided = trimmed.is_empty() || FUNCTION.starts_with(trimmed);
        if undecided && !end {
            return (State::TagBody, false);
        }
        // Not a call we understand: the tag and what follows are content.
        let rest = std::mem::take(&mut self.buf);
        self.content(OPEN);
        self.buf = rest;
        (State::Text { fresh: false }, true)
    }

    fn json(&mut self, mut call: JsonCall, tagged: bool, end: bool) -> (State, bool) {
        let consumed = call.feed(&self.buf);
        self.buf.drain(..consumed);
        // Start the call once its name is known; stream the arguments as they come.
        if call.index.is_none() {
            if let Some(name) = call.name.clone() {
                call.index = Some(self.start_call(name));
            }
        }
        if let (Some(index), Some((start, stop))) = (call.index, call.args) {
            if !call.args_is_string {
                let upto = stop.unwrap_or(call.raw.len());
                let from = call.emitted.max(start);
                if upto > from {
                    let piece = call.raw[from..upto].to_string();
                    self.args(index, &piece);
                    call.emitted = upto;
                }
            }
        }
        if !call.done && !end {
            return (State::Json { call, tagged }, false);
        }
        let element = !call.raw.is_empty();
        self.end_json_call(&call, tagged);
        if call.list && element && !call.list_done && !end {
            // Another object of the list may follow.
            return (State::Json { call: JsonCall::new(true), tagged }, true);
        }
        match (tagged, call.index.is_some()) {
            (true, _) => (State::AfterCall, true),
            (false, true) => (State::Between, true),
            (false, false) => (State::Text { fresh: false }, true),
        }
    }

    fn end_json_call(&mut self, call: &JsonCall, tagged: bool) {
        let Some(index) = call.index else {
            if !call.raw.is_empty() {
                // Never became a call: what was held back is content.
                let text = if tagged { format!("{OPEN}{}", call.raw) } else { call.raw.clone() };
                self.content(&text);
            }
            return;
        };
        match call.args {
            None => self.args(index, "{}"),
            Some((start, stop)) if call.args_is_string => {
                let raw = &call.raw[start..stop.unwrap_or(call.raw.len())];
                let text = serde_json::from_str::<String>(raw).unwrap_or_else(|_| raw.to_string());
                self.args(index, &text);
            }
            Some(_) => {}
        }
    }

    fn xml(&mut self, mut call: XmlCall, end: bool) -> (State, bool) {
        loop {
            if call.name.is_none() {
                let Some(gt) = self.buf.find('>') else { break };
                let name = self.buf[FUNCTION.len()..gt].trim().to_string();
                self.buf.drain(..gt + 1);
                call.raw = self.tools.is_custom(&name).then_some(false);
                call.index = Some(self.start_call(name.clone()));
                call.name = Some(name);
                continue;
            }
            if let (Some(started), Some(index)) = (call.raw, call.index) {
                // A custom tool's input, verbatim, up to `\n</function>`.
                if !started {
                    if self.buf.is_empty() {
                        break;
                    }
                    if self.buf.starts_with('\n') {
                        self.buf.drain(..1);
                    }
                    call.raw = Some(true);
                }
                if let Some(at) = self.buf.find(RAW_END) {
                    let input = self.buf[..at].to_string();
                    self.args(index, &input);
                    self.buf.drain(..at + RAW_END.len());
                    return (call.after(), true);
                }
                // What may be the start of `\n</function>` waits; at the end (the token limit cut the
                // call off) it is markup, dropped.
                let keep = held_back(&self.buf, RAW_END);
                let input: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.args(index, &input);
                if end {
                    self.buf.clear();
                }
                break;
            }
            let trimmed = self.buf.trim_start();
            let lead = self.buf.len() - trimmed.len();
            if trimmed.starts_with("</function>") {
                self.buf.drain(..lead + "</function>".len());
                self.finish_xml(&call);
                return (call.after(), true);
            }
            if trimmed.starts_with("<parameter=") {
                let Some(gt) = trimmed.find('>') else { break };
                let Some(close) = trimmed[gt..].find("</parameter>") else { break };
                let param = trimmed["<parameter=".len()..gt].trim().to_string();
                let value = trimmed[gt + 1..gt + close].to_string();
                let value = value.strip_prefix('\n').unwrap_or(&value);
                let value = value.strip_suffix('\n').unwrap_or(value).to_string();
                let used = lead + gt + close + "</parameter>".len();
                self.buf.drain(..used);
                call.params.push((param, value));
                continue;
            }
            if trimmed.is_empty() || "</function>".starts_with(trimmed) || "<parameter=".starts_with(trimmed) {
                break;
            }
            // Anything else inside a function: skip one character (tolerance).
            let skip = lead + trimmed.chars().next().map_or(0, char::len_utf8);
            self.buf.drain(..skip);
        }
        if end {
            if call.index.is_some() {
                self.finish_xml(&call);
            } else {
                let rest = std::mem::take(&mut self.buf);
                self.content(&format!("{OPEN}{rest}"));
            }
            return (State::Text { fresh: false }, false);
        }
        (State::Xml(call), false)
    }

    fn finish_xml(&mut self, call: &XmlCall) {
        let (Some(index), Some(name)) = (call.index, &call.name) else { return };
        if call.raw.is_some() {
            return;
        }
        let mut args = serde_json::Map::new();
        for (param, value) in &call.params {
            let v = if self.tools.is_string_param(name, param) {
                Value::String(value.clone())
            } else {
                serde_json::from_str(value.trim()).unwrap_or_else(|_| Value::String(value.clone()))
            };
            args.insert(param.clone(), v);
        }
        self.args(index, &Value::Object(args).to_string());
    }

    fn between(&mut self, end: bool) -> (State, bool) {
        let trimmed = self.buf.trim_start();
        let lead = self.buf.len() - trimmed.len();
        if trimmed.starts_with(OPEN) {
            self.buf.drain(..lead + OPEN.len());
            return (State::TagBody, true);
        }
        if self.fenced {
            // The fence the last call was in closes: markup too.
            if let Some(rest) = trimmed.strip_prefix("```") {
                if !rest.starts_with(|c: char| c.is_ascii_alphanumeric()) && (end || !rest.is_empty()) {
                    self.buf.drain(..lead + 3);
                    self.fenced = false;
                    return (State::Between, true);
                }
                if rest.is_empty() {
                    return (State::Between, false);
                }
            }
        }
        if trimmed.starts_with('{')
            || trimmed.starts_with('[')
            || trimmed.starts_with("```")
            || trimmed.starts_with(FUNCTION)
        {
            // Perhaps another bare call.
            self.buf.drain(..lead);
            return (State::Text { fresh: true }, true);
        }
        if trimmed.is_empty() {
            if end {
                self.buf.clear();
            }
            return (State::Between, false);
        }
        if OPEN.starts_with(trimmed) {
            if end {
                // The start of another call, cut off by the token limit: markup, not content.
                self.buf.clear();
            }
            return (State::Between, false);
        }
        if !end && ("```".starts_with(trimmed) || FUNCTION.starts_with(trimmed)) {
            // Perhaps a fence (another call in one), or another bare `<function=` call.
            return (State::Between, false);
        }
        // Prose after the calls is content.
        (State::Text { fresh: false }, true)
    }

    fn after_call(&mut self, end: bool) -> (State, bool) {
        let close = self.buf.find(CLOSE);
        let open = self.buf.find(OPEN);
        match (close, open) {
            // A new call without the previous one's closing tag.
            (c, Some(o)) if c.is_none_or(|c| o < c) => {
                self.buf.drain(..o + OPEN.len());
                return (State::TagBody, true);
            }
            (Some(c), _) => {
                self.buf.drain(..c + CLOSE.len());
                return (State::Between, true);
            }
            _ => {}
        }
        if end {
            self.buf.clear();
            return (State::AfterCall, false);
        }
        // Keep only what could still become a tag.
        let keep = held_back(&self.buf, CLOSE).max(held_back(&self.buf, OPEN));
        self.buf.drain(..self.buf.len() - keep);
        (State::AfterCall, false)
    }
}

/// Whether a fence's language says it may hold JSON calls.
fn json_fence(lang: &str) -> bool {
    matches!(lang, "" | "json" | "tool_call" | "tool_calls")
}

/// Where the first line after a newline starts with `{` or a fence (after spaces or tabs).
fn line_start(text: &str) -> Option<usize> {
    text.match_indices('\n').map(|(i, _)| i + 1).find(|&i| {
        let t = text[i..].trim_start_matches([' ', '\t']);
        t.starts_with('{') || t.starts_with("```")
    })
}

/// The length of the last line, with the newline before it, when it may still become one
/// [`line_start`] finds (blank so far, or a partial fence).
fn open_line(text: &str) -> usize {
    let Some(i) = text.rfind('\n') else { return 0 };
    let t = text[i + 1..].trim_start_matches([' ', '\t']);
    if t.is_empty() || "```".starts_with(t) {
        text.len() - i
    } else {
        0
    }
}

/// Where the fence line `text` ends with starts, when it is an opening fence a tagged call may
/// follow (```` ``` ````, ```` ```json ````, ```` ```xml ````, …): the fence line, its newline,
/// then nothing but blank space and perhaps the start of `<tool_call>`.
fn opening_fence(text: &str) -> Option<usize> {
    let rest = &text[..text.len() - held_back(text, OPEN)];
    let body = rest.trim_end_matches([' ', '\t', '\r', '\n']);
    if !rest[body.len()..].contains('\n') {
        return None;
    }
    let start = body.rfind('\n').map_or(0, |i| i + 1);
    let lang = body[start..].trim_start_matches([' ', '\t']).strip_prefix("```")?.trim();
    (json_fence(lang) || lang == "xml").then_some(start)
}

/// The length of the longest suffix of `text` that is a proper prefix of `tag`.
pub(crate) fn held_back(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&tag[..n]))
        .unwrap_or(0)
}

/// A call in Qwen3-Coder's XML form, as its parameters arrive.
#[derive(Default)]
struct XmlCall {
    name: Option<String>,
    index: Option<usize>,
    /// A custom tool's call: its input is the body, verbatim (`Some(true)` once the newline
    /// after the opening tag is dropped).
    raw: Option<bool>,
    params: Vec<(String, String)>,
    /// Written without `<tool_call>` (then no `</tool_call>` follows either).
    bare: bool,
}

impl XmlCall {
    /// Where the parser goes once the call's body is complete.
    fn after(&self) -> State {
        if self.bare {
            State::Between
        } else {
            State::AfterCall
        }
    }
}

#[cfg(test)]
mod tests;
