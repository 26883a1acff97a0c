//! Operator endpoints: tenants and their tokens.

use crate::auth::OperatorAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{delete, get, post, web, HttpResponse};
use cachet_tenants::store::StoreError;
use cachet_tenants::{Tenant, TenantId};
use serde::Deserialize;
use std::time::Duration;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewTenant {
    pub name: String,
    /// A plan name (default: the configured default plan).
    #[serde(default)]
    pub plan: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct NewToken {
    /// Lifetime in seconds (default 30 days).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Conflict(m) => ApiError::bad_param("name", m),
        StoreError::Invalid(m) => ApiError::bad(m),
        StoreError::NotFound(m) => ApiError::NotFound(m),
        StoreError::Unavailable { message: m, .. } => ApiError::NotReady(format!("the database is unreachable: {m}")),
        other => ApiError::Internal(other.to_string()),
    }
}

/// Creates a tenant.
#[utoipa::path(post, path = "/admin/tenants", tag = "admin", request_body = NewTenant,
    responses((status = 201, description = "The new tenant"), (status = 400, description = "Bad name or plan"),
              (status = 401, description = "Not the operator")), security(("bearer" = [])))]
#[post("/admin/tenants")]
pub async fn create_tenant(
    state: web::Data<AppState>,
    _op: OperatorAuth,
    body: web::Json<NewTenant>,
) -> Result<HttpResponse, ApiError> {
    let name = body.name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(ApiError::bad_param("name", "a tenant name has 1 to 200 characters"));
    }
    let plan_name = body.plan.clone().unwrap_or_else(|| state.settings.tenants.default_plan.clone());
    let plan =
        state.settings.plan(&plan_name).ok_or_else(|| ApiError::bad_param("plan", format!("no plan {plan_name:?}")))?;
    let tenant = state.store.create_tenant(name, &plan).await.map_err(store_error)?;
    Ok(HttpResponse::Created().json(tenant))
}

/// Lists the live tenants.
#[utoipa::path(get, path = "/admin/tenants", tag = "admin",
    responses((status = 200, description = "Tenants"), (status = 401, description = "Not the operator")),
    security(("bearer" = [])))]
#[get("/admin/tenants")]
pub async fn list_tenants(state: web::Data<AppState>, _op: OperatorAuth) -> Result<HttpResponse, ApiError> {
    let tenants: Vec<Tenant> = state.store.list_tenants().await.map_err(store_error)?;
    Ok(HttpResponse::Ok().json(tenants))
}

/// Deletes a tenant: its tokens stop working at once.
#[utoipa::path(delete, path = "/admin/tenants/{id}", tag = "admin",
    responses((status = 204, description = "Deleted"), (status = 404, description = "Unknown tenant")),
    security(("bearer" = [])))]
#[delete("/admin/tenants/{id}")]
pub async fn delete_tenant(
    state: web::Data<AppState>,
    _op: OperatorAuth,
    id: web::Path<TenantId>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    if !state.store.delete_tenant(id).await.map_err(store_error)? {
        return Err(ApiError::NotFound(format!("no tenant {id}")));
    }
    state.auth.tenants.forget(id);
    if let Some(served) = state.model.served.get() {
        served.engine.purge_tenant(crate::state::engine_tenant(id));
    }
    Ok(HttpResponse::NoContent().finish())
}

/// Issues a bearer token for a tenant.
#[utoipa::path(post, path = "/admin/tenants/{id}/tokens", tag = "admin", request_body = NewToken,
    responses((status = 201, description = "`{\"token\": …}`"), (status = 404, description = "Unknown tenant")),
    security(("bearer" = [])))]
#[post("/admin/tenants/{id}/tokens")]
pub async fn issue_token(
    state: web::Data<AppState>,
    _op: OperatorAuth,
    id: web::Path<TenantId>,
    body: web::Json<NewToken>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    match state.store.get_tenant(id).await.map_err(store_error)? {
        Some(t) if t.deleted_at.is_none() => {}
        _ => return Err(ApiError::NotFound(format!("no tenant {id}"))),
    }
    let ttl = Duration::from_secs(body.ttl_secs.unwrap_or(30 * 24 * 3600));
    let token = state.auth.jwt.issue(id, ttl).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(HttpResponse::Created().json(serde_json::json!({ "token": token, "tenant": id })))
}
