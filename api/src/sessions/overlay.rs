//! After a push: the overlay, and the rebase behind it (`[context] after_push = "overlay"`, the
//! default).
//!
//! A session's prompts start with the repository context of one commit, its *base*, and the
//! engine keeps that prefix and the history after it warm. A push that changes a file the base
//! context shows would, rebuilt at the new head, move every block after the first changed one:
//! the next turn would recompute them and the whole history. Instead that turn keeps the base
//! context and the history as they are and carries, before its own content, an **overlay**: the
//! changed files' new versions as the new head's context renders them, under a heading that
//! says they replace what is above. The push webhook computes that prefix (base, history,
//! overlay) before it answers (`overlay_prewarm_wait_ms`), so the turn after it costs what a
//! warm turn costs; a turn that comes sooner computes the overlay's tokens itself.
//! Meanwhile the session is **rebased** in the background: the context at the new head and the
//! session's history are pre-warmed (preemptible, invisible to admission control), and the
//! first turn after that starts from them, fully cached again.
//!
//! Correctness: an overlay covers every change between the newest commit the session's
//! history has seen (its base, or the head of its last overlay) and the head, for every path
//! the base context shows, so no turn shows a stale block without the newer version after it.
//! Overlays are stored in the history with their turn, so later turns repeat them verbatim (and
//! cached). An overlay larger than half the context is not worth it: such a turn starts from
//! the head instead. The state lives in this replica's memory: a session it does not know (after
//! a restart, or served elsewhere until now) starts from the head, as `"rebuild"` does.

use super::prompt::{block, Kind, Piece};
use crate::config::AfterPush;
use crate::error::ApiError;
use cachet_context::{ChangeKind, CommitId, ContextError, Mirror, RepoContext, Segment};
use cachet_tenants::{RepoId, SessionId, TenantId};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The largest changed file an overlay shows in full when the new context does not show it.
pub const OVERLAY_FILE_BYTES: u64 = 16 * 1024;

/// Lines of context around each change of a file's diff in an overlay.
const DIFF_CONTEXT_LINES: u32 = 2;

/// Sessions remembered at most (the least recently used beyond it are forgotten: they start
/// from the head, which is always correct).
const MAX_SESSIONS: usize = 100_000;

/// Where a turn's prompt comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct At {
    /// The branch head: the turn's commit, where named files are read.
    pub head: CommitId,
    /// The commit of the repository context (the head, or the session's warm base).
    pub context: CommitId,
    /// Show the changes from this commit to the head in an overlay.
    pub overlay_since: Option<CommitId>,
}

impl At {
    /// Everything at the head.
    pub fn head(head: CommitId) -> At {
        At { context: head.clone(), head, overlay_since: None }
    }
}

/// A background rebase of a session onto a newer commit.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rebase {
    commit: CommitId,
    /// The history turns it pre-warms.
    turns: usize,
    warm: bool,
}

/// Whose session it is: the tenant, and the repository branch it works on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub tenant: TenantId,
    pub repo: RepoId,
    pub branch: String,
}

#[derive(Clone, Debug)]
struct Base {
    owner: Owner,
    /// The commit whose context the session's prompts start with.
    context: CommitId,
    /// The newest commit the history has seen (in its context or in an overlay).
    seen: CommitId,
    rebase: Option<Rebase>,
    /// The tools its last turn rendered (a template may render them before the history: what
    /// is pre-warmed for its next turn must have them where that turn will).
    tools: Option<serde_json::Value>,
    touched: Instant,
}

/// A session the push left behind: rebase it onto `head`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Behind {
    pub session: SessionId,
    pub tenant: TenantId,
    pub head: CommitId,
}

/// Each session's base on this replica.
#[derive(Debug, Default)]
pub struct SessionBases {
    inner: Mutex<HashMap<SessionId, Base>>,
}

impl SessionBases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Base>> {
        // The map holds plain values: a panic elsewhere cannot leave it half-updated.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where the next turn of `session` (whose history has `turns` turns) starts from.
    pub fn plan(&self, session: SessionId, head: &CommitId, turns: usize, mode: AfterPush) -> At {
        if mode == AfterPush::Rebuild {
            return At::head(head.clone());
        }
        let map = self.lock();
        let Some(base) = map.get(&session) else { return At::head(head.clone()) };
        if let Some(r) = base.rebase.as_ref().filter(|r| r.warm && r.turns == turns) {
            let overlay_since = (r.commit != *head).then(|| r.commit.clone());
            return At { head: head.clone(), context: r.commit.clone(), overlay_since };
        }
        if base.context == *head {
            return At::head(head.clone());
        }
        At {
            head: head.clone(),
            context: base.context.clone(),
            overlay_since: (base.seen != *head).then(|| base.seen.clone()),
        }
    }

    /// Records a stored turn (the history now has `turns` turns) that started from `at`; says
    /// whether the session should be rebased onto the head (it is behind it, and no rebase of
    /// this history is under way).
    pub fn record(
        &self,
        session: SessionId,
        owner: &Owner,
        at: &At,
        turns: usize,
        tools: Option<&serde_json::Value>,
    ) -> Option<Behind> {
        let mut map = self.lock();
        if map.len() >= MAX_SESSIONS && !map.contains_key(&session) {
            if let Some(oldest) = map.iter().min_by_key(|(_, b)| b.touched).map(|(id, _)| *id) {
                map.remove(&oldest);
            }
        }
        let rebase = map.get(&session).and_then(|b| b.rebase.clone()).filter(|r| r.commit != at.context);
        let behind = at.context != at.head;
        let under_way = rebase.as_ref().is_some_and(|r| r.commit == at.head && r.turns == turns);
        let rebase = match (behind, under_way) {
            (false, _) => None,
            (true, true) => rebase,
            (true, false) => Some(Rebase { commit: at.head.clone(), turns, warm: false }),
        };
        let start = behind && !under_way;
        map.insert(
            session,
            Base {
                owner: owner.clone(),
                context: at.context.clone(),
                seen: at.head.clone(),
                rebase,
                tools: tools.cloned(),
                touched: Instant::now(),
            },
        );
        start.then(|| Behind { session, tenant: owner.tenant, head: at.head.clone() })
    }

    /// The sessions of a branch this replica knows that are behind `head` and were active
    /// within `idle` (a push): each is marked as being rebased.
    pub fn behind(&self, repo: RepoId, branch: &str, head: &CommitId, idle: Duration) -> Vec<Behind> {
        let mut map = self.lock();
        let now = Instant::now();
        map.retain(|_, b| now.duration_since(b.touched) < idle);
        map.iter_mut()
            .filter(|(_, b)| b.owner.repo == repo && b.owner.branch == branch && b.context != *head)
            .filter(|(_, b)| b.rebase.as_ref().is_none_or(|r| r.commit != *head))
            .map(|(id, b)| {
                // The turn count is set when the rebase reads the history.
                b.rebase = Some(Rebase { commit: head.clone(), turns: usize::MAX, warm: false });
                Behind { session: *id, tenant: b.owner.tenant, head: head.clone() }
            })
            .collect()
    }

    /// Whether a session of the branch was active here within `idle`: its warm prefix (the base
    /// context and its history) is what its next turns reuse, so a push must not evict it.
    pub fn serving(&self, repo: RepoId, branch: &str, idle: Duration) -> bool {
        let now = Instant::now();
        self.lock()
            .values()
            .any(|b| b.owner.repo == repo && b.owner.branch == branch && now.duration_since(b.touched) < idle)
    }

    /// A rebase of `session` onto `commit` pre-warms a history of `turns` turns; false if the
    /// session is no longer known or another rebase replaced this one.
    pub fn rebasing(&self, session: SessionId, commit: &CommitId, turns: usize) -> bool {
        let mut map = self.lock();
        let Some(r) = map.get_mut(&session).and_then(|b| b.rebase.as_mut()) else { return false };
        if r.commit != *commit || r.warm {
            return false;
        }
        r.turns = turns;
        true
    }

    /// The rebase of `session` onto `commit` over `turns` turns is warm: the next turn starts from it.
    pub fn warm(&self, session: SessionId, commit: &CommitId, turns: usize) {
        let mut map = self.lock();
        if let Some(r) = map.get_mut(&session).and_then(|b| b.rebase.as_mut()) {
            if r.commit == *commit && r.turns == turns {
                r.warm = true;
            }
        }
    }

    /// A rebase that failed or was cancelled: a later turn starts another.
    pub fn abandon(&self, session: SessionId, commit: &CommitId) {
        let mut map = self.lock();
        if let Some(b) = map.get_mut(&session) {
            if b.rebase.as_ref().is_some_and(|r| r.commit == *commit && !r.warm) {
                b.rebase = None;
            }
        }
    }

    /// The tools the session's last turn rendered.
    pub fn tools(&self, session: SessionId) -> Option<serde_json::Value> {
        self.lock().get(&session).and_then(|b| b.tools.clone())
    }

    /// A closed session.
    pub fn forget(&self, session: SessionId) {
        self.lock().remove(&session);
    }
}

fn short(c: &CommitId) -> String {
    c.to_string().chars().take(12).collect()
}

/// The overlay of the changes from `since` to `head` over the context `base` (at `base_commit`;
/// the head's own context is `now`).
pub fn overlay(
    mirror: &Mirror,
    base: &RepoContext,
    base_commit: &CommitId,
    now: &RepoContext,
    since: &CommitId,
    head: &CommitId,
) -> Result<Overlay, ApiError> {
    let blocks = |ctx: &RepoContext| -> HashMap<String, Segment> {
        ctx.segments.iter().filter_map(|s| Some((s.path.clone()?, s.clone()))).collect()
    };
    let (shown, current) = (blocks(base), blocks(now));
    let mut text = String::new();
    for change in mirror.changed_paths(since, head)? {
        let path = change.path.as_str();
        let Some(old) = shown.get(path) else { continue };
        let rendered = match current.get(path) {
            // The block reads as the base shows it, and no overlay in between said otherwise.
            Some(new) if since == base_commit && new.kind == old.kind && new.version == old.version => continue,
            Some(new) => now.text[new.text.clone()].to_string(),
            None => match mirror.read_file_at_most(head, path, OVERLAY_FILE_BYTES) {
                Ok(None) => format!("### {path} (deleted)\n\n"),
                Ok(Some(file)) => match String::from_utf8(file.bytes) {
                    Ok(content) => block(path, &content),
                    Err(_) => format!("### {path} (changed; not text)\n\n"),
                },
                Err(ContextError::TooLarge(_)) => {
                    format!("### {path} (changed; too large to show here: name it in `files` to read it)\n\n")
                }
                Err(e) => return Err(e.into()),
            },
        };
        // The file's diff when it says the same in fewer bytes (a small edit to a large file).
        let diff = match change.kind {
            ChangeKind::Modified => mirror.file_diff(since, head, path, DIFF_CONTEXT_LINES)?,
            _ => None,
        };
        match diff.map(|d| block(&format!("{path} (diff of the file since {})", short(since)), &d)) {
            Some(d) if d.len() < rendered.len() => text.push_str(&d),
            _ => text.push_str(&rendered),
        }
    }
    if text.is_empty() {
        return Ok(Overlay::Nothing);
    }
    if text.len() > base.text.len() / 2 {
        return Ok(Overlay::TooLarge);
    }
    let heading = format!(
        "### Repository changes since commit {} (now {}): what follows replaces what is shown above\n\n",
        short(since),
        short(head)
    );
    let mut piece = Piece::text(Kind::Overlay, heading + &text);
    piece.version = Some(head.to_string());
    Ok(Overlay::Piece(piece))
}

/// What an overlay comes to.
#[derive(Debug)]
pub enum Overlay {
    /// No block the context shows changed.
    Nothing,
    /// The overlay would be larger than half the context: start from the head instead.
    TooLarge,
    Piece(Piece),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(n: u8) -> CommitId {
        CommitId(format!("{n:02x}").repeat(20))
    }

    fn owner() -> Owner {
        Owner { tenant: TenantId(uuid::Uuid::nil()), repo: RepoId(uuid::Uuid::max()), branch: "main".into() }
    }

    #[test]
    fn a_session_stays_on_its_base_until_its_rebase_of_this_history_is_warm() {
        let bases = SessionBases::default();
        let s = SessionId::random();
        let (c0, c1) = (commit(1), commit(2));
        // Unknown: the head.
        assert_eq!(bases.plan(s, &c0, 0, AfterPush::Overlay), At::head(c0.clone()));
        assert_eq!(bases.record(s, &owner(), &At::head(c0.clone()), 2, None), None);
        // A push: the base and an overlay since it.
        let at = bases.plan(s, &c1, 2, AfterPush::Overlay);
        assert_eq!(at, At { head: c1.clone(), context: c0.clone(), overlay_since: Some(c0.clone()) });
        assert_eq!(bases.plan(s, &c1, 2, AfterPush::Rebuild), At::head(c1.clone()));
        // The webhook marks it; the rebase reads two turns; the turn stored meanwhile makes it stale.
        let behind = bases.behind(owner().repo, "main", &c1, Duration::from_secs(60));
        assert_eq!(behind, vec![Behind { session: s, tenant: owner().tenant, head: c1.clone() }]);
        assert!(bases.rebasing(s, &c1, 2));
        let again = bases.record(s, &owner(), &at, 4, None);
        assert_eq!(again, Some(Behind { session: s, tenant: owner().tenant, head: c1.clone() }));
        // The overlay was seen: the next turn on the base has none.
        let next = bases.plan(s, &c1, 4, AfterPush::Overlay);
        assert_eq!(next, At { head: c1.clone(), context: c0.clone(), overlay_since: None });
        // The stale rebase finishing changes nothing; the current one switches the session.
        bases.warm(s, &c1, 2);
        assert_eq!(bases.plan(s, &c1, 4, AfterPush::Overlay).context, c0);
        assert!(bases.rebasing(s, &c1, 4));
        bases.warm(s, &c1, 4);
        assert_eq!(bases.plan(s, &c1, 4, AfterPush::Overlay), At::head(c1.clone()));
        assert_eq!(bases.record(s, &owner(), &At::head(c1.clone()), 6, None), None);
        assert_eq!(bases.plan(s, &c1, 6, AfterPush::Overlay), At::head(c1.clone()));
        bases.forget(s);
        assert!(bases.behind(owner().repo, "main", &commit(3), Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn a_rebase_warm_onto_an_older_commit_switches_with_an_overlay_since_it() {
        let bases = SessionBases::default();
        let s = SessionId::random();
        let (c0, c1, c2) = (commit(1), commit(2), commit(3));
        bases.record(s, &owner(), &At::head(c0.clone()), 2, None);
        assert_eq!(bases.behind(owner().repo, "main", &c1, Duration::from_secs(60)).len(), 1);
        assert!(bases.rebasing(s, &c1, 2));
        bases.warm(s, &c1, 2);
        let at = bases.plan(s, &c2, 2, AfterPush::Overlay);
        assert_eq!(at, At { head: c2.clone(), context: c1.clone(), overlay_since: Some(c1.clone()) });
        // Recorded on the new base, behind the head: a rebase onto the head starts.
        let start = bases.record(s, &owner(), &at, 4, None);
        assert_eq!(start.map(|b| b.head), Some(c2));
        // A failed rebase is abandoned, and the next turn starts another.
        bases.abandon(s, &commit(3));
        let at = bases.plan(s, &commit(3), 4, AfterPush::Overlay);
        assert_eq!(at.context, c1);
        assert!(bases.record(s, &owner(), &at, 6, None).is_some());
    }
}
