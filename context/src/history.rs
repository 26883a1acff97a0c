//! How often and how recently each path changed, from the first-parent history up to a commit (no
//! look-ahead). The input of stability ordering.

use std::collections::HashMap;
use std::sync::Arc;

use git2::Repository;
use moka::sync::Cache;

use crate::store::tree::{commit_changes, find_commit, PathChange};
use crate::{CommitId, ContextError};

/// One change of a path: how many commits ago (0 = the commit itself), and its blobs before and
/// after (`None`: absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    pub age: u32,
    pub old: Option<git2::Oid>,
    pub new: Option<git2::Oid>,
}

/// The change record of the first-parent history ending at one commit.
#[derive(Debug, Default)]
pub(crate) struct History {
    /// For each path changed in the window: its changes, most recent first.
    events: HashMap<String, Vec<Event>>,
    /// The age of the current epoch's start (see [`history`]).
    pub epoch: u32,
}

impl History {
    /// The changes of `path`, most recent first; empty if it did not change in the window.
    pub(crate) fn events(&self, path: &str) -> &[Event] {
        self.events.get(path).map_or(&[], Vec::as_slice)
    }
}

/// The paths each commit changed against its first parent. A commit never changes, so entries never
/// go stale.
pub(crate) type ChangeCache = Cache<CommitId, Arc<Vec<PathChange>>>;

/// The expected number of commits between epoch starts.
pub(crate) const EPOCH_SPACING: u32 = 32;
/// The longest an epoch lasts (when no commit id happens to start one).
const EPOCH_MAX: usize = 4 * EPOCH_SPACING as usize;

/// Records every path change by age over the first-parent history ending at `head`: the commits
/// of the current *epoch*, and `depth` commits before it.
///
/// An epoch starts at a commit whose id is divisible by [`EPOCH_SPACING`] (ids are random, so
/// about every 32 commits; at most [`EPOCH_MAX`]; a history shorter than that without such a
/// commit is all before the epoch). Stability keys are computed from the history
/// before the epoch's start only, so they stay the same for every commit of the epoch: a push
/// then moves only the blocks it changes (to the tail), and the blocks before the first of them
/// keep their order and their cached KV. Keys computed at the head would drift with every push
/// and move unchanged blocks around.
pub(crate) fn history(
    repo: &Repository,
    head: &CommitId,
    depth: usize,
    changes: &ChangeCache,
) -> Result<History, ContextError> {
    let mut chain = Vec::new();
    let mut commit = find_commit(repo, head)?;
    let mut epoch = None;
    while epoch.is_none_or(|e| chain.len() < e + depth) {
        if epoch.is_none() && (is_anchor(commit.id(), EPOCH_SPACING) || chain.len() == EPOCH_MAX) {
            epoch = Some(chain.len());
        }
        let parent = commit.parent(0).ok();
        chain.push(commit);
        match parent {
            Some(p) => commit = p,
            None => break,
        }
    }
    // A history too young to have started an epoch has keys from all of it.
    let epoch = epoch.unwrap_or(0);
    chain.truncate(epoch + depth);
    let mut events: HashMap<String, Vec<Event>> = HashMap::new();
    for (age, commit) in chain.iter().enumerate() {
        let id = CommitId::from_oid(commit.id());
        let paths = match changes.get(&id) {
            Some(p) => p,
            None => {
                let p = Arc::new(commit_changes(repo, commit)?);
                changes.insert(id, p.clone());
                p
            }
        };
        let age = u32::try_from(age).unwrap_or(u32::MAX);
        for change in paths.iter() {
            events.entry(change.path.clone()).or_default().push(Event { age, old: change.old, new: change.new });
        }
    }
    Ok(History { events, epoch: u32::try_from(epoch).unwrap_or(u32::MAX) })
}

fn is_anchor(oid: git2::Oid, spacing: u32) -> bool {
    let b = oid.as_bytes();
    let n = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    n.is_multiple_of(spacing)
}
