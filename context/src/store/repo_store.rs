//! [`RepoStore`]: creates, opens and removes the bare mirrors under one directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::source::validate_source;
use super::{Mirror, Source, SourcePolicy};
use crate::ContextError;

/// The mirrors of all registered repositories, one bare repository `<mirrors_dir>/<id>.git` each.
///
/// Cheap to clone; `Send + Sync`. Creation and removal of one mirror are serialized (per mirror).
#[derive(Clone, Debug)]
pub struct RepoStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    mirrors_dir: PathBuf,
    /// Checked before every fetch of a remote mirror (see `net`).
    policy: Arc<SourcePolicy>,
}

impl RepoStore {
    /// Opens (creating it if needed) the mirrors directory. The allowed root, if any, must exist.
    pub fn new(mirrors_dir: impl Into<PathBuf>, policy: SourcePolicy) -> Result<RepoStore, ContextError> {
        let dir = mirrors_dir.into();
        std::fs::create_dir_all(&dir)?;
        // Tenants' source code: only this user reads it.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let mirrors_dir = dir.canonicalize()?;
        let allowed_root = match policy.allowed_root {
            Some(root) => Some(root.canonicalize().map_err(|e| {
                ContextError::Io(std::io::Error::new(
                    e.kind(),
                    format!("allowed root {} cannot be resolved: {e}", root.display()),
                ))
            })?),
            None => None,
        };
        // The server's own directories, canonical; one that holds the root keeps only the
        // mirrors out (the root's part of it is the operator's to share).
        let mut private_dirs = vec![mirrors_dir.clone()];
        for dir in &policy.private_dirs {
            let Ok(dir) = dir.canonicalize() else { continue };
            if !allowed_root.as_ref().is_some_and(|root| root.starts_with(&dir)) && !private_dirs.contains(&dir) {
                private_dirs.push(dir);
            }
        }
        let policy = Arc::new(SourcePolicy { allowed_root, private_dirs, ..policy });
        let inner = Inner { mirrors_dir, policy };
        Ok(RepoStore { inner: Arc::new(inner) })
    }

    /// The canonical mirrors directory.
    pub fn mirrors_dir(&self) -> &Path {
        &self.inner.mirrors_dir
    }

    /// Checks a registration source against the policy without touching git.
    ///
    /// Accepts a local path or `file://` URL naming a git repository whose canonical path and git
    /// data (git directory, common directory, alternates, symlinks inside them) are inside
    /// `allowed_root` and outside the mirrors and the policy's private directories (refused, with
    /// one message whatever the reason, if no root is configured, if anything escapes through
    /// `..`, symlinks or `gitdir:` files, or if it is not a repository), and `https://`, `http://`, `ssh://`, `git://` and scp-like `user@host:path`
    /// URLs when remote sources are allowed. Anything else (`ext::`, `fd::`, empty strings, strings
    /// starting with `-`, control characters, other schemes) is [`ContextError::BadSource`].
    ///
    /// This check is syntactic; where a remote URL's host leads (its allowed list, the addresses
    /// it resolves to) is checked before every fetch, when it matters.
    pub fn validate(&self, url: &str) -> Result<Source, ContextError> {
        validate_source(url, &self.inner.policy)
    }

    /// Creates the bare mirror of repository `id` (`[A-Za-z0-9_-]{1,64}`, else `BadSource`) and
    /// fetches all its branches. Idempotent: an existing mirror gets its source updated and is
    /// fetched again. A mirror whose first fetch fails is removed again.
    ///
    /// Only this mirror is locked meanwhile (a slow remote delays nobody else's registration).
    pub fn create_mirror(&self, id: &str, source: &Source) -> Result<Mirror, ContextError> {
        let path = self.mirror_path(id)?;
        let lock = super::mirror::lifecycle_lock(&path);
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        let existed = path.exists();
        let result = Mirror::init_bare(&path, &source.git_url())
            .map(|m| m.guarded(self.inner.policy.clone()))
            .and_then(|m| m.fetch().map(|()| m));
        if result.is_err() && !existed {
            let _ = std::fs::remove_dir_all(&path);
        }
        result
    }

    /// Opens the existing mirror of `id`; [`ContextError::NotFound`] if there is none.
    pub fn mirror(&self, id: &str) -> Result<Mirror, ContextError> {
        let path = self.mirror_path(id)?;
        if !path.is_dir() {
            return Err(ContextError::NotFound(format!("no mirror for repository '{id}'")));
        }
        Ok(Mirror::open_path(&path)?.guarded(self.inner.policy.clone()))
    }

    /// Deletes the mirror of `id`; [`ContextError::NotFound`] if there is none.
    pub fn remove(&self, id: &str) -> Result<(), ContextError> {
        let path = self.mirror_path(id)?;
        let lock = super::mirror::lifecycle_lock(&path);
        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
        if !path.is_dir() {
            return Err(ContextError::NotFound(format!("no mirror for repository '{id}'")));
        }
        std::fs::remove_dir_all(&path)?;
        Ok(())
    }

    fn mirror_path(&self, id: &str) -> Result<PathBuf, ContextError> {
        let ok =
            (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !ok {
            return Err(ContextError::BadSource(format!("repository id must match [A-Za-z0-9_-]{{1,64}}, got {id:?}")));
        }
        Ok(self.inner.mirrors_dir.join(format!("{id}.git")))
    }
}
