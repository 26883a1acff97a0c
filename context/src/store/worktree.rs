//! A local repository's working tree as a commit of its mirror: [`Mirror::snapshot_worktree`].
//!
//! A developer running cachet beside their checkout wants the context to follow their edits
//! before they commit them. The working tree's state — the checked-out commit plus every
//! uncommitted change git sees (modified, added, deleted and untracked files that are not
//! ignored) — is written into the *mirror* (never into the developer's repository) as a commit
//! whose parent is the checked-out commit, under `refs/cachet/worktree/<branch>`. Everything that
//! reads a repository at a commit (the context builder, its history-based order, the diff a push
//! invalidates by) then works on it unchanged, and its provenance says what it is: a commit
//! named "working tree of <branch>" over the commit it changes.
//!
//! Files are read the way git stores them and no further: a symlink is stored as its target
//! text (never read through), a path below a symlinked directory is not read, and only regular
//! files up to [`MAX_WORKTREE_FILE_BYTES`] are (a larger one keeps the checked-out version).

use std::path::Path;

use git2::build::TreeUpdateBuilder;
use git2::{FileMode, Repository, RepositoryOpenFlags, Status, StatusOptions};

use super::mirror::Mirror;
use super::paths::check_repo_path;
use crate::{CommitId, ContextError};

/// The largest working-tree file taken into a snapshot, in bytes.
pub const MAX_WORKTREE_FILE_BYTES: u64 = 4 << 20;
/// The most changed paths one snapshot takes (a working tree with more is refused: commit or
/// ignore them).
pub const MAX_WORKTREE_CHANGES: usize = 20_000;
/// The namespace of the snapshot refs in a mirror.
pub const WORKTREE_REFS: &str = "refs/cachet/worktree/";

/// A working tree's state as a commit of the mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorktreeSnapshot {
    /// The branch checked out (`None`: a detached HEAD, which no branch's context follows).
    pub branch: Option<String>,
    /// The checked-out commit.
    pub head: CommitId,
    /// The snapshot: `head` itself when nothing is changed, else a commit over it.
    pub commit: CommitId,
    /// How many paths differ from `head`.
    pub changed: usize,
}

impl Mirror {
    /// Records the working tree of the repository at `workdir` (its origin, already fetched:
    /// the checked-out commit must be in the mirror) as a commit of this mirror, and points
    /// `refs/cachet/worktree/<branch>` at it (removing the refs of other branches: the working
    /// tree is on one branch at a time).
    pub fn snapshot_worktree(&self, workdir: &Path) -> Result<WorktreeSnapshot, ContextError> {
        let source =
            Repository::open_ext(workdir, RepositoryOpenFlags::NO_SEARCH, std::iter::empty::<&std::ffi::OsStr>())
                .map_err(|e| {
                    ContextError::NotFound(format!("no repository at {}: {}", workdir.display(), e.message()))
                })?;
        if source.is_bare() {
            return Err(ContextError::BadSource("a bare repository has no working tree to watch".into()));
        }
        let head_ref = source.head().map_err(|_| ContextError::UnknownRef("HEAD does not point at a commit".into()))?;
        let branch = if head_ref.is_branch() { head_ref.shorthand().ok().map(str::to_string) } else { None };
        let head_oid = head_ref.peel_to_commit()?.id();
        let head = CommitId::from_oid(head_oid);
        let mirror = self.repo()?;
        let base = mirror.find_commit(head_oid).map_err(|_| {
            ContextError::NotFound(format!("the checked-out commit {head} is not in the mirror (fetch first)"))
        })?;
        let mut opts = StatusOptions::new();
        opts.include_untracked(true).recurse_untracked_dirs(true).include_ignored(false).exclude_submodules(true);
        let statuses = source.statuses(Some(&mut opts))?;
        if statuses.len() > MAX_WORKTREE_CHANGES {
            return Err(ContextError::TooLarge(format!(
                "{} changed paths in the working tree (at most {MAX_WORKTREE_CHANGES})",
                statuses.len()
            )));
        }
        let mut removed = Vec::new();
        let mut files = Vec::new();
        for entry in statuses.iter() {
            let Ok(path) = entry.path() else { continue };
            if check_repo_path(path).is_err() || entry.status().contains(Status::IGNORED) {
                continue;
            }
            match worktree_entry(&mirror, workdir, path)? {
                Entry::Absent => removed.push(path.to_string()),
                Entry::File(blob, mode) => files.push((path.to_string(), blob, mode)),
                Entry::Skip => {}
            }
        }
        let base_tree = base.tree()?;
        let tree_id = updated_tree(&mirror, &base_tree, &removed, &files)?;
        let tree = mirror.find_tree(tree_id)?;
        // Paths that differ from the checked-out commit (the status also lists files whose index
        // entry alone differs).
        let changed = mirror.diff_tree_to_tree(Some(&base_tree), Some(&tree), None)?.deltas().len();
        let commit = if tree_id == base_tree.id() {
            head.clone()
        } else {
            let who = git2::Signature::now("cachet", "cachet@localhost")?;
            let on = branch.as_deref().unwrap_or("a detached HEAD");
            let message = format!("working tree of {on}: uncommitted changes over {head}\n");
            CommitId::from_oid(mirror.commit(None, &who, &who, &message, &tree, &[&base])?)
        };
        for name in mirror
            .references_glob(&format!("{WORKTREE_REFS}*"))?
            .names()
            .flatten()
            .map(str::to_string)
            .collect::<Vec<_>>()
        {
            mirror.find_reference(&name)?.delete()?;
        }
        if let Some(branch) = &branch {
            let oid = commit.oid().ok_or_else(|| ContextError::NotFound(format!("bad commit id {commit}")))?;
            mirror.reference(&format!("{WORKTREE_REFS}{branch}"), oid, true, "cachet: working tree")?;
        }
        Ok(WorktreeSnapshot { branch, head, commit, changed })
    }

    /// The latest working-tree snapshot of `branch` ([`Mirror::snapshot_worktree`]), if any.
    pub fn worktree_head(&self, branch: &str) -> Result<Option<CommitId>, ContextError> {
        let repo = self.repo()?;
        let found = match repo.find_reference(&format!("{WORKTREE_REFS}{branch}")) {
            Ok(r) => Ok(Some(CommitId::from_oid(r.peel_to_commit()?.id()))),
            Err(e) if matches!(e.code(), git2::ErrorCode::NotFound | git2::ErrorCode::InvalidSpec) => Ok(None),
            Err(e) => Err(e.into()),
        };
        found
    }
}

/// `base` with `removed` gone and `files` in. A path whose kind changed (a directory become a
/// file or a symlink, a file become a directory) is removed first, then written: git's tree
/// update refuses to turn one into the other in place.
fn updated_tree(
    repo: &Repository,
    base: &git2::Tree<'_>,
    removed: &[String],
    files: &[(String, git2::Oid, FileMode)],
) -> Result<git2::Oid, ContextError> {
    if removed.is_empty() && files.is_empty() {
        return Ok(base.id());
    }
    let kind_at = |path: &str| base.get_path(Path::new(path)).ok().and_then(|e| e.kind());
    let mut first = TreeUpdateBuilder::new();
    for path in removed {
        first.remove(path.as_str());
    }
    for (path, _, _) in files {
        if kind_at(path) == Some(git2::ObjectType::Tree) {
            first.remove(path.as_str());
        }
        // A file where a directory of this path is now.
        let mut ancestor = path.as_str();
        while let Some((parent, _)) = ancestor.rsplit_once('/') {
            if kind_at(parent) == Some(git2::ObjectType::Blob) {
                first.remove(parent);
            }
            ancestor = parent;
        }
    }
    let cleared = repo.find_tree(first.create_updated(repo, base)?)?;
    let mut then = TreeUpdateBuilder::new();
    for (path, blob, mode) in files {
        then.upsert(path.as_str(), *blob, *mode);
    }
    Ok(then.create_updated(repo, &cleared)?)
}

/// What a changed path is in the working tree now.
enum Entry {
    /// Not there (deleted, or below something that is no longer a directory).
    Absent,
    /// A blob written to the mirror, with its mode.
    File(git2::Oid, FileMode),
    /// Not taken (too large, not a file, below a symlink): the checked-out version stays.
    Skip,
}

/// Reads `path` of the working tree at `workdir` as git would store it, into `mirror`'s objects.
fn worktree_entry(mirror: &Repository, workdir: &Path, path: &str) -> Result<Entry, ContextError> {
    // Every directory on the way must be a real directory of the tree, never a symlink (which
    // could lead anywhere on the host).
    let mut at = workdir.to_path_buf();
    let parts: Vec<&str> = path.split('/').collect();
    for dir in &parts[..parts.len() - 1] {
        at.push(dir);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(m) if m.file_type().is_symlink() => return Ok(Entry::Skip),
            Ok(_) => return Ok(Entry::Absent),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Entry::Absent),
            Err(e) => return Err(e.into()),
        }
    }
    at.push(parts[parts.len() - 1]);
    let meta = match std::fs::symlink_metadata(&at) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Entry::Absent),
        Err(e) => return Err(e.into()),
    };
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&at)?;
        return Ok(Entry::File(mirror.blob(target.as_os_str().as_encoded_bytes())?, FileMode::Link));
    }
    if !meta.is_file() || meta.len() > MAX_WORKTREE_FILE_BYTES {
        return Ok(Entry::Skip);
    }
    let bytes = std::fs::read(&at)?;
    #[cfg(unix)]
    let executable = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0;
    #[cfg(not(unix))]
    let executable = false;
    let mode = if executable { FileMode::BlobExecutable } else { FileMode::Blob };
    Ok(Entry::File(mirror.blob(&bytes)?, mode))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestRepo;

    fn mirror_of(repo: &TestRepo, dir: &Path) -> Mirror {
        let mirror = Mirror::init_bare(&dir.join("mirror.git"), &repo.path().to_string_lossy()).unwrap();
        mirror.fetch().unwrap();
        mirror
    }

    #[test]
    fn the_snapshot_holds_uncommitted_edits_new_files_and_deletions() {
        let dir = tempfile::tempdir().unwrap();
        let repo = TestRepo::init(dir.path().join("work")).unwrap();
        repo.commit(&[("src/a.rs", Some("fn a() {}\n")), ("src/b.rs", Some("fn b() {}\n"))], "first").unwrap();
        repo.checkout().unwrap();
        let mirror = mirror_of(&repo, dir.path());
        let clean = mirror.snapshot_worktree(repo.path()).unwrap();
        assert_eq!((clean.commit.clone(), clean.changed), (clean.head.clone(), 0));
        assert_eq!(mirror.worktree_head("main").unwrap(), Some(clean.head.clone()));

        std::fs::write(repo.path().join("src/a.rs"), "fn a() { edited() }\n").unwrap();
        std::fs::write(repo.path().join("src/new.rs"), "fn new() {}\n").unwrap();
        std::fs::remove_file(repo.path().join("src/b.rs")).unwrap();
        std::fs::write(repo.path().join(".gitignore"), "*.log\n").unwrap();
        std::fs::write(repo.path().join("debug.log"), "ignored\n").unwrap();
        let snap = mirror.snapshot_worktree(repo.path()).unwrap();
        assert_ne!(snap.commit, snap.head);
        assert_eq!(snap.branch.as_deref(), Some("main"));
        assert_eq!(snap.changed, 4, "{snap:?}");
        assert_eq!(mirror.worktree_head("main").unwrap(), Some(snap.commit.clone()));
        let read = |p: &str| mirror.read_file(&snap.commit, p).unwrap().map(|f| String::from_utf8(f.bytes).unwrap());
        assert_eq!(read("src/a.rs").as_deref(), Some("fn a() { edited() }\n"));
        assert_eq!(read("src/new.rs").as_deref(), Some("fn new() {}\n"));
        assert_eq!(read("src/b.rs"), None);
        assert_eq!(read("debug.log"), None, "ignored files stay out");
        let mut changed: Vec<String> =
            mirror.changed_paths(&snap.head, &snap.commit).unwrap().into_iter().map(|c| c.path).collect();
        changed.sort();
        assert_eq!(changed, [".gitignore", "src/a.rs", "src/b.rs", "src/new.rs"]);
        // The developer's repository is untouched: its HEAD and status are as they were.
        let source = git2::Repository::open(repo.path()).unwrap();
        assert_eq!(source.head().unwrap().peel_to_commit().unwrap().id(), snap.head.oid().unwrap());
        assert!(source.find_reference(&format!("{WORKTREE_REFS}main")).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_stored_as_links_and_never_read_through() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "host secret\n").unwrap();
        let repo = TestRepo::init(dir.path().join("work")).unwrap();
        repo.commit(&[("lib/x.rs", Some("fn x() {}\n"))], "first").unwrap();
        repo.checkout().unwrap();
        let mirror = mirror_of(&repo, dir.path());
        std::os::unix::fs::symlink(outside.join("secret.txt"), repo.path().join("link.txt")).unwrap();
        // `lib` replaced by a symlink to a directory outside the tree: `lib/x.rs` is not read there.
        std::fs::remove_dir_all(repo.path().join("lib")).unwrap();
        std::fs::create_dir_all(outside.join("lib")).unwrap();
        std::fs::write(outside.join("lib/x.rs"), "host file\n").unwrap();
        std::os::unix::fs::symlink(outside.join("lib"), repo.path().join("lib")).unwrap();
        let snap = mirror.snapshot_worktree(repo.path()).unwrap();
        let m = mirror.repo().unwrap();
        let tree = m.find_commit(snap.commit.oid().unwrap()).unwrap().tree().unwrap();
        let link = tree.get_path(Path::new("link.txt")).unwrap();
        assert_eq!(link.filemode(), i32::from(FileMode::Link));
        let target = m.find_blob(link.id()).unwrap();
        assert_eq!(target.content(), outside.join("secret.txt").as_os_str().as_encoded_bytes());
        for path in ["link.txt", "lib/x.rs", "lib"] {
            let text = mirror.read_file(&snap.commit, path).unwrap().map(|f| f.bytes);
            assert!(
                text.as_deref() != Some(b"host secret\n".as_slice())
                    && text.as_deref() != Some(b"host file\n".as_slice())
            );
        }
    }
}
