//! Applies what other replicas (or the command line) changed: every replica on the same
//! database keeps its own engine and mirrors, so a push that one of them received must reach the
//! others' caches (invalidate the changed files' spans, pre-warm a branch served here), a deleted
//! tenant's cache namespace must be purged everywhere, and a deleted repository's mirror removed
//! everywhere. The notices travel through Postgres `LISTEN`/`NOTIFY`
//! (`cachet_tenants::store::fanout`).

use crate::context::mirror_id;
use crate::routes::webhooks::{apply, Push, Received};
use crate::state::AppState;
use actix_web::web;
use cachet_context::ContextError;
use cachet_tenants::store::fanout::Change;
use cachet_tenants::store::Invalidation;
use std::time::Duration;

/// Runs until aborted: listens, applies, and after an error tries again with a growing pause.
pub async fn run(state: web::Data<AppState>) {
    let mut pause = Duration::from_millis(500);
    let mut listener = loop {
        match state.store.listen_changes(state.replica.id).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::warn!("cannot listen for other replicas' changes yet: {e}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    };
    pause = Duration::from_millis(500);
    loop {
        match listener.next().await {
            Ok(changes) => {
                pause = Duration::from_millis(500);
                for change in changes {
                    let kind = match &change {
                        Change::Invalidation(inv) => {
                            apply_push(&state, inv).await;
                            "push"
                        }
                        Change::TenantDeleted(tenant) => {
                            state.auth.tenants.forget(*tenant);
                            state.accounting.shares.lock().unwrap_or_else(|e| e.into_inner()).remove(tenant);
                            if let Some(served) = state.model.served.get() {
                                served.engine.purge_tenant(crate::state::engine_tenant(*tenant));
                            }
                            tracing::info!(%tenant, "a deleted tenant's cache purged");
                            "tenant_deleted"
                        }
                        Change::RepositoryDeleted(repo) => {
                            remove_mirror(&state, *repo).await;
                            "repository_deleted"
                        }
                        Change::PublicPrefixes => {
                            let _ = state.ops.prefix_changes.send(());
                            "public_prefixes"
                        }
                    };
                    metrics::counter!("cachet:replica_changes_total", "kind" => kind).increment(1);
                    state.replica.changes_applied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Err(e) => {
                tracing::warn!("listening for other replicas' changes: {e}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Applies one push that another replica recorded; failures are logged (the cache stays
/// correct without it: matching is token-exact).
async fn apply_push(state: &web::Data<AppState>, inv: &Invalidation) {
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
    match apply(state, &repo, branch, &push, Received::Elsewhere).await {
        Ok(applied) => {
            tracing::info!(repo = %repo.id, branch, delivery = inv.delivery_id, paths = applied.paths.len(),
                           evicted = applied.evicted, prewarmed = applied.prewarmed,
                           "applied a push another replica received");
        }
        Err(e) => tracing::warn!(repo = %repo.id, delivery = inv.delivery_id, "a push from another replica: {e}"),
    }
}

/// Removes a deleted repository's mirror here, if this replica has one.
async fn remove_mirror(state: &web::Data<AppState>, repo: cachet_tenants::RepoId) {
    let repos = state.repos.clone();
    match web::block(move || repos.store.remove(&mirror_id(repo))).await {
        Ok(Ok(())) => tracing::info!(%repo, "a deleted repository's mirror removed"),
        Ok(Err(ContextError::NotFound(_))) => {}
        Ok(Err(e)) => tracing::warn!(%repo, "removing a deleted repository's mirror: {e}"),
        Err(e) => tracing::warn!(%repo, "removing a deleted repository's mirror: {e}"),
    }
}
