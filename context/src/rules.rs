//! Which files of a commit are eligible: the built-in skips of [`FileRules`] plus its globs.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::{ContextError, FileRules};

/// Directory names whose contents are third-party code.
const VENDORED_DIRS: [&str; 16] = [
    "vendor",
    "vendored",
    "node_modules",
    "bower_components",
    "jspm_packages",
    "third_party",
    "third-party",
    "thirdparty",
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    "site-packages",
    "__pycache__",
    ".yarn",
];

/// File names that are generated (lockfiles).
const GENERATED_NAMES: [&str; 12] = [
    "Cargo.lock",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "poetry.lock",
    "Pipfile.lock",
    "uv.lock",
    "composer.lock",
    "Gemfile.lock",
    "go.sum",
    "flake.lock",
];

/// File name endings that are generated (minified bundles, source maps, protobuf output, …).
const GENERATED_SUFFIXES: [&str; 9] =
    [".lock", ".min.js", ".min.css", ".map", ".pb.go", "_pb2.py", "_pb2_grpc.py", ".pb.cc", ".pb.h"];

/// Markers that, in the first lines of a file, say it is generated.
const GENERATED_MARKERS: [&str; 3] = ["@generated", "DO NOT EDIT", "Code generated"];

/// How many leading lines are searched for a generated marker.
const MARKER_LINES: usize = 5;

/// The bytes searched for NUL to call a file binary.
const BINARY_PROBE: usize = 8 * 1024;

/// Why a file is not in the context (for diagnostics and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    Excluded,
    Vendored,
    Generated,
    Oversized,
    Binary,
    WeirdPath,
}

/// [`FileRules`] compiled once per build.
#[derive(Debug)]
pub(crate) struct FileFilter {
    max_bytes: u64,
    exclude: GlobSet,
    include: GlobSet,
    skip_vendored: bool,
    skip_generated: bool,
}

impl FileFilter {
    /// Compiles the globs; an invalid glob is [`ContextError::BadOptions`].
    pub(crate) fn new(rules: &FileRules) -> Result<FileFilter, ContextError> {
        Ok(FileFilter {
            max_bytes: rules.max_file_bytes,
            exclude: glob_set(&rules.exclude)?,
            include: glob_set(&rules.include)?,
            skip_vendored: rules.skip_vendored,
            skip_generated: rules.skip_generated,
        })
    }

    /// True when nothing below directory `dir` (ending in '/') can be eligible: it is vendored and
    /// no `include` pattern could re-admit a file in it.
    pub(crate) fn prunes_dir(&self, dir: &str) -> bool {
        self.skip_vendored && self.include.is_empty() && is_vendored(dir)
    }

    /// The checks that need only the path.
    pub(crate) fn check_path(&self, path: &str) -> Result<(), Skip> {
        if path.chars().any(char::is_control) {
            return Err(Skip::WeirdPath);
        }
        if self.exclude.is_match(path) {
            return Err(Skip::Excluded);
        }
        let included = self.include.is_match(path);
        if self.skip_vendored && !included && is_vendored(path) {
            return Err(Skip::Vendored);
        }
        if self.skip_generated && !included && has_generated_name(path) {
            return Err(Skip::Generated);
        }
        Ok(())
    }

    /// Whether an `include` pattern names `path`.
    pub(crate) fn includes(&self, path: &str) -> bool {
        self.include.is_match(path)
    }

    /// The size limit (checked before the blob is read).
    pub(crate) fn check_size(&self, size: u64) -> Result<(), Skip> {
        if size > self.max_bytes {
            Err(Skip::Oversized)
        } else {
            Ok(())
        }
    }

    /// The checks on the content, given what [`classify`] found in it.
    pub(crate) fn check_content(&self, path: &str, binary: bool, generated: bool) -> Result<(), Skip> {
        if binary {
            return Err(Skip::Binary);
        }
        if self.skip_generated && generated && !self.include.is_match(path) {
            return Err(Skip::Generated);
        }
        Ok(())
    }
}

/// What the content says about a file: `(binary, generated)`. Binary means a NUL byte in the first
/// 8 KiB or not UTF-8; generated means a generated-file marker in the first lines.
pub(crate) fn classify(bytes: &[u8]) -> (bool, bool) {
    if bytes[..bytes.len().min(BINARY_PROBE)].contains(&0) {
        return (true, false);
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => (false, has_generated_marker(text)),
        Err(_) => (true, false),
    }
}

fn is_vendored(path: &str) -> bool {
    let mut dirs = path.split('/');
    dirs.next_back();
    dirs.any(|d| VENDORED_DIRS.contains(&d))
}

fn has_generated_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    GENERATED_NAMES.contains(&name) || GENERATED_SUFFIXES.iter().any(|s| name.ends_with(s))
}

fn has_generated_marker(text: &str) -> bool {
    text.lines().take(MARKER_LINES).any(|line| GENERATED_MARKERS.iter().any(|m| line.contains(m)))
}

/// Globs on repository-relative paths: a pattern without '/' matches a name at any depth, a leading
/// '/' anchors at the root, a trailing '/' means everything below a directory.
fn glob_set(patterns: &[String]) -> Result<GlobSet, ContextError> {
    let mut builder = GlobSetBuilder::new();
    for raw in patterns {
        let mut p = raw.trim().to_string();
        if p.is_empty() {
            continue;
        }
        if p.ends_with('/') {
            p.push_str("**");
        }
        let p = match p.strip_prefix('/') {
            Some(anchored) => anchored.to_string(),
            None if !p.contains('/') => format!("**/{p}"),
            None => p,
        };
        let glob = GlobBuilder::new(&p)
            .literal_separator(true)
            .build()
            .map_err(|e| ContextError::BadOptions(format!("invalid glob {raw:?}: {e}")))?;
        builder.add(glob);
        if !p.ends_with("/**") {
            // `docs` should also exclude everything below a directory called `docs`.
            let below = GlobBuilder::new(&format!("{p}/**")).literal_separator(true).build();
            if let Ok(g) = below {
                builder.add(g);
            }
        }
    }
    builder.build().map_err(|e| ContextError::BadOptions(format!("invalid globs: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(exclude: &[&str], include: &[&str]) -> FileFilter {
        let rules = FileRules {
            exclude: exclude.iter().map(|s| s.to_string()).collect(),
            include: include.iter().map(|s| s.to_string()).collect(),
            ..FileRules::default()
        };
        FileFilter::new(&rules).unwrap()
    }

    #[test]
    fn built_in_skips() {
        let f = filter(&[], &[]);
        assert_eq!(f.check_path("src/lib.rs"), Ok(()));
        assert_eq!(f.check_path("vendor/x/lib.rs"), Err(Skip::Vendored));
        assert_eq!(f.check_path("web/node_modules/a/index.js"), Err(Skip::Vendored));
        assert_eq!(f.check_path("Cargo.lock"), Err(Skip::Generated));
        assert_eq!(f.check_path("dist/app.min.js"), Err(Skip::Generated));
        assert_eq!(f.check_size(1 << 20), Err(Skip::Oversized));
        assert_eq!(f.check_size(1000), Ok(()));
        assert_eq!(f.check_path("a\nb.rs"), Err(Skip::WeirdPath));
        assert!(f.prunes_dir("web/node_modules/") && !f.prunes_dir("src/"));
        assert!(!filter(&[], &["vendor/ours/**"]).prunes_dir("vendor/"));
        assert_eq!(classify(b"fn a() {}\0"), (true, false));
        assert_eq!(classify(&[0xff, 0xfe, b'a']), (true, false));
        assert_eq!(classify(b"// Code generated by protoc. DO NOT EDIT.\n"), (false, true));
        assert_eq!(classify(b"fn a() {}\n"), (false, false));
        assert_eq!(f.check_content("a.go", false, true), Err(Skip::Generated));
        assert_eq!(f.check_content("a.rs", true, false), Err(Skip::Binary));
        assert_eq!(f.check_content("a.rs", false, false), Ok(()));
    }

    #[test]
    fn globs() {
        let f = filter(&["*.md", "/docs/", "tests/fixtures"], &["vendor/ours/**", "Cargo.lock"]);
        assert_eq!(f.check_path("README.md"), Err(Skip::Excluded));
        assert_eq!(f.check_path("a/b/NOTES.md"), Err(Skip::Excluded));
        assert_eq!(f.check_path("docs/x.rs"), Err(Skip::Excluded));
        assert_eq!(f.check_path("src/docs/x.rs"), Ok(()));
        assert_eq!(f.check_path("tests/fixtures/a.rs"), Err(Skip::Excluded));
        assert_eq!(f.check_path("vendor/ours/lib.rs"), Ok(()));
        assert_eq!(f.check_path("vendor/theirs/lib.rs"), Err(Skip::Vendored));
        assert_eq!(f.check_path("Cargo.lock"), Ok(()));
        assert!(FileFilter::new(&FileRules { exclude: vec!["a[".into()], ..FileRules::default() }).is_err());
    }
}
