//! Python outlines: classes with their methods and annotated attributes, functions, decorators and
//! module constants, in stub style (`def area(self) -> float: ...`).

use tree_sitter::Node;

use super::syntax::{named_children, Outline, MAX_DEPTH};

/// Writes the outline of a `module` or of a class `block`.
pub(super) fn block(out: &mut Outline<'_>, parent: Node<'_>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for node in named_children(parent) {
        statement(out, node, depth);
    }
}

fn statement(out: &mut Outline<'_>, node: Node<'_>, depth: usize) {
    match node.kind() {
        "function_definition" | "class_definition" => definition(out, node, depth),
        "decorated_definition" => {
            let Some(def) = node.child_by_field_name("definition") else { return };
            for d in named_children(node).into_iter().filter(|n| n.kind() == "decorator") {
                let line = out.flat(d);
                out.prefix_line(depth, &line);
            }
            definition(out, def, depth);
        }
        "expression_statement" => {
            for a in named_children(node).into_iter().filter(|n| n.kind() == "assignment") {
                assignment(out, a, depth);
            }
        }
        _ => {}
    }
}

fn definition(out: &mut Outline<'_>, node: Node<'_>, depth: usize) {
    let body = node.child_by_field_name("body");
    let head = out.head(node, body);
    let name = node.child_by_field_name("name");
    if node.kind() == "function_definition" {
        out.def_line(depth, &format!("{head} ..."), name, node);
        return;
    }
    let before = out.lines.len();
    out.def_line(depth, &head, name, node);
    if let Some(b) = body {
        block(out, b, depth + 1);
    }
    if out.lines.len() == before + 1 {
        out.lines.truncate(before);
        out.entries.truncate(before);
        if out.line(depth, &format!("{head} ...")) {
            out.describe_last(name, node);
        }
    }
}

/// `x: int = 0` → `x: int`; a module-level `MAX_SIZE = 10` → `MAX_SIZE = ...`.
fn assignment(out: &mut Outline<'_>, node: Node<'_>, depth: usize) {
    let Some(left) = node.child_by_field_name("left") else { return };
    if left.kind() != "identifier" {
        return;
    }
    let name = out.text(left);
    if let Some(ty) = node.child_by_field_name("type") {
        let line = format!("{name}: {}", out.flat(ty));
        out.def_line(depth, &line, Some(left), node);
    } else if depth == 0 && is_constant_name(name) {
        out.def_line(depth, &format!("{name} = ..."), Some(left), node);
    }
}

fn is_constant_name(name: &str) -> bool {
    name.chars().any(|c| c.is_ascii_uppercase())
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}
