//! Repositories, their webhook deliveries and the invalidations pushes caused.
//!
//! Reads that a tenant makes take its [`TenantId`]; the webhook path, which is authenticated by
//! the repository's HMAC secret instead of a tenant token, looks a repository up by id alone.

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use uuid::Uuid;

use super::{Store, StoreError};
use crate::ids::{RepoId, SessionId, TenantId};
use crate::words::text_enum;
use crate::Secret;

/// A registered repository.
#[derive(Clone, Debug, PartialEq)]
pub struct Repository {
    pub id: RepoId,
    pub tenant: TenantId,
    pub name: String,
    /// The clone URL or local path as registered.
    pub source: String,
    /// Unknown while the registration fetches (unless the tenant named it); always known once
    /// ready.
    pub default_branch: Option<String>,
    /// The push webhook's HMAC key (given to the tenant once, at registration).
    pub webhook_secret: Secret,
    /// How the repository's context is built (the context crate's options, as JSON).
    pub options: serde_json::Value,
    pub created_at: DateTime<Utc>,
    /// Where its registration stands.
    pub status: RepoStatus,
    /// Why the registration failed (words the tenant may see).
    pub error: Option<String>,
}

text_enum!(
    /// Where a repository's registration stands: it is a job that outlives its HTTP request.
    RepoStatus, "repository status" {
        /// Its mirror is being fetched.
        Fetching = "fetching",
        /// Usable.
        Ready = "ready",
        /// The fetch failed; the row stays so the tenant sees why, the name is free again.
        Failed = "failed",
    }
);

/// What [`Store::create_repository`] needs.
#[derive(Clone, Debug)]
pub struct NewRepository<'a> {
    /// Chosen by the caller (the mirror is named after it).
    pub id: RepoId,
    pub tenant: TenantId,
    pub name: &'a str,
    pub source: &'a str,
    /// As the tenant named it (else found by the fetch).
    pub default_branch: Option<&'a str>,
    pub webhook_secret: &'a str,
    pub options: &'a serde_json::Value,
}

/// One push's effect on the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct Invalidation {
    pub repo: RepoId,
    pub delivery_id: String,
    pub git_ref: String,
    pub before: String,
    pub after: String,
    pub paths: Vec<String>,
    pub evicted_tokens: i64,
    pub prewarmed: i32,
}

#[derive(sqlx::FromRow)]
struct RepoRow {
    id: RepoId,
    tenant_id: TenantId,
    name: String,
    source: String,
    default_branch: Option<String>,
    webhook_secret: String,
    options: Json<serde_json::Value>,
    created_at: DateTime<Utc>,
    status: RepoStatus,
    error: Option<String>,
}

impl From<RepoRow> for Repository {
    fn from(r: RepoRow) -> Repository {
        Repository {
            id: r.id,
            tenant: r.tenant_id,
            name: r.name,
            source: r.source,
            default_branch: r.default_branch,
            webhook_secret: Secret::new(r.webhook_secret),
            options: r.options.0,
            created_at: r.created_at,
            status: r.status,
            error: r.error,
        }
    }
}

const REPO_COLUMNS: &str =
    "id, tenant_id, name, source, default_branch, webhook_secret, options, created_at, status, error";

impl Store {
    /// Registers a repository, `fetching` until [`Store::repository_fetched`] or
    /// [`Store::repository_failed`]. The name must be unique among the tenant's live repositories
    /// ([`StoreError::Conflict`]); an unknown tenant is [`StoreError::NotFound`].
    pub async fn create_repository(&self, new: &NewRepository<'_>) -> Result<Repository, StoreError> {
        let name = new.name.trim();
        if name.is_empty() || name.chars().count() > 200 {
            return Err(StoreError::Invalid("a repository name has 1 to 200 characters".into()));
        }
        let row: RepoRow = sqlx::query_as(&format!(
            "INSERT INTO repositories (id, tenant_id, name, source, default_branch, webhook_secret, options, status) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'fetching') RETURNING {REPO_COLUMNS}"
        ))
        .bind(new.id)
        .bind(new.tenant.0)
        .bind(name)
        .bind(new.source)
        .bind(new.default_branch)
        .bind(new.webhook_secret)
        .bind(Json(new.options))
        .fetch_one(self.pool())
        .await
        .map_err(|e| match StoreError::from(e) {
            StoreError::Conflict(_) => StoreError::Conflict(format!("a repository named {name:?} already exists")),
            other => other,
        })?;
        Ok(row.into())
    }

    /// A live repository of this tenant (`None` for another tenant's).
    pub async fn repository(&self, tenant: TenantId, id: RepoId) -> Result<Option<Repository>, StoreError> {
        let row: Option<RepoRow> = sqlx::query_as(&format!(
            "SELECT {REPO_COLUMNS} FROM repositories WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL"
        ))
        .bind(id)
        .bind(tenant.0)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(Repository::from))
    }

    /// A registration's fetch is done: the repository is ready with this default branch. False
    /// if it was not fetching any more (deleted meanwhile, or failed).
    pub async fn repository_fetched(&self, id: RepoId, default_branch: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE repositories SET status = 'ready', default_branch = $2, updated_at = now() \
             WHERE id = $1 AND status = 'fetching' AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(default_branch)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// A registration's fetch failed, for `error` (words the tenant may see). The row stays (the
    /// tenant sees why), its name is free again.
    pub async fn repository_failed(&self, id: RepoId, error: &str) -> Result<(), StoreError> {
        let error: String = error.chars().take(1000).collect();
        sqlx::query(
            "UPDATE repositories SET status = 'failed', error = $2, updated_at = now() \
             WHERE id = $1 AND status = 'fetching'",
        )
        .bind(id)
        .bind(error)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Registrations left `fetching` for longer than `stale` (their process died, or their job
    /// was lost): each is claimed (its clock restarts, so one replica takes it) and returned for
    /// its fetch to run again.
    pub async fn claim_stale_registrations(&self, stale: std::time::Duration) -> Result<Vec<Repository>, StoreError> {
        let rows: Vec<RepoRow> = sqlx::query_as(&format!(
            "UPDATE repositories SET updated_at = now() WHERE id IN ( \
               SELECT id FROM repositories WHERE status = 'fetching' AND deleted_at IS NULL \
               AND updated_at < now() - make_interval(secs => $1) FOR UPDATE SKIP LOCKED) \
             RETURNING {REPO_COLUMNS}"
        ))
        .bind(stale.as_secs_f64())
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(Repository::from).collect())
    }

    /// A live repository by id alone, for the webhook (which proves itself with the secret).
    pub async fn repository_for_webhook(&self, id: RepoId) -> Result<Option<Repository>, StoreError> {
        let row: Option<RepoRow> = sqlx::query_as(&format!(
            "SELECT {REPO_COLUMNS} FROM repositories r WHERE id = $1 AND deleted_at IS NULL \
             AND EXISTS (SELECT 1 FROM tenants t WHERE t.id = r.tenant_id AND t.deleted_at IS NULL)"
        ))
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(Repository::from))
    }

    /// Every live, ready repository whose working tree is watched (`"watch": true` in its
    /// options), of every tenant whose account is live.
    pub async fn watched_repositories(&self) -> Result<Vec<Repository>, StoreError> {
        let rows: Vec<RepoRow> = sqlx::query_as(&format!(
            "SELECT {REPO_COLUMNS} FROM repositories r WHERE deleted_at IS NULL AND status = 'ready' \
             AND options->>'watch' = 'true' \
             AND EXISTS (SELECT 1 FROM tenants t WHERE t.id = r.tenant_id AND t.deleted_at IS NULL) ORDER BY created_at, id"
        ))
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(Repository::from).collect())
    }

    /// The tenant's live repositories, oldest first.
    pub async fn repositories(&self, tenant: TenantId) -> Result<Vec<Repository>, StoreError> {
        let rows: Vec<RepoRow> = sqlx::query_as(&format!(
            "SELECT {REPO_COLUMNS} FROM repositories WHERE tenant_id = $1 AND deleted_at IS NULL ORDER BY created_at, id"
        ))
        .bind(tenant.0)
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(Repository::from).collect())
    }

    /// Soft-deletes a repository and closes its open sessions; returns the ids of the sessions
    /// it closed, or `None` if the repository is unknown, deleted or another tenant's. Every
    /// replica hears of it at commit (`fanout`) and removes its mirror.
    pub async fn delete_repository(&self, tenant: TenantId, id: RepoId) -> Result<Option<Vec<SessionId>>, StoreError> {
        let mut tx = self.pool().begin().await?;
        let done = sqlx::query(
            "UPDATE repositories SET deleted_at = now() WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(tenant.0)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            return Ok(None);
        }
        let closed: Vec<(SessionId,)> = sqlx::query_as(
            "UPDATE sessions SET closed_at = now() WHERE repo_id = $1 AND closed_at IS NULL RETURNING id",
        )
        .bind(id)
        .fetch_all(&mut *tx)
        .await?;
        super::fanout::notify(&mut tx, &super::fanout::Notice::RepositoryDeleted { repo: id }).await?;
        tx.commit().await?;
        Ok(Some(closed.into_iter().map(|(id,)| id).collect()))
    }

    /// Replaces the webhook secret of the tenant's repository; false if the repository is
    /// unknown, deleted or another tenant's.
    pub async fn set_webhook_secret(&self, tenant: TenantId, id: RepoId, secret: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE repositories SET webhook_secret = $3 WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL",
        )
        .bind(id)
        .bind(tenant.0)
        .bind(secret)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Whether a delivery of `repo` was recorded already (a webhook checks before applying a
    /// push; [`Store::record_delivery`] decides for good afterwards).
    pub async fn delivery_recorded(&self, repo: RepoId, delivery_id: &str) -> Result<bool, StoreError> {
        let seen: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM webhook_deliveries WHERE repo_id = $1 AND delivery_id = $2)",
        )
        .bind(repo)
        .bind(delivery_id)
        .fetch_one(self.pool())
        .await?;
        Ok(seen)
    }

    /// Records a webhook delivery inside `tx`. Returns `false` if this delivery id was already
    /// recorded for the repository (a redelivery). Concurrent duplicates wait for the first
    /// transaction and then see it, so committing the transaction only after the push has been
    /// applied makes a failed attempt retryable and a successful one happen once.
    pub async fn record_delivery(
        tx: &mut sqlx::PgConnection,
        repo: RepoId,
        delivery_id: &str,
        event: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO webhook_deliveries (repo_id, delivery_id, event) VALUES ($1, $2, $3) \
             ON CONFLICT (repo_id, delivery_id) DO NOTHING",
        )
        .bind(repo)
        .bind(delivery_id)
        .bind(event)
        .execute(tx)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records what a push invalidated (inside the delivery's transaction) and notifies every
    /// replica listening on [`super::fanout::CHANNEL`]; Postgres delivers the notice when the
    /// transaction commits, and never if it rolls back. `origin` names the recording replica,
    /// which has applied the push already. Returns the invalidation's id.
    pub async fn record_invalidation(
        tx: &mut sqlx::PgConnection,
        inv: &Invalidation,
        origin: Uuid,
    ) -> Result<i64, StoreError> {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO invalidations (repo_id, delivery_id, ref, before, after, paths, evicted_tokens, prewarmed) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
        )
        .bind(inv.repo)
        .bind(&inv.delivery_id)
        .bind(&inv.git_ref)
        .bind(&inv.before)
        .bind(&inv.after)
        .bind(&inv.paths)
        .bind(inv.evicted_tokens)
        .bind(inv.prewarmed)
        .fetch_one(&mut *tx)
        .await?;
        super::fanout::notify(tx, &super::fanout::Notice::Invalidation { id, origin }).await?;
        Ok(id)
    }

    /// A repository's invalidations, newest first (at most `limit`).
    pub async fn invalidations(
        &self,
        tenant: TenantId,
        repo: RepoId,
        limit: i64,
    ) -> Result<Vec<Invalidation>, StoreError> {
        let rows: Vec<InvalidationRow> = sqlx::query_as(
            "SELECT i.id, i.repo_id, i.delivery_id, i.ref AS git_ref, i.before, i.after, i.paths, i.evicted_tokens, \
             i.prewarmed FROM invalidations i JOIN repositories r ON r.id = i.repo_id \
             WHERE i.repo_id = $1 AND r.tenant_id = $2 ORDER BY i.id DESC LIMIT $3",
        )
        .bind(repo)
        .bind(tenant.0)
        .bind(limit.max(0))
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(Invalidation::from).collect())
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct InvalidationRow {
    pub id: i64,
    repo_id: RepoId,
    delivery_id: String,
    git_ref: String,
    before: String,
    after: String,
    paths: Vec<String>,
    evicted_tokens: i64,
    prewarmed: i32,
}

impl From<InvalidationRow> for Invalidation {
    fn from(r: InvalidationRow) -> Invalidation {
        Invalidation {
            repo: r.repo_id,
            delivery_id: r.delivery_id,
            git_ref: r.git_ref,
            before: r.before,
            after: r.after,
            paths: r.paths,
            evicted_tokens: r.evicted_tokens,
            prewarmed: r.prewarmed,
        }
    }
}
