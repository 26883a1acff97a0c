//! Tasks: a unit of work an agent attempts, closed once with its outcome.

use super::{Store, StoreError};
use crate::ids::{SessionId, TaskId, TenantId};
use crate::words::text_enum;
use chrono::{DateTime, Utc};
use serde::Serialize;

text_enum!(
    /// Where a task stands: open, then its outcome.
    TaskStatus, "task status" {
        Open = "open",
        Succeeded = "succeeded",
        Failed = "failed",
        Abandoned = "abandoned",
    }
);

/// A task. Only the store makes one (`non_exhaustive`), from a row it read for its tenant:
/// [`Task::owned`] is therefore a task of [`Task::tenant`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Task {
    pub id: TaskId,
    pub tenant: TenantId,
    pub session_id: Option<SessionId>,
    pub title: String,
    pub status: TaskStatus,
    pub evidence: Option<serde_json::Value>,
    /// The client's own run id the server opened this task for (see
    /// [`Store::task_for_client_session`]).
    pub client_session: Option<String>,
    pub created_at: DateTime<Utc>,
    pub last_active_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

impl Task {
    /// The handle that marks the task active ([`Store::touch_task`]).
    pub fn owned(&self) -> OwnedTask {
        OwnedTask { tenant: self.tenant, id: self.id }
    }
}

/// A task whose tenant the store has checked (see [`crate::store::OwnedSession`]): only a
/// [`Task`] the store read gives one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OwnedTask {
    tenant: TenantId,
    id: TaskId,
}

impl OwnedTask {
    pub fn id(self) -> TaskId {
        self.id
    }

    pub fn tenant(self) -> TenantId {
        self.tenant
    }
}

#[derive(sqlx::FromRow)]
struct TaskRow {
    id: TaskId,
    tenant_id: TenantId,
    session_id: Option<SessionId>,
    title: String,
    status: TaskStatus,
    evidence: Option<sqlx::types::Json<serde_json::Value>>,
    client_session: Option<String>,
    created_at: DateTime<Utc>,
    last_active_at: DateTime<Utc>,
    closed_at: Option<DateTime<Utc>>,
}

impl From<TaskRow> for Task {
    fn from(r: TaskRow) -> Task {
        Task {
            id: r.id,
            tenant: r.tenant_id,
            session_id: r.session_id,
            title: r.title,
            status: r.status,
            evidence: r.evidence.map(|e| e.0),
            client_session: r.client_session,
            created_at: r.created_at,
            last_active_at: r.last_active_at,
            closed_at: r.closed_at,
        }
    }
}

const TASK_COLUMNS: &str =
    "id, tenant_id, session_id, title, status, evidence, client_session, created_at, last_active_at, closed_at";

/// The longest client session id a task is opened for (the column's check).
pub const CLIENT_SESSION_MAX: usize = 200;

/// Why an outcome was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum OutcomeError {
    #[error("no such task")]
    NotFound,
    #[error("the task already has its outcome: {0}")]
    AlreadyClosed(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// Opens a task; `session` must be one of the tenant's sessions ([`StoreError::NotFound`]).
    pub async fn create_task(
        &self,
        tenant: TenantId,
        session: Option<SessionId>,
        title: &str,
    ) -> Result<Task, StoreError> {
        let title = title.trim();
        if title.is_empty() || title.chars().count() > 500 {
            return Err(StoreError::Invalid("a task title has 1 to 500 characters".into()));
        }
        let row: Option<TaskRow> = sqlx::query_as(&format!(
            "INSERT INTO tasks (id, tenant_id, session_id, title) \
             SELECT $1, $2, $3, $4 WHERE $3::uuid IS NULL \
                OR EXISTS (SELECT 1 FROM sessions WHERE id = $3 AND tenant_id = $2) \
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(TaskId::random())
        .bind(tenant.0)
        .bind(session)
        .bind(title)
        .fetch_optional(self.pool())
        .await?;
        row.map(Task::from).ok_or_else(|| match session {
            Some(s) => StoreError::NotFound(format!("session {s}")),
            None => StoreError::NotFound("tenant".into()),
        })
    }

    /// The task of this tenant's client session `client_session` (a run id the client sends on
    /// its own, such as Codex's `session-id` header), opened now with `title` if there is none;
    /// an open one is marked active. The same id from another tenant is another task.
    pub async fn task_for_client_session(
        &self,
        tenant: TenantId,
        client_session: &str,
        title: &str,
    ) -> Result<Task, StoreError> {
        if client_session.is_empty() || client_session.len() > CLIENT_SESSION_MAX {
            return Err(StoreError::Invalid(format!("a client session id has 1 to {CLIENT_SESSION_MAX} bytes")));
        }
        let title: String = title.trim().chars().take(500).collect();
        if title.is_empty() {
            return Err(StoreError::Invalid("a task title has 1 to 500 characters".into()));
        }
        let row: TaskRow = sqlx::query_as(&format!(
            "INSERT INTO tasks (id, tenant_id, title, client_session) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id, client_session) DO UPDATE SET last_active_at = \
                CASE WHEN tasks.status = 'open' THEN now() ELSE tasks.last_active_at END \
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(TaskId::random())
        .bind(tenant.0)
        .bind(&title)
        .bind(client_session)
        .fetch_one(self.pool())
        .await?;
        Ok(row.into())
    }

    /// This tenant's task for a client session id, if the server opened one.
    pub async fn task_by_client_session(
        &self,
        tenant: TenantId,
        client_session: &str,
    ) -> Result<Option<Task>, StoreError> {
        let row: Option<TaskRow> =
            sqlx::query_as(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE tenant_id = $1 AND client_session = $2"))
                .bind(tenant.0)
                .bind(client_session)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(Task::from))
    }

    /// This tenant's newest tasks, at most `limit`.
    pub async fn recent_tasks(&self, tenant: TenantId, limit: i64) -> Result<Vec<Task>, StoreError> {
        let rows: Vec<TaskRow> = sqlx::query_as(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE tenant_id = $1 ORDER BY created_at DESC, id LIMIT $2"
        ))
        .bind(tenant.0)
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(Task::from).collect())
    }

    /// A task of this tenant (`None` for another tenant's).
    pub async fn task(&self, tenant: TenantId, id: TaskId) -> Result<Option<Task>, StoreError> {
        let row: Option<TaskRow> =
            sqlx::query_as(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1 AND tenant_id = $2"))
                .bind(id)
                .bind(tenant.0)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(Task::from))
    }

    /// Marks an open task active now (a request carried it).
    pub async fn touch_task(&self, task: OwnedTask) -> Result<(), StoreError> {
        sqlx::query("UPDATE tasks SET last_active_at = now() WHERE id = $1 AND tenant_id = $2 AND status = 'open'")
            .bind(task.id)
            .bind(task.tenant)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Records a task's outcome, once.
    pub async fn close_task(
        &self,
        tenant: TenantId,
        id: TaskId,
        status: TaskStatus,
        evidence: Option<&serde_json::Value>,
    ) -> Result<Task, OutcomeError> {
        if status == TaskStatus::Open {
            return Err(StoreError::Invalid("an outcome is succeeded, failed or abandoned".into()).into());
        }
        let row: Option<TaskRow> = sqlx::query_as(&format!(
            "UPDATE tasks SET status = $3, evidence = $4, closed_at = now() \
             WHERE id = $1 AND tenant_id = $2 AND status = 'open' RETURNING {TASK_COLUMNS}"
        ))
        .bind(id)
        .bind(tenant.0)
        .bind(status)
        .bind(evidence.map(sqlx::types::Json))
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::from)?;
        match row {
            Some(r) => Ok(r.into()),
            None => match self.task(tenant, id).await? {
                Some(t) => Err(OutcomeError::AlreadyClosed(t.status.as_str())),
                None => Err(OutcomeError::NotFound),
            },
        }
    }

    /// How many ledger rows a task of this tenant has, and their cost.
    pub async fn task_cost(&self, tenant: TenantId, task: TaskId) -> Result<(i64, f64), StoreError> {
        let row: (i64, f64) = sqlx::query_as(
            "SELECT count(*), COALESCE(sum(cost), 0)::float8 FROM requests WHERE tenant_id = $1 AND task_id = $2",
        )
        .bind(tenant.0)
        .bind(task)
        .fetch_one(self.pool())
        .await?;
        Ok(row)
    }

    /// Marks every open task idle since before `cutoff` abandoned; returns how many.
    pub async fn abandon_idle_tasks(&self, cutoff: DateTime<Utc>) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE tasks SET status = 'abandoned', closed_at = now(), \
             evidence = '{\"reason\": \"idle\"}'::jsonb WHERE status = 'open' AND last_active_at < $1",
        )
        .bind(cutoff)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }
}
