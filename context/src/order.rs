//! Block order: stable first, by path, or least recently changed first. Only reorders; never adds or
//! drops a block.
//!
//! What counts as a block's change is a change of its *text*: a full file changes with every edit
//! of the file, a manifest only when what it shows changes, an outline only when the file's
//! outline changes (an edit inside a function body leaves it as it was). Ordering by file edits
//! instead would move an outline block at every body edit, and the move alone breaks the reusable
//! prefix where the block used to be; body edits weigh in only once the outline's text changed
//! after them ([`StabilityModel::lazy_body_edits`]).

use std::cmp::Ordering;
use std::collections::HashMap;

use git2::Repository;

use crate::cap::shown_outline;
use crate::context::{Block, SegmentKind};
use crate::history::{Event, History};
use crate::manifest;
use crate::outline::Lang;
use crate::refs::References;
use crate::render::MAX_OUTLINE_BYTES;
use crate::snapshot::{blob_text, cached_info, BlobCache};
use crate::stability::StabilityModel;
use crate::{ContextError, Order};

/// For each block's path: the ages (most recent first) at which the block's text changed; and
/// the age of the current epoch's start ([`crate::history::history`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockAges {
    pub ages: HashMap<String, Vec<u32>>,
    /// For outline blocks: the ages of the file's edits that left the outline as it was.
    pub body_edits: HashMap<String, Vec<u32>>,
    pub epoch: u32,
}

/// The change ages of each block in `blocks`, from `history`.
pub(crate) fn block_ages(
    repo: &Repository,
    history: &History,
    blocks: &[Block],
    refs: &References,
    blobs: &BlobCache,
) -> Result<BlockAges, ContextError> {
    let mut out = BlockAges { ages: HashMap::new(), body_edits: HashMap::new(), epoch: history.epoch };
    for b in blocks {
        let Some(path) = &b.path else { continue };
        let (mut ages, mut body) = (Vec::new(), Vec::new());
        for e in history.events(path) {
            let changed = match b.kind {
                SegmentKind::Outline => outline_changed(repo, path, e, refs, blobs)?,
                _ if manifest::applies(path) => manifest_changed(repo, path, e),
                _ => true,
            };
            if changed {
                ages.push(e.age);
            } else {
                body.push(e.age);
            }
        }
        out.ages.insert(path.clone(), ages);
        out.body_edits.insert(path.clone(), body);
    }
    Ok(out)
}

/// Whether a change of `path` changed its outline (an addition or deletion always does), as
/// shown with the names the current commit's files reference.
fn outline_changed(
    repo: &Repository,
    path: &str,
    e: &Event,
    refs: &References,
    blobs: &BlobCache,
) -> Result<bool, ContextError> {
    let (Some(old), Some(new)) = (e.old, e.new) else { return Ok(true) };
    let lang = Lang::from_path(path);
    let outline = |oid| {
        cached_info(repo, oid, lang, blobs).map(|i| {
            let a = &i.analysis;
            shown_outline(a, MAX_OUTLINE_BYTES, &|n| refs.elsewhere(a, n)).text
        })
    };
    Ok(outline(old)? != outline(new)?)
}

/// Whether a change of the manifest at `path` changed what its block shows (the manifest without
/// its metadata and tool settings, [`crate::manifest`]); an addition, a deletion or a version that
/// cannot be read as text always does.
fn manifest_changed(repo: &Repository, path: &str, e: &Event) -> bool {
    let (Some(old), Some(new)) = (e.old, e.new) else { return true };
    let shown = |oid| {
        blob_text(repo, oid).ok().map(|text| match manifest::summarize(path, &text) {
            Some(s) => (s.text, s.left_out),
            None => (text, Vec::new()),
        })
    };
    match (shown(old), shown(new)) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    }
}

/// Sorts `blocks` (the header excluded) for `order`. `ages` is needed for `Stability` and
/// `LastChange`; without it they fall back to path order.
///
/// Stability: first the blocks that did not change in the current epoch, by their stability key
/// as of the epoch's start (ascending, ties by path); then the blocks that changed in the epoch,
/// in the order they first changed (so the tail too keeps its order as the epoch goes on).
pub(crate) fn order_blocks(blocks: &mut [Block], order: Order, ages: Option<&BlockAges>, model: &StabilityModel) {
    let get =
        |m: &HashMap<String, Vec<u32>>, b: &Block| m.get(b.path.as_deref().unwrap_or("")).cloned().unwrap_or_default();
    let of = |a: &BlockAges, b: &Block| get(&a.ages, b);
    match (order, ages) {
        (Order::Stability, Some(a)) => {
            let key = |b: &Block| -> (u8, f64) {
                let ages = of(a, b);
                let epoch = if model.epochs { a.epoch } else { 0 };
                let recent = ages.iter().copied().filter(|&x| x < epoch).max();
                match recent {
                    // Changed in this epoch: the earliest first change first.
                    Some(first) => (1, -f64::from(first)),
                    None => {
                        let before: Vec<u32> = ages.iter().map(|&x| x - epoch).collect();
                        let body: Vec<u32> =
                            get(&a.body_edits, b).iter().filter(|&&x| x >= epoch).map(|&x| x - epoch).collect();
                        (0, model.score(&before, &body, b.kind, b.tokens.len()))
                    }
                }
            };
            let mut keyed: Vec<((u8, f64), Block)> = blocks.iter().map(|b| (key(b), b.clone())).collect();
            keyed.sort_by(|x, y| {
                (x.0 .0.cmp(&y.0 .0)).then(x.0 .1.total_cmp(&y.0 .1)).then_with(|| x.1.path.cmp(&y.1.path))
            });
            for (slot, (_, b)) in blocks.iter_mut().zip(keyed) {
                *slot = b;
            }
        }
        (Order::LastChange, Some(a)) => {
            // Never changed in the window (no age) first, then oldest last change first.
            let age = |b: &Block| of(a, b).first().copied().unwrap_or(u32::MAX);
            blocks.sort_by(|x, y| match age(y).cmp(&age(x)) {
                Ordering::Equal => x.path.cmp(&y.path),
                o => o,
            });
        }
        _ => blocks.sort_by(|a, b| a.path.cmp(&b.path)),
    }
}
