//! A chat-shaped request bound to one of the tenant's repositories with no change to the client:
//! the model name (`<model>@<repository>` or `<model>@<repository>:<branch>`, what `/v1/models`
//! lists) or the `X-Cachet-Repository` header (`<repository>` or `<repository>:<branch>`) chooses
//! it, by name or id. Only the tenant's own repositories are looked up, so another tenant's name
//! is as unknown as a made-up one (404).
//!
//! The prompt keeps both caches ([`render`]): the operator's public prompt and the client's own
//! system messages (and the tools the template shows with them) come first, as they would
//! unbound, so an agent's preamble is still the prefix every tenant shares; the repository
//! context follows as a system message of its own, at the branch head, most stable part first;
//! then the conversation. Every turn of a conversation, and every new conversation on the same
//! commit, repeats the same tokens up to the end of the context, which the engine's prefix cache
//! then holds for the tenant. The context's pieces carry their files' cache tags, so a push that
//! changes a file evicts what followed its old text, as it does for sessions.

use crate::context::Repos;
use crate::error::ApiError;
use crate::sessions::assemble::{context_pieces, spans};
use crate::sessions::prompt::{assemble, Kind, Message, Piece, PromptError, Render, Segment};
use crate::state::{AppState, Served};
use actix_web::{web, HttpRequest};
use cachet_context::CommitId;
use cachet_engine::chat_template::{ChatMessage, ChatTemplate};
use cachet_engine::generate::GenerateParams;
use cachet_engine::runtime::{EngineHandle, PublicPrefix, Request as EngineRequest, SloClass, TokenSpan};
use cachet_tenants::store::{RepoStatus, Repository};
use cachet_tenants::{RepoId, Tenant};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The header that binds a request to a repository, for clients that can send one.
pub const HEADER: &str = "x-cachet-repository";

/// The longest binding a request may name (a repository name is at most 200 bytes; a branch
/// name rarely longer).
const MAX_BINDING_BYTES: usize = 512;

/// The repository a request is bound to, and the branch.
#[derive(Clone, Debug)]
pub struct Binding {
    pub repo: Repository,
    pub branch: String,
}

/// A model name without its binding, and the binding (`model@binding`).
pub fn split_model(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((model, binding)) => (model, Some(binding)),
        None => (name, None),
    }
}

/// The binding a request asks for: in its model name, or in the header (both: they must agree).
pub(crate) fn requested<'a>(http: &'a HttpRequest, in_model: Option<&'a str>) -> Result<Option<&'a str>, ApiError> {
    let header = match http.headers().get(HEADER) {
        None => None,
        Some(value) => Some(
            value.to_str().map_err(|_| ApiError::bad(format!("the {HEADER} header must be visible ASCII")))?.trim(),
        ),
    };
    match (in_model, header) {
        (Some(a), Some(b)) if a != b => Err(ApiError::bad_param(
            "model",
            format!("the model name binds repository {a:?} and the {HEADER} header {b:?}: give one"),
        )),
        (Some(chosen), _) | (None, Some(chosen)) => Ok(Some(chosen)),
        (None, None) => Ok(None),
    }
}

/// The tenant's repository (and branch) that `chosen` names: `<name or id>` or
/// `<name or id>:<branch>` (a name that itself holds a colon is matched whole first).
pub(crate) async fn find(state: &AppState, tenant: &Tenant, chosen: &str) -> Result<Binding, ApiError> {
    if chosen.is_empty() || chosen.len() > MAX_BINDING_BYTES {
        return Err(ApiError::bad_param("model", format!("a repository binding is 1 to {MAX_BINDING_BYTES} bytes")));
    }
    let repos = state.store.repositories(tenant.id).await?;
    let named = |name: &str| {
        let hits =
            repos.iter().filter(|r| r.name == name || r.id.to_string() == name || r.id.simple().to_string() == name);
        // A failed registration keeps its row (and may share its name with a newer one).
        hits.min_by_key(|r| r.status != RepoStatus::Ready)
    };
    let (repo, branch) = match named(chosen) {
        Some(repo) => (repo, None),
        None => match chosen.rsplit_once(':') {
            Some((name, branch)) if !branch.is_empty() => match named(name) {
                Some(repo) => (repo, Some(branch)),
                None => return Err(unknown(chosen)),
            },
            _ => return Err(unknown(chosen)),
        },
    };
    let default = crate::registration::ready(repo)?;
    Ok(Binding { repo: repo.clone(), branch: branch.unwrap_or(default).to_string() })
}

fn unknown(chosen: &str) -> ApiError {
    ApiError::NotFound(format!("repository {chosen:?} (GET /v1/models lists the repositories this token may bind)"))
}

/// A conversation's prompt as the model sees it.
#[derive(Debug)]
pub struct Rendered {
    pub text: String,
    pub tokens: Vec<u32>,
    /// The cache tags of the repository's files in the prompt.
    pub spans: Vec<TokenSpan>,
    /// What each part of the prompt is (bound requests).
    pub segments: Vec<Segment>,
    /// The commit of the repository context (bound requests).
    pub commit: Option<CommitId>,
    /// A watched working tree's snapshot (`crate::watch`): the branch head its uncommitted
    /// changes are over.
    pub uncommitted_over: Option<CommitId>,
}

/// How a bound conversation is rendered: what [`Render`] holds, owned, for the blocking pool.
#[derive(Clone, Debug)]
pub struct Request {
    /// The conversation, the operator's public prompt first where there is one.
    pub messages: Vec<ChatMessage>,
    /// Whether the first message is the operator's public prompt.
    pub public_first: bool,
    pub tools: Option<Value>,
    pub kwargs: Option<Map<String, Value>>,
    pub generation_prompt: bool,
}

impl Request {
    /// A conversation behind the operator's public prompt (where there is one).
    pub fn new(
        served: &Served,
        messages: Vec<ChatMessage>,
        tools: Option<Value>,
        kwargs: Option<Map<String, Value>>,
    ) -> Request {
        let mut conversation = Vec::with_capacity(messages.len() + 1);
        if let Some((public, _)) = &served.public {
            conversation.push(ChatMessage::system(public.clone()));
        }
        let public_first = !conversation.is_empty();
        conversation.extend(messages);
        Request { messages: conversation, public_first, tools, kwargs, generation_prompt: true }
    }
}

/// The served model and the repository (if any) a chat-shaped request names.
pub(crate) async fn resolve<'a>(
    state: &'a AppState,
    tenant: &Tenant,
    http: &HttpRequest,
    name: &str,
) -> Result<(&'a Served, Option<Binding>), ApiError> {
    let (model, in_model) = split_model(name);
    let served = super::model_named(state, model)?;
    let binding = match requested(http, in_model)? {
        Some(chosen) => Some(find(state, tenant, chosen).await?),
        None => None,
    };
    Ok((served, binding))
}

/// A conversation's prompt: rendered with the model's template behind the public system prompt
/// and tokenized (special tokens parsed) or, bound to a repository, [`render`]ed on the blocking
/// pool.
pub(crate) async fn prompt(
    state: &AppState,
    served: &Served,
    request: Request,
    binding: Option<Binding>,
) -> Result<Rendered, ApiError> {
    let Some(binding) = binding else {
        let template = served.engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
        let text = request.text(template, &request.messages)?;
        let tokens = super::encode(&served.engine, text.clone()).await?;
        return Ok(Rendered {
            text,
            tokens,
            spans: Vec::new(),
            segments: Vec::new(),
            commit: None,
            uncommitted_over: None,
        });
    };
    // What the client sent is refused before any work where it could not fit (as `encode` does).
    let limit = served.engine.max_context();
    let bytes: usize = request.messages.iter().map(|m| m.content.len()).sum();
    if bytes > limit.saturating_mul(super::MAX_BYTES_PER_TOKEN) {
        return Err(ApiError::PromptTooLarge { bytes, limit });
    }
    // Prompts rendered with a repository's context (what `scripts/agents-check.sh` counts).
    metrics::counter!("cachet:bound_prompts_total").increment(1);
    state.note_branch_served(binding.repo.id, &binding.branch);
    state.replica.preambles.record(binding.repo.id, &binding.branch, &request);
    let (repos, engine) = (state.repos.clone(), served.engine.clone());
    web::block(move || render(&repos, &engine, &binding, &request))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
}

/// Renders a bound conversation (blocking: it may build the repository's context, and it
/// tokenizes). The context is a system message after the leading system messages; the client's
/// messages are tokenized as text, the context's pieces are taken as already tokenized, and the
/// whole is checked against the template's own rendering (see `sessions::prompt`). A template
/// that rewrites message contents gets the same text tokenized whole, without file tags.
pub(crate) fn render(
    repos: &Arc<Repos>,
    engine: &EngineHandle,
    binding: &Binding,
    request: &Request,
) -> Result<Rendered, ApiError> {
    let template = engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
    let tokenizer = engine.tokenizer();
    let mirror = repos.mirror(&binding.repo)?;
    let commit = repos.head(&binding.repo, &mirror, &binding.branch)?;
    let uncommitted_over = match repos.watched(&binding.repo) {
        true => mirror.branch_head(&binding.branch).ok().filter(|head| *head != commit),
        false => None,
    };
    let context = repos.context(&binding.repo, &mirror, &commit, tokenizer)?;
    let leading = request.messages.iter().take_while(|m| m.role == "system").count();
    let mut messages: Vec<Message> =
        request.messages.iter().enumerate().map(|(i, m)| message(m, i == 0 && request.public_first)).collect();
    if !context.segments.is_empty() {
        messages.insert(leading, Message::new("system", context_pieces(&context)));
    }
    let how = Render {
        tools: request.tools.as_ref(),
        kwargs: request.kwargs.as_ref(),
        generation_prompt: request.generation_prompt,
    };
    match assemble(template, tokenizer, &messages, how) {
        Ok(assembled) => Ok(Rendered {
            spans: spans(binding.repo.id, &binding.branch, &assembled),
            text: assembled.text,
            tokens: assembled.tokens,
            segments: assembled.segments,
            commit: Some(commit),
            uncommitted_over,
        }),
        Err(PromptError::Unsupported) => {
            tracing::debug!("the chat template rewrites message contents: a bound prompt is tokenized whole");
            let mut whole = request.messages.clone();
            if !context.segments.is_empty() {
                whole.insert(leading, ChatMessage::system(context.text.clone()));
            }
            let text = request.text(template, &whole)?;
            let tokens = tokenizer.encode(&text, true).map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
            Ok(Rendered {
                text,
                tokens,
                spans: Vec::new(),
                segments: Vec::new(),
                commit: Some(commit),
                uncommitted_over,
            })
        }
        Err(PromptError::Template(m)) => Err(ApiError::bad_param("messages", m)),
        Err(PromptError::Tokenizer(m)) => Err(ApiError::bad_param("messages", m)),
    }
}

/// A client's message as pieces: its content as one piece of text (none if empty), the rest of
/// its fields as the template reads them.
fn message(m: &ChatMessage, public: bool) -> Message {
    let (role, kind) = match m.role.as_str() {
        "system" if public => ("system", Kind::System),
        "system" => ("system", Kind::Instructions),
        "assistant" => ("assistant", Kind::HistoryAssistant),
        "tool" => ("tool", Kind::HistoryTool),
        // Roles were checked when the request was read.
        _ => ("user", Kind::HistoryUser),
    };
    let pieces = match m.content.is_empty() {
        true => Vec::new(),
        false => vec![Piece::text(kind, m.content.clone())],
    };
    let mut message = Message::new(role, pieces);
    message.fields = m.clone();
    message
}

/// The preambles (a conversation's leading system messages, its tools and template variables)
/// of the latest bound requests on each (repository, branch) of this replica: what a push
/// pre-warms the new context behind ([`prewarm`]), so that the first request after it finds the
/// repository part cached as it would without the push. Bounded: [`PREAMBLES_PER_BRANCH`] per
/// branch, [`PREAMBLE_BRANCHES`] branches, none over [`MAX_PREAMBLE_BYTES`].
#[derive(Debug, Default)]
pub struct Preambles(Mutex<HashMap<(RepoId, String), Vec<Kept>>>);

/// A preamble and when a request last used it.
type Kept = (Request, Instant);

/// Distinct preambles kept per branch (agents of different clients on one repository).
pub const PREAMBLES_PER_BRANCH: usize = 2;
/// Branches whose preambles are kept (the least recently used goes first).
pub const PREAMBLE_BRANCHES: usize = 256;
/// The largest preamble kept, in bytes of message text and tool definitions.
pub const MAX_PREAMBLE_BYTES: usize = 256 << 10;

impl Request {
    /// The preamble of this conversation: its leading system messages, tools and variables.
    fn preamble(&self) -> Request {
        Request {
            messages: self.messages.iter().take_while(|m| m.role == "system").cloned().collect(),
            public_first: self.public_first,
            tools: self.tools.clone(),
            kwargs: self.kwargs.clone(),
            generation_prompt: true,
        }
    }

    /// `messages` rendered with this request's tools, variables and generation prompt.
    fn text(&self, template: &ChatTemplate, messages: &[ChatMessage]) -> Result<String, ApiError> {
        let none = Map::new();
        template
            .render_with(messages, self.generation_prompt, self.tools.as_ref(), self.kwargs.as_ref().unwrap_or(&none))
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))
    }

    fn same_preamble(&self, other: &Request) -> bool {
        let texts = |r: &Request| r.messages.iter().map(|m| (m.role.clone(), m.content.clone())).collect::<Vec<_>>();
        self.tools == other.tools && self.kwargs == other.kwargs && texts(self) == texts(other)
    }

    fn bytes(&self) -> usize {
        let tools = self.tools.as_ref().map_or(0, |t| t.to_string().len());
        self.messages.iter().map(|m| m.content.len()).sum::<usize>() + tools
    }
}

impl Preambles {
    /// Notes the preamble of a request bound to `branch` of `repo`.
    pub(crate) fn record(&self, repo: RepoId, branch: &str, request: &Request) {
        let preamble = request.preamble();
        if preamble.bytes() > MAX_PREAMBLE_BYTES {
            return;
        }
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = (repo, branch.to_string());
        if !map.contains_key(&key) && map.len() >= PREAMBLE_BRANCHES {
            let oldest = map.iter().min_by_key(|(_, list)| list.first().map(|(_, at)| *at)).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                map.remove(&oldest);
            }
        }
        let list = map.entry(key).or_default();
        list.retain(|(kept, _)| !kept.same_preamble(&preamble));
        list.insert(0, (preamble, Instant::now()));
        list.truncate(PREAMBLES_PER_BRANCH);
    }

    /// The preambles used on `branch` of `repo` within `within`, latest first.
    pub(crate) fn recent(&self, repo: RepoId, branch: &str, within: Duration) -> Vec<Request> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let list = map.get(&(repo, branch.to_string()));
        list.into_iter().flatten().filter(|(_, at)| at.elapsed() <= within).map(|(r, _)| r.clone()).collect()
    }
}

/// The token where a rendered prompt's repository context ends (0 without one).
fn context_end(segments: &[Segment]) -> usize {
    let context = |s: &&Segment| matches!(s.kind, Kind::ContextHeader | Kind::Outline | Kind::File);
    segments.iter().rev().find(context).map_or(0, |s| s.tokens.end)
}

/// After a push: computes the new context of `branch` into the tenant's cache behind each
/// preamble bound requests used on it lately (within the session idle time), as a push does for
/// sessions. Returns the number of pre-warm requests sent.
pub(crate) async fn prewarm(state: &AppState, served: &Served, repo: &Repository, branch: &str) -> usize {
    let mut sent = 0;
    for mut request in state.replica.preambles.recent(repo.id, branch, crate::sessions::idle(state)) {
        // Any user message: only the prefix before it is kept.
        request.messages.push(ChatMessage::user("?"));
        let binding = Binding { repo: repo.clone(), branch: branch.to_string() };
        let (repos, engine) = (state.repos.clone(), served.engine.clone());
        let done = web::block(move || render(&repos, &engine, &binding, &request)).await;
        let rendered = match done.map_err(|e| ApiError::Internal(e.to_string())).and_then(|r| r) {
            Ok(rendered) => rendered,
            Err(e) => {
                tracing::warn!(repo = %repo.id, branch, "pre-warming a bound preamble failed: {e}");
                continue;
            }
        };
        let end = context_end(&rendered.segments);
        if end == 0 {
            continue;
        }
        let public = served
            .public
            .as_ref()
            .filter(|(_, ids)| rendered.tokens[..end].starts_with(ids))
            .map(|(_, ids)| PublicPrefix { template: "chat".into(), tokens: ids.len() });
        let tenant = crate::state::engine_tenant(repo.tenant);
        let mut warm = EngineRequest::new(tenant, rendered.tokens[..end].to_vec(), GenerateParams::default());
        warm.prewarm = true;
        warm.slo = SloClass::Batch;
        warm.public = public;
        warm.spans = rendered.spans.into_iter().filter(|s| s.range.end <= end).collect();
        // Dropping the stream would cancel the request: drain it.
        let mut events = served.engine.submit(warm);
        tokio::spawn(async move { while events.next().await.is_some() {} });
        sent += 1;
    }
    sent
}
