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
            out.line(depth, &format!("{};", strip_semicolon(&head)));
            out.define(name);
        }
        "struct_item" | "union_item" => {
            out.define(name);
            match body.filter(|b| b.kind() == "field_declaration_list") {
                Some(fields) => {
                    let head = out.head(node, Some(fields));
                    out.braced(depth, &head, |o| members(o, fields, depth + 1, "field_declaration"));
                }
                None => {
                    let flat = out.flat(node);
                    out.line(depth, &format!("{};", strip_semicolon(&flat)));
                }
            }
        }
        "enum_item" => {
            out.define(name);
            match body {
                Some(variants) => {
                    let head = out.head(node, Some(variants));
                    out.braced(depth, &head, |o| members(o, variants, depth + 1, "enum_variant"));
                }
                None => out.line(depth, &out.flat(node)),
            }
        }
        "trait_item" | "impl_item" | "mod_item" | "foreign_mod_item" => {
            out.define(name);
            if let Some(list) = body {
                let head = out.head(node, Some(list));
                out.braced(depth, &head, |o| items(o, list, depth + 1));
            }
        }
        "const_item" | "static_item" => {
            let head = out.head(node, node.child_by_field_name("value"));
            out.line(depth, &format!("{};", strip_semicolon(strip_equals(&head))));
            out.define(name);
        }
        "type_item" | "associated_type" => {
            let flat = out.flat(node);
            out.line(depth, &format!("{};", strip_semicolon(&flat)));
            out.define(name);
        }
        "macro_definition" => {
            if let Some(n) = name {
                let line = format!("macro_rules! {};", out.text(n));
                out.line(depth, &line);
            }
            out.define(name);
        }
        _ => {}
    }
}

/// Struct fields or enum variants, one line each with a trailing comma.
fn members(out: &mut Outline<'_>, list: Node<'_>, depth: usize, kind: &str) {
    let all: Vec<Node<'_>> = named_children(list).into_iter().filter(|n| n.kind() == kind).collect();
    for member in all.iter().take(MAX_MEMBERS) {
        let line = format!("{},", out.flat(*member));
        out.line(depth, &line);
        out.define(member.child_by_field_name("name"));
    }
    if all.len() > MAX_MEMBERS {
        out.line(depth, "…");
    }
}
