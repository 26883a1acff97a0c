//! Sessions and their append-only turns.

use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

use super::{Store, StoreError};
use crate::ids::{RepoId, RequestId, SessionId, TenantId};
use crate::words::text_enum;

/// A session: a tenant working on one branch of one repository. Only the store makes one
/// (`non_exhaustive`: no struct literal outside this crate), from a row it read:
/// [`Session::owned`] is therefore a session of [`Session::tenant`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Session {
    pub id: SessionId,
    pub tenant: TenantId,
    pub repo: RepoId,
    pub branch: String,
    pub created_at: DateTime<Utc>,
    pub last_active_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

impl Session {
    /// The handle that opens the session's history and turn lease.
    pub fn owned(&self) -> OwnedSession {
        OwnedSession { tenant: self.tenant, id: self.id }
    }
}

/// A session whose tenant the store has checked: the key to its history ([`Store::turns`],
/// [`Store::append_turns`]), its turn lease ([`Store::begin_turn`] …) and its activity
/// ([`Store::touch_session`]). Only a [`Session`] the store read gives one, so these methods,
/// which take no tenant id, still act only on a session of the tenant that found it. It is
/// `Copy`: a turn's lease and its background work carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OwnedSession {
    tenant: TenantId,
    id: SessionId,
}

impl OwnedSession {
    pub fn id(self) -> SessionId {
        self.id
    }

    pub fn tenant(self) -> TenantId {
        self.tenant
    }
}

text_enum!(
    /// Who said a turn (spelt as chat templates and the API spell it).
    Role, "turn role" {
        User = "user",
        Assistant = "assistant",
        /// A tool's result, answering one of the previous assistant turn's calls.
        Tool = "tool",
    }
);

/// One turn of a session's history.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    pub seq: i32,
    pub role: Role,
    pub content: String,
    /// Assistant turns: the token ids as generated.
    pub tokens: Option<Vec<u32>>,
    /// Assistant turns: the model that generated them.
    pub model: Option<String>,
    /// User turns: the commit of the repository context.
    pub commit: Option<String>,
    pub request_id: Option<RequestId>,
    /// Tool turns: the id of the call this result answers.
    pub tool_call_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A turn to append.
#[derive(Clone, Debug)]
pub struct NewTurn<'a> {
    pub role: Role,
    pub content: &'a str,
    pub tokens: Option<&'a [u32]>,
    pub model: Option<&'a str>,
    pub commit: Option<&'a str>,
    pub request_id: Option<RequestId>,
    pub tool_call_id: Option<&'a str>,
}

impl<'a> NewTurn<'a> {
    /// A turn of `role` with `content` and nothing else.
    pub fn new(role: Role, content: &'a str) -> NewTurn<'a> {
        NewTurn { role, content, tokens: None, model: None, commit: None, request_id: None, tool_call_id: None }
    }
}

#[derive(sqlx::FromRow)]
struct SessionRow {
    id: SessionId,
    tenant_id: TenantId,
    repo_id: RepoId,
    branch: String,
    created_at: DateTime<Utc>,
    last_active_at: DateTime<Utc>,
    closed_at: Option<DateTime<Utc>>,
}

impl From<SessionRow> for Session {
    fn from(r: SessionRow) -> Session {
        Session {
            id: r.id,
            tenant: r.tenant_id,
            repo: r.repo_id,
            branch: r.branch,
            created_at: r.created_at,
            last_active_at: r.last_active_at,
            closed_at: r.closed_at,
        }
    }
}

#[derive(sqlx::FromRow)]
struct TurnRow {
    seq: i32,
    role: Role,
    content: String,
    tokens: Option<Vec<i32>>,
    model: Option<String>,
    commit: Option<String>,
    request_id: Option<RequestId>,
    tool_call_id: Option<String>,
    created_at: DateTime<Utc>,
}

const SESSION_COLUMNS: &str = "id, tenant_id, repo_id, branch, created_at, last_active_at, closed_at";

impl Store {
    /// Opens a session on a live repository of the tenant; [`StoreError::NotFound`] if the
    /// repository is unknown, deleted or another tenant's.
    pub async fn create_session(&self, tenant: TenantId, repo: RepoId, branch: &str) -> Result<Session, StoreError> {
        let row: Option<SessionRow> = sqlx::query_as(&format!(
            "INSERT INTO sessions (id, tenant_id, repo_id, branch) \
             SELECT $1, $2, $3, $4 WHERE EXISTS \
               (SELECT 1 FROM repositories WHERE id = $3 AND tenant_id = $2 AND deleted_at IS NULL) \
             RETURNING {SESSION_COLUMNS}"
        ))
        .bind(SessionId::random())
        .bind(tenant.0)
        .bind(repo)
        .bind(branch)
        .fetch_optional(self.pool())
        .await?;
        row.map(Session::from).ok_or_else(|| StoreError::NotFound(format!("repository {repo}")))
    }

    /// A session of this tenant, open or closed (`None` for another tenant's).
    pub async fn session(&self, tenant: TenantId, id: SessionId) -> Result<Option<Session>, StoreError> {
        let row: Option<SessionRow> =
            sqlx::query_as(&format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = $1 AND tenant_id = $2"))
                .bind(id)
                .bind(tenant.0)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(Session::from))
    }

    /// Whether `id` names a session of another tenant than `tenant` (a request may label itself
    /// with a session id of its own choosing, never with another tenant's session).
    pub async fn is_foreign_session(&self, tenant: TenantId, id: SessionId) -> Result<bool, StoreError> {
        let (foreign,): (bool,) =
            sqlx::query_as("SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND tenant_id <> $2)")
                .bind(id)
                .bind(tenant.0)
                .fetch_one(self.pool())
                .await?;
        Ok(foreign)
    }

    /// Marks a session active now.
    pub async fn touch_session(&self, session: OwnedSession) -> Result<(), StoreError> {
        sqlx::query("UPDATE sessions SET last_active_at = now() WHERE id = $1 AND tenant_id = $2")
            .bind(session.id)
            .bind(session.tenant.0)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Closes an open session of the tenant; `false` if it is unknown, another tenant's or
    /// already closed.
    pub async fn close_session(&self, tenant: TenantId, id: SessionId) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE sessions SET closed_at = now() WHERE id = $1 AND tenant_id = $2 AND closed_at IS NULL")
                .bind(id)
                .bind(tenant.0)
                .execute(self.pool())
                .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Closes every open session idle since before `cutoff`; returns them.
    pub async fn close_idle_sessions(&self, cutoff: DateTime<Utc>) -> Result<Vec<Session>, StoreError> {
        let rows: Vec<SessionRow> = sqlx::query_as(&format!(
            "UPDATE sessions SET closed_at = now() WHERE closed_at IS NULL AND last_active_at < $1 \
             RETURNING {SESSION_COLUMNS}"
        ))
        .bind(cutoff)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(Session::from).collect())
    }

    /// Open sessions on a repository's branch active since `since`, most recently active first.
    pub async fn active_sessions(
        &self,
        repo: RepoId,
        branch: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<Session>, StoreError> {
        let rows: Vec<SessionRow> = sqlx::query_as(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE repo_id = $1 AND branch = $2 AND closed_at IS NULL \
             AND last_active_at >= $3 ORDER BY last_active_at DESC, id"
        ))
        .bind(repo)
        .bind(branch)
        .bind(since)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(Session::from).collect())
    }

    /// Appends a turn at the end of the session's history and returns its sequence number. Two
    /// appends racing for one number cannot both succeed (primary key): the loser gets
    /// [`StoreError::Conflict`].
    pub async fn append_turn(&self, session: OwnedSession, turn: &NewTurn<'_>) -> Result<i32, StoreError> {
        let seqs = self.append_turns(session, std::slice::from_ref(turn)).await?;
        Ok(seqs[0])
    }

    /// Appends turns in order, all or none (one transaction); returns their sequence numbers.
    pub async fn append_turns(&self, session: OwnedSession, turns: &[NewTurn<'_>]) -> Result<Vec<i32>, StoreError> {
        let mut tx = self.pool().begin().await?;
        let mut seqs = Vec::with_capacity(turns.len());
        for turn in turns {
            let tokens: Option<Vec<i32>> = turn.tokens.map(|t| t.iter().map(|&id| id as i32).collect());
            let (seq,): (i32,) = sqlx::query_as(
                "INSERT INTO turns (session_id, seq, role, content, tokens, model, commit, request_id, tool_call_id) \
                 SELECT $1, COALESCE(MAX(seq) + 1, 0), $2, $3, $4, $5, $6, $7, $8 FROM turns WHERE session_id = $1 \
                 RETURNING seq",
            )
            .bind(session.id)
            .bind(turn.role)
            .bind(turn.content)
            .bind(tokens)
            .bind(turn.model)
            .bind(turn.commit)
            .bind(turn.request_id)
            .bind(turn.tool_call_id)
            .fetch_one(&mut *tx)
            .await?;
            seqs.push(seq);
        }
        tx.commit().await?;
        Ok(seqs)
    }

    /// Takes the session's turn lease for `holder` until `lease` from now, if no unexpired lease
    /// is held, or the one held is `replacing`'s (one turn at a time per session, whichever
    /// replica runs it). False when another turn holds it.
    pub async fn begin_turn(
        &self,
        session: OwnedSession,
        holder: Uuid,
        lease: Duration,
        replacing: Option<Uuid>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE sessions SET turn_holder = $2, turn_lease_until = now() + $3 * interval '1 millisecond' \
             WHERE id = $1 AND tenant_id = $5 \
             AND (turn_lease_until IS NULL OR turn_lease_until < now() OR turn_holder = $4)",
        )
        .bind(session.id)
        .bind(holder)
        .bind(lease.as_millis() as f64)
        .bind(replacing)
        .bind(session.tenant.0)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Notes that `replica` runs the session's turn now, and returns where the replica that ran
    /// its turn before can be read from, when that was another replica seen within `within` (a
    /// warm hand-off: fetch the session's prefix from it).
    pub async fn move_session(
        &self,
        session: OwnedSession,
        replica: Uuid,
        within: Duration,
    ) -> Result<Option<String>, StoreError> {
        // Both parts read the row as it was: `prev` sees the replica before this update.
        let url: Option<(String,)> = sqlx::query_as(
            "WITH prev AS (SELECT last_replica FROM sessions WHERE id = $1 AND tenant_id = $2),              moved AS (UPDATE sessions SET last_replica = $3 WHERE id = $1 AND tenant_id = $2)              SELECT r.kv_url FROM prev JOIN replicas r ON r.id = prev.last_replica              WHERE prev.last_replica <> $3 AND r.seen_at > now() - $4 * interval '1 millisecond'",
        )
        .bind(session.id)
        .bind(session.tenant.0)
        .bind(replica)
        .bind(within.as_millis() as f64)
        .fetch_optional(self.pool())
        .await?;
        Ok(url.map(|(u,)| u))
    }

    /// Records (or refreshes) where `replica`'s KV disk tier is read from; forgets replicas not
    /// seen for a day.
    pub async fn announce_replica(&self, replica: Uuid, kv_url: &str) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, kv_url, seen_at) VALUES ($1, $2, now())              ON CONFLICT (id) DO UPDATE SET kv_url = $2, seen_at = now()",
        )
        .bind(replica)
        .bind(kv_url)
        .execute(self.pool())
        .await?;
        sqlx::query("DELETE FROM replicas WHERE seen_at < now() - interval '1 day'").execute(self.pool()).await?;
        Ok(())
    }

    /// Extends `holder`'s lease to `lease` from now; false if another turn holds it now.
    pub async fn renew_turn(&self, session: OwnedSession, holder: Uuid, lease: Duration) -> Result<bool, StoreError> {
        self.begin_turn(session, holder, lease, Some(holder)).await
    }

    /// Gives up `holder`'s lease (nothing if it no longer holds it).
    pub async fn end_turn(&self, session: OwnedSession, holder: Uuid) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE sessions SET turn_holder = NULL, turn_lease_until = NULL \
             WHERE id = $1 AND tenant_id = $3 AND turn_holder = $2",
        )
        .bind(session.id)
        .bind(holder)
        .bind(session.tenant.0)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// A session's history in order.
    pub async fn turns(&self, session: OwnedSession) -> Result<Vec<Turn>, StoreError> {
        let rows: Vec<TurnRow> = sqlx::query_as(
            "SELECT seq, role, content, tokens, model, commit, request_id, tool_call_id, created_at FROM turns \
             WHERE session_id = $1 ORDER BY seq",
        )
        .bind(session.id)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| Turn {
                seq: r.seq,
                role: r.role,
                content: r.content,
                tokens: r.tokens.map(|t| t.into_iter().map(|id| id as u32).collect()),
                model: r.model,
                commit: r.commit,
                request_id: r.request_id,
                tool_call_id: r.tool_call_id,
                created_at: r.created_at,
            })
            .collect())
    }
}
