//! Shared pieces of the per-language outline walkers: node text, signature lines, and the outline
//! being written with the names it defines.

use std::ops::Range;

use tree_sitter::Node;

use super::{doc, Lang, OutlineEntry};

/// Outline lines are cut at this many characters.
const MAX_LINE_CHARS: usize = 240;
/// At most this many member lines per container (struct fields, enum variants, class members).
pub(super) const MAX_MEMBERS: usize = 100;
/// At most this many lines per outline.
const MAX_LINES: usize = 4000;
/// Containers nested deeper than this are not descended into (bounds recursion on hostile input).
pub(super) const MAX_DEPTH: usize = 24;

const INDENT: &str = "    ";

/// An outline being written: indented signature lines plus the names the file defines (and the
/// byte ranges of those name nodes, so they are not also counted as references).
#[derive(Debug)]
pub(super) struct Outline<'s> {
    pub lang: Lang,
    pub src: &'s str,
    pub lines: Vec<String>,
    /// What is known about each line (parallel to `lines`).
    pub entries: Vec<OutlineEntry>,
    pub defines: Vec<String>,
    pub def_ranges: Vec<Range<usize>>,
}

impl<'s> Outline<'s> {
    pub fn new(lang: Lang, src: &'s str) -> Self {
        Outline { lang, src, lines: Vec::new(), entries: Vec::new(), defines: Vec::new(), def_ranges: Vec::new() }
    }

    /// The source text of a node.
    pub fn text(&self, node: Node<'_>) -> &'s str {
        self.src.get(node.byte_range()).unwrap_or("")
    }

    /// The source text from `from`'s start up to `to`'s start, collapsed to one line.
    pub fn head(&self, from: Node<'_>, to: Option<Node<'_>>) -> String {
        let end = to.map_or(from.end_byte(), |n| n.start_byte());
        collapse(self.src.get(from.start_byte()..end).unwrap_or(""))
    }

    /// A node's whole text collapsed to one line.
    pub fn flat(&self, node: Node<'_>) -> String {
        collapse(self.text(node))
    }

    /// Appends a line at `depth`, cut to [`MAX_LINE_CHARS`]; false when the outline is full.
    pub fn line(&mut self, depth: usize, text: &str) -> bool {
        if self.lines.len() >= MAX_LINES {
            return false;
        }
        let mut line = INDENT.repeat(depth);
        line.push_str(&truncate(text, MAX_LINE_CHARS));
        self.lines.push(line);
        self.entries.push(OutlineEntry { depth: depth.min(usize::from(u16::MAX)) as u16, ..OutlineEntry::default() });
        true
    }

    /// Appends the line of a definition: the name it defines (recorded as with [`Outline::define`])
    /// and the first line of the doc comment of `def`, the definition's node.
    pub fn def_line(&mut self, depth: usize, text: &str, name: Option<Node<'_>>, def: Node<'_>) {
        if self.line(depth, text) {
            self.describe_last(name, def);
        }
        self.define(name);
    }

    /// Appends a line that belongs to the definition written next (a decorator, an attribute).
    pub fn prefix_line(&mut self, depth: usize, text: &str) {
        if self.line(depth, text) {
            if let Some(e) = self.entries.last_mut() {
                e.prefix = true;
            }
        }
    }

    /// Names the last line's definition and gives it its doc comment's first line.
    pub fn describe_last(&mut self, name: Option<Node<'_>>, def: Node<'_>) {
        let name = name.map(|n| self.text(n)).filter(|t| !t.is_empty()).map(str::to_string);
        let doc = doc::first_line(self.lang, def, self.src);
        if let Some(e) = self.entries.last_mut() {
            e.name = name;
            e.doc = doc;
        }
    }

    /// Records the name node of a definition.
    pub fn define(&mut self, name: Option<Node<'_>>) {
        if let Some(n) = name {
            let t = self.text(n);
            if !t.is_empty() {
                self.defines.push(t.to_string());
                self.def_ranges.push(n.byte_range());
            }
        }
    }

    /// Writes `head {`, the members `body` writes, and `}`; or `head {}` when it writes none.
    /// `def` is the container's definition node and `name` its name, if it has one.
    pub fn braced(
        &mut self,
        depth: usize,
        head: &str,
        name: Option<Node<'_>>,
        def: Node<'_>,
        body: impl FnOnce(&mut Self),
    ) {
        let open = self.lines.len();
        if self.line(depth, &format!("{head} {{")) {
            self.describe_last(name, def);
        }
        self.define(name);
        let before = self.lines.len();
        body(self);
        if self.lines.len() == before {
            self.lines.truncate(open);
            self.entries.truncate(open);
            if self.line(depth, &format!("{head} {{}}")) {
                self.describe_last(name, def);
            }
        } else if self.line(depth, "}") {
            if let Some(e) = self.entries.last_mut() {
                e.closing = true;
            }
        }
    }
}

/// The named children of a node.
pub(super) fn named_children(node: Node<'_>) -> Vec<Node<'_>> {
    let mut cursor = node.walk();
    node.named_children(&mut cursor).collect()
}

/// Whitespace runs become one space; no space just inside brackets or before a comma; a trailing
/// comma on its own line before a closing bracket is dropped (`(u32,)` is kept).
pub(super) fn collapse(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut pending_space = false;
    for c in s.chars() {
        if c.is_whitespace() {
            pending_space = !out.is_empty();
            continue;
        }
        if matches!(c, ')' | ']') && pending_space && out.ends_with(',') {
            out.pop();
        }
        let glue = matches!(c, ')' | ']' | ',') || out.ends_with(['(', '[']);
        if pending_space && !glue {
            out.push(' ');
        }
        pending_space = false;
        out.push(c);
    }
    out
}

/// Cuts `s` to at most `max` characters, marking the cut with `…`.
pub(super) fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// `s` without a trailing `;` (and the whitespace before it).
pub(super) fn strip_semicolon(s: &str) -> &str {
    s.trim_end().trim_end_matches(';').trim_end()
}

/// `s` without a trailing `=` (the text of a declaration up to its value).
pub(super) fn strip_equals(s: &str) -> &str {
    s.trim_end().trim_end_matches('=').trim_end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_whitespace() {
        assert_eq!(collapse("fn new(x: T,\n      y: T) -> Self"), "fn new(x: T, y: T) -> Self");
        assert_eq!(collapse("def f(\n    a,\n    b,\n)"), "def f(a, b)");
        assert_eq!(collapse("  Name   string "), "Name string");
        assert_eq!(collapse("type T = (u32,);"), "type T = (u32,);");
    }

    #[test]
    fn truncation() {
        assert_eq!(truncate("abcdef", 3), "abc…");
        assert_eq!(truncate("ééé", 5), "ééé");
    }
}
