//! Block text. Every block starts with `#` and ends with `"\n"` (after a blank line), so byte-level
//! BPE cannot merge across a block boundary and blocks can be tokenized one by one.

use sha2::{Digest, Sha256};

/// The first block of every context. Constant: nothing volatile (no commit id, no date).
pub(crate) const HEADER: &str = "# Repository context\n\
Source files of the repository: outlines list definitions with bodies elided; full files are shown whole.\n\n";

/// The version of the header block.
pub(crate) const HEADER_VERSION: &str = "header:v1";

/// The largest outline shown, in bytes (about 150 tokens): a repository map of many files beats a
/// few exhaustive outlines, and small blocks keep a push's damage to the reusable prefix small
/// (1,600 until 2026-12-03; `docs/context.md` has the replay and "definitions visible" figures of
/// both). [`crate::cap`] chooses what a larger outline shows.
pub(crate) const MAX_OUTLINE_BYTES: usize = 600;

/// `### path (outline)` and the outline in a fenced block.
pub(crate) fn outline_block(path: &str, tag: &str, outline: &str) -> String {
    fenced(path, "outline", tag, outline)
}

/// `### path (full)` and the file's text in a fenced block.
pub(crate) fn full_block(path: &str, tag: &str, content: &str) -> String {
    fenced(path, "full", tag, content)
}

/// `### path (manifest; left out: …)` and the manifest's kept text in a fenced block
/// ([`crate::manifest`]).
pub(crate) fn manifest_block(path: &str, tag: &str, left_out: &[String], kept: &str) -> String {
    fenced(path, &format!("manifest; left out: {}", left_out.join(", ")), tag, kept)
}

/// The version of an outline block: `outline:` + 16 hex digits of SHA-256 of its text.
pub(crate) fn outline_version(block_text: &str) -> String {
    text_version("outline:", block_text)
}

/// The version of a block whose text is a function of its file's content: `prefix` + 16 hex
/// digits of SHA-256 of the block's text (equal texts share their cached tokens and K/V).
pub(crate) fn text_version(prefix: &str, block_text: &str) -> String {
    let digest = Sha256::digest(block_text.as_bytes());
    let mut v = String::with_capacity(prefix.len() + 16);
    v.push_str(prefix);
    for b in &digest[..8] {
        v.push_str(&format!("{b:02x}"));
    }
    v
}

fn fenced(path: &str, what: &str, tag: &str, body: &str) -> String {
    let fence = "`".repeat(longest_backtick_run(body).max(2) + 1);
    let mut s = String::with_capacity(body.len() + path.len() + 32);
    s.push_str("### ");
    s.push_str(path);
    s.push_str(" (");
    s.push_str(what);
    s.push_str(")\n");
    s.push_str(&fence);
    s.push_str(tag);
    s.push('\n');
    s.push_str(body);
    if !body.is_empty() && !body.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&fence);
    s.push_str("\n\n");
    s
}

fn longest_backtick_run(s: &str) -> usize {
    let mut best = 0;
    let mut run = 0;
    for b in s.bytes() {
        if b == b'`' {
            run += 1;
            best = best.max(run);
        } else {
            run = 0;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_start_with_hash_and_end_with_newline() {
        for b in [HEADER.to_string(), full_block("a.txt", "", "x"), outline_block("a.rs", "rust", "fn a();\n")] {
            assert!(b.starts_with('#') && b.ends_with('\n'), "{b:?}");
        }
        assert_eq!(full_block("a.rs", "rust", "fn a() {}"), "### a.rs (full)\n```rust\nfn a() {}\n```\n\n");
    }

    #[test]
    fn fence_outgrows_the_content() {
        let b = full_block("README.md", "markdown", "```sh\nls\n```\n````\n");
        assert!(b.starts_with("### README.md (full)\n`````markdown\n"));
        assert!(b.ends_with("\n`````\n\n"));
    }

    #[test]
    fn outline_versions_are_short_and_stable() {
        let v = outline_version("x");
        assert_eq!(v.len(), "outline:".len() + 16);
        assert_eq!(v, outline_version("x"));
        assert_ne!(v, outline_version("y"));
    }
}
