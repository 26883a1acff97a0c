//! Thinking models: a chat template with a reasoning block (Qwen3's `<think>…</think>`) makes the
//! model write its reasoning before the answer. [`Think`] takes that reasoning out of the text as it
//! streams in, so that it comes back as `reasoning_content` (chat) or a reasoning output item
//! (Responses API) and never reaches the content or the tool-call parser.
//!
//! The block is recognised at the start of the answer (after whitespace), or the answer starts
//! inside it when the rendered prompt already opened it (templates that end the generation prompt
//! with `<think>\n`). Text that may still be the opening or closing tag is held back.

use super::tools::parse::held_back;
use serde_json::{Map, Value};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a chat template's model writes a `<think>` block.
pub(crate) fn template_thinks(source: &str) -> bool {
    source.contains(OPEN) && source.contains(CLOSE)
}

/// Whether the rendered prompt leaves the answer inside an opened `<think>` block.
pub(crate) fn prompt_opens_block(rendered: &str) -> bool {
    let tail = rendered.trim_end_matches([' ', '\n', '\r', '\t']);
    tail.ends_with(OPEN)
}

/// Template variables names a request may not set through `chat_template_kwargs` (cachet sets them).
const RESERVED: [&str; 6] = ["messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"];

/// Checks `chat_template_kwargs` (vLLM's field: extra variables for the chat template, such as
/// Qwen3's `enable_thinking`).
pub(crate) fn check_kwargs(kwargs: Option<&Map<String, Value>>) -> Result<(), crate::error::ApiError> {
    for key in kwargs.into_iter().flat_map(|k| k.keys()) {
        if RESERVED.contains(&key.as_str()) {
            return Err(crate::error::ApiError::bad_param(
                format!("chat_template_kwargs.{key}"),
                format!("chat_template_kwargs may not set {key:?} (cachet sets it)"),
            ));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// At the start of the answer: it may open a block.
    Start,
    /// Inside the block.
    Inside,
    /// Past the block (or there was none): everything is the answer.
    After,
}

/// Splits a streamed answer into reasoning and the rest.
#[derive(Debug)]
pub(crate) struct Think {
    state: State,
    buf: String,
    /// The answer after `</think>`: its leading whitespace is dropped.
    fresh: bool,
    /// Just inside the block: its leading line breaks are dropped.
    lead: bool,
}

impl Think {
    /// A splitter; `inside` when the prompt opened the block.
    pub(crate) fn new(inside: bool) -> Think {
        Think { state: if inside { State::Inside } else { State::Start }, buf: String::new(), fresh: false, lead: true }
    }

    /// Takes the next piece of text: (reasoning, answer) released by it.
    pub(crate) fn push(&mut self, text: &str) -> (String, String) {
        self.buf.push_str(text);
        self.run(false)
    }

    /// The answer is complete: whatever was held back.
    pub(crate) fn finish(&mut self) -> (String, String) {
        self.run(true)
    }

    fn run(&mut self, end: bool) -> (String, String) {
        let (mut reasoning, mut answer) = (String::new(), String::new());
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.buf.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Inside;
                        continue;
                    }
                    if !end && OPEN.starts_with(trimmed) {
                        break;
                    }
                    self.state = State::After;
                }
                State::Inside => {
                    // The line breaks just inside the tags are the block's markup, not reasoning.
                    if self.lead {
                        let t = self.buf.trim_start_matches('\n');
                        if t.is_empty() && !end {
                            self.buf.clear();
                            break;
                        }
                        self.buf = t.to_string();
                        self.lead = false;
                    }
                    if let Some(at) = self.buf.find(CLOSE) {
                        reasoning.push_str(self.buf[..at].trim_end_matches('\n'));
                        self.buf.drain(..at + CLOSE.len());
                        self.state = State::After;
                        self.fresh = true;
                        continue;
                    }
                    let mut keep = 0;
                    if !end {
                        // What may be the closing tag waits, and so do the line breaks before it.
                        keep = held_back(&self.buf, CLOSE);
                        let body = &self.buf[..self.buf.len() - keep];
                        keep += body.len() - body.trim_end_matches('\n').len();
                    }
                    reasoning.extend(self.buf.drain(..self.buf.len() - keep));
                    break;
                }
                State::After => {
                    if self.fresh {
                        let trimmed = self.buf.trim_start();
                        if trimmed.is_empty() && !end {
                            self.buf.clear();
                            break;
                        }
                        self.buf = trimmed.to_string();
                        self.fresh = false;
                    }
                    answer.push_str(&std::mem::take(&mut self.buf));
                    break;
                }
            }
        }
        (reasoning, answer)
    }
}

/// A whole answer: (reasoning, answer).
pub(crate) fn split(inside: bool, text: &str) -> (String, String) {
    let mut t = Think::new(inside);
    let (mut reasoning, mut answer) = t.push(text);
    let (r, a) = t.finish();
    reasoning.push_str(&r);
    answer.push_str(&a);
    (reasoning, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole, and in pieces of 1 to 6 bytes: the same reasoning and answer.
    fn both(inside: bool, text: &str) -> (String, String) {
        let whole = split(inside, text);
        for size in 1..=6 {
            let mut t = Think::new(inside);
            let (mut r, mut a) = (String::new(), String::new());
            let bytes: Vec<char> = text.chars().collect();
            for piece in bytes.chunks(size) {
                let (pr, pa) = t.push(&piece.iter().collect::<String>());
                r.push_str(&pr);
                a.push_str(&pa);
            }
            let (pr, pa) = t.finish();
            r.push_str(&pr);
            a.push_str(&pa);
            assert_eq!((r, a), whole, "pieces of {size}: {text:?}");
        }
        whole
    }

    #[test]
    fn reasoning_is_taken_out_of_the_answer() {
        let (r, a) = both(false, "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.");
        assert_eq!((r.as_str(), a.as_str()), ("The user wants 2+2.", "It is 4."));
        let (r, a) = both(false, "  <think>\n\n</think>\n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>");
        assert_eq!((r.as_str(), a.as_str()), ("", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>"));
        // No block: everything is the answer, untouched.
        assert_eq!(both(false, "<thin air> and <think> later"), (String::new(), "<thin air> and <think> later".into()));
        assert_eq!(both(false, "  plain"), (String::new(), "  plain".into()));
        // The prompt opened the block.
        assert_eq!(both(true, "step 1, step 2\n</think>\n\nDone"), ("step 1, step 2".into(), "Done".into()));
        // Cut off inside the block: all reasoning, no answer.
        assert_eq!(both(false, "<think>\nhmm, </thi"), ("hmm, </thi".into(), String::new()));
    }

    #[test]
    fn templates_and_prompts() {
        assert!(template_thinks("{{ '<think>\\n' + reasoning + '\\n</think>' }}"));
        assert!(!template_thinks("{% for m in messages %}{{ m.content }}{% endfor %}"));
        assert!(prompt_opens_block("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_block("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        let mut bad = Map::new();
        bad.insert("tools".into(), Value::Null);
        assert!(check_kwargs(Some(&bad)).is_err());
        let mut ok = Map::new();
        ok.insert("enable_thinking".into(), Value::Bool(false));
        assert!(check_kwargs(Some(&ok)).is_ok());
    }
}
