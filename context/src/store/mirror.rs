//! [`Mirror`]: one repository on disk, read at exact commits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use git2::{FetchOptions, FetchPrune, Repository, RepositoryOpenFlags};

use super::paths::{branch_ref, check_repo_path, looks_like_sha};
use super::tree::{diff_trees, find_commit};
use super::{net, SourcePolicy};
use crate::{BlobId, CommitId, ContextError};

/// A repository on disk: a bare mirror from [`crate::RepoStore`] or any repository opened with
/// [`Mirror::open_path`].
///
/// Holds only the path: every call opens its own `git2::Repository` (which is not `Sync`), so a
/// `Mirror` is `Send + Sync` and cheap to clone. Fetches of the same path are serialized.
#[derive(Clone, Debug)]
pub struct Mirror {
    path: PathBuf,
    /// The store's source policy: a mirror from [`crate::RepoStore`] checks its remote's host
    /// against it before every fetch and follows no redirect to another host.
    guard: Option<Arc<SourcePolicy>>,
}

/// A file's content at a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileAt {
    /// The blob id of the content.
    pub blob: BlobId,
    /// The raw bytes.
    pub bytes: Vec<u8>,
}

/// One path changed between two commits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    /// Repository-relative path with '/' separators.
    pub path: String,
    /// What happened to it.
    pub kind: ChangeKind,
}

/// How a path changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Absent before, present after.
    Added,
    /// Present in both with different content or mode.
    Modified,
    /// Present before, absent after.
    Deleted,
}

const HEADS_REFSPEC: &str = "+refs/heads/*:refs/heads/*";

impl Mirror {
    /// Opens an existing repository (bare or with a work tree) at exactly `path` (no search in
    /// parent directories). Nothing is ever written through it except by [`Mirror::fetch`] and
    /// [`Mirror::snapshot_worktree`] (a mirror's own objects and `refs/cachet/worktree/*`).
    pub fn open_path(path: &Path) -> Result<Mirror, ContextError> {
        let mirror = Mirror { path: path.to_path_buf(), guard: None };
        mirror.repo().map_err(|e| match e {
            ContextError::Git(e) => {
                ContextError::NotFound(format!("no repository at {}: {}", path.display(), e.message()))
            }
            other => other,
        })?;
        Ok(mirror)
    }

    /// Creates (or reuses) a bare repository at `path` whose `origin` points at `url`.
    pub(crate) fn init_bare(path: &Path, url: &str) -> Result<Mirror, ContextError> {
        let repo = if path.exists() { open_exact(path)? } else { Repository::init_bare(path)? };
        match repo.find_remote("origin") {
            Ok(remote) if remote.url().ok() == Some(url) => {}
            Ok(_) => repo.remote_set_url("origin", url)?,
            Err(_) => {
                repo.remote_with_fetch("origin", url, HEADS_REFSPEC)?;
            }
        }
        Ok(Mirror { path: path.to_path_buf(), guard: None })
    }

    /// The same mirror, fetching under `policy` (see [`Mirror::fetch`]).
    pub(crate) fn guarded(self, policy: Arc<SourcePolicy>) -> Mirror {
        Mirror { guard: Some(policy), ..self }
    }

    /// The repository's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the repository (crate-internal: the builder opens it once per build).
    pub(crate) fn repo(&self) -> Result<Repository, ContextError> {
        open_exact(&self.path)
    }

    /// Fetches every branch of `origin` into `refs/heads/*`, pruning branches deleted there.
    ///
    /// A mirror of the [`crate::RepoStore`] first checks a remote origin's host against the
    /// store's policy ([`ContextError::BadSource`] when refused: nothing is connected to), and
    /// follows no redirect to another host; a local origin must still be a repository whose git
    /// data lies under the allowed root (see [`crate::RepoStore::validate`]). A failure of the remote itself is
    /// [`ContextError::Fetch`], whose message (libgit2's, naming what answered and how) is for
    /// the operator's log, not for the tenant.
    pub fn fetch(&self) -> Result<(), ContextError> {
        let lock = fetch_lock(&self.path);
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let repo = self.repo()?;
        let mut remote = repo.find_remote("origin")?;
        let mut opts = FetchOptions::new();
        opts.prune(FetchPrune::On).download_tags(git2::AutotagOption::None);
        let mut over = None;
        if let Some(policy) = &self.guard {
            let url = remote.url().unwrap_or_default().to_string();
            if net::remote_endpoint(&url).is_some() {
                net::check_remote(&url, policy)?;
            } else {
                // A local source is checked again: its directory may have changed since.
                super::source::local_source(Path::new(&url), policy)?;
            }
            opts.follow_redirects(git2::RemoteRedirect::None);
            // Time and size limits, checked as the pack arrives (libgit2's own server timeout,
            // set at start-up, covers a remote that stops answering).
            let deadline = policy.fetch_timeout.map(|t| std::time::Instant::now() + t);
            let max = policy.max_fetch_bytes;
            let exceeded = std::rc::Rc::new(std::cell::Cell::new(None));
            over = Some(exceeded.clone());
            let mut callbacks = git2::RemoteCallbacks::new();
            callbacks.transfer_progress(move |p| {
                let reason = if max.is_some_and(|m| p.received_bytes() as u64 > m) {
                    Some(ContextError::TooLarge(format!(
                        "the repository is larger than this server's limit ({} bytes)",
                        max.unwrap_or_default()
                    )))
                } else if deadline.is_some_and(|d| std::time::Instant::now() > d) {
                    Some(ContextError::Fetch("the fetch took longer than this server's limit".into()))
                } else {
                    None
                };
                let go_on = reason.is_none();
                if reason.is_some() {
                    exceeded.set(reason);
                }
                go_on
            });
            opts.remote_callbacks(callbacks);
        }
        let result = remote.fetch(&[HEADS_REFSPEC], Some(&mut opts), None);
        if let Some(reason) = over.and_then(|o| o.take()) {
            return Err(reason);
        }
        result.map_err(|e| ContextError::Fetch(e.message().into()))
    }

    /// The commit a branch points at; `branch` is `main` or `refs/heads/main`.
    /// [`ContextError::UnknownRef`] if the name is invalid or the branch does not exist.
    pub fn branch_head(&self, branch: &str) -> Result<CommitId, ContextError> {
        let full = branch_ref(branch)?;
        let repo = self.repo()?;
        let reference = match repo.find_reference(&full) {
            Ok(r) => r,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                return Err(ContextError::UnknownRef(format!("no branch {branch:?}")))
            }
            Err(e) => return Err(e.into()),
        };
        let commit = reference.peel_to_commit()?;
        Ok(CommitId::from_oid(commit.id()))
    }

    /// Resolves a branch name, a full or abbreviated commit id, or `HEAD` to a commit.
    /// [`ContextError::UnknownRef`] if it names nothing, is ambiguous, or is not a commit.
    pub fn resolve(&self, rev: &str) -> Result<CommitId, ContextError> {
        if rev == "HEAD" {
            let repo = self.repo()?;
            let head = repo.head().and_then(|h| h.peel_to_commit());
            return head
                .map(|c| CommitId::from_oid(c.id()))
                .map_err(|_| ContextError::UnknownRef("HEAD does not point at a commit".into()));
        }
        match self.branch_head(rev) {
            Err(ContextError::UnknownRef(_)) => {}
            other => return other,
        }
        if !looks_like_sha(rev) {
            return Err(ContextError::UnknownRef(format!("no branch or commit {rev:?}")));
        }
        let repo = self.repo()?;
        let object = match repo.revparse_single(rev) {
            Ok(o) => o,
            Err(e) if e.code() == git2::ErrorCode::Ambiguous => {
                return Err(ContextError::UnknownRef(format!("{rev:?} is ambiguous")))
            }
            Err(e) if matches!(e.code(), git2::ErrorCode::NotFound | git2::ErrorCode::InvalidSpec) => {
                return Err(ContextError::UnknownRef(format!("no branch or commit {rev:?}")))
            }
            Err(e) => return Err(e.into()),
        };
        let commit = object.into_commit().map_err(|_| ContextError::UnknownRef(format!("{rev:?} is not a commit")))?;
        Ok(CommitId::from_oid(commit.id()))
    }

    /// True if `c` is a commit present in the repository.
    pub fn has_commit(&self, c: &CommitId) -> bool {
        self.repo().is_ok_and(|repo| find_commit(&repo, c).is_ok())
    }

    /// The file at `path` in `commit`. `path` is repository-relative with '/' separators; absolute
    /// paths, `.`/`..`/empty components, NUL and backslashes are [`ContextError::BadPath`].
    /// `Ok(None)` when the path is absent at that commit or is not a regular file (a directory, a
    /// symlink, a submodule).
    pub fn read_file(&self, commit: &CommitId, path: &str) -> Result<Option<FileAt>, ContextError> {
        self.read_file_at_most(commit, path, u64::MAX)
    }

    /// [`Mirror::read_file`] of a file of at most `max_bytes`: its size comes from the object's
    /// header first, so a larger one is never read into memory.
    ///
    /// # Errors
    /// [`ContextError::TooLarge`] for a larger file; as [`Mirror::read_file`] otherwise.
    pub fn read_file_at_most(
        &self,
        commit: &CommitId,
        path: &str,
        max_bytes: u64,
    ) -> Result<Option<FileAt>, ContextError> {
        check_repo_path(path)?;
        let repo = self.repo()?;
        let tree = find_commit(&repo, commit)?.tree()?;
        let entry = match tree.get_path(Path::new(path)) {
            Ok(e) => e,
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if entry.kind() != Some(git2::ObjectType::Blob) || !matches!(entry.filemode(), 0o100644 | 0o100755) {
            return Ok(None);
        }
        let size = super::tree::blob_size(&repo, entry.id())?;
        if size > max_bytes {
            return Err(ContextError::TooLarge(format!("{path:?} has {size} bytes, more than {max_bytes}")));
        }
        let blob = repo.find_blob(entry.id())?;
        Ok(Some(FileAt { blob: BlobId::from_oid(blob.id()), bytes: blob.content().to_vec() }))
    }

    /// The paths changed from `before` to `after` (a tree diff; a rename is a deletion plus an
    /// addition), sorted by path.
    pub fn changed_paths(&self, before: &CommitId, after: &CommitId) -> Result<Vec<Change>, ContextError> {
        let repo = self.repo()?;
        let before_tree = find_commit(&repo, before)?.tree()?;
        let after_tree = find_commit(&repo, after)?.tree()?;
        let deltas = diff_trees(&repo, Some(&before_tree), &after_tree)?;
        Ok(deltas
            .into_iter()
            .map(|(path, delta)| {
                let kind = match delta {
                    git2::Delta::Added => ChangeKind::Added,
                    git2::Delta::Deleted => ChangeKind::Deleted,
                    _ => ChangeKind::Modified,
                };
                Change { path, kind }
            })
            .collect())
    }

    /// The unified diff of one file from `before` to `after`, with `context` lines around each
    /// change: its hunks (`@@ … @@` headers, then ` `, `-` and `+` lines), without the file
    /// headers. `None` when the file is the same at both, or binary on either side.
    pub fn file_diff(
        &self,
        before: &CommitId,
        after: &CommitId,
        path: &str,
        context: u32,
    ) -> Result<Option<String>, ContextError> {
        let repo = self.repo()?;
        let old = find_commit(&repo, before)?.tree()?;
        let new = find_commit(&repo, after)?.tree()?;
        let mut opts = git2::DiffOptions::new();
        opts.pathspec(path).disable_pathspec_match(true).context_lines(context);
        let diff = repo.diff_tree_to_tree(Some(&old), Some(&new), Some(&mut opts))?;
        let (mut out, mut binary) = (String::new(), false);
        diff.print(git2::DiffFormat::Patch, |_, _, line| {
            let content = String::from_utf8_lossy(line.content());
            match line.origin() {
                c @ (' ' | '+' | '-') => {
                    out.push(c);
                    out.push_str(&content);
                    if !content.ends_with('\n') {
                        out.push('\n');
                    }
                }
                'H' => out.push_str(&content),
                'B' => binary = true,
                // File headers, and the "no newline at end of file" markers.
                _ => {}
            }
            true
        })?;
        Ok((!binary && !out.is_empty()).then_some(out))
    }

    /// First-parent history from `head` back, newest first, at most `limit` commits (`head`
    /// included).
    pub fn first_parent(&self, head: &CommitId, limit: usize) -> Result<Vec<CommitId>, ContextError> {
        let repo = self.repo()?;
        let mut out = Vec::new();
        let mut commit = find_commit(&repo, head)?;
        while out.len() < limit {
            out.push(CommitId::from_oid(commit.id()));
            match commit.parent(0) {
                Ok(p) => commit = p,
                Err(_) => break,
            }
        }
        Ok(out)
    }
}

fn open_exact(path: &Path) -> Result<Repository, ContextError> {
    Ok(Repository::open_ext(path, RepositoryOpenFlags::NO_SEARCH, std::iter::empty::<&std::ffi::OsStr>())?)
}

/// One lock per repository path in this process, so two fetches never race on ref lock files.
/// Per-path locks.
type PathLocks = OnceLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>>;

fn fetch_lock(path: &Path) -> Arc<Mutex<()>> {
    static LOCKS: PathLocks = OnceLock::new();
    path_lock(&LOCKS, path)
}

/// The lock that serializes creating and removing the mirror at `path` (a fetch inside a
/// creation takes [`fetch_lock`] too).
pub(crate) fn lifecycle_lock(path: &Path) -> Arc<Mutex<()>> {
    static LOCKS: PathLocks = OnceLock::new();
    path_lock(&LOCKS, path)
}

/// One lock per path from `locks`; locks nobody holds or waits for are dropped from the table.
fn path_lock(locks: &PathLocks, path: &Path) -> Arc<Mutex<()>> {
    let mut map = locks.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    map.retain(|p, lock| p == path || Arc::strong_count(lock) > 1);
    map.entry(path.to_path_buf()).or_default().clone()
}
