//! An outline cut to a byte budget, keeping the definitions that matter most.
//!
//! Every definition line is ranked: referenced from another file first, then public, then
//! shallower, then earlier in the file. In that order, and within the first
//! [`FULL_LINES_PERCENT`] of the room, a definition is shown in full when it fits together with
//! the containers above it that are not shown yet (and, for a container, its own best member, so
//! no container is ever shown empty). Then, in the same order, the definitions left out are listed
//! tersely (`name(params)`, [`crate::terse`]) under their container, or at the end for top-level
//! ones, while the room lasts: a large class keeps most of its API in view. Then the first lines
//! of the shown definitions' doc comments while they fit. Lines keep their file order; a container
//! whose members are not all shown or listed ends with `... N more`, and the outline with `... N
//! more definitions` when top-level definitions are left out. Deterministic: a function of the
//! analysis, the budget and which names other files reference.

use std::collections::BTreeSet;

use crate::outline::{FileAnalysis, Lang, OutlineEntry};
use crate::terse::terse;

/// Bytes kept free for the closing `... N more definitions` line.
const TOP_MARKER_BYTES: usize = 32;
/// Bytes counted for a container's `... N more` line.
const MEMBER_MARKER_BYTES: usize = 20;
/// The part of a cut outline's room (percent) that full definition lines may use; terse entries
/// fill the rest. Chosen by replay (`docs/context.md`): 0–40% give nearly the same figures, 100%
/// (no terse entries) about half the definitions.
const FULL_LINES_PERCENT: usize = 20;

/// An outline as shown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShownOutline {
    /// The lines shown, each ending in `'\n'`.
    pub text: String,
    /// The names of the definitions shown.
    pub names: BTreeSet<String>,
}

/// `a`'s outline in at most about `max` bytes; `referenced(name)` says whether another file uses
/// `name`.
pub(crate) fn shown_outline(a: &FileAnalysis, max: usize, referenced: &dyn Fn(&str) -> bool) -> ShownOutline {
    let lines: Vec<&str> = a.outline.lines().collect();
    let entries = described(&lines, &a.entries);
    let tree = Tree::new(&entries);
    let n = lines.len();
    let key = |i: usize| {
        let e = &entries[i];
        let used = e.name.as_deref().is_some_and(referenced);
        (!used, !e.public, e.depth, i)
    };
    let mut units: Vec<usize> = (0..n).filter(|&i| tree.is_unit(&entries, i)).collect();
    units.sort_by_key(|&i| key(i));
    let unit_bytes = |i: usize| -> usize {
        let own = lines[i].len() + 1;
        let prefixes: usize = tree.prefixes[i].iter().map(|&p| lines[p].len() + 1).sum();
        let closer = tree.closer[i].map_or(0, |c| lines[c].len() + 1);
        let marker = if tree.children[i].len() > 1 { MEMBER_MARKER_BYTES } else { 0 };
        own + prefixes + closer + marker
    };

    let mut kept = vec![false; n];
    let all_fit = a.outline.len() <= max;
    let room = if all_fit { max } else { max.saturating_sub(TOP_MARKER_BYTES) };
    let full_room = if all_fit { room } else { room * FULL_LINES_PERCENT / 100 };
    let mut used = 0;
    for &i in &units {
        if kept[i] {
            continue;
        }
        let mut take = Vec::new();
        let mut up = tree.parent[i];
        while let Some(p) = up.filter(|&p| !kept[p]) {
            take.push(p);
            up = tree.parent[p];
        }
        // The unit and, down its containers, each one's best member when none is shown yet.
        let mut down = Some(i);
        while let Some(d) = down {
            take.push(d);
            down = if tree.children[d].iter().any(|&c| kept[c]) {
                None
            } else {
                tree.children[d].iter().copied().min_by_key(|&c| key(c))
            };
        }
        let cost: usize = take.iter().map(|&t| unit_bytes(t)).sum();
        if used + cost <= full_room {
            used += cost;
            for t in take {
                kept[t] = true;
            }
        }
    }

    // The members left out, tersely, in the same order, under a shown container or at the top.
    let mut terse_of: Vec<Option<String>> = vec![None; n];
    // Listed members in the order they were chosen, with the containers each one brought.
    let mut chosen: Vec<(usize, Vec<usize>)> = Vec::new();
    for &i in &units {
        if kept[i] {
            continue;
        }
        let Some(name) = entries[i].name.as_deref() else { continue };
        // The containers above it that are not shown yet are shown in full.
        let mut up = Vec::new();
        let mut p = tree.parent[i];
        while let Some(q) = p.filter(|&q| !kept[q]) {
            up.push(q);
            p = tree.parent[q];
        }
        // An overload, a setter: the name is shown once.
        let siblings = tree.parent[i].map_or(&tree.top, |p| &tree.children[p]);
        let shown = |c: usize| kept[c] || terse_of[c].is_some();
        if siblings.iter().any(|&c| shown(c) && entries[c].name.as_deref() == Some(name)) {
            continue;
        }
        let first = siblings.iter().all(|&c| terse_of[c].is_none());
        let property = tree.prefixes[i].iter().any(|&d| lines[d].contains("property"));
        let t = if property { name.to_string() } else { terse(lines[i], name) };
        let indent = 4 * tree.parent[i].map_or(0, |p| usize::from(entries[p].depth) + 1);
        let mut cost = t.len() + 2 + if first { indent + ALSO.len() + 1 } else { 0 };
        cost += up
            .iter()
            .map(|&q| unit_bytes(q) - if tree.children[q].len() > 1 { MEMBER_MARKER_BYTES } else { 0 })
            .sum::<usize>();
        if used + cost <= room {
            used += cost;
            terse_of[i] = Some(t);
            for &q in &up {
                kept[q] = true;
                terse_of[q] = None;
            }
            chosen.push((i, up));
        }
    }

    let lang = a.lang.unwrap_or(Lang::Rust);
    let mut with_doc = vec![false; n];
    for &i in &units {
        if let (true, Some(doc)) = (kept[i], &entries[i].doc) {
            let bytes = lines[i].len() - lines[i].trim_start().len() + doc_line(lang, doc).len() + 1;
            if used + bytes <= room {
                used += bytes;
                with_doc[i] = true;
            }
        }
    }
    // The byte counts above leave out where terse lists wrap: while the text is too long, the
    // member listed last leaves (with the containers it brought).
    loop {
        let out = render(&lines, &entries, &tree, lang, &kept, &with_doc, &terse_of);
        let Some((i, up)) = out.text.len().gt(&max).then(|| chosen.pop()).flatten() else { return out };
        terse_of[i] = None;
        for q in up {
            kept[q] = false;
            with_doc[q] = false;
        }
    }
}

/// Starts a line of terse members.
const ALSO: &str = "... also: ";
/// Terse lists wrap after this many bytes.
const ALSO_WIDTH: usize = 100;

/// `{indent}... also: a(x), b, c(y, z)`, wrapped, one line per [`ALSO_WIDTH`] bytes.
fn also_lines(out: &mut String, indent: &str, items: &[&str]) {
    if items.is_empty() {
        return;
    }
    let mut line = format!("{indent}{ALSO}");
    let start = line.len();
    for (k, item) in items.iter().enumerate() {
        if line.len() > start && line.len() + item.len() > ALSO_WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = format!("{indent}    ");
        }
        line.push_str(item);
        if k + 1 < items.len() {
            line.push_str(", ");
        }
    }
    out.push_str(&line);
    out.push('\n');
}

/// Writes the kept lines in file order, with doc lines and `... N more` markers.
fn render(
    lines: &[&str],
    entries: &[OutlineEntry],
    tree: &Tree,
    lang: Lang,
    kept: &[bool],
    with_doc: &[bool],
    terse_of: &[Option<String>],
) -> ShownOutline {
    let mut out = ShownOutline::default();
    // Members neither shown nor listed, an overload or setter of a shown name aside.
    let shown = |c: usize| kept[c] || terse_of[c].is_some();
    let omitted = |of: &[usize]| {
        let name = |c: usize| entries[c].name.as_deref();
        of.iter()
            .filter(|&&c| !shown(c) && !of.iter().any(|&o| shown(o) && name(o).is_some() && name(o) == name(c)))
            .count()
    };
    let also = |out: &mut ShownOutline, of: &[usize], indent: &str| {
        let items: Vec<&str> = of.iter().filter_map(|&c| terse_of[c].as_deref()).collect();
        also_lines(&mut out.text, indent, &items);
        for &c in of {
            if let (Some(_), Some(name)) = (&terse_of[c], &entries[c].name) {
                out.names.insert(name.clone());
            }
        }
    };
    let marker = |out: &mut ShownOutline, c: usize| {
        let indent = "    ".repeat(usize::from(entries[c].depth) + 1);
        also(out, &tree.children[c], &indent);
        let left = omitted(&tree.children[c]);
        if left > 0 {
            out.text.push_str(&format!("{indent}... {left} more\n"));
        }
    };
    // Containers shown and not yet ended.
    let mut open: Vec<usize> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let owner = tree.owner(entries, i);
        if !owner.is_some_and(|o| kept[o]) {
            continue;
        }
        let depth = entries[i].depth;
        while let Some(&c) = open.last().filter(|&&c| entries[c].depth >= depth) {
            open.pop();
            marker(&mut out, c);
        }
        if let Some(u) = owner.filter(|&o| tree.first_line[o] == i && with_doc[o]) {
            let indent = &line[..line.len() - line.trim_start().len()];
            let doc = entries[u].doc.as_deref().unwrap_or_default();
            out.text.push_str(indent);
            out.text.push_str(&doc_line(lang, doc));
            out.text.push('\n');
        }
        out.text.push_str(line);
        out.text.push('\n');
        if tree.is_unit(entries, i) {
            if let Some(name) = &entries[i].name {
                out.names.insert(name.clone());
            }
            if !tree.children[i].is_empty() {
                open.push(i);
            }
        }
    }
    while let Some(c) = open.pop() {
        marker(&mut out, c);
    }
    also(&mut out, &tree.top, "");
    let left = omitted(&tree.top);
    if left > 0 {
        out.text.push_str(&format!("... {left} more definitions\n"));
    }
    out
}

/// A doc comment's first line as a comment of the language.
fn doc_line(lang: Lang, doc: &str) -> String {
    match lang {
        Lang::Rust => format!("/// {doc}"),
        Lang::Go => format!("// {doc}"),
        Lang::Python => format!("# {doc}"),
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => format!("/** {doc} */"),
    }
}

/// The entries of `lines`: the analysis's own, or (for an analysis without them) depths read from
/// the indentation.
fn described(lines: &[&str], entries: &[OutlineEntry]) -> Vec<OutlineEntry> {
    if entries.len() == lines.len() {
        return entries.to_vec();
    }
    lines
        .iter()
        .map(|l| OutlineEntry {
            depth: u16::try_from((l.len() - l.trim_start().len()) / 4).unwrap_or(u16::MAX),
            ..OutlineEntry::default()
        })
        .collect()
}

/// The nesting of an outline's lines. A unit is a definition line (not a closing `}`, not a
/// decorator); decorators belong to the unit below them, closing lines to the unit they close.
struct Tree {
    /// The container unit of each unit.
    parent: Vec<Option<usize>>,
    /// The member units of each unit.
    children: Vec<Vec<usize>>,
    /// The top-level units.
    top: Vec<usize>,
    /// Each unit's closing line.
    closer: Vec<Option<usize>>,
    /// Each unit's decorator lines.
    prefixes: Vec<Vec<usize>>,
    /// The unit a closing or decorator line belongs to.
    belongs: Vec<Option<usize>>,
    /// Each unit's first line (its first decorator, or itself).
    first_line: Vec<usize>,
}

impl Tree {
    fn new(entries: &[OutlineEntry]) -> Tree {
        let n = entries.len();
        let mut t = Tree {
            parent: vec![None; n],
            children: vec![Vec::new(); n],
            top: Vec::new(),
            closer: vec![None; n],
            prefixes: vec![Vec::new(); n],
            belongs: vec![None; n],
            first_line: (0..n).collect(),
        };
        let mut open: Vec<usize> = Vec::new();
        let mut pending: Vec<usize> = Vec::new(); // decorators waiting for their definition
        for (i, e) in entries.iter().enumerate() {
            if e.closing {
                while open.last().is_some_and(|&o| entries[o].depth > e.depth) {
                    open.pop();
                }
                if let Some(o) = open.pop_if(|o| entries[*o].depth == e.depth) {
                    t.closer[o] = Some(i);
                    t.belongs[i] = Some(o);
                }
                continue;
            }
            if e.prefix {
                pending.push(i);
                continue;
            }
            while open.last().is_some_and(|&o| entries[o].depth >= e.depth) {
                open.pop();
            }
            t.parent[i] = open.last().copied();
            match t.parent[i] {
                Some(p) => t.children[p].push(i),
                None => t.top.push(i),
            }
            if let Some(&first) = pending.first() {
                t.first_line[i] = first;
            }
            for p in pending.drain(..) {
                t.belongs[p] = Some(i);
                t.prefixes[i].push(p);
            }
            open.push(i);
        }
        t
    }

    fn is_unit(&self, entries: &[OutlineEntry], i: usize) -> bool {
        !entries[i].closing && !entries[i].prefix
    }

    /// The unit line `i` shows or belongs to (`None` for a stray closing line or decorator).
    fn owner(&self, entries: &[OutlineEntry], i: usize) -> Option<usize> {
        if self.is_unit(entries, i) {
            Some(i)
        } else {
            self.belongs[i]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outline::analyze;

    fn none(_: &str) -> bool {
        false
    }

    #[test]
    fn a_small_outline_is_shown_whole_with_its_docs() {
        let a = analyze("a.rs", "/// A point.\npub struct P {\n    /// Across.\n    pub x: u8,\n}\nfn f() {}\n");
        let s = shown_outline(&a, 1600, &none);
        assert_eq!(s.text, "/// A point.\npub struct P {\n    /// Across.\n    pub x: u8,\n}\nfn f();\n");
        assert_eq!(s.names.iter().map(String::as_str).collect::<Vec<_>>(), ["P", "f", "x"]);
    }

    #[test]
    fn a_large_class_keeps_its_used_and_public_members_never_only_a_marker() {
        let mut src = String::from("class App:\n");
        for i in 0..60 {
            src.push_str(&format!("    def _private_{i:02}(self, request, response, extra=None): pass\n"));
        }
        src.push_str("    def route(self, rule, **options): pass\n");
        src.push_str("    def run(self, host=None, port=None): pass\n");
        let a = analyze("app.py", &src);
        assert!(a.outline.len() > 1600);
        let used = |n: &str| n == "route";
        let s = shown_outline(&a, 1600, &used);
        let lines: Vec<&str> = s.text.lines().collect();
        assert_eq!(lines[0], "class App:");
        assert!(lines[1].contains("def _private_00") || lines[1].contains("def route"), "{}", s.text);
        assert!(s.text.contains("    def route(self, rule, **options): ..."), "{}", s.text);
        assert!(s.text.contains("    def run(self, host=None, port=None): ..."), "{}", s.text);
        assert!(s.text.contains("more\n") && s.text.len() <= 1600, "{}", s.text);
        // The file order is kept: route comes after every shown private method.
        let route = s.text.find("def route").unwrap();
        assert!(s.text.rfind("def _private").is_none_or(|p| p < route));
    }

    #[test]
    fn containers_are_never_empty() {
        let mut src = String::new();
        for t in 0..40 {
            src.push_str(&format!("impl Type{t:02} {{\n"));
            for m in 0..5 {
                src.push_str(&format!("    fn method_{m}_with_a_long_name(&self, value: u64) -> u64 {{ value }}\n"));
            }
            src.push_str("}\n");
        }
        let a = analyze("a.rs", &src);
        let s = shown_outline(&a, 1600, &none);
        let lines: Vec<&str> = s.text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.ends_with('{') {
                let next = lines[i + 1];
                assert!(
                    next.starts_with("    fn ") || next.starts_with("    ... also: "),
                    "empty container at line {i}:\n{}",
                    s.text
                );
            }
        }
        assert!(s.text.ends_with(" more definitions\n"), "{}", s.text);
        assert!(lines.iter().filter(|l| l.starts_with("impl")).count() >= 3, "{}", s.text);
    }

    #[test]
    fn members_that_do_not_fit_in_full_are_listed_tersely_once() {
        let mut src = String::from("class App:\n    config: dict[str, t.Any]\n");
        for i in 0..30 {
            src.push_str(&format!(
                "    def method_{i:02}(self, request: Request, *, timeout: float = 1.0) -> Response: pass\n"
            ));
        }
        src.push_str("    @property\n    def debug(self) -> bool: pass\n    @debug.setter\n    def debug(self, v: bool) -> None: pass\n");
        src.push_str("def helper(path: str, mode: str = 'r') -> None: pass\n");
        let a = analyze("app.py", &src);
        let s = shown_outline(&a, 1200, &|n: &str| n == "method_29" || n == "helper");
        assert!(s.text.len() <= 1200, "{}", s.text);
        assert!(s.text.starts_with("class App:\n"), "{}", s.text);
        // The referenced method is shown in full, the others by name and parameters.
        assert!(
            s.text.contains("    def method_29(self, request: Request, *, timeout: float = 1.0) -> Response: ..."),
            "{}",
            s.text
        );
        assert!(s.text.contains("    ... also: "), "{}", s.text);
        assert!(s.text.contains("method_00(request, timeout)"), "{}", s.text);
        // A property is listed as an attribute, once with its setter.
        assert!(s.text.contains("debug,") || s.text.contains("debug\n"), "{}", s.text);
        assert!(!s.text.contains("debug("), "{}", s.text);
        assert_eq!(s.text.matches("debug").count(), 1, "{}", s.text);
        // Every listed name counts as shown.
        assert!(s.names.contains("method_00") && s.names.contains("method_29") && s.names.contains("config"));
        // Wrapped lines stay near the width and keep the container's indentation.
        for l in s.text.lines().filter(|l| !l.contains("def ")) {
            assert!(l.len() <= ALSO_WIDTH + 30, "{l}");
        }
        // Far more of the class is named than its full lines alone could show.
        assert!(s.names.len() >= 20, "{} names:\n{}", s.names.len(), s.text);
    }

    #[test]
    fn a_member_listed_tersely_brings_its_container() {
        let mut src = String::new();
        for c in 0..6 {
            src.push_str(&format!("pub struct Type{c} {{}}\nimpl Type{c} {{\n"));
            for m in 0..8 {
                src.push_str(&format!(
                    "    pub fn operation_{m}(&self, input: &[u8], out: &mut Vec<u8>) -> usize {{ 0 }}\n"
                ));
            }
            src.push_str("}\n");
        }
        let a = analyze("a.rs", &src);
        let s = shown_outline(&a, 600, &none);
        let lines: Vec<&str> = s.text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.ends_with('{') {
                let next = lines[i + 1];
                assert!(
                    next.starts_with("    pub fn ") || next.starts_with("    ... also: "),
                    "empty container:\n{}",
                    s.text
                );
            }
        }
        assert!(s.text.contains("operation_1(input, out)"), "{}", s.text);
    }

    #[test]
    fn decorators_stay_with_their_definition() {
        let a = analyze("a.py", "@app.get('/')\ndef index():\n    \"\"\"The home page.\"\"\"\n    pass\n");
        let s = shown_outline(&a, 1600, &none);
        assert_eq!(s.text, "# The home page.\n@app.get('/')\ndef index(): ...\n");
    }
}
