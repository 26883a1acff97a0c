//! Manifests as an agent reads them: what the code builds with (name, version, entry points,
//! scripts, dependencies, features, workspace), without the package's registry metadata (keywords,
//! classifiers, authors, funding, URLs, licence) and without the settings of tools that live in it
//! (`xo`, `ava`, `jest` in `package.json`; `[tool.*]` in `pyproject.toml`). Those take a third to
//! two thirds of a typical manifest, tell an agent working on the code nothing it acts on, and
//! would otherwise keep the manifest out of the budget or make each of its pushes cost more of the
//! context.
//!
//! The block says what it left out (`### package.json (manifest; left out: keywords, xo)`), so an
//! agent that needs them reads the file. What is kept reads as in the file: `package.json` is
//! re-printed in its own key order and indentation, TOML manifests keep their formatting and
//! comments ([`toml_edit`]). A manifest that does not parse, or has nothing to leave out, is shown
//! in full.

use serde::Serialize;
use serde_json::{Map, Value};
use toml_edit::{DocumentMut, Item};

/// Top-level keys of `package.json` left out: registry metadata and the settings of linters,
/// test runners, formatters, git hooks and release tools.
const PACKAGE_JSON: [&str; 30] = [
    "keywords",
    "author",
    "contributors",
    "maintainers",
    "funding",
    "repository",
    "bugs",
    "homepage",
    "license",
    "licenses",
    "publishConfig",
    "xo",
    "ava",
    "nyc",
    "c8",
    "jest",
    "mocha",
    "prettier",
    "eslintConfig",
    "eslintIgnore",
    "stylelint",
    "babel",
    "browserslist",
    "tsd",
    "np",
    "lint-staged",
    "husky",
    "simple-git-hooks",
    "commitlint",
    "renovate",
];

/// Keys of Cargo's `[package]` / `[workspace.package]` left out.
const CARGO_PACKAGE: [&str; 13] = [
    "authors",
    "keywords",
    "categories",
    "repository",
    "homepage",
    "documentation",
    "readme",
    "license",
    "license-file",
    "exclude",
    "include",
    "metadata",
    "badges",
];

/// Keys of `pyproject.toml`'s `[project]` (and Poetry's `[tool.poetry]`) left out.
const PYPROJECT_PROJECT: [&str; 12] = [
    "authors",
    "maintainers",
    "keywords",
    "classifiers",
    "urls",
    "license",
    "license-files",
    "readme",
    "homepage",
    "repository",
    "documentation",
    "packages",
];

/// A manifest without what an agent does not use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Summary {
    /// The manifest's text without the left-out keys.
    pub text: String,
    /// The keys left out, dotted (`project.classifiers`, `tool.ruff`).
    pub left_out: Vec<String>,
}

/// The manifests [`summarize`] knows.
#[derive(Clone, Copy)]
enum Kind {
    PackageJson,
    Cargo,
    Pyproject,
}

fn kind(path: &str) -> Option<Kind> {
    match path.rsplit('/').next().unwrap_or(path) {
        "package.json" => Some(Kind::PackageJson),
        "Cargo.toml" => Some(Kind::Cargo),
        "pyproject.toml" => Some(Kind::Pyproject),
        _ => None,
    }
}

/// Whether `path` is a manifest [`summarize`] may shorten (its block's text then depends on the
/// file's content, not only on its blob id).
pub(crate) fn applies(path: &str) -> bool {
    kind(path).is_some()
}

/// The manifest at `path` without its metadata and tool settings; `None` when it is not such a
/// manifest, does not parse, or has nothing to leave out.
pub(crate) fn summarize(path: &str, content: &str) -> Option<Summary> {
    let summary = match kind(path)? {
        Kind::PackageJson => package_json(content)?,
        Kind::Cargo => toml_manifest(
            content,
            &[("package", &CARGO_PACKAGE), ("workspace.package", &CARGO_PACKAGE)],
            &["badges", "workspace.metadata"],
            false,
        )?,
        Kind::Pyproject => {
            toml_manifest(content, &[("project", &PYPROJECT_PROJECT), ("tool.poetry", &PYPROJECT_PROJECT)], &[], true)?
        }
    };
    (!summary.left_out.is_empty()).then_some(summary)
}

fn package_json(content: &str) -> Option<Summary> {
    let all: Map<String, Value> = serde_json::from_str(content).ok()?;
    let (mut kept, mut left_out) = (Map::new(), Vec::new());
    for (key, value) in all {
        if PACKAGE_JSON.contains(&key.as_str()) {
            left_out.push(key);
        } else {
            kept.insert(key, value);
        }
    }
    let indent = indent_of(content);
    let mut out = Vec::with_capacity(content.len());
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes()),
    );
    kept.serialize(&mut ser).ok()?;
    let mut text = String::from_utf8(out).ok()?;
    text.push('\n');
    Some(Summary { text, left_out })
}

/// The indentation of the first indented line (a tab or spaces), two spaces if none.
fn indent_of(content: &str) -> &str {
    content
        .lines()
        .map(|l| &l[..l.len() - l.trim_start_matches([' ', '\t']).len()])
        .find(|w| !w.is_empty())
        .unwrap_or("  ")
}

/// Removes `keys` from each of the (dotted) `tables`, the whole (dotted) `items`, and with
/// `tools` every `[tool.*]` table but Poetry's (which holds the dependencies of Poetry projects).
fn toml_manifest(content: &str, tables: &[(&str, &[&str])], items: &[&str], tools: bool) -> Option<Summary> {
    let mut doc: DocumentMut = content.parse().ok()?;
    let mut left_out = Vec::new();
    for (table, keys) in tables {
        for key in *keys {
            remove(&mut doc, table, key, &mut left_out);
        }
    }
    for item in items {
        let (table, key) = item.rsplit_once('.').unwrap_or(("", item));
        remove(&mut doc, table, key, &mut left_out);
    }
    if tools {
        let names: Vec<String> = doc
            .get("tool")
            .and_then(Item::as_table_like)
            .map(|t| t.iter().map(|(k, _)| k.to_string()).filter(|k| k != "poetry").collect())
            .unwrap_or_default();
        for name in &names {
            remove(&mut doc, "tool", name, &mut left_out);
        }
        if doc.get("tool").and_then(Item::as_table_like).is_some_and(|t| t.is_empty()) {
            doc.remove("tool");
        }
    }
    Some(Summary { text: doc.to_string(), left_out })
}

/// Removes `key` from the table at the dotted path `table` (`""`: the document), noting it.
fn remove(doc: &mut DocumentMut, table: &str, key: &str, left_out: &mut Vec<String>) {
    let mut item = doc.as_item_mut();
    for part in table.split('.').filter(|p| !p.is_empty()) {
        match item.get_mut(part) {
            Some(next) if next.is_table_like() => item = next,
            _ => return,
        }
    }
    let Some(t) = item.as_table_like_mut() else { return };
    if t.remove(key).is_some() {
        left_out.push(if table.is_empty() { key.to_string() } else { format!("{table}.{key}") });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_json_keeps_order_and_indentation() {
        let src = "{\n\t\"name\": \"ky\",\n\t\"version\": \"1.5.0\",\n\t\"keywords\": [\n\t\t\"fetch\"\n\t],\n\t\"scripts\": {\n\t\t\"test\": \"xo && ava\"\n\t},\n\t\"xo\": {\n\t\t\"envs\": [\"browser\"]\n\t},\n\t\"devDependencies\": {\n\t\t\"ava\": \"^5.3.1\"\n\t}\n}\n";
        let s = summarize("package.json", src).unwrap();
        assert_eq!(s.left_out, ["keywords", "xo"]);
        assert_eq!(
            s.text,
            "{\n\t\"name\": \"ky\",\n\t\"version\": \"1.5.0\",\n\t\"scripts\": {\n\t\t\"test\": \"xo && ava\"\n\t},\n\t\"devDependencies\": {\n\t\t\"ava\": \"^5.3.1\"\n\t}\n}\n"
        );
        // Nothing to leave out, not JSON, not an object, or not a manifest: shown as it is.
        assert_eq!(summarize("package.json", "{\n  \"name\": \"a\"\n}\n"), None);
        assert_eq!(summarize("package.json", "{\"name\": "), None);
        assert_eq!(summarize("package.json", "[1, 2]"), None);
        assert_eq!(summarize("other.json", src), None);
        assert!(summarize("web/package.json", src).is_some());
    }

    #[test]
    fn cargo_toml_keeps_formatting() {
        let src = "[package]\nname = \"rg\"   # the binary\nversion = \"14.1.0\"\nauthors = [\"A\"]\nkeywords = [\"grep\"]\ndescription = \"\"\"\nfast\n\"\"\"\n\n[package.metadata.deb]\nassets = []\n\n[dependencies]\nregex = \"1\"\n\n[badges]\nci = \"x\"\n";
        let s = summarize("Cargo.toml", src).unwrap();
        assert_eq!(s.left_out, ["package.authors", "package.keywords", "package.metadata", "badges"]);
        assert_eq!(s.text, "[package]\nname = \"rg\"   # the binary\nversion = \"14.1.0\"\ndescription = \"\"\"\nfast\n\"\"\"\n\n[dependencies]\nregex = \"1\"\n");
        assert_eq!(summarize("Cargo.toml", "[package]\nname = \"a\"\n"), None);
        assert_eq!(summarize("Cargo.toml", "[package\n"), None);
    }

    #[test]
    fn pyproject_drops_metadata_and_tools_but_poetry() {
        let src = "[project]\nname = \"Flask\"\nclassifiers = [\n    \"Typing :: Typed\",\n]\ndependencies = [\"click\"]\n\n[project.urls]\nSource = \"x\"\n\n[tool.poetry]\nauthors = [\"a\"]\n\n[tool.poetry.dependencies]\npython = \"^3.10\"\n\n[tool.ruff]\nsrc = [\"src\"]\n\n[tool.pytest.ini_options]\ntestpaths = [\"tests\"]\n";
        let s = summarize("pyproject.toml", src).unwrap();
        assert_eq!(
            s.left_out,
            ["project.classifiers", "project.urls", "tool.poetry.authors", "tool.ruff", "tool.pytest"]
        );
        assert_eq!(
            s.text,
            "[project]\nname = \"Flask\"\ndependencies = [\"click\"]\n\n[tool.poetry]\n\n[tool.poetry.dependencies]\npython = \"^3.10\"\n"
        );
        let only_tools = summarize("pyproject.toml", "[tool.black]\nline-length = 88\n").unwrap();
        assert_eq!((only_tools.text.as_str(), only_tools.left_out), ("", vec!["tool.black".to_string()]));
    }
}
