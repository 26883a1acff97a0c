//! What a file that is not parsed as code is worth to an agent working on the code, for the
//! selection's last phase: manifests first (what the code builds with), then the top-level README,
//! then source of languages without outlines, then documentation. Repository metadata and tool
//! configuration (dotfiles and dot-directories such as `.github/` and `.cargo/`, licences,
//! change logs wherever they are, CI, editor and lint settings, data and config formats that are not
//! a manifest, empty files), and the plain-text files of test, example and documentation
//! directories other than documentation pages (fixtures, `docs/Makefile`, an example's manifest)
//! never take the budget of files an agent works on; a repository that wants one in the context
//! names it in its `include` rules.

/// The class of a plain-text file, in selection order (`Skip` is never selected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TextClass {
    /// A build manifest (`Cargo.toml`, `pyproject.toml`, `package.json`, `go.mod`, …).
    Manifest,
    /// The repository's top-level README.
    Readme,
    /// Source of a language without an outline (C, Java, shell, SQL, …).
    Source,
    /// Documentation (`.md`, `.rst`, `.txt`).
    Docs,
    /// Metadata, CI and tool configuration.
    Skip,
}

/// Build manifests, by file name.
const MANIFESTS: [&str; 16] = [
    "Cargo.toml",
    "pyproject.toml",
    "setup.cfg",
    "requirements.txt",
    "package.json",
    "tsconfig.json",
    "deno.json",
    "go.mod",
    "Makefile",
    "CMakeLists.txt",
    "meson.build",
    "Gemfile",
    "pom.xml",
    "build.gradle",
    "build.gradle.kts",
    "Dockerfile",
];

/// Manifests larger than this are left out (a manifest that large is mostly data).
pub(crate) const MAX_MANIFEST_BYTES: u64 = 8 * 1024;

/// File names (any case, any extension, `-` or `_` suffixes) of repository metadata at the top.
const METADATA_STEMS: [&str; 12] = [
    "license",
    "licence",
    "copying",
    "notice",
    "authors",
    "changelog",
    "changes",
    "history",
    "codeowners",
    "funding",
    "security",
    "code_of_conduct",
];

/// File names (any case, any extension) of change logs, wherever they are: they change with
/// nearly every commit and tell an agent nothing the code does not.
const CHANGE_LOG_STEMS: [&str; 4] = ["changelog", "changes", "news", "contributing"];

/// File names (any case, any extension) of licence texts and pages, wherever they are
/// (`docs/license.rst`): they tell an agent nothing it acts on.
const LICENCE_STEMS: [&str; 3] = ["license", "licence", "copying"];

/// Directories whose plain-text files are test fixtures or examples' and documentation's own
/// build files, not the project's: a template a test renders, `docs/Makefile`,
/// `examples/x/pyproject.toml`. (Code files there are still outlined like any other.)
const NOT_THE_PROJECTS: [&str; 10] =
    ["test", "tests", "testdata", "fixtures", "__tests__", "__snapshots__", "docs", "doc", "examples", "example"];

/// Extensions of documentation.
const DOCS: [&str; 5] = ["md", "markdown", "rst", "txt", "adoc"];

/// Extensions of configuration and data formats.
const CONFIG: [&str; 13] =
    ["toml", "yaml", "yml", "json", "ini", "cfg", "conf", "xml", "properties", "env", "lock", "csv", "in"];

/// Directories of tests.
const TEST_DIRS: [&str; 5] = ["test", "tests", "__tests__", "spec", "specs"];

/// Whether `path` is a test file: under a test directory, or named as one (`test_x.py`,
/// `x_test.go`, `x.test.ts`, `x.spec.js`, `conftest.py`).
pub(crate) fn is_test_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    let mut parts = lower.split('/').rev();
    let name = parts.next().unwrap_or("");
    if parts.any(|d| TEST_DIRS.contains(&d)) {
        return true;
    }
    let stem = name.split('.').next().unwrap_or(name);
    stem.starts_with("test_")
        || stem.ends_with("_test")
        || stem.ends_with("_tests")
        || stem == "conftest"
        || name.contains(".test.")
        || name.contains(".spec.")
}

/// The class of a plain-text file at `path` of `size` bytes.
pub(crate) fn text_class(path: &str, size: u64) -> TextClass {
    let name = path.rsplit('/').next().unwrap_or(path);
    if size == 0 || path.split('/').any(|part| part.starts_with('.')) {
        return TextClass::Skip;
    }
    let (stem, ext) = name.rsplit_once('.').unwrap_or((name, ""));
    let stem = stem.to_ascii_lowercase();
    let ext = ext.to_ascii_lowercase();
    if CHANGE_LOG_STEMS.contains(&stem.as_str()) || LICENCE_STEMS.contains(&stem.as_str()) {
        return TextClass::Skip;
    }
    let dirs: Vec<String> = path.split('/').rev().skip(1).map(str::to_ascii_lowercase).collect();
    if dirs.iter().any(|d| NOT_THE_PROJECTS.contains(&d.as_str())) {
        // Documentation pages are the project's, wherever they are; nothing else here is.
        let docs = dirs.iter().any(|d| d == "docs" || d == "doc");
        return if docs && DOCS.contains(&ext.as_str()) { TextClass::Docs } else { TextClass::Skip };
    }
    if MANIFESTS.contains(&name) {
        return if size <= MAX_MANIFEST_BYTES { TextClass::Manifest } else { TextClass::Skip };
    }
    let metadata = |m: &&str| stem == *m || stem.strip_prefix(m).is_some_and(|r| r.starts_with(['-', '_']));
    if !path.contains('/') && METADATA_STEMS.iter().any(metadata) {
        return TextClass::Skip;
    }
    if !path.contains('/') && stem == "readme" {
        return TextClass::Readme;
    }
    if DOCS.contains(&ext.as_str()) {
        return TextClass::Docs;
    }
    if CONFIG.contains(&ext.as_str()) || ext.is_empty() {
        return TextClass::Skip;
    }
    TextClass::Source
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths() {
        for p in [
            "tests/test_cli.py",
            "test/browser.ts",
            "src/a/__tests__/b.tsx",
            "x_test.go",
            "pkg/conftest.py",
            "src/ky.test.ts",
            "lib/a.spec.js",
            "test_app.py",
            "crates/core/tests/it.rs",
        ] {
            assert!(is_test_path(p), "{p}");
        }
        for p in ["src/flask/testing.py", "latest.py", "contest.py", "src/attest/mod.rs", "testdata_gen.go"] {
            assert!(!is_test_path(p), "{p}");
        }
    }

    #[test]
    fn classes() {
        let cases = [
            ("Cargo.toml", 900, TextClass::Manifest),
            ("crates/core/Cargo.toml", 900, TextClass::Manifest),
            ("package.json", 3_000, TextClass::Manifest),
            ("package.json", 40_000, TextClass::Skip),
            ("go.mod", 200, TextClass::Manifest),
            ("README.md", 5_000, TextClass::Readme),
            ("docs/README.md", 5_000, TextClass::Docs),
            ("docs/guide.md", 5_000, TextClass::Docs),
            ("src/native/parse.c", 5_000, TextClass::Source),
            ("scripts/release.sh", 500, TextClass::Source),
            (".editorconfig", 100, TextClass::Skip),
            (".gitattributes", 100, TextClass::Skip),
            (".npmrc", 20, TextClass::Skip),
            (".gitignore", 100, TextClass::Skip),
            (".github/security.md", 500, TextClass::Skip),
            (".github/funding.yml", 50, TextClass::Skip),
            (".github/workflows/main.yml", 900, TextClass::Skip),
            (".cargo/config.toml", 200, TextClass::Skip),
            ("LICENSE", 1_000, TextClass::Skip),
            ("LICENSE-MIT", 1_000, TextClass::Skip),
            ("CHANGELOG.md", 9_000, TextClass::Skip),
            ("CONTRIBUTING.md", 2_000, TextClass::Skip),
            ("rustfmt.toml", 50, TextClass::Skip),
            ("tests/fixtures/data.json", 500, TextClass::Skip),
            ("docs/security.md", 500, TextClass::Docs),
            ("docs/changes.rst", 500, TextClass::Skip),
            ("docs/license.rst", 500, TextClass::Skip),
            ("third_party/LICENSE.txt", 500, TextClass::Skip),
            ("docs/contributing.rst", 500, TextClass::Skip),
            ("docs/Makefile", 500, TextClass::Skip),
            ("doc/usage.txt", 500, TextClass::Docs),
            ("examples/celery/pyproject.toml", 500, TextClass::Skip),
            ("tests/templates/_macro.html", 100, TextClass::Skip),
            ("tests/templates/mail.txt", 100, TextClass::Skip),
            ("src/flask/py.typed", 0, TextClass::Skip),
            ("MANIFEST.in", 300, TextClass::Skip),
            ("requirements/dev.in", 300, TextClass::Skip),
            ("NEWS", 300, TextClass::Skip),
        ];
        for (path, size, want) in cases {
            assert_eq!(text_class(path, size), want, "{path}");
        }
    }
}
