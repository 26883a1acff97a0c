//! What one replica changes, every replica hears of, through Postgres `LISTEN`/`NOTIFY`.
//!
//! Each replica keeps its own engine (and prefix cache) and its own repository mirrors, so three
//! changes must reach them all:
//! - a push webhook, received by one replica, which applies it to its own engine and records it
//!   ([`Store::record_invalidation`]): the others apply the same push to their caches (their
//!   mirror fetches, the changed files' spans are invalidated, a branch they serve is pre-warmed);
//! - a deleted tenant ([`Store::delete_tenant`]): every replica purges its cache namespace;
//! - a deleted repository ([`Store::delete_repository`]): every replica removes its mirror;
//! - a public prefix registered or removed ([`Store::add_public_prefix`]): every replica reloads
//!   the list.
//!
//! The notice is sent inside the change's transaction, so Postgres delivers it at commit and
//! never for a change that rolled back. A push names its origin replica, which skips its own;
//! deletions go to every replica, the deleting one included (applying one twice does nothing).
//! When the listening connection drops, notices sent meanwhile are lost, so after reconnecting
//! the listener reads what was recorded since: invalidations above the last id it saw, tenants
//! and repositories deleted since it last listened (some may come twice; that is harmless).
//! Nothing about correctness depends on any of this — the cache matches tokens exactly and
//! tenant tokens are checked against the database — it frees memory early and pre-warms.

use super::repos::InvalidationRow;
use super::{Invalidation, Store, StoreError};
use crate::ids::{RepoId, TenantId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use uuid::Uuid;

/// The notification channel.
pub const CHANNEL: &str = "cachet_changes";

/// The payload of one notice.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum Notice {
    Invalidation { id: i64, origin: Uuid },
    TenantDeleted { tenant: TenantId },
    RepositoryDeleted { repo: RepoId },
    PublicPrefixes,
}

/// Sends `notice` when `tx` commits.
pub(super) async fn notify(tx: &mut sqlx::PgConnection, notice: &Notice) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(serde_json::to_string(notice).expect("a notice serializes"))
        .execute(tx)
        .await?;
    Ok(())
}

/// A change another replica (or the command line) made that this replica must apply.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A push that another replica received and applied to its own cache.
    Invalidation(Invalidation),
    TenantDeleted(TenantId),
    RepositoryDeleted(RepoId),
    /// The registered public prefixes changed (or may have, while the listener was away).
    PublicPrefixes,
}

/// Receives the changes to apply.
pub struct ChangeListener {
    listener: PgListener,
    store: Store,
    origin: Uuid,
    /// The highest invalidation id seen (notified or read).
    last_id: i64,
    /// The database's clock when the current connection started listening.
    listening_since: DateTime<Utc>,
    /// The connection dropped: listen on a new one, then read what was missed.
    reconnect: bool,
    /// Read what was missed since this time (and above `last_id`).
    catch_up: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for ChangeListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChangeListener").field("origin", &self.origin).field("last_id", &self.last_id).finish()
    }
}

/// Listens on a new connection; returns it with the database's clock, read after `LISTEN`.
async fn listen(store: &Store) -> Result<(PgListener, DateTime<Utc>), StoreError> {
    let mut listener = PgListener::connect_with(store.pool()).await?;
    listener.listen(CHANNEL).await?;
    let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(store.pool()).await?;
    Ok((listener, now))
}

const SELECT_INVALIDATION: &str =
    "SELECT id, repo_id, delivery_id, ref AS git_ref, before, after, paths, evicted_tokens, prewarmed \
     FROM invalidations";

impl Store {
    /// Starts listening for the changes that replicas other than `origin` (and the command line)
    /// make from now on.
    pub async fn listen_changes(&self, origin: Uuid) -> Result<ChangeListener, StoreError> {
        let (listener, listening_since) = listen(self).await?;
        // Read after LISTEN: whatever commits from here on is either notified or above this id.
        let last_id: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM invalidations").fetch_one(self.pool()).await?;
        Ok(ChangeListener {
            listener,
            store: self.clone(),
            origin,
            last_id,
            listening_since,
            reconnect: false,
            catch_up: None,
        })
    }

    /// One invalidation by id (the fan-out reads it; no tenant scope: replicas act for all).
    pub async fn invalidation(&self, id: i64) -> Result<Option<Invalidation>, StoreError> {
        let row: Option<InvalidationRow> = sqlx::query_as(&format!("{SELECT_INVALIDATION} WHERE id = $1"))
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.map(Invalidation::from))
    }

    /// What changed after invalidation `last_id` and since `since`, oldest invalidation first;
    /// also the new highest invalidation id.
    async fn changes_since(&self, last_id: i64, since: DateTime<Utc>) -> Result<(Vec<Change>, i64), StoreError> {
        let rows: Vec<InvalidationRow> = sqlx::query_as(&format!("{SELECT_INVALIDATION} WHERE id > $1 ORDER BY id"))
            .bind(last_id)
            .fetch_all(self.pool())
            .await?;
        let top = rows.last().map_or(last_id, |r| r.id);
        let tenants: Vec<TenantId> = sqlx::query_scalar("SELECT id FROM tenants WHERE deleted_at >= $1")
            .bind(since)
            .fetch_all(self.pool())
            .await?;
        let repos: Vec<RepoId> = sqlx::query_scalar("SELECT id FROM repositories WHERE deleted_at >= $1")
            .bind(since)
            .fetch_all(self.pool())
            .await?;
        let mut changes: Vec<Change> = rows.into_iter().map(|r| Change::Invalidation(r.into())).collect();
        changes.extend(tenants.into_iter().map(Change::TenantDeleted));
        changes.extend(repos.into_iter().map(Change::RepositoryDeleted));
        // Reloading the public prefixes costs one small query: do it whenever notices may have been missed.
        changes.push(Change::PublicPrefixes);
        Ok((changes, top))
    }
}

impl ChangeListener {
    /// The next changes to apply: the one just notified or, after the connection dropped, those
    /// made meanwhile. An `Err` leaves the listener usable: call again after a pause (the
    /// connection is re-established on the next call).
    pub async fn next(&mut self) -> Result<Vec<Change>, StoreError> {
        loop {
            if self.reconnect {
                // Listen again before reading what was missed, so nothing falls in between.
                let (listener, now) = listen(&self.store).await?;
                self.listener = listener;
                self.catch_up = Some(self.listening_since);
                self.listening_since = now;
                self.reconnect = false;
            }
            if let Some(since) = self.catch_up {
                let (changes, top) = self.store.changes_since(self.last_id, since).await?;
                self.catch_up = None;
                self.last_id = top;
                if !changes.is_empty() {
                    return Ok(changes);
                }
                continue;
            }
            let note = match self.listener.try_recv().await {
                Ok(Some(note)) => note,
                Ok(None) => {
                    tracing::warn!("the change listener lost its connection; reconnecting");
                    self.reconnect = true;
                    continue;
                }
                Err(e) => {
                    self.reconnect = true;
                    return Err(e.into());
                }
            };
            let notice: Notice = match serde_json::from_str(note.payload()) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(payload = note.payload(), "ignoring a malformed change notice: {e}");
                    continue;
                }
            };
            match notice {
                Notice::TenantDeleted { tenant } => return Ok(vec![Change::TenantDeleted(tenant)]),
                Notice::RepositoryDeleted { repo } => return Ok(vec![Change::RepositoryDeleted(repo)]),
                Notice::PublicPrefixes => return Ok(vec![Change::PublicPrefixes]),
                Notice::Invalidation { id, origin } => {
                    self.last_id = self.last_id.max(id);
                    if origin == self.origin {
                        continue;
                    }
                    match self.store.invalidation(id).await? {
                        Some(inv) => return Ok(vec![Change::Invalidation(inv)]),
                        None => tracing::warn!(id, "a notified invalidation is not in the database"),
                    }
                }
            }
        }
    }
}
