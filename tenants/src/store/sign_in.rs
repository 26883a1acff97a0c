//! One-time sign-in codes of the report page: a tenant (or the operator) asks for a link with its
//! bearer token; a browser exchanges the link's code, once, for a session cookie. The store keeps
//! only each code's SHA-256, so its rows are useless to whoever reads them.

use super::{Store, StoreError};
use crate::ids::TenantId;
use chrono::{DateTime, Utc};
use std::time::Duration;
use uuid::Uuid;

/// Whose a sign-in code is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignInSubject {
    /// A tenant's.
    Tenant(TenantId),
    /// The operator's.
    Operator,
}

impl SignInSubject {
    fn from_row(tenant: Option<Uuid>) -> SignInSubject {
        tenant.map_or(SignInSubject::Operator, |t| SignInSubject::Tenant(TenantId(t)))
    }
}

impl Store {
    /// Stores a code (by its SHA-256) for `subject`, good once for `ttl`; returns when it expires.
    /// Codes that expired more than a day ago go at the same time.
    pub async fn create_sign_in_code(
        &self,
        code_sha256: &[u8; 32],
        subject: SignInSubject,
        ttl: Duration,
    ) -> Result<DateTime<Utc>, StoreError> {
        let tenant = match subject {
            SignInSubject::Tenant(t) => Some(t.0),
            SignInSubject::Operator => None,
        };
        let ttl = chrono::Duration::from_std(ttl).map_err(|_| StoreError::Invalid("ttl out of range".into()))?;
        sqlx::query("DELETE FROM sign_in_codes WHERE expires_at < now() - interval '1 day'")
            .execute(self.pool())
            .await?;
        let (expires,): (DateTime<Utc>,) = sqlx::query_as(
            "INSERT INTO sign_in_codes (code_sha256, tenant_id, expires_at) \
             SELECT $1, $2, now() + $3 WHERE $2::uuid IS NULL \
                OR EXISTS (SELECT 1 FROM tenants WHERE id = $2 AND deleted_at IS NULL) \
             RETURNING expires_at",
        )
        .bind(&code_sha256[..])
        .bind(tenant)
        .bind(ttl)
        .fetch_optional(self.pool())
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("tenant {}", tenant.unwrap_or_default())))?;
        Ok(expires)
    }

    /// Whose the code is, if it is unused and unexpired (it stays usable).
    pub async fn peek_sign_in_code(&self, code_sha256: &[u8; 32]) -> Result<Option<SignInSubject>, StoreError> {
        let row: Option<(Option<Uuid>,)> = sqlx::query_as(
            "SELECT tenant_id FROM sign_in_codes WHERE code_sha256 = $1 AND used_at IS NULL AND expires_at > now()",
        )
        .bind(&code_sha256[..])
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|(t,)| SignInSubject::from_row(t)))
    }

    /// Uses the code: whose it is if it was unused and unexpired, and from now on it is used. Of
    /// two concurrent redemptions only one succeeds.
    pub async fn redeem_sign_in_code(&self, code_sha256: &[u8; 32]) -> Result<Option<SignInSubject>, StoreError> {
        let row: Option<(Option<Uuid>,)> = sqlx::query_as(
            "UPDATE sign_in_codes SET used_at = now() \
             WHERE code_sha256 = $1 AND used_at IS NULL AND expires_at > now() RETURNING tenant_id",
        )
        .bind(&code_sha256[..])
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|(t,)| SignInSubject::from_row(t)))
    }
}
