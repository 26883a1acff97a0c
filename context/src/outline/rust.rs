//! Rust outlines: functions, structs, enums, unions, traits, impls, modules, consts, statics, type
//! aliases and macros, with bodies elided (`fn area(&self) -> f64;`).

use tree_sitter::Node;

use super::syntax::{named_children, strip_equals, strip_semicolon, Outline, MAX_DEPTH, MAX_MEMBERS};

/// Writes the outline of a `source_file` (or of any `declaration_list`); items under
/// `#[cfg(test)]` are left out.
pub(super) fn items(out: &mut Outline<'_>, parent: Node<'_>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    let mut test_only = false;
    for node in named_children(parent) {
        if node.kind() == "attribute_item" {
            test_only |= out.text(node).replace(' ', "").contains("cfg(test)");
            continue;
        }
        if !test_only {
            item(out, node, depth);
        }
        test_only = false;
    }
}

fn item(out: &mut Outline<'_>, node: Node<'_>, depth: usize) {
    let name = node.child_by_field_name("name");
    let body = node.child_by_field_name("body");
    match node.kind() {
        "function_item" | "function_signature_item" => {
            let head = out.head(node, body);
            out.def_line(depth, &format!("{};", strip_semicolon(&head)), name, node);
        }
        "struct_item" | "union_item" => match body.filter(|b| b.kind() == "field_declaration_list") {
            Some(fields) => {
                let head = out.head(node, Some(fields));
                out.braced(depth, &head, name, node, |o| members(o, fields, depth + 1, "field_declaration"));
            }
            None => {
                let flat = out.flat(node);
                out.def_line(depth, &format!("{};", strip_semicolon(&flat)), name, node);
            }
        },
        "enum_item" => match body {
            Some(variants) => {
                let head = out.head(node, Some(variants));
                out.braced(depth, &head, name, node, |o| members(o, variants, depth + 1, "enum_variant"));
            }
            None => {
                let flat = out.flat(node);
                out.def_line(depth, &flat, name, node);
            }
        },
        "trait_item" | "impl_item" | "mod_item" | "foreign_mod_item" => match body {
            Some(list) => {
                let head = out.head(node, Some(list));
                out.braced(depth, &head, name, node, |o| items(o, list, depth + 1));
            }
            None => out.define(name),
        },
        "const_item" | "static_item" => {
            let head = out.head(node, node.child_by_field_name("value"));
            out.def_line(depth, &format!("{};", strip_semicolon(strip_equals(&head))), name, node);
        }
        "type_item" | "associated_type" => {
            let flat = out.flat(node);
            out.def_line(depth, &format!("{};", strip_semicolon(&flat)), name, node);
        }
        "macro_definition" => match name {
            Some(n) => {
                let line = format!("macro_rules! {};", out.text(n));
                out.def_line(depth, &line, name, node);
            }
            None => out.define(name),
        },
        _ => {}
    }
}

/// Struct fields or enum variants, one line each with a trailing comma.
fn members(out: &mut Outline<'_>, list: Node<'_>, depth: usize, kind: &str) {
    let all: Vec<Node<'_>> = named_children(list).into_iter().filter(|n| n.kind() == kind).collect();
    for member in all.iter().take(MAX_MEMBERS) {
        let line = format!("{},", out.flat(*member));
        out.def_line(depth, &line, member.child_by_field_name("name"), *member);
    }
    if all.len() > MAX_MEMBERS {
        out.line(depth, "…");
    }
}
