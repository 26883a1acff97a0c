//! The identifiers a file uses, counted, for the reference graph.

use std::collections::BTreeMap;
use std::ops::Range;

use tree_sitter::Node;

use super::Lang;

/// At most this many distinct identifiers are kept per file (the most frequent; ties by name).
const MAX_DISTINCT: usize = 2000;

/// Counts identifier nodes outside `def_ranges` (the definitions' own names), walking the tree
/// iteratively (no recursion, whatever the nesting).
pub(super) fn collect(lang: Lang, root: Node<'_>, src: &str, def_ranges: &[Range<usize>]) -> Vec<(String, u32)> {
    let kinds = lang.identifier_kinds();
    let mut defs: Vec<&Range<usize>> = def_ranges.iter().collect();
    defs.sort_by_key(|r| (r.start, r.end));
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    let mut cursor = root.walk();
    'walk: loop {
        let node = cursor.node();
        if kinds.contains(&node.kind()) {
            let range = node.byte_range();
            let is_def = defs.binary_search_by_key(&(range.start, range.end), |r| (r.start, r.end)).is_ok();
            if let Some(text) = src.get(range).filter(|t| !is_def && !t.is_empty()) {
                *counts.entry(text).or_default() += 1;
            }
        }
        if cursor.goto_first_child() {
            continue;
        }
        while !cursor.goto_next_sibling() {
            if !cursor.goto_parent() {
                break 'walk;
            }
        }
    }
    let mut refs: Vec<(String, u32)> = counts.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    if refs.len() > MAX_DISTINCT {
        refs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        refs.truncate(MAX_DISTINCT);
        refs.sort();
    }
    refs
}
