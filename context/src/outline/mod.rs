//! Per-file analysis with tree-sitter: an outline of the definitions (signatures, bodies elided)
//! and the identifiers a file defines and references, for ranking.
//!
//! Never fails: a file that does not parse cleanly (syntax errors, a parse that runs past its time
//! limit, a file too large to parse) is plain text — no outline, no identifiers.

mod doc;
mod go;
mod javascript;
mod lang;
mod python;
mod references;
mod rust;
mod syntax;
mod visibility;

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

pub(crate) use lang::plain_fence_tag;
pub use lang::Lang;

/// Files larger than this are not parsed (they are plain text).
const MAX_PARSE_BYTES: usize = 1 << 20;
/// A parse that takes longer than this is abandoned (the file is plain text).
const PARSE_TIME_LIMIT: Duration = Duration::from_secs(2);

/// What the context needs to know about one file's content. A pure function of (language, bytes),
/// so it is cached by blob id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileAnalysis {
    /// The language the file parsed as; `None` for plain text (including parse failures).
    pub lang: Option<Lang>,
    /// The outline, one definition per line with nesting by four spaces, each line ending in
    /// `'\n'`; empty for plain text and for code that defines nothing.
    pub outline: String,
    /// What is known about each line of `outline` (same order, same count), for showing the
    /// lines that matter most when the whole outline does not fit.
    pub entries: Vec<OutlineEntry>,
    /// The identifiers the file defines, sorted and de-duplicated.
    pub defines: Vec<String>,
    /// The identifiers the file uses (other than at their definitions), with counts, sorted.
    pub references: Vec<(String, u32)>,
}

/// One line of an outline, described.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutlineEntry {
    /// Nesting depth (0: top level).
    pub depth: u16,
    /// The name the line defines, if any.
    pub name: Option<String>,
    /// The first line of the definition's doc comment, without comment markers.
    pub doc: Option<String>,
    /// Visible outside its file or type (`pub`, exported, capitalised in Go, no leading `_` in
    /// Python, a trait's or trait impl's member).
    pub public: bool,
    /// The line belongs to the definition on the next line (a decorator).
    pub prefix: bool,
    /// The line closes the container opened by the last line above it at the same depth (`}`).
    pub closing: bool,
}

impl FileAnalysis {
    /// True when the file parsed as code (it may still have an empty outline).
    pub fn is_code(&self) -> bool {
        self.lang.is_some()
    }
}

/// Analyzes `text` as the language of `path`'s extension (plain text when there is none).
pub fn analyze(path: &str, text: &str) -> FileAnalysis {
    match Lang::from_path(path) {
        Some(lang) => analyze_as(lang, text),
        None => FileAnalysis::default(),
    }
}

/// Analyzes `text` as `lang`; plain text when it does not parse cleanly.
pub fn analyze_as(lang: Lang, text: &str) -> FileAnalysis {
    if text.len() > MAX_PARSE_BYTES {
        return FileAnalysis::default();
    }
    let Some(tree) = parse(lang, text) else { return FileAnalysis::default() };
    let root = tree.root_node();
    if root.has_error() {
        return FileAnalysis::default();
    }
    let mut out = syntax::Outline::new(lang, text);
    match lang {
        Lang::Rust => rust::items(&mut out, root, 0),
        Lang::Python => python::block(&mut out, root, 0),
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => javascript::statements(&mut out, root, 0),
        Lang::Go => go::source_file(&mut out, root),
    }
    let references = references::collect(lang, root, text, &out.def_ranges);
    let mut defines = out.defines;
    defines.sort();
    defines.dedup();
    let mut outline = String::new();
    for line in &out.lines {
        outline.push_str(line);
        outline.push('\n');
    }
    let mut entries = out.entries;
    visibility::mark(lang, &out.lines, &mut entries);
    FileAnalysis { lang: Some(lang), outline, entries, defines, references }
}

fn parse(lang: Lang, text: &str) -> Option<tree_sitter::Tree> {
    let mut parser = tree_sitter::Parser::new();
    parser.set_language(&lang.grammar()).ok()?;
    let bytes = text.as_bytes();
    let started = Instant::now();
    let mut progress = |_: &tree_sitter::ParseState| {
        if started.elapsed() > PARSE_TIME_LIMIT {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let options = tree_sitter::ParseOptions::new().progress_callback(&mut progress);
    let mut read = |i: usize, _| bytes.get(i..).unwrap_or_default();
    parser.parse_with_options(&mut read, None, Some(options))
}
