//! Invalidations fan out to every replica through Postgres `LISTEN`/`NOTIFY`.
//!
//! The replica that receives a push webhook applies it to its own engine and records it
//! ([`Store::record_invalidation`]); the notice goes out with the commit. Every other replica
//! listens ([`Store::listen_invalidations`]) and applies the same push to its own cache: its
//! mirror fetches, the changed files' spans are invalidated, its active sessions pre-warmed.
//!
//! A notice names the invalidation by id and its origin replica (which skips its own). When the
//! listening connection drops, notices sent meanwhile are lost, so after a reconnect the
//! listener reads every invalidation recorded since the last one it saw (its own included:
//! applying a push twice frees nothing more and pre-warms from the cache). Nothing about
//! correctness depends on this — the cache matches tokens exactly, so a stale span is never
//! reused for a prompt built at a newer commit — it frees memory early and pre-warms.

use super::repos::InvalidationRow;
use super::{Invalidation, Store, StoreError};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use uuid::Uuid;

/// The notification channel.
pub const CHANNEL: &str = "cachet_invalidations";

/// The payload of one notice.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Notice {
    pub id: i64,
    pub origin: Uuid,
}

/// Receives the invalidations other replicas record.
pub struct InvalidationListener {
    listener: PgListener,
    store: Store,
    origin: Uuid,
    /// The highest invalidation id seen (notified or read).
    last_id: i64,
    /// The connection dropped: listen on a new one, then read what was missed.
    reconnect: bool,
    catch_up: bool,
}

impl std::fmt::Debug for InvalidationListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InvalidationListener").field("origin", &self.origin).field("last_id", &self.last_id).finish()
    }
}

impl Store {
    /// Starts listening for invalidations that replicas other than `origin` record from now on.
    pub async fn listen_invalidations(&self, origin: Uuid) -> Result<InvalidationListener, StoreError> {
        let listener = listen(self).await?;
        // Read after LISTEN: whatever commits from here on is either notified or above this id.
        let last_id: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM invalidations").fetch_one(self.pool()).await?;
        Ok(InvalidationListener { listener, store: self.clone(), origin, last_id, reconnect: false, catch_up: false })
    }

    /// One invalidation by id (the fan-out reads it; no tenant scope: replicas act for all).
    pub async fn invalidation(&self, id: i64) -> Result<Option<Invalidation>, StoreError> {
        let row: Option<InvalidationRow> = sqlx::query_as(
            "SELECT id, repo_id, delivery_id, ref AS git_ref, before, after, paths, evicted_tokens, prewarmed \
             FROM invalidations WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(Invalidation::from))
    }

    async fn invalidations_after(&self, id: i64) -> Result<Vec<InvalidationRow>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT id, repo_id, delivery_id, ref AS git_ref, before, after, paths, evicted_tokens, prewarmed \
             FROM invalidations WHERE id > $1 ORDER BY id LIMIT 1000",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?)
    }
}

async fn listen(store: &Store) -> Result<PgListener, StoreError> {
    let mut listener = PgListener::connect_with(store.pool()).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

impl InvalidationListener {
    /// The next invalidations to apply: the one just notified or, after the connection
    /// dropped, those recorded meanwhile (oldest first). An `Err` leaves the listener usable:
    /// call again after a pause (the connection is re-established on the next call).
    pub async fn next(&mut self) -> Result<Vec<Invalidation>, StoreError> {
        loop {
            if self.reconnect {
                // Listen again before reading what was missed, so nothing falls in between.
                self.listener = listen(&self.store).await?;
                self.reconnect = false;
                self.catch_up = true;
            }
            if self.catch_up {
                let rows = self.store.invalidations_after(self.last_id).await?;
                self.catch_up = rows.len() == 1000;
                if let Some(last) = rows.last() {
                    self.last_id = last.id;
                    return Ok(rows.into_iter().map(Invalidation::from).collect());
                }
                continue;
            }
            let note = match self.listener.try_recv().await {
                Ok(Some(note)) => note,
                Ok(None) => {
                    tracing::warn!("the invalidation listener lost its connection; reconnecting");
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
                    tracing::warn!(payload = note.payload(), "ignoring a malformed invalidation notice: {e}");
                    continue;
                }
            };
            self.last_id = self.last_id.max(notice.id);
            if notice.origin == self.origin {
                continue;
            }
            match self.store.invalidation(notice.id).await? {
                Some(inv) => return Ok(vec![inv]),
                None => tracing::warn!(id = notice.id, "a notified invalidation is not in the database"),
            }
        }
    }
}
