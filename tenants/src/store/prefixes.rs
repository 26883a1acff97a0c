//! Public prefixes the operator registered (see `api/src/prefixes.rs`): each server renders them
//! with its own model, so the store keeps what the operator gave, not tokens. Every change is
//! announced to the replicas ([`super::fanout`]), which reload the list.

use super::{fanout, Store, StoreError};
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

/// A registered public prefix as stored.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PublicPrefixRow {
    pub id: Uuid,
    pub name: String,
    /// What the operator gave (`{"messages": …, "tools": …}`, `{"text": …}` or `{"tokens": …}`),
    /// its keys in the order given.
    pub source: serde_json::Value,
    /// Whether servers compute it into the cache at start.
    pub prewarm: bool,
    pub created_at: DateTime<Utc>,
}

/// The row as read: the source as its text (`json`, which keeps the order of keys).
#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    name: String,
    source: String,
    prewarm: bool,
    created_at: DateTime<Utc>,
}

impl TryFrom<Row> for PublicPrefixRow {
    type Error = StoreError;
    fn try_from(r: Row) -> Result<PublicPrefixRow, StoreError> {
        let source = serde_json::from_str(&r.source)
            .map_err(|e| StoreError::Database { message: e.to_string(), source: Some(Box::new(e)) })?;
        Ok(PublicPrefixRow { id: r.id, name: r.name, source, prewarm: r.prewarm, created_at: r.created_at })
    }
}

const COLUMNS: &str = "id, name, source::text AS source, prewarm, created_at";

impl Store {
    /// Registers a public prefix; [`StoreError::Conflict`] if the name is taken.
    pub async fn add_public_prefix(
        &self,
        name: &str,
        source: &serde_json::Value,
        prewarm: bool,
    ) -> Result<PublicPrefixRow, StoreError> {
        let mut tx = self.pool().begin().await?;
        let row: Row = sqlx::query_as(&format!(
            "INSERT INTO public_prefixes (id, name, source, prewarm) VALUES ($1, $2, $3::json, $4) RETURNING {COLUMNS}"
        ))
        .bind(Uuid::new_v4())
        .bind(name)
        .bind(source.to_string())
        .bind(prewarm)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| match StoreError::from(e) {
            StoreError::Conflict(_) => StoreError::Conflict(format!("a public prefix named {name:?} exists")),
            other => other,
        })?;
        fanout::notify(&mut tx, &fanout::Notice::PublicPrefixes).await?;
        tx.commit().await?;
        row.try_into()
    }

    /// Every registered public prefix, oldest first.
    pub async fn list_public_prefixes(&self) -> Result<Vec<PublicPrefixRow>, StoreError> {
        let rows: Vec<Row> = sqlx::query_as(&format!("SELECT {COLUMNS} FROM public_prefixes ORDER BY created_at, id"))
            .fetch_all(self.pool())
            .await?;
        rows.into_iter().map(PublicPrefixRow::try_from).collect()
    }

    /// Removes a public prefix; `false` if there is none with this id.
    pub async fn remove_public_prefix(&self, id: Uuid) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await?;
        let done = sqlx::query("DELETE FROM public_prefixes WHERE id = $1").bind(id).execute(&mut *tx).await?;
        if done.rows_affected() != 1 {
            return Ok(false);
        }
        fanout::notify(&mut tx, &fanout::Notice::PublicPrefixes).await?;
        tx.commit().await?;
        Ok(true)
    }
}
