//! cachet-context: the repository context of a session — a repository read at
//! an exact commit, outlined with tree-sitter, ranked and rendered stable-first
//! with the provenance of every token span.
//!
//! Not built yet: see the "Repository context" issue. The crate exists so the
//! workspace layout of `DESIGN.md` is in place from the start.
