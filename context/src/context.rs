//! The output: a rendered repository context with the provenance of every byte and token.

use std::ops::Range;
use std::sync::Arc;

use crate::{BlobId, CommitId};

/// What a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// The fixed explanation line that opens every context.
    Header,
    /// A file's outline (signatures, bodies elided).
    Outline,
    /// A file's full text.
    File,
}

/// One block of a [`RepoContext`] and where it came from.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Segment {
    /// Header, outline or full file.
    pub kind: SegmentKind,
    /// The file's repository path; `None` for the header.
    pub path: Option<String>,
    /// The file's blob id; `None` for the header.
    pub blob: Option<BlobId>,
    /// What the block's bytes are a function of, for cache tags: the blob id for file blocks,
    /// `outline:` + 16 hex digits of the SHA-256 of the block text for outline blocks (an edit that
    /// keeps a file's outline keeps its outline block's version), a constant for the header.
    pub version: String,
    /// Byte range in [`RepoContext::text`].
    pub text: Range<usize>,
    /// Range in [`RepoContext::tokens`].
    pub tokens: Range<usize>,
}

/// A repository's context at one commit.
///
/// Invariants: the segments tile `text` and `tokens` in order without gaps; `tokens` is the
/// concatenation of each block's own tokenization; every block starts with a non-whitespace
/// character and ends with `'\n'`; the same commit and options give byte-identical text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RepoContext {
    /// The commit the context was read at.
    pub commit: CommitId,
    /// The rendered text.
    pub text: String,
    /// The tokens of `text`, block by block.
    pub tokens: Vec<u32>,
    /// The blocks, in order; the header first (absent only when the budget cannot hold it).
    pub segments: Vec<Segment>,
}

impl RepoContext {
    /// The text of one segment.
    pub fn segment_text(&self, segment: &Segment) -> &str {
        &self.text[segment.text.clone()]
    }
}

/// A rendered and tokenized block before it is placed.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub kind: SegmentKind,
    pub path: Option<String>,
    pub blob: Option<BlobId>,
    pub version: String,
    pub text: Arc<str>,
    pub tokens: Arc<[u32]>,
}

/// Concatenates blocks in the given order.
pub(crate) fn assemble(commit: &CommitId, blocks: &[Block]) -> RepoContext {
    let mut ctx = RepoContext {
        commit: commit.clone(),
        text: String::with_capacity(blocks.iter().map(|b| b.text.len()).sum()),
        tokens: Vec::with_capacity(blocks.iter().map(|b| b.tokens.len()).sum()),
        segments: Vec::with_capacity(blocks.len()),
    };
    for b in blocks {
        let text = ctx.text.len()..ctx.text.len() + b.text.len();
        let tokens = ctx.tokens.len()..ctx.tokens.len() + b.tokens.len();
        ctx.text.push_str(&b.text);
        ctx.tokens.extend_from_slice(&b.tokens);
        ctx.segments.push(Segment {
            kind: b.kind,
            path: b.path.clone(),
            blob: b.blob.clone(),
            version: b.version.clone(),
            text,
            tokens,
        });
    }
    ctx
}
