//! Test support: real git repositories written through git2, with deterministic commit ids.
//!
//! Used by this crate's tests and by the API's tests; small and always compiled. Every git failure
//! is returned as [`ContextError::Git`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};

use git2::build::TreeUpdateBuilder;
use git2::{FileMode, Oid, Repository, Signature, Time};

use crate::{CommitId, ContextError};

/// A repository on disk whose `main` branch tests grow commit by commit.
///
/// Author and committer are fixed and every commit is one minute after the previous one, so the
/// same sequence of calls always produces the same commit ids. Files are written to the object
/// database only (the work tree stays empty), which is all that fetching or reading needs.
#[derive(Debug)]
pub struct TestRepo {
    path: PathBuf,
    clock: AtomicI64,
}

const START: i64 = 1_700_000_000;

impl TestRepo {
    /// Creates an empty repository (with a work tree) at `dir`, `HEAD` on `main`.
    pub fn init(dir: impl AsRef<Path>) -> Result<TestRepo, ContextError> {
        let path = dir.as_ref().to_path_buf();
        let repo = Repository::init(&path)?;
        repo.set_head("refs/heads/main")?;
        Ok(TestRepo { path, clock: AtomicI64::new(0) })
    }

    /// The repository directory (the work tree; `.git` is inside).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits on `main`: `Some(text)` writes a file, `None` deletes it. Returns the new commit.
    pub fn commit(&self, files: &[(&str, Option<&str>)], message: &str) -> Result<CommitId, ContextError> {
        let files: Vec<(&str, Option<&[u8]>)> = files.iter().map(|(p, c)| (*p, c.map(str::as_bytes))).collect();
        self.commit_bytes(&files, message)
    }

    /// [`TestRepo::commit`] with raw bytes (for binary and non-UTF-8 files).
    pub fn commit_bytes(&self, files: &[(&str, Option<&[u8]>)], message: &str) -> Result<CommitId, ContextError> {
        self.commit_on("main", files, message, &[])
    }

    /// Commits on `branch` (created from nothing if absent) with `extra_parents` after the branch's
    /// head, e.g. `commit_on("main", &[], "merge", &[feature_head])` for a merge commit.
    pub fn commit_on(
        &self,
        branch: &str,
        files: &[(&str, Option<&[u8]>)],
        message: &str,
        extra_parents: &[CommitId],
    ) -> Result<CommitId, ContextError> {
        let repo = self.repo()?;
        let refname = format!("refs/heads/{branch}");
        let head = repo.find_reference(&refname).ok().and_then(|r| r.peel_to_commit().ok());
        let base_tree = match &head {
            Some(c) => c.tree()?,
            None => repo.find_tree(repo.treebuilder(None)?.write()?)?,
        };
        let mut update = TreeUpdateBuilder::new();
        for (path, content) in files {
            match content {
                Some(bytes) => {
                    let blob = repo.blob(bytes)?;
                    update.upsert(*path, blob, FileMode::Blob);
                }
                None => {
                    update.remove(*path);
                }
            }
        }
        let tree = repo.find_tree(update.create_updated(&repo, &base_tree)?)?;
        let mut parents: Vec<git2::Commit<'_>> = head.into_iter().collect();
        for p in extra_parents {
            parents.push(repo.find_commit(Oid::from_str(&p.0)?)?);
        }
        let parent_refs: Vec<&git2::Commit<'_>> = parents.iter().collect();
        let sig = self.signature()?;
        let oid = repo.commit(Some(&refname), &sig, &sig, message, &tree, &parent_refs)?;
        Ok(CommitId(oid.to_string()))
    }

    /// Points branch `name` at commit `at` (creating or moving it).
    pub fn branch(&self, name: &str, at: &CommitId) -> Result<(), ContextError> {
        let repo = self.repo()?;
        let commit = repo.find_commit(Oid::from_str(&at.0)?)?;
        repo.branch(name, &commit, true)?;
        Ok(())
    }

    /// Deletes branch `name`.
    pub fn delete_branch(&self, name: &str) -> Result<(), ContextError> {
        let repo = self.repo()?;
        repo.find_branch(name, git2::BranchType::Local)?.delete()?;
        Ok(())
    }

    /// Writes the checked-out commit's files into the working tree and the index (commits only
    /// write objects and refs): what `git checkout -f` does.
    pub fn checkout(&self) -> Result<(), ContextError> {
        let repo = self.repo()?;
        repo.set_head("refs/heads/main")?;
        repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))?;
        Ok(())
    }

    /// The commit `main` points at.
    pub fn head(&self) -> Result<CommitId, ContextError> {
        let repo = self.repo()?;
        let c = repo.find_reference("refs/heads/main")?.peel_to_commit()?;
        Ok(CommitId(c.id().to_string()))
    }

    fn repo(&self) -> Result<Repository, ContextError> {
        Ok(Repository::open(&self.path)?)
    }

    fn signature(&self) -> Result<Signature<'static>, ContextError> {
        let tick = self.clock.fetch_add(1, Ordering::SeqCst);
        Ok(Signature::new("cachet test", "test@cachet.invalid", &Time::new(START + 60 * tick, 0))?)
    }
}
