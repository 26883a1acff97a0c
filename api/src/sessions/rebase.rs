//! The background half of the overlay (see [`super::overlay`]), all of it pre-warms (the lowest
//! priority: preemptible, invisible to admission control):
//!
//! - at a push, each session it left behind gets what its next turn starts with — its warm base
//!   context, its history and the overlay — computed at once ([`prewarm_overlays`]; the webhook
//!   answers once these are warm, or after `overlay_prewarm_wait_ms`), so that turn costs what a
//!   warm turn costs;
//! - then the session is rebased: its repository context at the new head and its history;
//!   once that is warm, the session's turns start from it.

use super::assemble::{session_prompt, SessionPrompt, TurnInput};
use super::overlay::{At, Behind};
use super::prompt::Kind;
use crate::error::ApiError;
use crate::openai::retention_key;
use crate::state::AppState;
use actix_web::web;
use cachet_engine::generate::GenerateParams;
use cachet_engine::runtime::{Event, Request, SloClass};
use cachet_tenants::store::Repository;

/// Rebases each session of `behind` in turn (one at a time: they share the new context, which
/// the first computes and the others reuse), in the background, starting `delay` from now.
pub(crate) fn spawn(
    state: web::Data<AppState>,
    repo: Repository,
    branch: String,
    behind: Vec<Behind>,
    delay: std::time::Duration,
) {
    if behind.is_empty() {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        for b in behind {
            run(&state, &repo, &branch, &b).await;
        }
    });
}

/// Rebases one session; a failure leaves it on its base (its turns stay correct, with their
/// overlay) and lets a later turn start another rebase.
async fn run(state: &web::Data<AppState>, repo: &Repository, branch: &str, behind: &Behind) {
    match rebase(state, repo, branch, behind).await {
        Ok(true) => metrics::counter!("cachet:session_rebases_total", "outcome" => "warm").increment(1),
        Ok(false) => {}
        Err(e) => {
            metrics::counter!("cachet:session_rebases_total", "outcome" => "failed").increment(1);
            tracing::warn!(session = %behind.session, head = %behind.head, "rebasing the session failed: {e}");
            state.replica.bases.abandon(behind.session, &behind.head);
        }
    }
}

/// Pre-warms the session's context at the head and its history; true once warm, false when
/// the rebase is no longer wanted (the session closed, or a newer rebase replaced it).
async fn rebase(
    state: &web::Data<AppState>,
    repo: &Repository,
    branch: &str,
    behind: &Behind,
) -> Result<bool, ApiError> {
    let served = state.served()?;
    let Some(history) = history(state, repo, behind).await? else { return Ok(false) };
    let turns = history.len();
    if !state.replica.bases.rebasing(behind.session, &behind.head, turns) {
        return Ok(false);
    }
    let tools = state.replica.bases.tools(behind.session);
    let prompt = prompt_at(state, repo, branch, At::head(behind.head.clone()), history, tools).await?;
    // The context and its framing, then the history up to the end of its last turn: what the
    // session's next prompt starts with, whatever the role of its next message.
    let history_end = prompt.assembled.segments.iter().filter(|s| s.turn.is_some()).map(|s| s.tokens.end).max();
    let end = history_end.unwrap_or(0).max(prompt.context_end);
    if end == 0 {
        return Err(ApiError::Internal("the session's prompt has no context or history to pre-warm".into()));
    }
    prewarm(state, served, behind, prompt, end).await?;
    state.replica.bases.warm(behind.session, &behind.head, turns);
    tracing::debug!(session = %behind.session, head = %behind.head, tokens = end, "session rebased");
    Ok(true)
}

/// The history of the session a push left `behind`, as the store finds it for the repository's
/// tenant (`None`: the session is gone, nothing to pre-warm).
async fn history(
    state: &web::Data<AppState>,
    repo: &Repository,
    behind: &Behind,
) -> Result<Option<Vec<cachet_tenants::store::Turn>>, ApiError> {
    let Some(session) = state.store.session(repo.tenant, behind.session).await? else { return Ok(None) };
    Ok(Some(state.store.turns(session.owned()).await?))
}

/// A session's prompt at `at` over `history`, for a turn that only asks (`"?"`) with the tools
/// its last turn rendered: what every next turn's prompt starts with, up to its own content.
async fn prompt_at(
    state: &web::Data<AppState>,
    repo: &Repository,
    branch: &str,
    at: At,
    history: Vec<cachet_tenants::store::Turn>,
    tools: Option<serde_json::Value>,
) -> Result<SessionPrompt, ApiError> {
    let (st, r, b) = (state.clone(), repo.clone(), branch.to_string());
    web::block(move || {
        let served = st.served()?;
        let turn = TurnInput { question: "?".into(), tools, ..TurnInput::default() };
        session_prompt(&st.repos, served, &r, &b, &at, &history, Some(&turn))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?
}

/// Computes `prompt`'s first `end` tokens into the cache as background work, kept warm for the
/// session; returns once they are computed.
async fn prewarm(
    state: &web::Data<AppState>,
    served: &crate::state::Served,
    behind: &Behind,
    prompt: SessionPrompt,
    end: usize,
) -> Result<(), ApiError> {
    let mut request = Request::new(
        crate::state::engine_tenant(behind.tenant),
        prompt.assembled.tokens[..end].to_vec(),
        GenerateParams::default(),
    );
    request.prewarm = true;
    request.slo = SloClass::Batch;
    request.public = prompt.public;
    request.spans = prompt.spans.into_iter().filter(|s| s.range.end <= end).collect();
    request.retention = Some((retention_key(behind.tenant, behind.session), super::idle(state)));
    // A decode server has its prefill server compute it (then loads it: see `crate::disagg`).
    crate::disagg::remote_prefill(state, &served.engine, &request).await;
    let mut events = served.engine.submit(request);
    while let Some(event) = events.next().await {
        match event {
            Event::Done(_) => return Ok(()),
            Event::Error(e) => return Err(ApiError::Internal(format!("the pre-warm failed: {e}"))),
            Event::Token { .. } => {}
        }
    }
    Err(ApiError::Internal("the pre-warm ended without an answer".into()))
}

/// Pre-warms, for each session a push left `behind`, its next turn's prompt up to the end of
/// its overlay (its warm base context and history are cached already: only the overlay is
/// computed). Waits at most `wait` for them (they go on in the background after that); returns
/// how many were warm by then.
pub(crate) async fn prewarm_overlays(
    state: &web::Data<AppState>,
    repo: &Repository,
    branch: &str,
    behind: &[Behind],
    wait: std::time::Duration,
) -> usize {
    let tasks: Vec<_> = behind
        .iter()
        .cloned()
        .map(|b| {
            let (st, r, br) = (state.clone(), repo.clone(), branch.to_string());
            tokio::spawn(async move {
                match prewarm_overlay(&st, &r, &br, &b).await {
                    Ok(warm) => warm,
                    Err(e) => {
                        tracing::warn!(session = %b.session, head = %b.head, "pre-warming the overlay failed: {e}");
                        false
                    }
                }
            })
        })
        .collect();
    let all = futures_util::future::join_all(tasks);
    match tokio::time::timeout(wait, all).await {
        Ok(done) => done.into_iter().filter(|d| matches!(d, Ok(true))).count(),
        Err(_) => 0,
    }
}

/// One session's overlay pre-warm; false when there is nothing to pre-warm (the session is
/// gone, its next turn starts from the head, or its overlay cannot be cut off cleanly from
/// the turn's own content).
async fn prewarm_overlay(
    state: &web::Data<AppState>,
    repo: &Repository,
    branch: &str,
    behind: &Behind,
) -> Result<bool, ApiError> {
    let served = state.served()?;
    let Some(history) = history(state, repo, behind).await? else { return Ok(false) };
    // Where the next turn will start from (as `post_message` plans it).
    let at = state.replica.bases.plan(behind.session, &behind.head, history.len(), state.repos.after_push(repo));
    if at.overlay_since.is_none() {
        return Ok(false);
    }
    let tools = state.replica.bases.tools(behind.session);
    let prompt = prompt_at(state, repo, branch, at, history, tools).await?;
    // The prefix ends with the overlay where the turn's own content is tokenized apart from it
    // (a clean boundary: the question has tokens of its own, starting there).
    let segments = &prompt.assembled.segments;
    let Some(i) = segments.iter().position(|s| s.kind == Kind::Overlay) else { return Ok(false) };
    let end = segments[i].tokens.end;
    let clean = segments[i + 1..]
        .iter()
        .find(|s| !s.tokens.is_empty())
        .is_some_and(|s| s.kind == Kind::Question && s.tokens.start == end);
    if end == 0 || !clean {
        return Ok(false);
    }
    prewarm(state, served, behind, prompt, end).await?;
    tracing::debug!(session = %behind.session, head = %behind.head, tokens = end, "overlay pre-warmed");
    Ok(true)
}
