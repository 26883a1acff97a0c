//! The prompt builders of the eight scenarios built from source text. Each conversation draws from
//! its own random stream (seed, scenario, index), so conversations do not
//! change when others are added.

use super::{Conversation, Scenario, ScenarioSpec, CHARS_PER_TOKEN};
use crate::client::{HttpRequest, Message};
use crate::rng::Rng;
use crate::workload::source::SourceCorpus;

/// The system prompt of `repeated-context`, before the repository context.
const REPO_SYSTEM: &str = "You are a senior software engineer. Answer questions about the repository whose \
files follow. Be concise and refer to files by path.\n\n";

/// The system prompt of `agent` sessions: a coding agent's tool descriptions.
const AGENT_SYSTEM: &str = "You are a coding agent working in a git repository. You can call these tools:\n\
- read_file(path, revision?): returns the file's contents at a revision (default HEAD).\n\
- git_diff(from, to): returns the unified diff between two commits.\n\
- edit_file(path, old, new): replaces the text `old` with `new` in the file.\n\
- run_tests(filter?): runs the test suite and returns its output.\n\
Think step by step. After each tool result, say what you learned and which tool you call next.";

/// Conversation `i` of `spec`.
pub(super) fn conversation(spec: &ScenarioSpec, corpus: &SourceCorpus, seed: u64, i: usize) -> Conversation {
    let mut rng = Rng::derive(seed, &format!("{}/{i}", spec.scenario));
    let chars = spec.prompt_tokens * CHARS_PER_TOKEN;
    match spec.scenario {
        Scenario::RepeatedContext => {
            // The same stream for every session: the shared prefix.
            let mut shared = Rng::derive(seed, "repeated-context/context");
            let context = corpus.context(&mut shared, spec.shared_tokens * CHARS_PER_TOKEN);
            let turns = (0..spec.turns)
                .map(|k| {
                    let lead = if k == 0 { "" } else { "Follow-up question. " };
                    ask(&mut rng, corpus, lead, chars)
                })
                .collect();
            Conversation {
                preamble: vec![Message::new("system", format!("{REPO_SYSTEM}{context}"))],
                turns,
                replay: Vec::new(),
            }
        }
        Scenario::Unrelated | Scenario::Peak => single(code_then_question(&mut rng, corpus, chars, None)),
        Scenario::LongInput => single(code_then_question(
            &mut rng,
            corpus,
            chars,
            Some("List the three most important problems in the code above, one sentence each."),
        )),
        Scenario::LongOutput => single(code_then_question(
            &mut rng,
            corpus,
            chars,
            Some("Explain the code above line by line in detail, then propose improvements and rewrite it in full."),
        )),
        Scenario::Agent => agent(spec, corpus, &mut rng),
        Scenario::CodeEdit => single(code_edit(&mut rng, corpus, chars)),
        Scenario::CodeEditTools => code_edit_tools(spec, &mut rng, corpus, chars),
        // Built from a trace (`Workload::from_trace`), not from source text.
        Scenario::AgentTrace => Conversation { preamble: Vec::new(), turns: Vec::new(), replay: Vec::new() },
    }
}

/// A fresh prompt of about `tokens` approximate tokens (an excerpt and a question), drawn for
/// `label`: what a lone request of that size looks like, for calibration. `label` goes in the
/// first line, so two labels never share a cached prefix.
pub(crate) fn lone_prompt(corpus: &SourceCorpus, seed: u64, label: &str, tokens: usize) -> String {
    let mut rng = Rng::derive(seed, &format!("lone/{label}"));
    let head = format!("[{label}]\n");
    let body = code_then_question(&mut rng, corpus, (tokens * CHARS_PER_TOKEN).saturating_sub(head.len()), None);
    format!("{head}{body}")
}

fn single(user: String) -> Conversation {
    Conversation { preamble: Vec::new(), turns: vec![user], replay: Vec::new() }
}

/// A fenced excerpt of about `chars` characters (question included), then a
/// question about it (`question`, or one drawn about the excerpt).
fn code_then_question(rng: &mut Rng, corpus: &SourceCorpus, chars: usize, question: Option<&str>) -> String {
    // Leave room for a drawn question of typical length.
    let q_room = question.map_or(120, str::len);
    let room = chars.saturating_sub(q_room + 10).max(CHARS_PER_TOKEN * 8);
    let (path, code) = corpus.excerpt(rng, room);
    let q = match question {
        Some(q) => q.to_string(),
        None => question_about(rng, &path, &code),
    };
    format!("```\n{code}```\n{q}")
}

/// A question about a random file, padded with an excerpt of that file to
/// about `chars` characters.
fn ask(rng: &mut Rng, corpus: &SourceCorpus, lead: &str, chars: usize) -> String {
    let index = rng.below(corpus.files().len());
    let file = &corpus.files()[index];
    let q = format!("{lead}{}", question_about(rng, &file.path, &file.text));
    let room = chars.saturating_sub(q.len() + 30);
    if room < CHARS_PER_TOKEN * 8 {
        return q;
    }
    let (_, code) = corpus.excerpt_of(rng, index, room);
    format!("{q}\nThe code I mean:\n```\n{code}```")
}

/// An agent session: the task and an initial file, then tool results that
/// alternate between `git diff` output and files read at older commits.
fn agent(spec: &ScenarioSpec, corpus: &SourceCorpus, rng: &mut Rng) -> Conversation {
    let chars = spec.prompt_tokens * CHARS_PER_TOKEN;
    let file = corpus.pick(rng);
    let task = question_about(rng, &file.path, &file.text);
    let initial = super::source::truncate_at_line(&file.text, spec.shared_tokens.max(1) * CHARS_PER_TOKEN);
    let mut turns =
        vec![format!("Task: {task} Fix what you find.\nTool result (read_file {}):\n```\n{initial}```", file.path)];
    for k in 1..spec.turns {
        let diff = if k % 2 == 1 { corpus.diff(rng, chars) } else { None };
        turns.push(match diff {
            Some(d) => format!("Tool result (git_diff):\n```diff\n{d}```\nContinue with the task."),
            None => {
                let (label, text) = corpus.file_at_older_commit(rng);
                let text = super::source::truncate_at_line(&text, chars);
                format!("Tool result (read_file {label}):\n```\n{text}```\nContinue with the task.")
            }
        });
    }
    Conversation { preamble: vec![Message::new("system", AGENT_SYSTEM)], turns, replay: Vec::new() }
}

/// A file of the corpus (its first `chars` characters, whole lines) asked back whole with a small
/// change: a declared name renamed, a comment above each function, or doc comments.
fn code_edit(rng: &mut Rng, corpus: &SourceCorpus, chars: usize) -> String {
    let (path, text, change) = edit(rng, corpus, chars);
    format!(
        "Here is `{path}`:\n```\n{text}```\n{change} Answer with the whole new file in one fenced code block and \
         nothing else."
    )
}

/// The file (path, its first `chars` characters in whole lines) and the change asked for.
fn edit(rng: &mut Rng, corpus: &SourceCorpus, chars: usize) -> (String, String, String) {
    let file = corpus.pick(rng);
    let text = super::source::truncate_at_line(&file.text, chars.max(CHARS_PER_TOKEN * 8));
    let items = identifiers(text);
    let change = match rng.below(3) {
        0 if !items.is_empty() => {
            let item = &items[rng.below(items.len())];
            format!("Rename `{item}` to `{item}_v2` everywhere in it.")
        }
        1 => "Add a one-line comment above every function explaining what it does.".to_string(),
        _ => "Add a doc comment (or docstring) to every function and type that has none.".to_string(),
    };
    (file.path.clone(), text.to_string(), change)
}

/// The system prompt of `code-edit-tools`.
const EDIT_SYSTEM: &str = "You are a coding agent. Make the change the user asks for by calling write_file once \
with the file's path and its whole new content.";

/// `code-edit`'s edit as an agent asks for it: a chat request with a `write_file` tool that must
/// be called (`tool_choice` `required`, one call), greedy, streamed with its usage.
fn code_edit_tools(spec: &ScenarioSpec, rng: &mut Rng, corpus: &SourceCorpus, chars: usize) -> Conversation {
    let (path, text, change) = edit(rng, corpus, chars);
    let user = format!("Here is `{path}`:\n```\n{text}```\n{change} Write the whole new file with write_file.");
    let body = serde_json::json!({
        "messages": [{"role": "system", "content": EDIT_SYSTEM}, {"role": "user", "content": user}],
        "tools": [{"type": "function", "function": {
            "name": "write_file",
            "description": "Replaces a file's whole content.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "The file's path."},
                "content": {"type": "string", "description": "The file's new content, whole."}
            }, "required": ["path", "content"], "additionalProperties": false}
        }}],
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let approx_prompt_tokens = super::trace::approx_prompt_tokens(&body);
    let req = HttpRequest { path: "/v1/chat/completions".into(), body, approx_prompt_tokens };
    Conversation { preamble: Vec::new(), turns: Vec::new(), replay: vec![req] }
}

/// A question about an item of `text` (a function, type, ...) in `path`, or
/// about the file itself when it declares nothing.
fn question_about(rng: &mut Rng, path: &str, text: &str) -> String {
    let items = identifiers(text);
    if items.is_empty() {
        return match rng.below(3) {
            0 => format!("What is the purpose of `{path}`, and what would break if it were removed?"),
            1 => format!("Is anything in `{path}` wrong or out of date? Explain briefly."),
            _ => format!("How does `{path}` fit into the rest of the repository?"),
        };
    }
    let item = &items[rng.below(items.len())];
    match rng.below(6) {
        0 => format!("What does `{item}` in `{path}` do, and which callers depend on its behaviour?"),
        1 => format!("Is there a bug or an unhandled edge case in `{item}` (`{path}`)? Explain briefly."),
        2 => format!("How would you unit-test `{item}` in `{path}`?"),
        3 => format!("Suggest a clearer name or signature for `{item}` in `{path}`, and say why."),
        4 => format!("Which invariants does `{item}` in `{path}` rely on?"),
        _ => format!("How does `{item}` in `{path}` fit into the rest of the repository?"),
    }
}

/// Names declared in `text`: the word after `fn`, `struct`, `def`, `class`, ...
fn identifiers(text: &str) -> Vec<String> {
    const KEYWORDS: [&str; 10] = ["fn", "struct", "enum", "trait", "def", "class", "func", "function", "type", "impl"];
    let words: Vec<&str> = text.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
    let mut out: Vec<String> = words
        .windows(2)
        .filter(|w| KEYWORDS.contains(&w[0]) && w[1].len() > 2 && !w[1].starts_with(|c: char| c.is_ascii_digit()))
        .map(|w| w[1].to_string())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_declared_names() {
        let ids = identifiers("pub fn open_file(x: u32) {}\nstruct Pool;\ndef parse():\nlet fn = 3;");
        assert_eq!(ids, vec!["Pool", "open_file", "parse"]);
    }
}
