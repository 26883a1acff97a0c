//! Which outline lines are public: what another file can use, by each language's own rule.

use super::{Lang, OutlineEntry};

/// Sets `public` on every entry of an outline (`lines` and `entries` in step).
pub(super) fn mark(lang: Lang, lines: &[String], entries: &mut [OutlineEntry]) {
    // The text of the open container at each depth (the last non-closing line at depth d).
    let mut open: Vec<(usize, bool)> = Vec::new(); // (line index, public)
    for i in 0..entries.len().min(lines.len()) {
        let depth = usize::from(entries[i].depth);
        open.truncate(depth);
        let container = open.last().map(|&(j, public)| (lines[j].trim_start(), public));
        let text = lines[i].trim_start();
        let e = &mut entries[i];
        e.public = !e.closing && public(lang, text, e.name.as_deref(), depth, container);
        if !e.closing && !e.prefix {
            open.push((i, e.public));
        }
    }
}

fn public(lang: Lang, text: &str, name: Option<&str>, depth: usize, container: Option<(&str, bool)>) -> bool {
    let private_name = |n: &str| n.starts_with('_') && !(n.starts_with("__") && n.ends_with("__"));
    match lang {
        Lang::Rust => {
            text.starts_with("pub ")
                || text.starts_with("pub(")
                || container.is_some_and(|(c, container_public)| {
                    let c = c.trim_start_matches("pub ").trim_start_matches("unsafe ");
                    // A trait's items and a trait impl's items are as visible as the trait; an
                    // enum's variants as the enum.
                    let trait_impl = c.starts_with("impl") && c.contains(" for ");
                    trait_impl || ((c.starts_with("trait ") || c.starts_with("enum ")) && container_public)
                })
        }
        Lang::Python => name.is_none_or(|n| !private_name(n)) && container.is_none_or(|(_, p)| p),
        Lang::Go => name.and_then(|n| n.chars().next()).is_some_and(char::is_uppercase),
        Lang::JavaScript | Lang::TypeScript | Lang::Tsx => {
            if depth == 0 || container.is_some_and(|(c, _)| c.starts_with("declare ")) {
                return text.starts_with("export ") || text.starts_with("declare ");
            }
            let hidden = ["private ", "protected ", "#"].iter().any(|p| text.starts_with(p))
                || text.split_whitespace().any(|w| w.starts_with('#'))
                || name.is_some_and(private_name);
            !hidden && container.is_some_and(|(_, p)| p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks(lang: Lang, outline: &[(&str, u16, Option<&str>)]) -> Vec<bool> {
        let lines: Vec<String> =
            outline.iter().map(|(t, d, _)| format!("{}{t}", "    ".repeat(usize::from(*d)))).collect();
        let mut entries: Vec<OutlineEntry> = outline
            .iter()
            .map(|(t, d, n)| OutlineEntry {
                depth: *d,
                name: n.map(str::to_string),
                closing: *t == "}",
                ..OutlineEntry::default()
            })
            .collect();
        mark(lang, &lines, &mut entries);
        entries.iter().map(|e| e.public).collect()
    }

    #[test]
    fn rust_pub_trait_members_and_trait_impls() {
        let got = marks(
            Lang::Rust,
            &[
                ("pub struct A {", 0, Some("A")),
                ("pub x: u8,", 1, Some("x")),
                ("y: u8,", 1, Some("y")),
                ("}", 0, None),
                ("impl Display for A {", 0, None),
                ("fn fmt(&self) -> Result;", 1, Some("fmt")),
                ("}", 0, None),
                ("impl A {", 0, None),
                ("fn private(&self);", 1, Some("private")),
                ("}", 0, None),
            ],
        );
        assert_eq!(got, [true, true, false, false, false, true, false, false, false, false]);
    }

    #[test]
    fn python_underscores_and_go_capitals() {
        let py = marks(
            Lang::Python,
            &[
                ("class App:", 0, Some("App")),
                ("def __init__(self) ...", 1, Some("__init__")),
                ("def _helper(self) ...", 1, Some("_helper")),
                ("class _Hidden:", 0, Some("_Hidden")),
                ("def run(self) ...", 1, Some("run")),
            ],
        );
        assert_eq!(py, [true, true, false, false, false]);
        let go = marks(Lang::Go, &[("func New() *C", 0, Some("New")), ("func helper()", 0, Some("helper"))]);
        assert_eq!(go, [true, false]);
    }

    #[test]
    fn typescript_exports_and_private_members() {
        let got = marks(
            Lang::TypeScript,
            &[
                ("export class Ky {", 0, Some("Ky")),
                ("get(url: string): Promise;", 1, Some("get")),
                ("private retry(): void;", 1, Some("retry")),
                ("#abort: AbortController;", 1, Some("#abort")),
                ("}", 0, None),
                ("function local(): void;", 0, Some("local")),
            ],
        );
        assert_eq!(got, [true, true, false, false, false, false]);
    }
}
