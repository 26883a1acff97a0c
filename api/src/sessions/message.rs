//! `POST /v1/sessions/{id}/messages`: one turn of a session.

use super::assemble::{session_prompt, ToolOutput, ToolResult, TurnInput};
use super::overlay::Owner;
use super::{idle, open_session};
use crate::auth::TenantAuth;
use crate::config::AfterPush;
use crate::error::ApiError;
use crate::openai::tools::{self, ToolFields};
use crate::openai::types::{reject_unknown, Sampling, ToolRequest, Unknown};
use crate::openai::{execute, model, params, Answer, BoundSession, Endpoint, Job};
use crate::state::AppState;
use actix_web::{post, web, HttpRequest, HttpResponse};
use cachet_tenants::store::{NewTurn, Role};
use cachet_tenants::SessionId;
use serde::Deserialize;
use serde_json::json;

/// One or several.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// A session turn.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
pub struct MessageRequest {
    /// The question.
    #[serde(default)]
    pub content: String,
    /// Repository files to show in full (paths at the session's commit).
    #[serde(default)]
    pub files: Vec<String>,
    /// Output of tools the agent ran: a string, `{name, content}`, or a list.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_output: Option<OneOrMany<ToolOutput>>,
    /// Results of the calls the previous answer made (`tool` messages): `[{tool_call_id, content}]`.
    #[serde(default)]
    pub tool_results: Vec<ToolResult>,
    /// Return the assembled prompt instead of running the model.
    #[serde(default)]
    pub dry_run: bool,
    /// The model (default: the served one).
    #[serde(default)]
    pub model: Option<String>,
    /// Tools and structured output, as on `/v1/chat/completions`.
    #[serde(flatten)]
    pub tooling: ToolRequest,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub sampling: Sampling,
    #[serde(flatten)]
    #[schema(ignore)]
    pub unknown: Unknown,
}

/// Sends a message in a session: the server assembles public system prompt →
/// repository context at the branch head → history → this turn, and answers
/// like chat completions (streaming with `"stream": true`), with the commit
/// it used under `"cachet"` and in `X-Cachet-Commit`.
#[utoipa::path(post, path = "/v1/sessions/{id}/messages", tag = "sessions", request_body = MessageRequest,
    responses((status = 200, description = "The answer (or, with `dry_run`, the assembled prompt and its segments)"),
              (status = 400, description = "Invalid message (unknown file, bad path)"),
              (status = 404, description = "Unknown session"),
              (status = 409, description = "The session is closed, or a turn is in progress"),
              (status = 413, description = "The prompt is longer than the context")),
    security(("bearer" = [])))]
#[post("/v1/sessions/{id}/messages")]
pub async fn post_message(
    state: web::Data<AppState>,
    http: HttpRequest,
    auth: TenantAuth,
    id: web::Path<SessionId>,
    body: web::Json<MessageRequest>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    reject_unknown(&body.unknown)?;
    let served = model(&state, body.model.as_deref().unwrap_or("default"))?;
    let template = served.engine.chat_template().ok_or_else(|| ApiError::bad("the model has no chat template"))?;
    let fields = ToolFields::of(&body.tooling, body.sampling.grammar.as_ref());
    let plan = tools::plan(fields, template.source())?;
    let session = open_session(&state, &auth, id.into_inner()).await?;
    // A dry run changes nothing, so it may look while a turn runs.
    let guard = if body.dry_run {
        None
    } else {
        Some(state.begin_turn(session.owned()).await?.ok_or_else(|| {
            ApiError::Conflict(format!("a turn of session {} is in progress; wait for its answer", session.id))
        })?)
    };
    let tenant = auth.0.id;
    let repo = state
        .store
        .repository(tenant, session.repo)
        .await?
        .ok_or_else(|| ApiError::Conflict("the session's repository was deleted".into()))?;
    let history = state.store.turns(session.owned()).await?;
    // The turn lease (`guard`) keeps other turns out: this turn's rows come next.
    let next_seq = history.last().map_or(0, |t| t.seq + 1);
    let turn = TurnInput {
        tool_results: body.tool_results.clone(),
        tools: plan.template_tools.clone(),
        files: body.files.clone(),
        tool_output: match body.tool_output.clone() {
            None => Vec::new(),
            Some(OneOrMany::One(o)) => vec![o],
            Some(OneOrMany::Many(v)) => v,
        },
        question: body.content.clone(),
    };
    let turns_before = history.len();
    let (st, r, branch, sid) = (state.clone(), repo.clone(), session.branch.clone(), session.id);
    let prompt = web::block(move || {
        let served = st.served()?;
        let head = st.repos.head(&r, &st.repos.mirror(&r)?, &branch)?;
        // The warm base and an overlay of what changed since, or the head (see `overlay`).
        let at = st.replica.bases.plan(sid, &head, history.len(), st.repos.after_push(&r));
        session_prompt(&st.repos, served, &r, &branch, &at, &history, Some(&turn))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let commit = prompt.at.head.to_string();
    let context_commit = prompt.at.context.to_string();
    state.note_branch_served(repo.id, &session.branch);
    if body.dry_run {
        return Ok(HttpResponse::Ok().json(json!({
            "object": "session.prompt",
            "session_id": session.id,
            "commit": commit,
            "context_commit": context_commit,
            "prompt": prompt.assembled.text,
            "prompt_tokens": prompt.assembled.tokens.len(),
            "context_tokens": prompt.context_end,
            "segments": prompt.assembled.segments,
            "token_ids": prompt.assembled.tokens,
        })));
    }
    let params = params(&body.sampling, prompt.assembled.tokens.len(), served)?;
    crate::openai::count_results(Endpoint::SessionMessages, body.tool_results.len());
    let id = crate::telemetry::request_id(&http);
    let mut job = Job::new(id, Endpoint::SessionMessages, prompt.assembled.tokens, prompt.public, params);
    job.grammar = tools::compile(&served.engine, &plan).await?;
    job.calls = plan.calls;
    // This turn's tool results, then its user message (if it has one), then the answer: stored
    // together once the answer is complete, all or none. A request refused (429), failed or cut
    // off by a crash leaves the history as it was, never a question without its answer.
    let results: Vec<(String, String)> =
        body.tool_results.iter().map(|r| (r.tool_call_id.clone(), r.content.clone())).collect();
    let user = (!prompt.user_content.is_empty()).then(|| prompt.user_content.clone());
    let before_answer = results.len() + usize::from(user.is_some());
    let seq = if before_answer == 0 { 0 } else { next_seq + before_answer as i32 - 1 };
    state.store.touch_session(session.owned()).await?;

    if crate::handoff::enabled(&state, &served.engine) {
        // This replica runs the turn now; the one before, if another, has the prefix on disk.
        job.handoff = state.store.move_session(session.owned(), state.replica.id, crate::handoff::SEEN_WITHIN).await?;
    }
    job.session = Some(BoundSession { id: session.id, retention: idle(&state) });
    job.spans = prompt.spans;
    job.extra =
        Some(json!({"session_id": session.id, "commit": commit, "context_commit": context_commit, "turn": seq}));
    job.headers = vec![("X-Cachet-Commit", commit.clone()), ("X-Cachet-Session", session.id.to_string())];
    let (store, model_id, session_id, request_id) = (state.store.clone(), served.id.clone(), session.id, job.id);
    let owned = session.owned();
    let (st, at, rebase_repo) = (state.clone(), prompt.at, repo.clone());
    let owner = Owner { tenant, repo: repo.id, branch: session.branch.clone() };
    let tools = plan.template_tools.clone();
    job.answer = Some(Box::new(move |answer: Answer| {
        Box::pin(async move {
            let mut turns: Vec<NewTurn<'_>> = results
                .iter()
                .map(|(id, content)| NewTurn { tool_call_id: Some(id), ..NewTurn::new(Role::Tool, content) })
                .collect();
            if let Some(user) = &user {
                turns.push(NewTurn {
                    commit: Some(&commit),
                    request_id: Some(request_id),
                    ..NewTurn::new(Role::User, user)
                });
            }
            turns.push(NewTurn {
                tokens: Some(&answer.tokens),
                model: Some(&model_id),
                request_id: Some(request_id),
                ..NewTurn::new(Role::Assistant, &answer.text)
            });
            match store.append_turns(owned, &turns).await {
                Err(e) => tracing::error!(session = %session_id, "storing the turn failed: {e}"),
                // What the history has now seen; a session behind the head is rebased.
                Ok(_) => {
                    if let Some(behind) =
                        st.replica.bases.record(session_id, &owner, &at, turns_before + turns.len(), tools.as_ref())
                    {
                        if st.repos.after_push(&rebase_repo) == AfterPush::Overlay {
                            let delay = std::time::Duration::from_millis(st.settings.context.rebase_delay_ms);
                            super::rebase::spawn(st.clone(), rebase_repo, owner.branch.clone(), vec![behind], delay);
                        }
                    }
                }
            }
            if let Err(e) = store.touch_session(owned).await {
                tracing::warn!(session = %session_id, "{e}");
            }
            drop(guard);
        })
    }));
    execute(&state, &http, auth, served, &body.sampling, job).await
}
