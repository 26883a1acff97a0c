//! Public prefixes: prompt openings every tenant may share in the prefix cache.
//!
//! Agent clients open every conversation with a long preamble (system prompt and tool schemas)
//! that is the same for all their users. Everything a tenant sends is cached in the tenant's own
//! scope (a shared cache would be a timing channel: another tenant could learn, token by token,
//! what was sent); the operator may declare such preambles public. A request whose prompt
//! begins with a registered prefix is then keyed publicly up to the end of that prefix (its
//! computation is shared by every tenant) and in its tenant's scope after it. Sharing a prefix
//! the operator made public tells a tenant only that someone sent that public text, and a
//! pre-warmed one is always cached, so not even that.
//!
//! A prefix comes from the configuration (`[[model.public_prefixes]]`) or from the operator
//! (`/admin/public-prefixes`, `cachet public-prefixes`, stored in Postgres as given). Its source
//! is chat messages and tools, rendered through the served model's chat template exactly as a
//! request would be (the prefix ends where the next message would begin), or text, or token ids.
//! The longest registered prefix a prompt begins with wins; a prompt must begin with the whole
//! prefix (a partial match shares nothing). [`discovery`] finds candidates for the operator.
//! The threat model is in `docs/security.md`.

pub mod discovery;

use crate::error::ApiError;
use crate::openai::tools::{self, ToolFields};
use crate::openai::types::ChatMessageIn;
use crate::state::{AppState, Served};
use cachet_engine::chat_template::ChatMessage;
use cachet_engine::generate::GenerateParams;
use cachet_engine::radix::TenantKey;
use cachet_engine::runtime::{PublicPrefix, Request};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::{Arc, Mutex, RwLock};

/// The cache scope every public prefix is keyed in (the operator's system prompt's, too).
pub const SCOPE: &str = "chat";

/// Preview length, in characters, of a prefix or candidate in listings.
const PREVIEW_CHARS: usize = 240;

/// What a public prefix is made from: exactly one of `messages` (with `tools`), `text`, `tokens`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Chat messages the prompt opens with (usually the system message), rendered with the
    /// served model's chat template as a request's are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<Vec<Value>>,
    /// Tool schemas, as a request's `tools` (rendered into the prompt by the template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    /// Text the prompt opens with (tokenized as a completions prompt is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Token ids the prompt opens with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
}

impl Source {
    /// Parses a source as given (a JSON object), with a 400 naming what is wrong.
    pub fn parse(v: &Value) -> Result<Source, ApiError> {
        let s: Source = serde_json::from_value(v.clone()).map_err(|e| ApiError::bad_param("source", e.to_string()))?;
        let chat = s.messages.is_some() || s.tools.is_some();
        match (chat, s.text.is_some(), s.tokens.is_some()) {
            (true, false, false) | (false, true, false) | (false, false, true) => Ok(s),
            _ => Err(ApiError::bad_param("source", "give exactly one of messages (with tools), text or tokens")),
        }
    }
}

/// One registered prefix, rendered for the served model.
#[derive(Clone, Debug, Serialize)]
pub struct Registered {
    /// The id in Postgres; none for a prefix from the configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<uuid::Uuid>,
    pub name: String,
    /// `config`, `operator` (registered through the API or the command line) or `system_prompt`.
    pub origin: &'static str,
    pub prewarm: bool,
    /// Tokens, as the served model renders it (0 when it could not be rendered).
    pub tokens: usize,
    /// Why it could not be rendered (it then matches nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The beginning of its text.
    pub preview: String,
    #[serde(skip)]
    pub ids: Arc<[u32]>,
}

/// The registered prefixes and the discovery counts of one server.
#[derive(Debug, Default)]
pub struct PublicPrefixes {
    /// Longest first.
    registered: RwLock<Arc<Vec<Registered>>>,
    discovery: Mutex<discovery::Discovery>,
}

/// The public part of a prompt: the longest registered prefix it begins with.
#[derive(Clone, Debug, PartialEq)]
pub struct Matched {
    pub name: String,
    pub tokens: usize,
}

impl PublicPrefixes {
    /// Every registered prefix, longest first.
    pub fn list(&self) -> Arc<Vec<Registered>> {
        self.registered.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the registered prefixes.
    pub fn set(&self, mut all: Vec<Registered>) {
        all.sort_by(|a, b| b.ids.len().cmp(&a.ids.len()).then(a.name.cmp(&b.name)));
        *self.registered.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(all);
    }

    /// Adds (or replaces, by name) one registered prefix.
    pub fn insert(&self, r: Registered) {
        let mut all: Vec<Registered> = self.list().iter().filter(|x| x.name != r.name).cloned().collect();
        all.push(r);
        self.set(all);
    }

    /// The longest registered prefix `tokens` begins with (whole), if any.
    pub fn matching(&self, tokens: &[u32]) -> Option<Matched> {
        let all = self.list();
        // Longest first: the first that matches wins.
        all.iter()
            .find(|r| !r.ids.is_empty() && r.ids.len() < tokens.len() && tokens.starts_with(&r.ids))
            .map(|r| Matched { name: r.name.clone(), tokens: r.ids.len() })
    }

    /// The public part of a request's prompt: the longest registered prefix, or what the request
    /// was built with (the operator's system prompt), whichever is longer.
    pub fn public_for(&self, tokens: &[u32], built: Option<PublicPrefix>) -> (Option<PublicPrefix>, Option<Matched>) {
        let longer = self.matching(tokens).filter(|m| built.as_ref().is_none_or(|b| b.tokens < m.tokens));
        match longer {
            Some(m) => (Some(PublicPrefix { template: SCOPE.into(), tokens: m.tokens }), Some(m)),
            None => (built, None),
        }
    }

    /// Counts a prompt a tenant sent, for discovery.
    pub fn observe(&self, tenant: &str, tokens: &[u32]) {
        self.discovery.lock().unwrap_or_else(|e| e.into_inner()).observe(tenant, tokens);
    }

    /// Candidates sent by at least `min_tenants` tenants.
    pub fn candidates(&self, min_tenants: usize) -> Vec<discovery::Candidate> {
        self.discovery.lock().unwrap_or_else(|e| e.into_inner()).candidates(min_tenants)
    }

    /// One candidate by id.
    pub fn candidate(&self, id: &str) -> Option<discovery::Candidate> {
        self.discovery.lock().unwrap_or_else(|e| e.into_inner()).candidate(id)
    }
}

/// The beginning of the text of `ids`.
pub fn preview(served: &Served, ids: &[u32]) -> String {
    let head = &ids[..ids.len().min(PREVIEW_CHARS)];
    let text = served.engine.tokenizer().decode(head, false).unwrap_or_default();
    text.chars().take(PREVIEW_CHARS).collect()
}

/// Renders a source for the served model: the token ids a request's prompt opens with when it
/// opens with this.
pub async fn render(served: &Served, source: &Source) -> Result<Vec<u32>, ApiError> {
    let ids = if let Some(text) = &source.text {
        crate::openai::encode(&served.engine, text.clone()).await?
    } else if let Some(tokens) = &source.tokens {
        let vocab = served.engine.vocab_size();
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::bad_param("tokens", format!("token {bad} is outside the vocabulary ({vocab})")));
        }
        tokens.clone()
    } else {
        render_chat(served, source).await?
    };
    if ids.is_empty() {
        return Err(ApiError::bad_param("source", "the prefix renders to no tokens"));
    }
    if ids.len() >= served.engine.max_context() {
        return Err(ApiError::bad_param("source", "the prefix is as long as the context"));
    }
    Ok(ids)
}

/// A chat source: the conversation is rendered as a request's would be (behind the operator's
/// system prompt, with the tools), followed by three different next messages; the prefix is what
/// the three renderings share, so it ends where the next message begins whatever it is.
async fn render_chat(served: &Served, source: &Source) -> Result<Vec<u32>, ApiError> {
    let template = served.engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
    let mut conversation = Vec::new();
    if let Some((public, _)) = &served.public {
        conversation.push(ChatMessage::system(public.clone()));
    }
    for (i, m) in source.messages.iter().flatten().enumerate() {
        let m: ChatMessageIn = serde_json::from_value(m.clone())
            .map_err(|e| ApiError::bad_param(format!("messages[{i}]"), e.to_string()))?;
        conversation.push(crate::openai::chat::message(&m, i)?);
    }
    let fields = ToolFields {
        tools: source.tools.as_ref(),
        tool_choice: None,
        parallel_tool_calls: None,
        response_format: None,
        grammar: None,
    };
    let plan = tools::plan(fields, template.source())?;
    let mut shared: Option<Vec<u32>> = None;
    for next in [ChatMessage::user("Alpha?"), ChatMessage::user("zeta!"), ChatMessage::assistant("3")] {
        let mut c = conversation.clone();
        c.push(next);
        let text = template
            .render(&c, true, plan.template_tools.as_ref())
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
        let ids = crate::openai::encode(&served.engine, text).await?;
        shared = Some(match shared {
            None => ids,
            Some(s) => s.iter().zip(&ids).take_while(|(a, b)| a == b).map(|(a, _)| *a).collect(),
        });
    }
    Ok(shared.unwrap_or_default())
}

/// Renders one prefix into a listing entry (a source that fails to render is listed with its
/// error and matches nothing).
pub async fn registered(
    served: &Served,
    id: Option<uuid::Uuid>,
    name: &str,
    origin: &'static str,
    prewarm: bool,
    source: &Value,
) -> Registered {
    let rendered = match Source::parse(source) {
        Ok(s) => render(served, &s).await,
        Err(e) => Err(e),
    };
    let (ids, error) = match rendered {
        Ok(ids) => (ids, None),
        Err(e) => {
            tracing::warn!(prefix = name, "a public prefix cannot be rendered for this model: {e}");
            (Vec::new(), Some(e.to_string()))
        }
    };
    let mut r = Registered::rendered(served, id, name, origin, prewarm, ids);
    r.error = error;
    r
}

impl Registered {
    /// A prefix rendered to `ids` for the served model.
    pub fn rendered(
        served: &Served,
        id: Option<uuid::Uuid>,
        name: &str,
        origin: &'static str,
        prewarm: bool,
        ids: Vec<u32>,
    ) -> Registered {
        let ids: Arc<[u32]> = ids.into();
        let preview = preview(served, &ids);
        Registered { id, name: name.to_string(), origin, prewarm, tokens: ids.len(), error: None, preview, ids }
    }
}

/// Loads every registered prefix (configuration, operator's system prompt, Postgres) for the
/// served model and pre-warms those new here that ask for it. Postgres unreachable: the
/// operator's prefixes loaded before stay, and the error is returned (the caller tries again).
pub async fn load(state: &AppState, served: &Served) -> Result<(), cachet_tenants::StoreError> {
    let mut all = Vec::new();
    if let Some((_, ids)) = &served.public {
        all.push(Registered::rendered(served, None, "public_system_prompt", "system_prompt", true, ids.clone()));
    }
    for c in &state.settings.model.public_prefixes {
        all.push(registered(served, None, &c.name, "config", c.prewarm, &Value::Object(c.source.clone())).await);
    }
    let stored = state.store.list_public_prefixes().await;
    match &stored {
        Ok(rows) => {
            for r in rows {
                all.push(registered(served, Some(r.id), &r.name, "operator", r.prewarm, &r.source).await);
            }
        }
        // Postgres unreachable: the operator's prefixes loaded before stay in force.
        Err(_) => all.extend(served.prefixes.list().iter().filter(|r| r.origin == "operator").cloned()),
    }
    let before: Vec<Arc<[u32]>> = served.prefixes.list().iter().map(|r| r.ids.clone()).collect();
    for r in &all {
        if r.prewarm && !r.ids.is_empty() && !before.contains(&r.ids) {
            prewarm(served, &r.ids);
        }
    }
    served.prefixes.set(all);
    stored.map(|_| ())
}

/// Computes a prefix into the cache's public scope, at the lowest priority.
pub fn prewarm(served: &Served, ids: &[u32]) {
    let mut request = Request::new(TenantKey::new("public-prefixes"), ids.to_vec(), GenerateParams::default());
    request.prewarm = true;
    request.slo = cachet_engine::runtime::SloClass::Batch;
    request.public = Some(PublicPrefix { template: SCOPE.into(), tokens: ids.len() });
    let mut events = served.engine.submit(request);
    // Dropping the stream would cancel the request: drain it.
    tokio::spawn(async move { while events.next().await.is_some() {} });
}

/// Loads the prefixes once the model is loaded, then again whenever told to (a change in
/// Postgres); a failed load is tried again with a growing pause.
pub async fn keep_loaded(state: actix_web::web::Data<AppState>, mut changed: tokio::sync::mpsc::UnboundedReceiver<()>) {
    let served = loop {
        if let Some(s) = state.model.served.get() {
            break s;
        }
        if state.model.load_error.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let mut pause = std::time::Duration::from_secs(1);
    loop {
        match load(&state, served).await {
            Ok(()) => {
                pause = std::time::Duration::from_secs(1);
                if changed.recv().await.is_none() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!("loading the public prefixes from the database (the configured ones are in use): {e}");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    c = changed.recv() => if c.is_none() { return },
                }
                pause = (pause * 2).min(std::time::Duration::from_secs(60));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, ids: &[u32]) -> Registered {
        Registered {
            id: None,
            name: name.into(),
            origin: "config",
            prewarm: false,
            tokens: ids.len(),
            error: None,
            preview: String::new(),
            ids: ids.into(),
        }
    }

    #[test]
    fn the_longest_whole_prefix_wins_and_a_partial_one_shares_nothing() {
        let p = PublicPrefixes::default();
        p.set(vec![
            entry("short", &[1, 2]),
            entry("long", &[1, 2, 3, 4]),
            entry("other", &[9, 9, 9]),
            entry("bad", &[]),
        ]);
        let m = |t: &[u32]| p.matching(t).map(|m| (m.name, m.tokens));
        assert_eq!(m(&[1, 2, 3, 4, 5]), Some(("long".into(), 4)));
        assert_eq!(m(&[1, 2, 3, 7, 5]), Some(("short".into(), 2)), "long is not whole: short wins");
        assert_eq!(m(&[1, 2, 3, 4]), Some(("short".into(), 2)), "a prompt must go on past the prefix");
        assert_eq!(m(&[9, 9, 8, 1]), None, "a partial match shares nothing");
        assert_eq!(m(&[]), None);
        // The operator's system prompt (what the request was built with) stays when no longer prefix matches.
        let built = Some(PublicPrefix { template: SCOPE.into(), tokens: 3 });
        assert_eq!(p.public_for(&[1, 2, 3, 4, 5], built.clone()).0.unwrap().tokens, 4);
        assert_eq!(p.public_for(&[1, 2, 7, 7], built.clone()), (built.clone(), None));
        assert_eq!(p.public_for(&[5, 5], None), (None, None));
        // Replacing by name.
        p.insert(entry("long", &[1, 2, 3, 4, 5, 6]));
        assert_eq!(p.list().len(), 4);
        assert_eq!(m(&[1, 2, 3, 4, 5, 6, 7]), Some(("long".into(), 6)));
    }

    #[test]
    fn a_source_is_exactly_one_kind() {
        let ok = |v: Value| Source::parse(&v).is_ok();
        assert!(ok(serde_json::json!({"messages": [{"role": "system", "content": "x"}]})));
        assert!(ok(serde_json::json!({"messages": [], "tools": []})));
        assert!(ok(serde_json::json!({"text": "x"})));
        assert!(ok(serde_json::json!({"tokens": [1, 2]})));
        assert!(!ok(serde_json::json!({})));
        assert!(!ok(serde_json::json!({"text": "x", "tokens": [1]})));
        assert!(!ok(serde_json::json!({"messages": [], "text": "x"})));
        assert!(!ok(serde_json::json!({"text": "x", "model": "m"})), "unknown fields are refused");
        assert!(!ok(serde_json::json!({"tokens": [-1]})));
    }
}
