//! JSON calls in the model's text: whether an opening names a tool, whole calls in a
//! complete text, and the scanner that follows one call object as it streams in.

use super::ToolSet;
use serde_json::Value;

pub(super) enum Probe {
    NeedMore,
    Name(String),
    NotACall,
}

/// Whether `text` (starting with `{`) opens an object whose first key is `"name"`, and its value.
pub(super) fn probe_name(text: &str) -> Probe {
    let Some(rest) = text.strip_prefix('{') else {
        return if text.is_empty() { Probe::NeedMore } else { Probe::NotACall };
    };
    let rest = rest.trim_start();
    if rest.is_empty() || "\"name\"".starts_with(rest) {
        return Probe::NeedMore;
    }
    let Some(rest) = rest.strip_prefix("\"name\"") else { return Probe::NotACall };
    let rest = rest.trim_start();
    let Some(rest) = rest.strip_prefix(':') else {
        return if rest.is_empty() { Probe::NeedMore } else { Probe::NotACall };
    };
    let rest = rest.trim_start();
    if rest.is_empty() {
        return Probe::NeedMore;
    }
    if !rest.starts_with('"') {
        return Probe::NotACall;
    }
    match string_end(rest) {
        Some(n) => serde_json::from_str::<String>(&rest[..n]).map_or(Probe::NotACall, Probe::Name),
        None => Probe::NeedMore,
    }
}

/// The byte length of the JSON string at the start of `s` (which starts with `"`), if complete.
fn string_end(s: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Calls in a complete JSON text: one call object or a list of them, each naming a known tool.
pub(super) fn whole_calls(text: &str, tools: &ToolSet) -> Option<Vec<(String, String)>> {
    let value: Value = serde_json::from_str(text.trim()).ok()?;
    let items = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    items
        .into_iter()
        .map(|item| {
            let name = item.get("name")?.as_str()?.to_string();
            if !tools.knows(&name) {
                return None;
            }
            let args = item.get("arguments").or_else(|| item.get("parameters")).cloned().unwrap_or(Value::Null);
            let args = match args {
                Value::Null => "{}".to_string(),
                Value::String(s) => s,
                other => other.to_string(),
            };
            Some((name, args))
        })
        .collect()
}

/// A scanner over one JSON call object `{"name": …, "arguments": …}` (or one element
/// of a list of them), fed text as it arrives; it records the name and where the
/// arguments' value lies in its text.
#[derive(Default)]
pub(super) struct JsonCall {
    /// The object's text so far (from its `{`).
    pub(super) raw: String,
    pub(super) depth: usize,
    pub(super) in_string: bool,
    pub(super) escaped: bool,
    /// An element of a list of calls (`[{…}, {…}]`).
    pub(super) list: bool,
    /// The list's `]` was seen.
    pub(super) list_done: bool,
    /// Before the object's `{` (a list's next element).
    pub(super) before_object: bool,
    /// A top-level key string being read, and the current member's key.
    pub(super) key_start: Option<usize>,
    pub(super) key: Option<String>,
    /// After the member's `:`, and where its value's first character is.
    pub(super) after_colon: bool,
    pub(super) value_begun: Option<usize>,
    pub(super) name: Option<String>,
    /// Where the arguments' value starts in `raw`, and ends once known.
    pub(super) args: Option<(usize, Option<usize>)>,
    pub(super) args_is_string: bool,
    /// Bytes of `raw` already sent as argument pieces.
    pub(super) emitted: usize,
    pub(super) index: Option<usize>,
    pub(super) done: bool,
}

impl JsonCall {
    pub(super) fn new(list: bool) -> JsonCall {
        JsonCall { list, before_object: true, ..JsonCall::default() }
    }

    fn is_args_key(key: Option<&str>) -> bool {
        matches!(key, Some("arguments" | "parameters"))
    }

    /// Character `c` (at byte `i`) before the call's object, or between a list's objects:
    /// `Some(n)` when the call ends there, its first `n` bytes of the text being its own.
    fn before(&mut self, c: char, i: usize) -> Option<usize> {
        match c {
            '{' => {
                self.before_object = false;
                self.depth = 1;
                self.raw.push(c);
                None
            }
            ']' if self.list => {
                self.list_done = true;
                self.done = true;
                Some(i + 1)
            }
            _ if c.is_whitespace() || (self.list && c == ',') => None,
            _ => {
                // Not a call after all: what is left is not this scanner's.
                self.done = true;
                Some(i)
            }
        }
    }

    /// Scans `text`; returns how many of its bytes belong to this call.
    pub(super) fn feed(&mut self, text: &str) -> usize {
        for (i, c) in text.char_indices() {
            if self.done {
                return i;
            }
            if self.before_object {
                if let Some(taken) = self.before(c, i) {
                    return taken;
                }
                continue;
            }
            let pos = self.raw.len();
            self.raw.push(c);
            if self.in_string {
                match c {
                    _ if self.escaped => self.escaped = false,
                    '\\' => self.escaped = true,
                    '"' => {
                        self.in_string = false;
                        if let Some(start) = self.key_start.take() {
                            self.key = serde_json::from_str(&self.raw[start..]).ok();
                        } else if self.depth == 1 {
                            self.end_value(pos + 1);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => {
                    self.in_string = true;
                    if self.depth == 1 && !self.after_colon {
                        self.key_start = Some(pos);
                    } else if self.depth == 1 {
                        self.begin_value(pos);
                    }
                }
                '{' | '[' => {
                    if self.depth == 1 && self.after_colon {
                        self.begin_value(pos);
                    }
                    self.depth += 1;
                }
                '}' | ']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 1 {
                        self.end_value(pos + 1);
                    } else if self.depth == 0 {
                        self.end_value(pos);
                        self.done = true;
                        return i + c.len_utf8();
                    }
                }
                ':' if self.depth == 1 => self.after_colon = true,
                ',' if self.depth == 1 => {
                    self.end_value(pos);
                    self.after_colon = false;
                    self.key = None;
                }
                _ if self.depth == 1 && self.after_colon && !c.is_whitespace() => self.begin_value(pos),
                _ => {}
            }
        }
        text.len()
    }

    fn begin_value(&mut self, pos: usize) {
        if self.value_begun.is_some() {
            return;
        }
        self.value_begun = Some(pos);
        if Self::is_args_key(self.key.as_deref()) && self.args.is_none() {
            self.args = Some((pos, None));
            self.args_is_string = self.raw[pos..].starts_with('"');
        }
    }

    fn end_value(&mut self, end: usize) {
        let Some(start) = self.value_begun.take() else { return };
        let value = self.raw[start..end].trim_end();
        match self.key.as_deref() {
            Some("name") => self.name = serde_json::from_str(value).ok(),
            key if Self::is_args_key(key) => {
                if let Some((s, None)) = self.args {
                    self.args = Some((s, Some(start + value.len())));
                }
            }
            _ => {}
        }
    }
}
