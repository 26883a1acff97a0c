//! The background half of the overlay (see [`super::overlay`]): a session's repository context
//! at the new head and its history, pre-warmed at the lowest priority (preemptible, invisible
//! to admission control); once that is warm, the session's turns start from it.

use super::assemble::session_prompt;
use super::overlay::{At, Behind};
use crate::error::ApiError;
use crate::openai::retention_key;
use crate::state::AppState;
use actix_web::web;
use cachet_engine::generate::GenerateParams;
use cachet_engine::runtime::{Event, Request, SloClass};
use cachet_tenants::store::Repository;

/// Rebases each session of `behind` in turn (one at a time: they share the new context, which
/// the first computes and the others reuse), in the background, starting `rebase_delay_ms`
/// from now.
pub(crate) fn spawn(state: web::Data<AppState>, repo: Repository, branch: String, behind: Vec<Behind>) {
    if behind.is_empty() {
        return;
    }
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(state.settings.context.rebase_delay_ms)).await;
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
            state.bases.abandon(behind.session, &behind.head);
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
    // The session as the store finds it for the repository's tenant (gone: nothing to rebase).
    let Some(session) = state.store.session(repo.tenant, behind.session).await? else {
        return Ok(false);
    };
    let history = state.store.turns(session.owned()).await?;
    let turns = history.len();
    if !state.bases.rebasing(behind.session, &behind.head, turns) {
        return Ok(false);
    }
    let (st, r, b, head) = (state.clone(), repo.clone(), branch.to_string(), behind.head.clone());
    let prompt = web::block(move || {
        let served = st.served()?;
        session_prompt(&st.repos, served, &r, &b, &At::head(head), &history, None)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    // The context and its framing, then the history up to the end of its last turn: what the
    // session's next prompt starts with, whatever the role of its next message.
    let history_end = prompt.assembled.segments.iter().filter(|s| s.turn.is_some()).map(|s| s.tokens.end).max();
    let end = history_end.unwrap_or(0).max(prompt.context_end);
    if end == 0 {
        return Err(ApiError::Internal("the session's prompt has no context or history to pre-warm".into()));
    }
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
    let mut events = served.engine.submit(request);
    while let Some(event) = events.next().await {
        match event {
            Event::Done(_) => {
                state.bases.warm(behind.session, &behind.head, turns);
                tracing::debug!(session = %behind.session, head = %behind.head, tokens = end, "session rebased");
                return Ok(true);
            }
            Event::Error(e) => return Err(ApiError::Internal(format!("the pre-warm failed: {e}"))),
            Event::Token { .. } => {}
        }
    }
    Err(ApiError::Internal("the pre-warm ended without an answer".into()))
}
