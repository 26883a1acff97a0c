//! The Postgres store of everything a tenant owns (sqlx, runtime-checked queries).
//!
//! Every query that reads tenant-owned rows takes the [`TenantId`] and filters by it: a tenant
//! can never read another tenant's rows through this type.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::error::ErrorKind;
use sqlx::migrate::MigrateError;
use sqlx::postgres::PgPoolOptions;
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, QueryBuilder};

use crate::ids::{RequestId, SessionId, TaskId, TenantId};
use crate::model::{Plan, Tenant, UsageRecord};
use crate::words::{Endpoint, FinishReason, RequestStatus, SloClass};

pub mod fanout;
mod prefixes;
mod reports;
mod repos;
mod sessions;
mod sign_in;
mod tasks;

pub use prefixes::PublicPrefixRow;
pub use repos::{Invalidation, NewRepository, RepoStatus, Repository};
pub use sessions::{NewTurn, OwnedSession, Role, Session, Turn};
pub use sign_in::SignInSubject;
pub use tasks::{OutcomeError, OwnedTask, Task, TaskStatus, CLIENT_SESSION_MAX};

/// How long an operation waits for a connection before the store reports Postgres as unavailable.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// The most connections [`Store::connect`] opens.
pub const MAX_CONNECTIONS: u32 = 8;
/// The longest accepted tenant name, in characters.
pub const MAX_TENANT_NAME: usize = 200;

/// Rows per `INSERT` statement in [`Store::insert_usage`] (20 binds each, below Postgres' 65,535).
const USAGE_ROWS_PER_STATEMENT: usize = 1000;

/// What went wrong talking to Postgres.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Postgres cannot be reached: connection refused or lost, a timeout, the server shutting
    /// down, or the pool closed. Retrying later may succeed (HTTP 503).
    #[error("database unavailable: {message}")]
    Unavailable {
        message: String,
        /// sqlx's error, where there was one.
        #[source]
        source: Option<sqlx::Error>,
    },
    /// Postgres answered with an error that is not one of the kinds below.
    #[error("database error: {message}")]
    Database {
        message: String,
        /// sqlx's (or a stored value's decoding) error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// A row the operation needs does not exist (e.g. usage for an unknown tenant).
    #[error("not found: {0}")]
    NotFound(String),
    /// The change conflicts with an existing row (e.g. a live tenant already has that name).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The input breaks a rule of the schema (empty name, negative tokens, share outside 0..=1).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// Applying the migrations failed.
    #[error("migration failed: {0}")]
    Migration(String),
}

impl StoreError {
    /// Whether this is [`StoreError::Unavailable`]: the database is down or unreachable.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> StoreError {
        match err {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable { message: err.to_string(), source: Some(err) },
            sqlx::Error::RowNotFound => StoreError::NotFound(err.to_string()),
            sqlx::Error::Migrate(e) => StoreError::from(*e),
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default().into_owned();
                let message = db.message().to_owned();
                let kind = db.kind();
                let err = sqlx::Error::Database(db);
                match kind {
                    ErrorKind::UniqueViolation => StoreError::Conflict(message),
                    ErrorKind::ForeignKeyViolation => StoreError::NotFound(message),
                    ErrorKind::CheckViolation | ErrorKind::NotNullViolation => StoreError::Invalid(message),
                    // Class 08: connection exception; 57P0x: admin/crash shutdown, cannot connect now.
                    _ if code.starts_with("08") || code.starts_with("57P") => {
                        StoreError::Unavailable { message, source: Some(err) }
                    }
                    _ => StoreError::Database {
                        message: format!("{message} (SQLSTATE {code})"),
                        source: Some(Box::new(err)),
                    },
                }
            }
            other => StoreError::Database { message: other.to_string(), source: Some(Box::new(other)) },
        }
    }
}

impl From<MigrateError> for StoreError {
    fn from(err: MigrateError) -> StoreError {
        match err {
            MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _) => match StoreError::from(e) {
                unavailable @ StoreError::Unavailable { .. } => unavailable,
                other => StoreError::Migration(other.to_string()),
            },
            other => StoreError::Migration(other.to_string()),
        }
    }
}

/// The Postgres store. Cheap to clone: clones share one connection pool.
#[derive(Clone, Debug)]
pub struct Store {
    pool: PgPool,
}

#[derive(sqlx::FromRow)]
struct TenantRow {
    id: TenantId,
    name: String,
    plan: Json<Plan>,
    created_at: DateTime<Utc>,
    deleted_at: Option<DateTime<Utc>>,
}

impl From<TenantRow> for Tenant {
    fn from(row: TenantRow) -> Tenant {
        Tenant { id: row.id, name: row.name, plan: row.plan.0, created_at: row.created_at, deleted_at: row.deleted_at }
    }
}

#[derive(sqlx::FromRow)]
struct UsageRow {
    id: RequestId,
    tenant_id: TenantId,
    session_id: Option<SessionId>,
    task_id: Option<TaskId>,
    model: String,
    endpoint: Endpoint,
    prompt_tokens: i64,
    cached_tokens: i64,
    computed_tokens: i64,
    output_tokens: i64,
    queue_ms: f64,
    ttft_ms: Option<f64>,
    e2e_ms: f64,
    compute_seconds: f64,
    cost: f64,
    status: RequestStatus,
    finish_reason: Option<FinishReason>,
    created_at: DateTime<Utc>,
    slo_class: Option<SloClass>,
    slo_met: Option<bool>,
    kv_transfer_ms: Option<f64>,
    drafted_tokens: i64,
    accepted_tokens: i64,
}

impl From<UsageRow> for UsageRecord {
    fn from(r: UsageRow) -> UsageRecord {
        UsageRecord {
            id: r.id,
            tenant: r.tenant_id,
            session_id: r.session_id,
            task_id: r.task_id,
            model: r.model,
            endpoint: r.endpoint,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens,
            computed_tokens: r.computed_tokens,
            output_tokens: r.output_tokens,
            queue_ms: r.queue_ms,
            ttft_ms: r.ttft_ms,
            e2e_ms: r.e2e_ms,
            compute_seconds: r.compute_seconds,
            cost: r.cost,
            status: r.status,
            finish_reason: r.finish_reason,
            created_at: r.created_at,
            slo_class: r.slo_class,
            slo_met: r.slo_met,
            kv_transfer_ms: r.kv_transfer_ms,
            drafted_tokens: r.drafted_tokens,
            accepted_tokens: r.accepted_tokens,
        }
    }
}

const TENANT_COLUMNS: &str = "id, name, plan, created_at, deleted_at";
const USAGE_COLUMNS: &str = "id, tenant_id, session_id, task_id, model, endpoint, prompt_tokens, cached_tokens, \
     computed_tokens, output_tokens, queue_ms, ttft_ms, e2e_ms, compute_seconds, cost, status, finish_reason, created_at, \
     slo_class, slo_met, kv_transfer_ms, drafted_tokens, accepted_tokens";

fn check_name(name: &str) -> Result<&str, StoreError> {
    let name = name.trim();
    if name.is_empty() {
        return Err(StoreError::Invalid("tenant name is empty".into()));
    }
    if name.chars().count() > MAX_TENANT_NAME {
        return Err(StoreError::Invalid(format!("tenant name is longer than {MAX_TENANT_NAME} characters")));
    }
    Ok(name)
}

impl Store {
    /// Connects a small pool ([`MAX_CONNECTIONS`]) to `url`. Every operation waits at most
    /// [`ACQUIRE_TIMEOUT`] for a connection, so a database that is down fails fast with
    /// [`StoreError::Unavailable`] instead of hanging.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let pool =
            PgPoolOptions::new().max_connections(MAX_CONNECTIONS).acquire_timeout(ACQUIRE_TIMEOUT).connect(url).await?;
        Ok(Store { pool })
    }

    /// Wraps an existing pool.
    pub fn from_pool(pool: PgPool) -> Store {
        Store { pool }
    }

    /// The connection pool, for queries this type does not cover yet.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the migrations in `migrations/` that are not applied yet. Safe to run from several
    /// processes at once (sqlx takes an advisory lock).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("../migrations").run(&self.pool).await?;
        Ok(())
    }

    /// Checks that the database answers (`SELECT 1`).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Creates a tenant with a snapshot of `plan`. The name is trimmed and must be unique among
    /// live tenants ([`StoreError::Conflict`] otherwise).
    pub async fn create_tenant(&self, name: &str, plan: &Plan) -> Result<Tenant, StoreError> {
        let name = check_name(name)?;
        plan.validate().map_err(StoreError::Invalid)?;
        let row: TenantRow = sqlx::query_as(&format!(
            "INSERT INTO tenants (id, name, plan) VALUES ($1, $2, $3) RETURNING {TENANT_COLUMNS}"
        ))
        .bind(TenantId::random())
        .bind(name)
        .bind(Json(plan))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| match StoreError::from(e) {
            StoreError::Conflict(_) => StoreError::Conflict(format!("a tenant named {name:?} already exists")),
            other => other,
        })?;
        Ok(row.into())
    }

    /// The live tenants, oldest first.
    pub async fn list_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let rows: Vec<TenantRow> = sqlx::query_as(&format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE deleted_at IS NULL ORDER BY created_at, id"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(Tenant::from).collect())
    }

    /// The tenant with this id, deleted or not (check [`Tenant::deleted_at`]).
    pub async fn get_tenant(&self, id: TenantId) -> Result<Option<Tenant>, StoreError> {
        let row: Option<TenantRow> = sqlx::query_as(&format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"))
            .bind(id.0)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Tenant::from))
    }

    /// Soft-deletes a tenant: its rows stay (the ledger is history) and its name becomes free.
    /// Returns `false` if the tenant is unknown or already deleted.
    /// Every replica hears of it at commit (`fanout`) and purges the tenant's cache.
    pub async fn delete_tenant(&self, id: TenantId) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("UPDATE tenants SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL")
            .bind(id.0)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        fanout::notify(&mut tx, &fanout::Notice::TenantDeleted { tenant: id }).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Replaces a live tenant's plan snapshot. Returns `false` if the tenant is unknown or deleted.
    pub async fn set_plan(&self, id: TenantId, plan: &Plan) -> Result<bool, StoreError> {
        plan.validate().map_err(StoreError::Invalid)?;
        let done = sqlx::query("UPDATE tenants SET plan = $2 WHERE id = $1 AND deleted_at IS NULL")
            .bind(id.0)
            .bind(Json(plan))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Marks ledger rows still `running` that have not moved since `before` as `interrupted`
    /// (their process died mid-stream: what they streamed stays billed); returns how many.
    pub async fn interrupt_stale_rows(&self, before: chrono::DateTime<chrono::Utc>) -> Result<u64, StoreError> {
        let done =
            sqlx::query("UPDATE requests SET status = 'interrupted' WHERE status = 'running' AND updated_at < $1")
                .bind(before)
                .execute(&self.pool)
                .await?;
        Ok(done.rows_affected())
    }

    /// Writes rows to the usage ledger in one transaction. Idempotent on the request id: a row
    /// still open (`running`, or `interrupted`) takes the newer state, a final row is never
    /// changed, so a retried batch is safe. Returns the number of rows inserted or updated. An
    /// invalid row rejects the whole batch ([`StoreError::Invalid`]), a row for an unknown tenant
    /// too ([`StoreError::NotFound`]).
    pub async fn insert_usage(&self, rows: &[UsageRecord]) -> Result<u64, StoreError> {
        for row in rows {
            row.validate().map_err(StoreError::Invalid)?;
        }
        if rows.is_empty() {
            return Ok(0);
        }
        // One statement cannot upsert a row twice: of several states of one request in this
        // batch (its opening row, progress, the end), the last one written stands for them.
        let mut last = std::collections::HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            last.insert(r.id, i);
        }
        let rows: Vec<&UsageRecord> =
            rows.iter().enumerate().filter(|(i, r)| last[&r.id] == *i).map(|(_, r)| r).collect();
        let mut tx = self.pool.begin().await?;
        let mut inserted = 0;
        for chunk in rows.chunks(USAGE_ROWS_PER_STATEMENT) {
            let mut insert = QueryBuilder::<Postgres>::new(format!("INSERT INTO requests ({USAGE_COLUMNS}) "));
            insert.push_values(chunk, |mut values, r| {
                values
                    .push_bind(r.id)
                    .push_bind(r.tenant.0)
                    .push_bind(r.session_id)
                    .push_bind(r.task_id)
                    .push_bind(&r.model)
                    .push_bind(r.endpoint)
                    .push_bind(r.prompt_tokens)
                    .push_bind(r.cached_tokens)
                    .push_bind(r.computed_tokens)
                    .push_bind(r.output_tokens)
                    .push_bind(r.queue_ms)
                    .push_bind(r.ttft_ms)
                    .push_bind(r.e2e_ms)
                    .push_bind(r.compute_seconds)
                    .push_bind(r.cost)
                    .push_bind(r.status)
                    .push_bind(r.finish_reason)
                    .push_bind(r.created_at)
                    .push_bind(r.slo_class)
                    .push_bind(r.slo_met)
                    .push_bind(r.kv_transfer_ms)
                    .push_bind(r.drafted_tokens)
                    .push_bind(r.accepted_tokens);
            });
            // A row still open ('running', or 'interrupted' by the sweeper) takes the newer state;
            // a final row never changes.
            insert.push(
                " ON CONFLICT (id) DO UPDATE SET session_id = EXCLUDED.session_id, task_id = EXCLUDED.task_id, \
                 prompt_tokens = EXCLUDED.prompt_tokens, cached_tokens = EXCLUDED.cached_tokens, \
                 computed_tokens = EXCLUDED.computed_tokens, output_tokens = EXCLUDED.output_tokens, \
                 queue_ms = EXCLUDED.queue_ms, ttft_ms = EXCLUDED.ttft_ms, e2e_ms = EXCLUDED.e2e_ms, \
                 compute_seconds = EXCLUDED.compute_seconds, cost = EXCLUDED.cost, status = EXCLUDED.status, \
                 finish_reason = EXCLUDED.finish_reason, slo_class = EXCLUDED.slo_class, slo_met = EXCLUDED.slo_met, \
                 kv_transfer_ms = EXCLUDED.kv_transfer_ms, drafted_tokens = EXCLUDED.drafted_tokens, \
                 accepted_tokens = EXCLUDED.accepted_tokens, \
                 updated_at = now() \
                 WHERE requests.status IN ('running', 'interrupted')",
            );
            inserted += insert.build().execute(&mut *tx).await?.rows_affected();
        }
        tx.commit().await?;
        Ok(inserted)
    }

    /// A tenant's ledger rows, newest first, at most `limit` (negative counts as 0).
    pub async fn usage(&self, tenant: TenantId, limit: i64) -> Result<Vec<UsageRecord>, StoreError> {
        let rows: Vec<UsageRow> = sqlx::query_as(&format!(
            "SELECT {USAGE_COLUMNS} FROM requests WHERE tenant_id = $1 ORDER BY created_at DESC, id LIMIT $2"
        ))
        .bind(tenant.0)
        .bind(limit.max(0))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(UsageRecord::from).collect())
    }

    /// One ledger row of this tenant; `None` if it does not exist or belongs to another tenant.
    pub async fn usage_by_id(&self, tenant: TenantId, id: RequestId) -> Result<Option<UsageRecord>, StoreError> {
        let row: Option<UsageRow> =
            sqlx::query_as(&format!("SELECT {USAGE_COLUMNS} FROM requests WHERE tenant_id = $1 AND id = $2"))
                .bind(tenant.0)
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(UsageRecord::from))
    }
}

#[cfg(test)]
mod error_tests {
    use super::StoreError;
    use std::error::Error;

    /// sqlx's error stays reachable as the source (an operator's `{:#}` shows the chain).
    #[test]
    fn sqlx_errors_are_kept_as_sources() {
        let e = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(e.is_unavailable());
        assert!(e.source().and_then(|s| s.downcast_ref::<sqlx::Error>()).is_some(), "{e:?}");
        let e = StoreError::from(sqlx::Error::ColumnNotFound("x".into()));
        assert!(matches!(e, StoreError::Database { .. }), "{e:?}");
        assert!(e.source().and_then(|s| s.downcast_ref::<sqlx::Error>()).is_some(), "{e:?}");
    }
}
