//! Calls repeated back to back ([`Repeats`]).

use super::Delta;
use serde_json::Value;

/// Leaves out a call identical to the one before it (same name, same arguments as JSON values):
/// small models repeat a call back to back, under `tool_choice: "required"` until the context
/// is full. A call after the first is held back until its arguments are whole (or the next call
/// starts, or the output ends), then let through or dropped; the calls let through are numbered
/// without gaps.
#[derive(Default)]
pub(super) struct Repeats {
    /// The last call let through: its name and, once whole, its arguments.
    last: Option<(String, Option<Value>)>,
    /// The arguments so far of the last call let through (until they are whole).
    open: Option<(usize, String)>,
    /// The call being received while it may still be a repeat.
    held: Option<Held>,
    /// The answer's index of each call the parser started (`None`: dropped as a repeat).
    map: Vec<Option<usize>>,
    pub(super) emitted: usize,
    pub(super) repeated: bool,
}

struct Held {
    id: String,
    name: String,
    custom: bool,
    args: String,
    /// Content that came after the call began.
    after: Vec<Delta>,
}

/// The JSON value `text` is, once it is whole (checked only when it may be: it ends with a
/// closing bracket).
fn whole_json(text: &str) -> Option<Value> {
    let t = text.trim_end();
    (t.ends_with('}') || t.ends_with(']')).then(|| serde_json::from_str(t).ok()).flatten()
}

impl Repeats {
    pub(super) fn filter(&mut self, deltas: Vec<Delta>, end: bool) -> Vec<Delta> {
        let mut out = Vec::with_capacity(deltas.len());
        for d in deltas {
            match d {
                Delta::Content(t) => match &mut self.held {
                    Some(h) => h.after.push(Delta::Content(t)),
                    None => out.push(Delta::Content(t)),
                },
                Delta::Start { index, id, name, custom } => {
                    if let Some(h) = self.held.take() {
                        self.release(h, &mut out);
                    }
                    debug_assert_eq!(index, self.map.len());
                    if self.last.is_some() {
                        self.map.push(None);
                        self.held = Some(Held { id, name, custom, args: String::new(), after: Vec::new() });
                    } else {
                        let at = self.emitted;
                        self.map.push(Some(at));
                        self.emitted += 1;
                        self.last = Some((name.clone(), None));
                        self.open = Some((index, String::new()));
                        out.push(Delta::Start { index: at, id, name, custom });
                    }
                }
                Delta::Args { index, text } => {
                    let newest = index + 1 == self.map.len();
                    if newest && self.held.is_some() {
                        let h = self.held.as_mut().expect("held");
                        h.args.push_str(&text);
                        if let Some(value) = whole_json(&h.args) {
                            let h = self.held.take().expect("held");
                            let same =
                                self.last.as_ref().is_some_and(|(n, v)| *n == h.name && v.as_ref() == Some(&value));
                            if same {
                                self.repeated = true;
                                out.extend(h.after);
                            } else {
                                self.release(h, &mut out);
                            }
                        }
                    } else if let Some(Some(at)) = self.map.get(index).copied() {
                        if let Some((open, args)) = &mut self.open {
                            if *open == index {
                                args.push_str(&text);
                                if let Some(value) = whole_json(args) {
                                    if let Some((_, v)) = &mut self.last {
                                        *v = Some(value);
                                    }
                                    self.open = None;
                                }
                            }
                        }
                        out.push(Delta::Args { index: at, text });
                    }
                }
            }
        }
        if end {
            if let Some(h) = self.held.take() {
                self.release(h, &mut out);
            }
        }
        out
    }

    /// Lets a held call through.
    fn release(&mut self, h: Held, out: &mut Vec<Delta>) {
        let at = self.emitted;
        self.emitted += 1;
        if let Some(slot) = self.map.last_mut() {
            *slot = Some(at);
        }
        let value = whole_json(&h.args);
        self.open = value.is_none().then(|| (self.map.len() - 1, h.args.clone()));
        self.last = Some((h.name.clone(), value));
        out.push(Delta::Start { index: at, id: h.id, name: h.name, custom: h.custom });
        if !h.args.is_empty() {
            out.push(Delta::Args { index: at, text: h.args });
        }
        out.extend(h.after);
    }
}
