//! A session's prompt from its parts: the repository context at the branch
//! head, the stored history, and this turn (results of the previous answer's
//! tool calls, named files, tool output, the question). Blocking: call from
//! `spawn_blocking`.
//!
//! The operator's public system prompt and the repository context are one
//! system message, so that a template that renders tools after the system
//! message's content (Qwen's) puts them after the repository context: the
//! context stays first, and what was pre-warmed without tools stays reusable.

use super::overlay::{overlay, At, Overlay};
use super::prompt::{assemble, block, Assembled, Kind, Message, Piece, Render};
use crate::context::{tag_source, Repos};
use crate::error::ApiError;
use crate::state::Served;
use cachet_context::{CommitId, Mirror, RepoContext, SegmentKind};
use cachet_engine::radix::Tag;
use cachet_engine::runtime::{PublicPrefix, TokenSpan};
use cachet_tenants::store::{Repository, Role, Turn};
use cachet_tenants::RepoId;
use serde::Deserialize;

/// The largest file a message may name, in bytes.
pub const MAX_NAMED_FILE_BYTES: usize = 512 * 1024;
/// The most files one message may name.
pub const MAX_NAMED_FILES: usize = 32;

/// Tool output a message carries.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ToolOutput {
    Text(String),
    Named { name: Option<String>, content: String },
}

/// The result of a call the previous answer made.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolResult {
    /// The `id` of the call (from the answer's `tool_calls`).
    pub tool_call_id: String,
    /// What the tool returned.
    pub content: String,
}

/// This turn's input.
#[derive(Clone, Debug, Default)]
pub struct TurnInput {
    /// Results of the previous answer's calls (`tool` messages, before the user's).
    pub tool_results: Vec<ToolResult>,
    pub files: Vec<String>,
    pub tool_output: Vec<ToolOutput>,
    pub question: String,
    /// The tools the template renders this turn.
    pub tools: Option<serde_json::Value>,
}

/// A session prompt and what it was built from.
#[derive(Debug)]
pub struct SessionPrompt {
    /// The head it was built at, and the commit of its repository context (which differs, with
    /// an overlay, while the session's rebase is not warm yet).
    pub at: At,
    pub assembled: Assembled,
    /// The user turn's content as stored in the history.
    pub user_content: String,
    pub spans: Vec<TokenSpan>,
    pub public: Option<PublicPrefix>,
    /// Tokens up to the end of the repository context (and the framing
    /// after it): what pre-warm fills.
    pub context_end: usize,
}

/// The repository context as prompt pieces, with their tokens.
pub(crate) fn context_pieces(ctx: &RepoContext) -> Vec<Piece> {
    ctx.segments
        .iter()
        .map(|s| Piece {
            kind: match s.kind {
                SegmentKind::Header => Kind::ContextHeader,
                SegmentKind::Outline => Kind::Outline,
                SegmentKind::File => Kind::File,
            },
            text: ctx.text[s.text.clone()].to_string(),
            tokens: Some(ctx.tokens[s.tokens.clone()].to_vec()),
            path: s.path.clone(),
            blob: s.blob.as_ref().map(|b| b.to_string()),
            version: Some(s.version.clone()),
            turn: None,
        })
        .collect()
}

fn history_messages(served: &Served, history: &[Turn]) -> Vec<Message> {
    let tokenizer = served.engine.tokenizer();
    let stops = tokenizer.eos_ids();
    history
        .iter()
        .map(|turn| {
            let (role, kind) = match turn.role {
                Role::User => ("user", Kind::HistoryUser),
                Role::Assistant => ("assistant", Kind::HistoryAssistant),
                Role::Tool => ("tool", Kind::HistoryTool),
            };
            let mut piece = Piece::text(kind, turn.content.clone());
            piece.turn = Some(turn.seq);
            // The generated tokens, when they are this model's and spell the
            // stored text, so the next prompt repeats what is cached.
            if let (Some(tokens), Some(model)) = (&turn.tokens, &turn.model) {
                let mut tokens = tokens.clone();
                while tokens.last().is_some_and(|t| stops.contains(t)) {
                    tokens.pop();
                }
                let spells = tokenizer.decode(&tokens, true).is_ok_and(|t| t == turn.content);
                if *model == served.id && spells {
                    piece.tokens = Some(tokens);
                }
            }
            let mut message = Message::new(role, vec![piece]);
            message.fields.tool_call_id = turn.tool_call_id.clone();
            message
        })
        .collect()
}

/// The pieces of this turn's user message; named files are read at `commit`.
fn turn_pieces(mirror: &Mirror, commit: &CommitId, turn: &TurnInput) -> Result<Vec<Piece>, ApiError> {
    if turn.files.len() > MAX_NAMED_FILES {
        return Err(ApiError::bad_param("files", format!("at most {MAX_NAMED_FILES} files per message")));
    }
    let mut pieces = Vec::new();
    for path in &turn.files {
        // The size is checked from the blob's header: a larger file is never read.
        let file = match mirror.read_file_at_most(commit, path, MAX_NAMED_FILE_BYTES as u64) {
            Err(cachet_context::ContextError::TooLarge(_)) => {
                return Err(ApiError::bad_param(
                    "files",
                    format!("{path:?} is larger than {MAX_NAMED_FILE_BYTES} bytes"),
                ))
            }
            other => other?,
        }
        .ok_or_else(|| ApiError::bad_param("files", format!("{path:?} does not exist at commit {commit}")))?;
        let text = String::from_utf8(file.bytes)
            .map_err(|_| ApiError::bad_param("files", format!("{path:?} is not UTF-8 text")))?;
        let mut piece = Piece::text(Kind::TurnFile, block(path, &text));
        piece.path = Some(path.clone());
        piece.blob = Some(file.blob.to_string());
        piece.version = Some(file.blob.to_string());
        pieces.push(piece);
    }
    for output in &turn.tool_output {
        let (name, content) = match output {
            ToolOutput::Text(content) => (None, content),
            ToolOutput::Named { name, content } => (name.as_deref(), content),
        };
        let heading = match name {
            Some(n) => format!("Tool output: {}", n.trim()),
            None => "Tool output".to_string(),
        };
        pieces.push(Piece::text(Kind::ToolOutput, block(&heading, content)));
    }
    let question = turn.question.trim();
    if !question.is_empty() {
        pieces.push(Piece::text(Kind::Question, question));
    }
    if pieces.is_empty() && turn.tool_results.is_empty() {
        return Err(ApiError::bad_param("content", "the message has no content, files, tool output or tool results"));
    }
    Ok(pieces)
}

/// The most tool results one turn may carry, and the largest one.
pub const MAX_TOOL_RESULTS: usize = 64;
pub const MAX_TOOL_RESULT_BYTES: usize = 512 * 1024;

/// This turn's `tool` messages.
fn tool_messages(turn: &TurnInput) -> Result<Vec<Message>, ApiError> {
    if turn.tool_results.len() > MAX_TOOL_RESULTS {
        return Err(ApiError::bad_param(
            "tool_results",
            format!("at most {MAX_TOOL_RESULTS} tool results per message"),
        ));
    }
    turn.tool_results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if r.tool_call_id.is_empty() || r.tool_call_id.len() > 200 {
                return Err(ApiError::bad_param(
                    format!("tool_results[{i}].tool_call_id"),
                    "tool_call_id must be 1 to 200 bytes",
                ));
            }
            if r.content.len() > MAX_TOOL_RESULT_BYTES {
                return Err(ApiError::bad_param(
                    format!("tool_results[{i}].content"),
                    format!("a tool result may be at most {MAX_TOOL_RESULT_BYTES} bytes"),
                ));
            }
            Ok(Message::tool(vec![Piece::text(Kind::ToolResult, r.content.clone())], Some(r.tool_call_id.clone())))
        })
        .collect()
}

/// Builds the prompt of a session turn (`turn = None`: the shared prefix
/// only, for pre-warm) from the repository context at `at.context`, with an
/// overlay of what changed up to `at.head` when `at` asks for one (see
/// [`super::overlay`]; an overlay too large to be worth it builds at the head).
pub fn session_prompt(
    repos: &Repos,
    served: &Served,
    repo: &Repository,
    branch: &str,
    at: &At,
    history: &[Turn],
    turn: Option<&TurnInput>,
) -> Result<SessionPrompt, ApiError> {
    let template = served.engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
    let mirror = repos.mirror(repo)?;
    let tokenizer = served.engine.tokenizer();
    let mut at = at.clone();
    let mut overlaid = None;
    if let (Some(since), Some(_)) = (at.overlay_since.clone(), turn) {
        let base = repos.context(repo, &mirror, &at.context, tokenizer)?;
        let now = repos.context(repo, &mirror, &at.head, tokenizer)?;
        match overlay(&mirror, &base, &at.context, &now, &since, &at.head)? {
            Overlay::Nothing => {}
            Overlay::TooLarge => at = At::head(at.head.clone()),
            Overlay::Piece(piece) => overlaid = Some(piece),
        }
    }
    let context = repos.context(repo, &mirror, &at.context, tokenizer)?;
    let mut system = Vec::new();
    if let Some((public, _)) = &served.public {
        // A piece ends with a newline when another follows (see `prompt`).
        let text = if context.segments.is_empty() { public.clone() } else { format!("{}\n\n", public.trim_end()) };
        system.push(Piece::text(Kind::System, text));
    }
    system.extend(context_pieces(&context));
    let mut messages = Vec::new();
    if !system.is_empty() {
        messages.push(Message::new("system", system));
    }
    messages.extend(history_messages(served, history));
    let (pieces, tool_messages) = match turn {
        Some(turn) => {
            let mut pieces = turn_pieces(&mirror, &at.head, turn)?;
            pieces.splice(0..0, overlaid);
            (pieces, tool_messages(turn)?)
        }
        // Any user message: only the prefix before it is kept.
        None => (vec![Piece::text(Kind::Question, "?")], Vec::new()),
    };
    messages.extend(tool_messages);
    let user_content: String = pieces.iter().map(|p| p.text.as_str()).collect();
    if !pieces.is_empty() {
        messages.push(Message::new("user", pieces));
    }
    let tools = turn.and_then(|t| t.tools.as_ref());
    let assembled =
        assemble(template, served.engine.tokenizer(), &messages, Render::with_tools(tools)).map_err(|e| match e {
            super::prompt::PromptError::Tokenizer(m) => ApiError::bad(m),
            other => ApiError::Internal(other.to_string()),
        })?;
    // Pre-warm fills the system message and the framing after it (when there is one).
    let context_end = if messages.len() > 1 && !messages[0].pieces.is_empty() && messages[0].role == "system" {
        assembled.end_of_frame_after(0)
    } else {
        0
    };
    // The public prefix: the framing and the operator's prompt, the same for every tenant; only
    // up to the prompt's start when what follows was tokenized with it (a tools block, which is
    // the tenant's).
    let public = served.public.as_ref().and_then(|_| {
        let at = assembled.segments.iter().position(|s| s.kind == Kind::System)?;
        let system = &assembled.segments[at];
        let merged =
            assembled.segments[at + 1..].iter().take_while(|s| s.tokens.is_empty()).any(|s| !s.text.is_empty());
        let end = if merged { system.tokens.start } else { system.tokens.end };
        (end > 0).then(|| PublicPrefix { template: "chat".into(), tokens: end })
    });
    let spans = spans(repo.id, branch, &assembled);
    Ok(SessionPrompt { at, assembled, user_content, spans, public, context_end })
}

/// Cache tags for the repository pieces of a prompt.
pub(crate) fn spans(repo: RepoId, branch: &str, assembled: &Assembled) -> Vec<TokenSpan> {
    assembled
        .segments
        .iter()
        .filter(|s| !s.tokens.is_empty())
        .filter_map(|s| match (s.kind, &s.path, &s.version) {
            (Kind::Outline | Kind::File | Kind::TurnFile, Some(path), Some(version)) => Some(TokenSpan {
                range: s.tokens.clone(),
                tag: Tag { source: tag_source(repo, branch, path).into(), version: version.as_str().into() },
            }),
            _ => None,
        })
        .collect()
}
