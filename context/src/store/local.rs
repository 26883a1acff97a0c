//! Local repository sources: where libgit2 would really read a repository's objects from.
//!
//! A directory's canonical path being under the allowed root says nothing about where its git
//! data lies: a `.git` *file* (`gitdir: …`, as worktrees and submodules write), a symlinked
//! `.git`, a worktree's `commondir`, `objects/info/alternates`, or a symlink anywhere inside the
//! git directory (`objects -> …`) make libgit2 read another directory's objects — another
//! tenant's mirror, or any repository of the host. So a local source is accepted only when its
//! git directory, its common directory, every object store it borrows from (alternates, to
//! libgit2's depth) and the target of every symlink inside them all resolve under the allowed
//! root and outside the server's own directories. Checked at registration and again before every
//! fetch (the tenant may change the directory after registering it).
//!
//! Every refusal is the same words, whatever the reason — a missing path, a path outside the
//! root, a path that escapes: a different answer for "does not exist" and "outside the root"
//! would tell a tenant which paths exist on the host.

use std::path::{Path, PathBuf};

use git2::{Repository, RepositoryOpenFlags};

/// Where a local source's data may lie: under `root`, and under none of `private`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Confinement<'a> {
    /// The canonical allowed root.
    pub root: &'a Path,
    /// Canonical directories of the server's own (its mirrors, its data directory), none of
    /// which contains `root`.
    pub private: &'a [PathBuf],
}

/// libgit2 follows alternates this many levels deep (`GIT_ALTERNATES_MAX_DEPTH`).
const MAX_ALTERNATES_DEPTH: usize = 5;
/// How deep the walk of a git directory goes (symlinked directories included).
const MAX_WALK_DEPTH: usize = 24;
/// How many entries the walk of one source visits at most (a repository with more loose
/// objects than this is refused: `git gc` packs them).
const MAX_WALK_ENTRIES: usize = 2_000_000;

impl Confinement<'_> {
    /// Whether the canonical path `p` lies where a source's data may.
    fn allows(&self, p: &Path) -> bool {
        p.starts_with(self.root) && !self.private.iter().any(|d| p.starts_with(d))
    }

    /// The canonical form of `p`, when it exists and is allowed.
    fn resolve(&self, p: &Path) -> Option<PathBuf> {
        p.canonicalize().ok().filter(|c| self.allows(c))
    }

    /// `Some(canonical dir)` when `dir` is a git repository all of whose data lies where it may.
    pub(crate) fn check(&self, dir: &Path) -> Option<PathBuf> {
        if !dir.is_absolute() {
            return None;
        }
        let canonical = self.resolve(dir)?;
        if !canonical.is_dir() {
            return None;
        }
        // Opened as libgit2's local transport opens it: at exactly this path, following a
        // `gitdir:` file.
        let repo =
            Repository::open_ext(&canonical, RepositoryOpenFlags::NO_SEARCH, std::iter::empty::<&std::ffi::OsStr>())
                .ok()?;
        let git_dir = self.resolve(repo.path())?;
        let common = self.resolve(repo.commondir())?;
        let mut budget = MAX_WALK_ENTRIES;
        self.walk(&git_dir, 0, &mut budget)?;
        if common != git_dir {
            self.walk(&common, 0, &mut budget)?;
        }
        self.alternates(&common.join("objects"), 0, &mut budget)?;
        Some(canonical)
    }

    /// Checks the object store `objects` (already walked) borrows from, recursively.
    fn alternates(&self, objects: &Path, depth: usize, budget: &mut usize) -> Option<()> {
        let file = objects.join("info").join("alternates");
        let text = match std::fs::read(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(()),
            Err(_) => return None,
        };
        let text = String::from_utf8(text).ok()?;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            if depth >= MAX_ALTERNATES_DEPTH {
                return None;
            }
            let path = Path::new(line);
            let other = self.resolve(&if path.is_absolute() { path.to_path_buf() } else { objects.join(path) })?;
            self.walk(&other, 0, budget)?;
            self.alternates(&other, depth + 1, budget)?;
        }
        Some(())
    }

    /// Every symlink under `dir` (canonical) resolves where it may; symlinked directories are
    /// walked too.
    fn walk(&self, dir: &Path, depth: usize, budget: &mut usize) -> Option<()> {
        if depth > MAX_WALK_DEPTH {
            return None;
        }
        for entry in std::fs::read_dir(dir).ok()? {
            *budget = budget.checked_sub(1)?;
            let entry = entry.ok()?;
            let kind = entry.file_type().ok()?;
            if kind.is_symlink() {
                let target = self.resolve(&entry.path())?;
                if target.is_dir() {
                    self.walk(&target, depth + 1, budget)?;
                }
            } else if kind.is_dir() {
                self.walk(&entry.path(), depth + 1, budget)?;
            }
        }
        Some(())
    }
}
