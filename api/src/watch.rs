//! Watched working trees: a repository registered from a local path with `"watch": true` has its
//! working tree followed, so that a developer running cachet beside their checkout gets their
//! uncommitted edits into the context without pushing anything.
//!
//! File-system events (inotify and the like, through `notify`) under the working tree are
//! debounced ([`QUIET`], at most [`MAX_DEBOUNCE`] behind the first), then the working tree is
//! recorded as a commit of the mirror (`Mirror::snapshot_worktree`: the checked-out commit plus
//! every change git sees, ignored files left out) and applied as a push from the previous
//! snapshot to it (`routes::webhooks::apply`): the changed files' cached spans are evicted, and
//! the new context is pre-warmed for the sessions and bound requests that use the branch. The
//! checked-out branch's context is then built at the snapshot ([`crate::context::Repos::head`]).
//! Events inside `.git` count only where they change what is checked out (`HEAD`, the index,
//! branch refs).
//!
//! A watch runs on the replica that can see the directory: the sweeper starts one for every
//! watched repository whose source validates here ([`ensure`]), and stops those whose repository
//! is gone.

use crate::error::ApiError;
use crate::routes::webhooks::{apply, Push, Received};
use crate::state::AppState;
use actix_web::web;
use cachet_context::{CommitId, Source};
use cachet_tenants::store::Repository;
use cachet_tenants::RepoId;
use notify::{RecursiveMode, Watcher};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long the tree must be quiet before a snapshot.
pub const QUIET: Duration = Duration::from_millis(100);
/// The longest a snapshot waits behind the first event of a burst (a build writing for minutes
/// still gets one a second).
pub const MAX_DEBOUNCE: Duration = Duration::from_millis(1000);

/// The watches of this replica, by repository.
#[derive(Default)]
pub struct Watches(Mutex<HashMap<RepoId, notify::RecommendedWatcher>>);

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map(|m| m.len()).unwrap_or_default();
        f.debug_struct("Watches").field("repositories", &n).finish()
    }
}

impl Watches {
    /// Stops watching a repository (its task ends with the watcher's channel).
    pub fn stop(&self, repo: RepoId) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&repo);
    }

    fn watching(&self, repo: RepoId) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&repo)
    }
}

/// Starts watching `repo`'s working tree (nothing if it is not watched or already is here). Its
/// first snapshot is taken at once: edits made before the watch began are in the context too.
pub async fn start(state: &web::Data<AppState>, repo: &Repository) -> Result<(), ApiError> {
    if !state.repos.watched(repo) || state.replica.watches.watching(repo.id) {
        return Ok(());
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let (repos, source) = (state.repos.clone(), repo.source.clone());
    // Checking the source walks its git directory, and a recursive watch adds one per directory.
    let (watcher, dir) = web::block(move || -> Result<_, ApiError> {
        let Source::Local(dir) = repos.store.validate(&source)? else {
            return Err(ApiError::bad_param("watch", "only a repository registered from a local path can be watched"));
        };
        let root = dir.clone();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if let Ok(event) = event {
                if event.paths.iter().any(|p| counts(&root, p)) {
                    let _ = tx.send(());
                }
            }
        })
        .map_err(|e| ApiError::Internal(format!("watching {}: {e}", dir.display())))?;
        watcher
            .watch(&dir, RecursiveMode::Recursive)
            .map_err(|e| ApiError::Internal(format!("watching {}: {e}", dir.display())))?;
        Ok((watcher, dir))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    state.replica.watches.0.lock().unwrap_or_else(|e| e.into_inner()).insert(repo.id, watcher);
    tracing::info!(repo = %repo.id, dir = %dir.display(), "watching the working tree");
    tokio::spawn(follow(state.clone(), repo.clone(), dir, rx));
    Ok(())
}

/// Whether an event at `path` can change the snapshot of the tree at `root`.
fn counts(root: &Path, path: &Path) -> bool {
    let Ok(rel) = path.strip_prefix(root) else { return false };
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy());
    match parts.next().as_deref() {
        Some(".git") => match parts.next().as_deref() {
            Some("HEAD" | "index") => parts.next().is_none(),
            Some("refs") => parts.next().as_deref() == Some("heads"),
            _ => false,
        },
        _ => true,
    }
}

/// Takes a snapshot, then one after each debounced burst of events, until the watch is stopped.
async fn follow(state: web::Data<AppState>, repo: Repository, dir: PathBuf, mut events: mpsc::UnboundedReceiver<()>) {
    let mut last: Option<CommitId> = None;
    loop {
        match snapshot(&state, &repo, &dir, last.clone()).await {
            Ok(Some(commit)) => last = Some(commit),
            Ok(None) => {}
            Err(e) => tracing::warn!(repo = %repo.id, "a working-tree snapshot failed: {e}"),
        }
        if events.recv().await.is_none() {
            return;
        }
        let first = Instant::now();
        loop {
            match tokio::time::timeout(QUIET, events.recv()).await {
                Ok(Some(())) if first.elapsed() < MAX_DEBOUNCE => continue,
                Ok(None) => return,
                _ => break,
            }
        }
    }
}

/// Records the working tree and applies the change since `last` as a push; the new snapshot, if
/// it is on a branch.
async fn snapshot(
    state: &web::Data<AppState>,
    repo: &Repository,
    dir: &Path,
    last: Option<CommitId>,
) -> Result<Option<CommitId>, ApiError> {
    let started = Instant::now();
    let (repos, r, d) = (state.repos.clone(), repo.clone(), dir.to_path_buf());
    let snap = web::block(move || -> Result<_, ApiError> {
        let mirror = repos.mirror(&r)?;
        // The checked-out commit may be new (a local commit: no webhook tells of it).
        mirror.fetch()?;
        Ok(mirror.snapshot_worktree(&d)?)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let Some(branch) = snap.branch.clone() else { return Ok(None) };
    // The first snapshot of a watch is against the checked-out commit (what contexts were built
    // at until now).
    let before = last.unwrap_or_else(|| snap.head.clone());
    if before == snap.commit {
        return Ok(Some(before));
    }
    let push =
        Push { git_ref: format!("refs/heads/{branch}"), before: before.to_string(), after: snap.commit.to_string() };
    let applied = apply(state, repo, &branch, &push, Received::Here).await?;
    metrics::counter!("cachet:worktree_snapshots_total").increment(1);
    tracing::info!(repo = %repo.id, %branch, commit = %snap.commit, uncommitted = snap.changed,
                   paths = applied.paths.len(), evicted = applied.evicted,
                   prewarmed = applied.prewarmed + applied.bound, ms = started.elapsed().as_millis() as u64,
                   "working tree recorded");
    Ok(Some(snap.commit))
}

/// Starts a watch for every watched repository whose directory this replica can see, and stops
/// those whose repository is gone (run by the sweeper, first at start).
pub async fn ensure(state: &web::Data<AppState>) {
    let repos = match state.store.watched_repositories().await {
        Ok(repos) => repos,
        Err(e) => return tracing::warn!("listing watched repositories: {e}"),
    };
    let live: std::collections::HashSet<RepoId> = repos.iter().map(|r| r.id).collect();
    state.replica.watches.0.lock().unwrap_or_else(|e| e.into_inner()).retain(|id, _| live.contains(id));
    for repo in repos.iter().filter(|r| state.repos.watched(r)) {
        if let Err(e) = start(state, repo).await {
            tracing::debug!(repo = %repo.id, "not watching its working tree here: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::counts;
    use std::path::Path;

    #[test]
    fn events_inside_git_count_only_where_the_checkout_changes() {
        let root = Path::new("/w");
        for (path, expected) in [
            ("/w/src/lib.rs", true),
            ("/w/.gitignore", true),
            ("/w/.git/HEAD", true),
            ("/w/.git/index", true),
            ("/w/.git/refs/heads/main", true),
            ("/w/.git/objects/ab/cdef", false),
            ("/w/.git/logs/HEAD", false),
            ("/w/.git/index.lock", false),
            ("/elsewhere/x", false),
        ] {
            assert_eq!(counts(root, Path::new(path)), expected, "{path}");
        }
    }
}
