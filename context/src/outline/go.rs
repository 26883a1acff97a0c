//! Go outlines: functions, methods with their receivers, types (struct fields and interface
//! methods listed), constants and variables.

use tree_sitter::Node;

use super::syntax::{named_children, Outline, MAX_MEMBERS};

/// Writes the outline of a `source_file`.
pub(super) fn source_file(out: &mut Outline<'_>, root: Node<'_>) {
    for node in named_children(root) {
        match node.kind() {
            "function_declaration" | "method_declaration" => {
                let head = out.head(node, node.child_by_field_name("body"));
                out.def_line(0, &head, node.child_by_field_name("name"), node);
            }
            "type_declaration" => {
                for spec in named_children(node) {
                    type_spec(out, spec);
                }
            }
            "const_declaration" => specs(out, node, "const"),
            "var_declaration" => specs(out, node, "var"),
            _ => {}
        }
    }
}

fn type_spec(out: &mut Outline<'_>, spec: Node<'_>) {
    let name = spec.child_by_field_name("name");
    let ty = spec.child_by_field_name("type");
    let members = ty.and_then(|t| match t.kind() {
        "struct_type" => named_children(t).into_iter().find(|n| n.kind() == "field_declaration_list"),
        "interface_type" => Some(t),
        _ => None,
    });
    match (spec.kind(), members) {
        ("type_spec", Some(list)) => {
            let head = match list.kind() {
                "interface_type" => format!("type {} interface", out.head(spec, Some(list))),
                _ => format!("type {}", out.head(spec, Some(list))),
            };
            out.braced(0, &head, name, spec, |o| member_lines(o, list));
        }
        ("type_spec" | "type_alias", _) => {
            let line = format!("type {}", out.flat(spec));
            out.def_line(0, &line, name, spec);
        }
        _ => out.define(name),
    }
}

fn member_lines(out: &mut Outline<'_>, list: Node<'_>) {
    let members: Vec<Node<'_>> = named_children(list)
        .into_iter()
        .filter(|n| matches!(n.kind(), "field_declaration" | "method_elem" | "type_elem"))
        .collect();
    for m in members.iter().take(MAX_MEMBERS) {
        let line = out.flat(*m);
        out.def_line(1, &line, m.child_by_field_name("name"), *m);
    }
    if members.len() > MAX_MEMBERS {
        out.line(1, "…");
    }
}

/// `const A int = iota` → `const A int`; `var x = f()` → `var x`.
fn specs(out: &mut Outline<'_>, node: Node<'_>, keyword: &str) {
    for spec in named_children(node) {
        match spec.kind() {
            "const_spec" | "var_spec" => {
                let head = out.head(spec, spec.child_by_field_name("value"));
                let head = head.trim_end().trim_end_matches('=').trim_end();
                let mut cursor = spec.walk();
                let names: Vec<Node<'_>> = spec.children_by_field_name("name", &mut cursor).collect();
                out.def_line(0, &format!("{keyword} {head}"), names.first().copied(), spec);
                for n in names.into_iter().skip(1) {
                    out.define(Some(n));
                }
            }
            "var_spec_list" | "const_spec_list" => specs(out, spec, keyword),
            _ => {}
        }
    }
}
