//! A tenant's own ledger rows (never another tenant's).

use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{get, web, HttpResponse};
use serde::Deserialize;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct UsageQuery {
    /// Most rows, newest first (default 100, at most 1000).
    pub limit: Option<i64>,
}

/// The calling tenant's usage rows.
#[utoipa::path(get, path = "/v1/usage", tag = "usage", params(UsageQuery),
    responses((status = 200, description = "Ledger rows, newest first"), (status = 401, description = "No valid token")),
    security(("bearer" = [])))]
#[get("/v1/usage")]
pub async fn usage(
    state: web::Data<AppState>,
    TenantAuth(tenant): TenantAuth,
    q: web::Query<UsageQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = state.store.usage(tenant.id, limit).await.map_err(|e| ApiError::NotReady(e.to_string()))?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "object": "list", "data": rows })))
}
