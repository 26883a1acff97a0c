//! Assembling a session's prompt: public system prompt → repository context
//! → history → this turn, in the model's own chat template, tokenized piece
//! by piece so that every piece's token span is exact.
//!
//! The template's framing (the text around each message's content) is found
//! by rendering the conversation with sentinel contents; the prompt is then
//! the frames (tokenized with special tokens) interleaved with the pieces of
//! each message (tokenized as plain text, or taken as already tokenized: the
//! repository context, an assistant turn's generated tokens). Pieces start
//! with a non-whitespace character and end with a newline, and frames begin
//! or end at special tokens, so byte-level BPE cannot merge across a cut: the
//! pieces' tokens are the tokens of the whole text (a test checks this with
//! the real tokenizer). The assembled text is checked against the template's
//! own rendering, so a template that rewrites content is refused, not
//! silently mis-cached.

use cachet_engine::chat_template::{ChatMessage, ChatTemplate};
use cachet_engine::tokenizer::Tokenizer;
use serde::Serialize;
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
    /// A user turn of the history.
    HistoryUser,
    /// An assistant turn of the history.
    HistoryAssistant,
    /// This turn: a file the message names, in full.
    TurnFile,
    /// This turn: tool output the message carries.
    ToolOutput,
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

/// The framing of `roles` in `template`: one more frame than messages.
fn frames(template: &ChatTemplate, roles: &[&'static str]) -> Result<Vec<String>, PromptError> {
    let probe: Vec<ChatMessage> = roles.iter().enumerate().map(|(i, r)| ChatMessage::new(*r, sentinel(i))).collect();
    let rendered = template.render(&probe, true, None).map_err(|e| PromptError::Template(e.to_string()))?;
    let mut frames = Vec::with_capacity(roles.len() + 1);
    let mut rest = rendered.as_str();
    for i in 0..roles.len() {
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

/// Assembles `messages` in `template` (with the generation prompt).
pub fn assemble(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Message],
) -> Result<Assembled, PromptError> {
    let roles: Vec<&'static str> = messages.iter().map(|m| m.role).collect();
    let frames = frames(template, &roles)?;
    let mut out = Assembled { text: String::new(), tokens: Vec::new(), segments: Vec::new(), frame_ends: Vec::new() };
    let encode =
        |text: &str, special: bool| tokenizer.encode(text, special).map_err(|e| PromptError::Tokenizer(e.to_string()));
    let push = |out: &mut Assembled, piece: &Piece, tokens: Vec<u32>| {
        let text = out.text.len()..out.text.len() + piece.text.len();
        let range = out.tokens.len()..out.tokens.len() + tokens.len();
        out.text.push_str(&piece.text);
        out.tokens.extend_from_slice(&tokens);
        out.segments.push(Segment {
            kind: piece.kind,
            path: piece.path.clone(),
            blob: piece.blob.clone(),
            version: piece.version.clone(),
            turn: piece.turn,
            text,
            tokens: range,
        });
    };
    for (i, frame) in frames.iter().enumerate() {
        if !frame.is_empty() {
            push(&mut out, &Piece::text(Kind::Template, frame.clone()), encode(frame, true)?);
        }
        out.frame_ends.push(out.tokens.len());
        let Some(message) = messages.get(i) else { break };
        for piece in &message.pieces {
            let tokens = match &piece.tokens {
                Some(t) => t.clone(),
                None => encode(&piece.text, false)?,
            };
            push(&mut out, piece, tokens);
        }
    }
    // The template must place each content verbatim.
    let whole: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(m.role, m.pieces.iter().map(|p| p.text.as_str()).collect::<String>()))
        .collect();
    let rendered = template.render(&whole, true, None).map_err(|e| PromptError::Template(e.to_string()))?;
    if rendered != out.text {
        return Err(PromptError::Unsupported);
    }
    Ok(out)
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
