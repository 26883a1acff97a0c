//! Real source text for prompts, read from a git repository with git2: the
//! text files of HEAD, files at older commits, and per-file patches between
//! a commit and its first parent.

use crate::error::BenchError;
use crate::rng::Rng;
use std::fmt;
use std::path::{Path, PathBuf};

/// Extensions of the files used as prompt text.
const TEXT_EXTENSIONS: &[&str] = &[
    "rs", "py", "go", "js", "ts", "tsx", "jsx", "c", "h", "cc", "cpp", "hpp", "java", "kt", "rb", "md", "toml", "yaml",
    "yml", "sh", "sql", "html", "css", "cu", "proto",
];
/// Files smaller than this say too little; larger ones are probably generated.
const MIN_BYTES: usize = 200;
const MAX_BYTES: usize = 200_000;
/// How far back along first parents diffs are taken from.
const MAX_COMMITS: usize = 500;

/// One text file at HEAD.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Path within the repository.
    pub path: String,
    /// Its contents.
    pub text: String,
}

/// The text of a repository, ready to cut into prompts.
pub struct SourceCorpus {
    root: PathBuf,
    repo: git2::Repository,
    files: Vec<SourceFile>,
    /// First-parent history from HEAD: (commit, its first parent).
    commits: Vec<(git2::Oid, git2::Oid)>,
}

impl fmt::Debug for SourceCorpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceCorpus")
            .field("root", &self.root)
            .field("files", &self.files.len())
            .field("commits", &self.commits.len())
            .finish()
    }
}

impl SourceCorpus {
    /// Opens the repository containing `path` and reads the text files of HEAD.
    ///
    /// # Errors
    /// [`BenchError::Git`] when there is no repository or it cannot be read;
    /// [`BenchError::NoSourceText`] when HEAD has no usable text file.
    pub fn open(path: &Path) -> Result<SourceCorpus, BenchError> {
        let git = |source| BenchError::Git { path: path.to_path_buf(), source };
        let repo = git2::Repository::discover(path).map_err(git)?;
        let root = repo.workdir().unwrap_or_else(|| repo.path()).to_path_buf();
        let head = repo.head().and_then(|h| h.peel_to_commit()).map_err(git)?;
        let mut files = Vec::new();
        head.tree()
            .map_err(git)?
            .walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
                let name = entry.name().unwrap_or_default();
                let path = format!("{dir}{name}");
                if entry.kind() == Some(git2::ObjectType::Blob) && is_text_path(&path) {
                    if let Some(text) =
                        entry.to_object(&repo).ok().and_then(|o| o.into_blob().ok()).and_then(|b| text_of(&b))
                    {
                        files.push(SourceFile { path, text });
                    }
                }
                git2::TreeWalkResult::Ok
            })
            .map_err(git)?;
        if files.is_empty() {
            return Err(BenchError::NoSourceText(root));
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let commits = first_parent_history(&repo).map_err(git)?;
        drop(head);
        Ok(SourceCorpus { root, repo, files, commits })
    }

    /// The repository's working directory (or git directory when bare).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The text files of HEAD, sorted by path.
    pub fn files(&self) -> &[SourceFile] {
        &self.files
    }

    /// A random file.
    pub fn pick(&self, rng: &mut Rng) -> &SourceFile {
        &self.files[rng.below(self.files.len())]
    }

    /// About `chars` characters of code: from a random line of a random file,
    /// running on into the following files (each introduced by its path) when
    /// one is too short. Cut at a line end. Returns the first file's path and
    /// the text.
    pub fn excerpt(&self, rng: &mut Rng, chars: usize) -> (String, String) {
        let first = rng.below(self.files.len());
        self.excerpt_of(rng, first, chars)
    }

    /// [`SourceCorpus::excerpt`] starting in file `first` (an index into [`SourceCorpus::files`]).
    pub fn excerpt_of(&self, rng: &mut Rng, first: usize, chars: usize) -> (String, String) {
        let first = first.min(self.files.len() - 1);
        let file = &self.files[first];
        let lines: Vec<usize> = line_starts(&file.text);
        // Start somewhere in the first half so there is text after it.
        let start = lines[rng.below(lines.len().div_ceil(2))];
        let mut out = format!("// {}\n", file.path);
        out.push_str(&file.text[start..]);
        let mut next = first;
        while out.len() < chars && self.files.len() > 1 {
            next = (next + 1) % self.files.len();
            if next == first {
                break;
            }
            let f = &self.files[next];
            out.push_str(&format!("\n// {}\n{}", f.path, f.text));
        }
        (file.path.clone(), truncate_at_line(&out, chars).to_string())
    }

    /// About `chars` characters of whole files, each as a fenced block under
    /// its path, from a random file onwards: a "repository context".
    pub fn context(&self, rng: &mut Rng, chars: usize) -> String {
        let mut out = String::new();
        let first = rng.below(self.files.len());
        for i in 0..self.files.len() {
            if out.len() >= chars {
                break;
            }
            let f = &self.files[(first + i) % self.files.len()];
            let room = chars.saturating_sub(out.len() + f.path.len() + 16);
            out.push_str(&format!("File `{}`:\n```\n{}\n```\n", f.path, truncate_at_line(&f.text, room.max(1))));
        }
        out
    }

    /// Number of commits (with a parent) that diffs can be taken from.
    pub fn commit_count(&self) -> usize {
        self.commits.len()
    }

    /// A per-file patch (`git diff` text) between a random commit and its
    /// first parent, at most about `chars` long, with a header line naming it;
    /// `None` when the history has no textual change to show.
    pub fn diff(&self, rng: &mut Rng, chars: usize) -> Option<String> {
        for _ in 0..8 {
            if self.commits.is_empty() {
                return None;
            }
            let (commit, parent) = self.commits[rng.below(self.commits.len())];
            if let Some(d) = self.file_patch(rng, commit, parent) {
                let header = format!("$ git diff {} {}\n", short(parent), short(commit));
                let body = truncate_at_line(&d, chars.saturating_sub(header.len()).max(1));
                return Some(format!("{header}{body}"));
            }
        }
        None
    }

    /// One random non-binary file's patch of `parent..commit`.
    fn file_patch(&self, rng: &mut Rng, commit: git2::Oid, parent: git2::Oid) -> Option<String> {
        let tree = |oid| self.repo.find_commit(oid).and_then(|c| c.tree()).ok();
        let (new, old) = (tree(commit)?, tree(parent)?);
        let diff = self.repo.diff_tree_to_tree(Some(&old), Some(&new), None).ok()?;
        let n = diff.deltas().len();
        for k in 0..n.min(8) {
            let idx = (rng.below(n) + k) % n;
            let path = diff.get_delta(idx)?.new_file().path()?.to_string_lossy().into_owned();
            if !is_text_path(&path) {
                continue;
            }
            let Ok(Some(mut patch)) = git2::Patch::from_diff(&diff, idx) else { continue };
            if patch.delta().flags().is_binary() {
                continue;
            }
            let Ok(buf) = patch.to_buf() else { continue };
            if let Ok(text) = std::str::from_utf8(&buf) {
                if text.contains("\n@@") || text.starts_with("@@") {
                    return Some(text.to_string());
                }
            }
        }
        None
    }

    /// A random HEAD file as it was at a random older commit (falling back to
    /// HEAD when it did not exist then), with a label naming path and commit.
    pub fn file_at_older_commit(&self, rng: &mut Rng) -> (String, String) {
        let file = self.pick(rng);
        if !self.commits.is_empty() {
            let (commit, _) = self.commits[rng.below(self.commits.len())];
            let old = self
                .repo
                .find_commit(commit)
                .and_then(|c| c.tree())
                .and_then(|t| t.get_path(Path::new(&file.path)))
                .and_then(|e| e.to_object(&self.repo))
                .ok()
                .and_then(|o| o.into_blob().ok())
                .and_then(|b| text_of(&b));
            if let Some(text) = old {
                return (format!("{} at {}", file.path, short(commit)), text);
            }
        }
        (format!("{} at HEAD", file.path), file.text.clone())
    }
}

/// First-parent history of HEAD, newest first, as (commit, first parent).
fn first_parent_history(repo: &git2::Repository) -> Result<Vec<(git2::Oid, git2::Oid)>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push_head()?;
    walk.simplify_first_parent()?;
    let mut out = Vec::new();
    for oid in walk.take(MAX_COMMITS) {
        let commit = repo.find_commit(oid?)?;
        if let Ok(parent) = commit.parent_id(0) {
            out.push((commit.id(), parent));
        }
    }
    Ok(out)
}

/// The first 10 hex digits of a commit id.
fn short(oid: git2::Oid) -> String {
    oid.to_string().chars().take(10).collect()
}

fn is_text_path(path: &str) -> bool {
    let skip = ["vendor/", "node_modules/", "third_party/", ".min."];
    if skip.iter().any(|s| path.contains(s)) {
        return false;
    }
    let ext = path.rsplit_once('.').map(|(_, e)| e).unwrap_or_default();
    TEXT_EXTENSIONS.contains(&ext)
}

/// A blob's text when it is UTF-8, not binary and of a useful size.
fn text_of(blob: &git2::Blob<'_>) -> Option<String> {
    let bytes = blob.content();
    if blob.is_binary() || !(MIN_BYTES..=MAX_BYTES).contains(&bytes.len()) {
        return None;
    }
    std::str::from_utf8(bytes).ok().map(str::to_string)
}

/// Byte offsets at which lines start.
fn line_starts(text: &str) -> Vec<usize> {
    std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1).filter(|&i| i < text.len())).collect()
}

/// A prefix of `text` of at most `max` bytes: up to the last line end when
/// that keeps at least half of `max`, else up to a character boundary.
pub fn truncate_at_line(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].rfind('\n') {
        Some(nl) if (nl + 1) * 2 >= max => &text[..nl + 1],
        _ => &text[..end],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_lines_and_characters() {
        assert_eq!(truncate_at_line("ab\ncd\nef", 7), "ab\ncd\n");
        assert_eq!(truncate_at_line("ab\ncd", 100), "ab\ncd");
        assert_eq!(truncate_at_line("abcdef", 3), "abc");
        assert_eq!(truncate_at_line("a\nbcdefgh", 6), "a\nbcde");
        assert_eq!(truncate_at_line("é€x", 4), "é");
    }

    #[test]
    fn text_paths() {
        assert!(is_text_path("engine/src/lib.rs"));
        assert!(!is_text_path("Cargo.lock"));
        assert!(!is_text_path("x/vendor/y.rs"));
        assert!(!is_text_path("logo.png"));
    }
}
