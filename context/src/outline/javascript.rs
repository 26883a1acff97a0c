//! JavaScript, TypeScript and TSX outlines: functions, classes with their members, interfaces, type
//! aliases, enums, namespaces, and `const` bindings of functions or constants, in declaration-file
//! style (`export function load(path: string): Buffer;`).

use tree_sitter::Node;

use super::syntax::{named_children, strip_equals, strip_semicolon, truncate, Outline, MAX_DEPTH, MAX_MEMBERS};

/// Writes the outline of a `program` (or a namespace body).
pub(super) fn statements(out: &mut Outline<'_>, parent: Node<'_>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for node in named_children(parent) {
        match node.kind() {
            "export_statement" => {
                if let Some(decl) = node.child_by_field_name("declaration") {
                    let prefix = out.head(node, Some(decl));
                    declaration(out, decl, depth, &prefix);
                }
            }
            "expression_statement" => {
                for inner in named_children(node) {
                    if matches!(inner.kind(), "internal_module" | "module") {
                        declaration(out, inner, depth, "");
                    }
                }
            }
            _ => declaration(out, node, depth, ""),
        }
    }
}

fn declaration(out: &mut Outline<'_>, node: Node<'_>, depth: usize, prefix: &str) {
    let name = node.child_by_field_name("name");
    let body = node.child_by_field_name("body");
    let with_prefix = |s: String| if prefix.is_empty() { s } else { format!("{prefix} {s}") };
    match node.kind() {
        "function_declaration" | "generator_function_declaration" | "function_signature" => {
            let head = out.head(node, body);
            out.def_line(depth, &with_prefix(format!("{};", strip_semicolon(&head))), name, node);
        }
        "class_declaration" | "abstract_class_declaration" | "class" | "interface_declaration" => match body {
            Some(b) => {
                let head = with_prefix(out.head(node, Some(b)));
                out.braced(depth, &head, name, node, |o| members(o, b, depth + 1));
            }
            None => out.define(name),
        },
        "type_alias_declaration" => {
            let flat = out.flat(node);
            out.def_line(depth, &with_prefix(format!("{};", strip_semicolon(&flat))), name, node);
        }
        "enum_declaration" => {
            let flat = out.flat(node);
            out.def_line(depth, &with_prefix(flat), name, node);
        }
        "internal_module" | "module" => match body {
            Some(b) => {
                let head = with_prefix(out.head(node, Some(b)));
                out.braced(depth, &head, name, node, |o| statements(o, b, depth + 1));
            }
            None => out.define(name),
        },
        "ambient_declaration" => {
            for inner in named_children(node) {
                declaration(out, inner, depth, &with_prefix("declare".to_string()));
            }
        }
        "lexical_declaration" | "variable_declaration" => bindings(out, node, depth, prefix),
        _ => {}
    }
}

/// `const f = (a) => …` → `const f = (a) => …;`; `const MAX = 10` → `const MAX;`. Other bindings
/// (requires, objects, lowercase values) are not part of the outline.
fn bindings(out: &mut Outline<'_>, node: Node<'_>, depth: usize, prefix: &str) {
    let keyword = node.child(0).map(|k| out.text(k)).unwrap_or("const");
    for decl in named_children(node).into_iter().filter(|n| n.kind() == "variable_declarator") {
        let Some(name) = decl.child_by_field_name("name").filter(|n| n.kind() == "identifier") else { continue };
        let value = decl.child_by_field_name("value");
        let is_function = value.is_some_and(|v| {
            matches!(v.kind(), "arrow_function" | "function_expression" | "function" | "generator_function")
        });
        let text = if is_function {
            let v = value.expect("checked above");
            let signature = out.head(decl, v.child_by_field_name("body"));
            format!("{keyword} {signature} …;")
        } else if depth == 0 && is_constant_name(out.text(name)) {
            let head = out.head(decl, value);
            format!("{keyword} {};", strip_equals(&head))
        } else {
            continue;
        };
        let line = if prefix.is_empty() { text } else { format!("{prefix} {text}") };
        out.def_line(depth, &line, Some(name), node);
    }
}

/// Class and interface members, one line each.
fn members(out: &mut Outline<'_>, body: Node<'_>, depth: usize) {
    let all = named_children(body);
    let mut written = 0;
    for m in all {
        let line = match m.kind() {
            "method_definition" => format!("{};", out.head(m, m.child_by_field_name("body"))),
            "field_definition" | "public_field_definition" => {
                let head = out.head(m, m.child_by_field_name("value"));
                format!("{};", strip_semicolon(strip_equals(&head)))
            }
            "method_signature"
            | "abstract_method_signature"
            | "property_signature"
            | "call_signature"
            | "construct_signature"
            | "index_signature" => format!("{};", strip_semicolon(&out.flat(m))),
            _ => continue,
        };
        if written == MAX_MEMBERS {
            out.line(depth, "…");
            break;
        }
        written += 1;
        let name = m.child_by_field_name("name").or_else(|| m.child_by_field_name("property"));
        out.def_line(depth, &truncate(&line, 240), name, m);
    }
}

fn is_constant_name(name: &str) -> bool {
    name.chars().any(|c| c.is_ascii_uppercase())
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}
