//! Crate-internal reads on an open repository: the files of a commit, blob bytes, and the paths a
//! commit changed. The builder opens the repository once and calls these many times.

use git2::{ObjectType, Oid, Repository, TreeWalkMode, TreeWalkResult};

use crate::{CommitId, ContextError};

/// A regular file of a commit's tree (symlinks and submodules are not listed).
#[derive(Clone, Debug)]
pub(crate) struct TreeFile {
    pub path: String,
    pub blob: Oid,
}

/// Finds a commit; `NotFound` when the id is malformed or absent.
pub(crate) fn find_commit<'r>(repo: &'r Repository, c: &CommitId) -> Result<git2::Commit<'r>, ContextError> {
    let missing = || ContextError::NotFound(format!("no commit {c}"));
    let oid = c.oid().ok_or_else(missing)?;
    repo.find_commit(oid).map_err(|e| if e.code() == git2::ErrorCode::NotFound { missing() } else { e.into() })
}

/// All regular files (mode 100644 / 100755) at `commit`, sorted by path, except below directories
/// for which `prune` (given the directory path with a trailing '/') is true. Paths that are not
/// UTF-8 are left out: they cannot be named through the `&str` API.
pub(crate) fn list_files(
    repo: &Repository,
    commit: &CommitId,
    prune: impl Fn(&str) -> bool,
) -> Result<Vec<TreeFile>, ContextError> {
    let tree = find_commit(repo, commit)?.tree()?;
    let mut files = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(ObjectType::Tree) {
            let name = String::from_utf8_lossy(entry.name_bytes());
            return if prune(&format!("{dir}{name}/")) { TreeWalkResult::Skip } else { TreeWalkResult::Ok };
        }
        let regular = matches!(entry.filemode(), 0o100644 | 0o100755) && entry.kind() == Some(ObjectType::Blob);
        if regular {
            if let Ok(name) = std::str::from_utf8(entry.name_bytes()) {
                files.push(TreeFile { path: format!("{dir}{name}"), blob: entry.id() });
            }
        }
        TreeWalkResult::Ok
    })?;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// The size of a blob in bytes without reading it.
pub(crate) fn blob_size(repo: &Repository, blob: Oid) -> Result<u64, ContextError> {
    let (size, _) = repo.odb()?.read_header(blob)?;
    Ok(size as u64)
}

/// The bytes of a blob.
pub(crate) fn blob_bytes(repo: &Repository, blob: Oid) -> Result<Vec<u8>, ContextError> {
    Ok(repo.find_blob(blob)?.content().to_vec())
}

/// A path a commit changed: its blob before and after (`None`: absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PathChange {
    pub path: String,
    pub old: Option<Oid>,
    pub new: Option<Oid>,
}

/// The paths a commit changed against its first parent (everything, for a root commit), sorted,
/// with their blobs before and after (renames are a deletion plus an addition).
pub(crate) fn commit_changes(repo: &Repository, commit: &git2::Commit<'_>) -> Result<Vec<PathChange>, ContextError> {
    let after = commit.tree()?;
    let before = match commit.parent(0) {
        Ok(p) => Some(p.tree()?),
        Err(_) => None,
    };
    let mut opts = git2::DiffOptions::new();
    opts.include_typechange(true).ignore_submodules(false);
    let diff = repo.diff_tree_to_tree(before.as_ref(), Some(&after), Some(&mut opts))?;
    let present = |f: git2::DiffFile<'_>| Some(f.id()).filter(|id| !id.is_zero());
    let mut out: Vec<PathChange> = Vec::with_capacity(diff.deltas().len());
    for delta in diff.deltas() {
        let file = if delta.status() == git2::Delta::Deleted { delta.old_file() } else { delta.new_file() };
        if let Some(path) = file.path_bytes() {
            let path = String::from_utf8_lossy(path).into_owned();
            out.push(PathChange { path, old: present(delta.old_file()), new: present(delta.new_file()) });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out.dedup_by(|a, b| a.path == b.path);
    Ok(out)
}

/// A tree diff as (path, delta), sorted by path; renames are a deletion plus an addition.
pub(crate) fn diff_trees(
    repo: &Repository,
    before: Option<&git2::Tree<'_>>,
    after: &git2::Tree<'_>,
) -> Result<Vec<(String, git2::Delta)>, ContextError> {
    let mut opts = git2::DiffOptions::new();
    opts.include_typechange(true).ignore_submodules(false);
    let diff = repo.diff_tree_to_tree(before, Some(after), Some(&mut opts))?;
    let mut out = Vec::with_capacity(diff.deltas().len());
    for delta in diff.deltas() {
        let file = if delta.status() == git2::Delta::Deleted { delta.old_file() } else { delta.new_file() };
        if let Some(path) = file.path_bytes() {
            out.push((String::from_utf8_lossy(path).into_owned(), delta.status()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}
