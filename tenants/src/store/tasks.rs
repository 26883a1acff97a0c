//! Tasks: a unit of work an agent attempts, closed once with its outcome.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Store, StoreError};
use crate::model::TenantId;

/// Where a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Open,
    Succeeded,
    Failed,
    Abandoned,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Open => "open",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Abandoned => "abandoned",
        }
    }

    fn parse(s: &str) -> TaskStatus {
        match s {
            "succeeded" => TaskStatus::Succeeded,
            "failed" => TaskStatus::Failed,
            "abandoned" => TaskStatus::Abandoned,
            _ => TaskStatus::Open,
        }
    }
}

/// A task.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Task {
    pub id: Uuid,
    pub tenant: TenantId,
    pub session_id: Option<Uuid>,
    pub title: String,
    pub status: TaskStatus,
    pub evidence: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub last_active_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct TaskRow {
    id: Uuid,
    tenant_id: Uuid,
    session_id: Option<Uuid>,
    title: String,
    status: String,
    evidence: Option<sqlx::types::Json<serde_json::Value>>,
    created_at: DateTime<Utc>,
    last_active_at: DateTime<Utc>,
    closed_at: Option<DateTime<Utc>>,
}

impl From<TaskRow> for Task {
    fn from(r: TaskRow) -> Task {
        Task {
            id: r.id,
            tenant: TenantId(r.tenant_id),
            session_id: r.session_id,
            title: r.title,
            status: TaskStatus::parse(&r.status),
            evidence: r.evidence.map(|e| e.0),
            created_at: r.created_at,
            last_active_at: r.last_active_at,
            closed_at: r.closed_at,
        }
    }
}

const TASK_COLUMNS: &str = "id, tenant_id, session_id, title, status, evidence, created_at, last_active_at, closed_at";

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
    pub async fn create_task(&self, tenant: TenantId, session: Option<Uuid>, title: &str) -> Result<Task, StoreError> {
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
        .bind(Uuid::new_v4())
        .bind(tenant.0)
        .bind(session)
        .bind(title)
        .fetch_optional(self.pool())
        .await?;
        row.map(Task::from).ok_or_else(|| StoreError::NotFound(format!("session {}", session.unwrap_or_default())))
    }

    /// A task of this tenant (`None` for another tenant's).
    pub async fn task(&self, tenant: TenantId, id: Uuid) -> Result<Option<Task>, StoreError> {
        let row: Option<TaskRow> =
            sqlx::query_as(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1 AND tenant_id = $2"))
                .bind(id)
                .bind(tenant.0)
                .fetch_optional(self.pool())
                .await?;
        Ok(row.map(Task::from))
    }

    /// Marks an open task active now (a request carried it).
    pub async fn touch_task(&self, id: Uuid) -> Result<(), StoreError> {
        sqlx::query("UPDATE tasks SET last_active_at = now() WHERE id = $1 AND status = 'open'")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Records a task's outcome, once.
    pub async fn close_task(
        &self,
        tenant: TenantId,
        id: Uuid,
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
        .bind(status.as_str())
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
    pub async fn task_cost(&self, tenant: TenantId, task: Uuid) -> Result<(i64, f64), StoreError> {
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
