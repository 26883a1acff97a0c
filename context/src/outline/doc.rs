//! The first line of a definition's doc comment: `///` and `/** */` in Rust, the comment right
//! above a Go declaration, JSDoc (`/** */`) in JavaScript and TypeScript, the docstring in Python.

use tree_sitter::Node;

use super::Lang;

/// Doc lines are cut at this many characters.
const MAX_DOC_CHARS: usize = 120;

/// The first non-empty line of `def`'s doc comment, without comment markers, cut to
/// [`MAX_DOC_CHARS`]; `None` when it has none.
pub(super) fn first_line(lang: Lang, def: Node<'_>, src: &str) -> Option<String> {
    let text = match lang {
        Lang::Python => docstring(def, src)?,
        _ => comment_above(lang, def, src)?,
    };
    let line = text.lines().map(clean).find(|l| !l.is_empty())?;
    Some(super::syntax::truncate(&line, MAX_DOC_CHARS))
}

/// The text of the comment block right above `def` (or above the statement that wraps it:
/// `export`, Go's `type`/`const`/`var` group of one, a decorated definition), skipping attributes.
fn comment_above<'s>(lang: Lang, def: Node<'_>, src: &'s str) -> Option<&'s str> {
    let mut node = def;
    if node.prev_sibling().is_none_or(|p| !is_comment(p)) {
        if let Some(parent) = node.parent().filter(|p| wraps(lang, *p, node)) {
            node = parent;
        }
    }
    // The topmost comment of the contiguous run (no blank line between) ending right above.
    let mut top = None;
    let mut below = node;
    let mut cursor = node.prev_sibling();
    while let Some(p) = cursor {
        if lang == Lang::Rust && p.kind() == "attribute_item" {
            below = p;
            cursor = p.prev_sibling();
            continue;
        }
        if !is_comment(p) || below.start_position().row > p.end_position().row + 1 {
            break;
        }
        top = Some(p);
        below = p;
        cursor = p.prev_sibling();
    }
    let top = top?;
    let text = src.get(top.byte_range())?;
    let is_doc = match lang {
        Lang::Rust => text.starts_with("///") || text.starts_with("/**"),
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => text.starts_with("/**"),
        Lang::Go => true,
        Lang::Python => false,
    };
    is_doc.then_some(text)
}

fn is_comment(node: Node<'_>) -> bool {
    matches!(node.kind(), "comment" | "line_comment" | "block_comment")
}

/// Whether `parent` is a statement whose doc comment documents `child`.
fn wraps(lang: Lang, parent: Node<'_>, child: Node<'_>) -> bool {
    match lang {
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => {
            matches!(parent.kind(), "export_statement" | "ambient_declaration")
        }
        Lang::Go => {
            matches!(parent.kind(), "type_declaration" | "const_declaration" | "var_declaration")
                && parent.named_child_count() == 1
                && parent.named_child(0).is_some_and(|c| c.id() == child.id())
        }
        _ => false,
    }
}

/// The docstring of a Python function or class: the string that is its body's first statement.
fn docstring<'s>(def: Node<'_>, src: &'s str) -> Option<&'s str> {
    let body = def.child_by_field_name("body")?;
    let first = body.named_child(0).filter(|n| n.kind() == "expression_statement")?;
    let string = first.named_child(0).filter(|n| n.kind() == "string")?;
    src.get(string.byte_range())
}

/// One line of a comment or docstring without its markers: `///`, `//!`, `//`, `/**`, `*/`, a
/// leading `*`, string prefixes and quotes.
fn clean(line: &str) -> String {
    let mut l = line.trim();
    for p in ["///", "//!", "//", "/**", "/*"] {
        if let Some(rest) = l.strip_prefix(p) {
            l = rest;
            break;
        }
    }
    l = l.trim_end_matches("*/").trim();
    l = l.strip_prefix('*').unwrap_or(l).trim();
    let unprefixed = l.trim_start_matches(['r', 'u', 'b', 'f', 'R', 'U', 'B', 'F']);
    if unprefixed.starts_with(['"', '\'']) {
        l = unprefixed;
    }
    l.trim_matches(['"', '\'']).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::clean;

    #[test]
    fn markers_are_removed() {
        assert_eq!(clean("/// Returns the area."), "Returns the area.");
        assert_eq!(clean("/** Fetches a URL. */"), "Fetches a URL.");
        assert_eq!(clean(" * Second line"), "Second line");
        assert_eq!(clean("\"\"\"Create the app.\"\"\""), "Create the app.");
        assert_eq!(clean("r'''raw doc"), "raw doc");
        assert_eq!(clean("// Client sends requests."), "Client sends requests.");
        assert_eq!(clean("/**"), "");
    }
}
