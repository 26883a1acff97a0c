//! Assembling a session's prompt: public system prompt → repository context
//! → history → this turn, in the model's own chat template, tokenized piece
//! by piece so that every piece's token span is exact.
//!
//! The template's framing (the text around each message's content, the tools
//! block included) is found by rendering the conversation with sentinel
//! contents; the prompt is then the frames (special tokens split out)
//! interleaved with the pieces of each message (tokenized as plain text, or
//! taken as already tokenized: the repository context, an assistant turn's
//! generated tokens). Pieces start with a non-whitespace character and end
//! with a newline, and most frames begin and end at special tokens, so
//! byte-level BPE cannot merge across a cut; where it could (a frame that
//! starts with whitespace, such as Qwen's tools block after the system
//! message; tool results, which are the client's text), the items on both
//! sides are tokenized together. Either way the prompt's tokens are the tokens
//! of its whole text (a test checks this with the real tokenizer). The
//! assembled text is checked against the template's own rendering, so a
//! template that rewrites content is refused, not silently mis-cached.

use cachet_engine::chat_template::{ChatMessage, ChatTemplate};
use cachet_engine::tokenizer::Tokenizer;
use serde::Serialize;
use serde_json::Value;
use std::ops::Range;

/// What a piece of the prompt is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Chat-template framing (role markers and the like).
    Template,
    /// The operator's public system prompt.
    System,
    /// Repository context: its fixed header.
    ContextHeader,
    /// Repository context: a file's outline.
    Outline,
    /// Repository context: a file in full.
    File,
    /// The client's own system prompt (a request bound to a repository through the OpenAI API).
    Instructions,
    /// A user turn of the history.
    HistoryUser,
    /// An assistant turn of the history.
    HistoryAssistant,
    /// A tool's result in the history.
    HistoryTool,
    /// This turn: the new versions of files that changed since the repository context above
    /// (`[context] after_push = "overlay"`).
    Overlay,
    /// This turn: a file the message names, in full.
    TurnFile,
    /// This turn: tool output the message carries.
    ToolOutput,
    /// This turn: the result of a call the previous answer made (a `tool` message).
    ToolResult,
    /// This turn: the question.
    Question,
}

/// A piece of a message's content.
#[derive(Clone, Debug)]
pub struct Piece {
    pub kind: Kind,
    pub text: String,
    /// Tokens already known (repository context, generated answers).
    pub tokens: Option<Vec<u32>>,
    pub path: Option<String>,
    pub blob: Option<String>,
    /// The cache tag version of a repository piece.
    pub version: Option<String>,
    /// The history turn a piece comes from.
    pub turn: Option<i32>,
}

impl Piece {
    pub fn text(kind: Kind, text: impl Into<String>) -> Piece {
        Piece { kind, text: text.into(), tokens: None, path: None, blob: None, version: None, turn: None }
    }
}

/// A message of the conversation, as pieces.
#[derive(Clone, Debug)]
pub struct Message {
    pub role: &'static str,
    pub pieces: Vec<Piece>,
    /// The rest of the message as the template reads it (`tool_call_id`, an assistant's
    /// `tool_calls`, `name`, `reasoning_content`); its role and content are not read.
    pub fields: ChatMessage,
}

impl Message {
    /// A message of `role` made of `pieces`.
    pub fn new(role: &'static str, pieces: Vec<Piece>) -> Message {
        Message { role, pieces, fields: ChatMessage::new(role, "") }
    }

    /// A `tool` message answering the call `tool_call_id`.
    pub fn tool(pieces: Vec<Piece>, tool_call_id: Option<String>) -> Message {
        let mut message = Message::new("tool", pieces);
        message.fields.tool_call_id = tool_call_id;
        message
    }

    /// Whether the message has content to place (a message without any is rendered as it is).
    fn has_content(&self) -> bool {
        self.pieces.iter().any(|p| !p.text.is_empty())
    }
}

/// A span of the assembled prompt.
#[derive(Clone, Debug, Serialize)]
pub struct Segment {
    pub kind: Kind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<i32>,
    /// Byte range in the prompt text.
    pub text: Range<usize>,
    /// Range in the prompt tokens.
    pub tokens: Range<usize>,
}

/// The assembled prompt.
#[derive(Clone, Debug)]
pub struct Assembled {
    pub text: String,
    pub tokens: Vec<u32>,
    pub segments: Vec<Segment>,
    /// The token index where each frame ends (one more than messages).
    frame_ends: Vec<usize>,
}

impl Assembled {
    /// Where the framing after message `index` ends: the prefix up to there
    /// is shared by every prompt whose first `index + 1` messages are these
    /// and whose next message has the same role.
    pub fn end_of_frame_after(&self, index: usize) -> usize {
        self.frame_ends.get(index + 1).copied().unwrap_or(self.tokens.len())
    }
}

/// Why a prompt could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("the chat template failed: {0}")]
    Template(String),
    #[error("the served model's chat template does not keep message content verbatim, which sessions need")]
    Unsupported,
    #[error("tokenizing the prompt failed: {0}")]
    Tokenizer(String),
}

fn sentinel(i: usize) -> String {
    format!("\u{E000}cachet-{i}\u{E001}")
}

/// How the template renders a conversation: the tools it shows, the variables it is given
/// (`chat_template_kwargs`), and whether the prompt ends with the opening of the answer.
#[derive(Clone, Copy, Debug)]
pub struct Render<'a> {
    pub tools: Option<&'a Value>,
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
    pub generation_prompt: bool,
}

impl<'a> Render<'a> {
    /// The tools given, no variables, with the generation prompt.
    pub fn with_tools(tools: Option<&'a Value>) -> Render<'a> {
        Render { tools, kwargs: None, generation_prompt: true }
    }

    fn run(&self, template: &ChatTemplate, messages: &[ChatMessage]) -> Result<String, PromptError> {
        let none = serde_json::Map::new();
        template
            .render_with(messages, self.generation_prompt, self.tools, self.kwargs.unwrap_or(&none))
            .map_err(|e| PromptError::Template(e.to_string()))
    }
}

/// The conversation as a template sees it: `texts` as the messages' contents.
fn chat_messages(messages: &[Message], texts: impl Fn(usize) -> String) -> Vec<ChatMessage> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut msg = m.fields.clone();
            msg.role = m.role.to_string();
            msg.content = texts(i);
            msg
        })
        .collect()
}

/// The framing of `messages` in `template`: one more frame than messages (a message without
/// content has an empty frame before it: its framing is in the next one).
fn frames(template: &ChatTemplate, messages: &[Message], render: Render<'_>) -> Result<Vec<String>, PromptError> {
    let probe = chat_messages(messages, |i| if messages[i].has_content() { sentinel(i) } else { String::new() });
    let rendered = render.run(template, &probe)?;
    let mut frames = Vec::with_capacity(messages.len() + 1);
    let mut rest = rendered.as_str();
    for (i, message) in messages.iter().enumerate() {
        if !message.has_content() {
            frames.push(String::new());
            continue;
        }
        let mark = sentinel(i);
        let at = rest.find(&mark).ok_or(PromptError::Unsupported)?;
        frames.push(rest[..at].to_string());
        rest = &rest[at + mark.len()..];
    }
    if rest.contains('\u{E000}') {
        return Err(PromptError::Unsupported);
    }
    frames.push(rest.to_string());
    Ok(frames)
}

/// One unit of the prompt: a special token of a frame, a frame's other text, or a piece.
struct Item<'a> {
    text: &'a str,
    special: bool,
    /// The piece it is, if it is not framing.
    piece: Option<&'a Piece>,
}

/// Whether BPE cannot merge across the end of `a` and the start of `b`: `a` ends
/// with a newline and `b` starts with something else than whitespace (or either
/// is a special token, which the tokenizer splits out first).
fn clean(a: &Item<'_>, b: &Item<'_>) -> bool {
    a.special || b.special || (a.text.ends_with('\n') && !b.text.starts_with(char::is_whitespace))
}

/// Assembles `messages` in `template` as `render` says.
///
/// The tokens are those of the whole text: pieces and framing are tokenized on
/// their own where nothing can merge across their boundary, and together where
/// something can (Qwen's tools block, which follows the system message's content
/// with `"\n\n# Tools"`; a tool result's `"\n</tool_response>"`). A piece
/// tokenized together with its neighbours loses its given tokens; its segment
/// then holds the whole group's tokens.
pub fn assemble(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Message],
    render: Render<'_>,
) -> Result<Assembled, PromptError> {
    let frames = frames(template, messages, render)?;
    let mut items: Vec<Item<'_>> = Vec::new();
    // The items of each frame.
    let mut frame_items: Vec<Range<usize>> = Vec::with_capacity(frames.len());
    for (i, frame) in frames.iter().enumerate() {
        let first = items.len();
        let mut rest = frame.as_str();
        while !rest.is_empty() {
            let (text, special, used) = match tokenizer.find_special(rest) {
                Some(r) if r.start == 0 => (&rest[..r.end], true, r.end),
                Some(r) => (&rest[..r.start], false, r.start),
                None => (rest, false, rest.len()),
            };
            items.push(Item { text, special, piece: None });
            rest = &rest[used..];
        }
        frame_items.push(first..items.len());
        if let Some(message) = messages.get(i) {
            for piece in &message.pieces {
                items.push(Item { text: &piece.text, special: false, piece: Some(piece) });
            }
        }
    }
    let encode =
        |text: &str, special: bool| tokenizer.encode(text, special).map_err(|e| PromptError::Tokenizer(e.to_string()));
    let mut out = Assembled { text: String::new(), tokens: Vec::new(), segments: Vec::new(), frame_ends: Vec::new() };
    // The token count at each boundary between items (index k: before item k); inside a
    // group tokenized as one, the group's start (the last position shared for sure).
    let mut boundary = vec![0; items.len() + 1];
    let mut start = 0;
    while start < items.len() {
        // A group: items joined by boundaries BPE could merge across.
        let mut end = start + 1;
        while end < items.len() && !clean(&items[end - 1], &items[end]) {
            end += 1;
        }
        let group = &items[start..end];
        let tokens = match group {
            [one] if one.special => encode(one.text, true)?,
            [one] => match one.piece.and_then(|p| p.tokens.clone()) {
                Some(t) => t,
                None => encode(one.text, false)?,
            },
            // Never a special token inside: those are always clean boundaries.
            many => encode(&many.iter().map(|it| it.text).collect::<String>(), false)?,
        };
        // The group's tokens go to its first piece (else its first item).
        let owner = group.iter().position(|it| it.piece.is_some()).unwrap_or(0);
        let token_start = out.tokens.len();
        out.tokens.extend_from_slice(&tokens);
        let token_end = out.tokens.len();
        for (k, it) in group.iter().enumerate() {
            let text = out.text.len()..out.text.len() + it.text.len();
            out.text.push_str(it.text);
            let tokens = match k.cmp(&owner) {
                std::cmp::Ordering::Less => token_start..token_start,
                std::cmp::Ordering::Equal => token_start..token_end,
                std::cmp::Ordering::Greater => token_end..token_end,
            };
            push_segment(&mut out.segments, it, text, tokens);
            boundary[start + k + 1] = if start + k + 1 == end { token_end } else { token_start };
        }
        start = end;
    }
    out.frame_ends = frame_items.iter().map(|r| boundary[r.end]).collect();
    // The template must place each content verbatim.
    let whole = chat_messages(messages, |i| messages[i].pieces.iter().map(|p| p.text.as_str()).collect());
    if render.run(template, &whole)? != out.text {
        return Err(PromptError::Unsupported);
    }
    Ok(out)
}

/// Adds an item's segment, folding framing into the framing segment before it.
fn push_segment(segments: &mut Vec<Segment>, it: &Item<'_>, text: Range<usize>, tokens: Range<usize>) {
    let Some(piece) = it.piece else {
        if let Some(last) = segments.last_mut().filter(|s| s.kind == Kind::Template && s.text.end == text.start) {
            last.text.end = text.end;
            last.tokens.end = last.tokens.end.max(tokens.end);
            return;
        }
        segments.push(Segment {
            kind: Kind::Template,
            path: None,
            blob: None,
            version: None,
            turn: None,
            text,
            tokens,
        });
        return;
    };
    segments.push(Segment {
        kind: piece.kind,
        path: piece.path.clone(),
        blob: piece.blob.clone(),
        version: piece.version.clone(),
        turn: piece.turn,
        text,
        tokens,
    });
}

/// A fence of backticks longer than any run in `text`.
pub fn fence(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    "`".repeat((longest + 1).max(3))
}

/// A block showing `content` under a heading: starts with `#`, ends with a
/// newline (see the module docs).
pub fn block(heading: &str, content: &str) -> String {
    let fence = fence(content);
    let newline = if content.ends_with('\n') || content.is_empty() { "" } else { "\n" };
    format!("### {heading}\n{fence}\n{content}{newline}{fence}\n\n")
}
