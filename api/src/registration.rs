//! Registering a repository is a job that outlives the HTTP request that asks for it.
//!
//! `POST /v1/repos` writes the repository's row first (`fetching`: the name is taken and the
//! webhook secret kept before any network I/O), then starts the fetch of its mirror as a task of
//! its own and waits for it a while (`context.registration_wait_secs`). A fetch done by then is
//! answered `201` with the head found; one still running is answered `202` (the tenant polls
//! `GET /v1/repos/{id}` for `status`). Whatever the client does meanwhile — gives up, times out —
//! the job runs to its end and records it: `ready` with the default branch, or `failed` with an
//! error the tenant may see (its mirror removed, its name free again). A job whose process died
//! leaves its row `fetching`; the sweeper of any replica takes it up again once it has not moved
//! for longer than a fetch may last ([`stale_after`]).

use crate::context::{mirror_id, Repos};
use crate::error::ApiError;
use cachet_context::{ContextError, Mirror};
use cachet_tenants::store::{RepoStatus, Repository, Store};
use std::sync::Arc;
use std::time::Duration;

/// What a registration's fetch found.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub default_branch: String,
    /// The default branch's head commit.
    pub head: String,
}

/// How long a registration may stay `fetching` before it counts as abandoned: twice the longest
/// fetch, and a minute for the rest.
pub fn stale_after(fetch_timeout_secs: u64) -> Duration {
    Duration::from_secs(fetch_timeout_secs.max(1) * 2 + 60)
}

/// Starts a registration's job; the receiver hears its end (or nothing, if dropped: the job
/// goes on).
pub fn start(
    store: Store,
    repos: Arc<Repos>,
    repo: Repository,
) -> tokio::sync::oneshot::Receiver<Result<Fetched, ApiError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let result = run(&store, &repos, &repo).await;
        let _ = tx.send(result);
    });
    rx
}

async fn run(store: &Store, repos: &Arc<Repos>, repo: &Repository) -> Result<Fetched, ApiError> {
    let started = std::time::Instant::now();
    let fetched = {
        let (repos, repo) = (repos.clone(), repo.clone());
        tokio::task::spawn_blocking(move || fetch(&repos, &repo))
            .await
            .unwrap_or_else(|e| Err(ApiError::Internal(format!("the fetch stopped: {e}"))))
    };
    let recorded = match &fetched {
        Ok(f) => store.repository_fetched(repo.id, &f.default_branch).await.map(|live| {
            if !live {
                // Deleted while it was fetched: nothing will use the mirror.
                let (repos, repo) = (repos.clone(), repo.clone());
                drop(tokio::task::spawn_blocking(move || warn_if_unremoved(&repo, remove_mirror(&repos, &repo))));
            }
        }),
        Err(e) => store.repository_failed(repo.id, &public(e)).await,
    };
    match recorded {
        Ok(()) => tracing::info!(repo = %repo.id, ok = fetched.is_ok(), secs = started.elapsed().as_secs_f64(),
                                 "repository registration done"),
        // The row stays `fetching`: the sweeper runs the job again later.
        Err(e) => tracing::warn!(repo = %repo.id, "recording a registration's end: {e}"),
    }
    fetched
}

/// What the tenant may read of a failed fetch (an internal error's text is the operator's).
fn public(e: &ApiError) -> String {
    match e {
        ApiError::Internal(m) => {
            tracing::warn!("a registration's fetch failed: {m}");
            "an internal error stopped the fetch".into()
        }
        e => e.to_string(),
    }
}

/// Fetches the mirror (anew: a job taken up again may find a part of one) and finds the default
/// branch.
fn fetch(repos: &Repos, repo: &Repository) -> Result<Fetched, ApiError> {
    let source = repos.store.validate(&repo.source)?;
    remove_mirror(repos, repo)?;
    let found = repos
        .store
        .create_mirror(&mirror_id(repo.id), &source)
        .map_err(ApiError::from)
        .and_then(|mirror| default_branch(&mirror, repo.default_branch.as_deref()));
    match found {
        Ok((default_branch, head)) => Ok(Fetched { default_branch, head }),
        Err(e) => {
            warn_if_unremoved(repo, remove_mirror(repos, repo));
            Err(e)
        }
    }
}

/// Removes the repository's mirror, if there is one.
fn remove_mirror(repos: &Repos, repo: &Repository) -> Result<(), ContextError> {
    match repos.store.remove(&mirror_id(repo.id)) {
        Ok(()) | Err(ContextError::NotFound(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

fn warn_if_unremoved(repo: &Repository, removed: Result<(), ContextError>) {
    if let Err(e) = removed {
        tracing::warn!(repo = %repo.id, "removing a mirror: {e}");
    }
}

/// `main`, else `master`, when the tenant named no default branch.
fn default_branch(mirror: &Mirror, asked: Option<&str>) -> Result<(String, String), ApiError> {
    if let Some(b) = asked {
        return Ok((b.to_string(), mirror.branch_head(b)?.to_string()));
    }
    for b in ["main", "master"] {
        match mirror.branch_head(b) {
            Ok(head) => return Ok((b.to_string(), head.to_string())),
            Err(ContextError::UnknownRef(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::bad_param("default_branch", "the repository has no main or master branch: name its default_branch"))
}

/// A repository's default branch, if its registration is done; else why it cannot be used yet
/// (or at all).
pub fn ready(repo: &Repository) -> Result<&str, ApiError> {
    match (repo.status, repo.default_branch.as_deref()) {
        (RepoStatus::Ready, Some(branch)) => Ok(branch),
        (RepoStatus::Fetching, _) | (RepoStatus::Ready, None) => Err(ApiError::Conflict(format!(
            "repository {} is still being fetched: GET /v1/repos/{} says when it is ready",
            repo.id, repo.id
        ))),
        (RepoStatus::Failed, _) => Err(ApiError::Conflict(format!(
            "repository {}'s registration failed ({}): delete it and register it again",
            repo.id,
            repo.error.as_deref().unwrap_or("no reason recorded")
        ))),
    }
}

/// Takes up registrations whose job was lost (see the module): run by the sweeper.
pub async fn resume_abandoned(store: &Store, repos: &Arc<Repos>, stale: Duration) {
    match store.claim_stale_registrations(stale).await {
        Ok(claimed) => {
            for repo in claimed {
                tracing::warn!(repo = %repo.id, "taking up a registration whose job was lost");
                drop(start(store.clone(), repos.clone(), repo));
            }
        }
        Err(e) => tracing::warn!("looking for abandoned registrations: {e}"),
    }
}
