//! Which blocks fit the budget. Decided before, and independently of, the block order.
//!
//! Files are taken by (rank desc, path asc): first the full text of code files while they fit in
//! the full-file share of the budget, then the outlines of the remaining code files while they fit
//! the rest (a test file's outline only when it defines something another file uses — a helper, a
//! fixture — not for its own test cases), then, while anything is left, the full text of
//! plain-text files class by class ([`crate::usefulness`]: manifests, the README, other source,
//! documentation; never metadata or tool configuration).
//!
//! Each phase stops at the first block that does not fit the room left (blocks larger than the
//! phase's whole room are skipped). Skipping and trying smaller blocks instead would pack the
//! budget a little tighter, but then any push that changes one block's size by a few tokens
//! changes which small blocks fill the gaps — anywhere in the order — and the reusable prefix of
//! the context with it (measured with `replay`: 7 of 43 context-changing pushes against 2 of 43).

use crate::context::SegmentKind;
use crate::refs::References;
use crate::snapshot::Candidate;
use crate::usefulness::{is_test_path, text_class, TextClass};
use crate::ContextError;

/// Bytes per token above which a file is taken to be too large to tokenize for a room.
const MAX_BYTES_PER_TOKEN: u64 = 32;

/// The tokens of a file's block of a kind; `None` when that block would show nothing.
pub(crate) type BlockCost<'a> = dyn FnMut(&Candidate, SegmentKind) -> Result<Option<usize>, ContextError> + 'a;

/// The budget of one selection, in tokens, after the header.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    /// Tokens available for all blocks.
    pub total: usize,
    /// Tokens available for full code files (at most `total`).
    pub full: usize,
}

/// Chooses blocks from `ranked` (sorted by rank desc, path asc); `cost` tokenizes a block. Returns
/// (index into `ranked`, kind) in selection order.
pub(crate) fn select(
    ranked: &[&Candidate],
    refs: &References,
    budget: Budget,
    cost: &mut BlockCost<'_>,
) -> Result<Vec<(usize, SegmentKind)>, ContextError> {
    let mut chosen = Vec::new();
    let mut taken = vec![false; ranked.len()];
    let total = budget.total;
    let full_files = phase(ranked, &mut taken, &mut chosen, SegmentKind::File, budget.full.min(total), cost, |c| {
        c.analysis().is_code()
    })?;
    let outlines = phase(ranked, &mut taken, &mut chosen, SegmentKind::Outline, total - full_files, cost, |c| {
        !c.analysis().outline.is_empty()
            && (!is_test_path(&c.path) || refs.used_definitions(c.analysis()).next().is_some())
    })?;
    let mut left = total - full_files - outlines;
    for class in [TextClass::Manifest, TextClass::Readme, TextClass::Source, TextClass::Docs] {
        left -= phase(ranked, &mut taken, &mut chosen, SegmentKind::File, left, cost, |c| {
            !c.analysis().is_code() && usefulness(c) == class
        })?;
    }
    Ok(chosen)
}

/// One phase: blocks of `kind` for the untaken `eligible` files, in rank order, while they fit in
/// `room`. A block larger than the whole `room` is skipped; the first block that would fit an empty
/// phase but not what is left ends the phase. Returns the tokens used.
fn phase(
    ranked: &[&Candidate],
    taken: &mut [bool],
    chosen: &mut Vec<(usize, SegmentKind)>,
    kind: SegmentKind,
    room: usize,
    cost: &mut BlockCost<'_>,
    eligible: impl Fn(&Candidate) -> bool,
) -> Result<usize, ContextError> {
    let mut used = 0;
    for (i, c) in ranked.iter().enumerate() {
        if used >= room {
            break;
        }
        if taken[i] || !eligible(c) || (kind == SegmentKind::File && !may_fit(c, room)) {
            continue;
        }
        let Some(t) = cost(c, kind)? else { continue };
        if t > room {
            continue;
        }
        if used.saturating_add(t) > room {
            break;
        }
        used += t;
        taken[i] = true;
        chosen.push((i, kind));
    }
    Ok(used)
}

/// A plain-text file's class; a file the repository's `include` rules name goes first.
fn usefulness(c: &Candidate) -> TextClass {
    match text_class(&c.path, c.info.size) {
        TextClass::Skip if c.included => TextClass::Manifest,
        class => class,
    }
}

/// False when a file is so large that its block cannot fit `room` tokens (no tokenizer in use
/// averages more than [`MAX_BYTES_PER_TOKEN`] bytes per token on text).
fn may_fit(c: &Candidate, room: usize) -> bool {
    room > 0 && c.info.size <= MAX_BYTES_PER_TOKEN.saturating_mul(room as u64)
}
