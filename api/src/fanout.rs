//! Applies the pushes other replicas received: every replica on the same database keeps its own
//! engine, so a push that one of them recorded must reach the others' caches too (invalidate
//! the changed files' spans, pre-warm the branch's context). The notices travel through Postgres
//! `LISTEN`/`NOTIFY` (`cachet_tenants::store::fanout`).

use crate::routes::webhooks::{apply, Push, Received};
use crate::state::AppState;
use actix_web::web;
use cachet_tenants::store::Invalidation;
use std::time::Duration;

/// Runs until aborted: listens, applies, and after an error tries again with a growing pause.
pub async fn run(state: web::Data<AppState>) {
    let mut pause = Duration::from_millis(500);
    let mut listener = loop {
        match state.store.listen_invalidations(state.replica).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::warn!("cannot listen for other replicas' invalidations yet: {e}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    };
    pause = Duration::from_millis(500);
    loop {
        match listener.next().await {
            Ok(invalidations) => {
                pause = Duration::from_millis(500);
                for inv in invalidations {
                    apply_remote(&state, &inv).await;
                }
            }
            Err(e) => {
                tracing::warn!("listening for other replicas' invalidations: {e}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Applies one push that another replica recorded (counted once done, whatever the outcome);
/// failures are logged (the cache stays correct without it: matching is token-exact).
async fn apply_remote(state: &web::Data<AppState>, inv: &Invalidation) {
    let Some(branch) = inv.git_ref.strip_prefix("refs/heads/") else { return };
    let repo = match state.store.repository_for_webhook(inv.repo).await {
        Ok(Some(repo)) => repo,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(repo = %inv.repo, "a push from another replica: {e}");
            return;
        }
    };
    let push = Push { git_ref: inv.git_ref.clone(), before: inv.before.clone(), after: inv.after.clone() };
    let result = apply(state, &repo, branch, &push, Received::Elsewhere).await;
    state.pushes_from_elsewhere.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match result {
        Ok(applied) => {
            metrics::counter!("cachet:replica_invalidations_total").increment(1);
            tracing::info!(repo = %repo.id, branch, delivery = inv.delivery_id, paths = applied.paths.len(),
                           evicted = applied.evicted, prewarmed = applied.prewarmed,
                           "applied a push another replica received");
        }
        Err(e) => tracing::warn!(repo = %repo.id, delivery = inv.delivery_id, "a push from another replica: {e}"),
    }
}
