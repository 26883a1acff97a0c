//! Operator endpoints for public prefixes (see [`crate::prefixes`]): register, list, remove, and
//! the candidates discovery found. Tenants get 403 on every one of them.

use crate::auth::OperatorAuth;
use crate::error::ApiError;
use crate::prefixes::{self, Source};
use crate::state::AppState;
use actix_web::{delete, get, post, web, HttpResponse};
use cachet_tenants::store::StoreError;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

/// A prefix to register: its source, or a discovered candidate by id.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPublicPrefix {
    pub name: String,
    /// `{"messages": […], "tools": […]}`, `{"text": "…"}` or `{"tokens": […]}`.
    #[serde(default)]
    pub source: Option<Source>,
    /// A candidate's id from `GET /admin/public-prefixes/candidates` (its tokens become the source).
    #[serde(default)]
    pub candidate: Option<String>,
    /// Compute it into the cache now and at every start (default true).
    #[serde(default)]
    pub prewarm: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct CandidateQuery {
    /// Only openings sent by at least this many tenants (default 2).
    #[serde(default)]
    pub min_tenants: Option<usize>,
}

fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Conflict(m) => ApiError::Conflict(m),
        StoreError::Unavailable { message: m, .. } => ApiError::NotReady(format!("the database is unreachable: {m}")),
        other => ApiError::Internal(other.to_string()),
    }
}

/// Registers a public prefix: every tenant's prompt that begins with it shares its computation.
#[utoipa::path(post, path = "/admin/public-prefixes", tag = "admin", request_body = NewPublicPrefix,
    responses((status = 201, description = "Registered (name, tokens, preview)"), (status = 400, description = "Bad source"),
              (status = 403, description = "Not the operator"), (status = 409, description = "Name taken"),
              (status = 503, description = "The model is loading")),
    security(("bearer" = [])))]
#[post("/admin/public-prefixes")]
pub async fn add(
    state: web::Data<AppState>,
    _op: OperatorAuth,
    body: web::Json<NewPublicPrefix>,
) -> Result<HttpResponse, ApiError> {
    let served = state.served()?;
    let name = body.name.trim();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(ApiError::bad_param("name", "a prefix name has 1 to 200 characters"));
    }
    if served.prefixes.list().iter().any(|r| r.name == name) {
        return Err(ApiError::Conflict(format!("a public prefix named {name:?} exists")));
    }
    let source = match (&body.source, &body.candidate) {
        (Some(s), None) => s.clone(),
        (None, Some(id)) => {
            let c = served.prefixes.candidate(id).ok_or_else(|| {
                ApiError::NotFound(format!("no candidate {id} (candidates are counted anew at each start)"))
            })?;
            Source { tokens: Some(c.tokens[..c.len].to_vec()), ..Source::default() }
        }
        _ => return Err(ApiError::bad("give exactly one of source and candidate")),
    };
    let source_json = serde_json::to_value(&source).map_err(|e| ApiError::Internal(e.to_string()))?;
    // Checked before it is stored: what is stored renders here.
    let parsed = Source::parse(&source_json)?;
    let ids = prefixes::render(served, &parsed).await?;
    let prewarm = body.prewarm.unwrap_or(true);
    let row = state.store.add_public_prefix(name, &source_json, prewarm).await.map_err(store_error)?;
    let entry = prefixes::Registered::rendered(served, Some(row.id), name, "operator", prewarm, ids);
    if prewarm {
        prefixes::prewarm(served, &entry.ids);
    }
    served.prefixes.insert(entry.clone());
    Ok(HttpResponse::Created().json(entry))
}

/// Lists the public prefixes in force on this server, longest first.
#[utoipa::path(get, path = "/admin/public-prefixes", tag = "admin",
    responses((status = 200, description = "`{\"data\": [{name, origin, tokens, preview, …}]}`"),
              (status = 403, description = "Not the operator")),
    security(("bearer" = [])))]
#[get("/admin/public-prefixes")]
pub async fn list(state: web::Data<AppState>, _op: OperatorAuth) -> Result<HttpResponse, ApiError> {
    let served = state.served()?;
    Ok(HttpResponse::Ok().json(json!({ "data": *served.prefixes.list() })))
}

/// Removes a registered public prefix (one from the configuration stays until the configuration changes).
#[utoipa::path(delete, path = "/admin/public-prefixes/{id}", tag = "admin",
    responses((status = 204, description = "Removed"), (status = 404, description = "Unknown id")),
    security(("bearer" = [])))]
#[delete("/admin/public-prefixes/{id}")]
pub async fn remove(
    state: web::Data<AppState>,
    _op: OperatorAuth,
    id: web::Path<uuid::Uuid>,
) -> Result<HttpResponse, ApiError> {
    let uuid = id.into_inner();
    let missing = || ApiError::NotFound(format!("no public prefix {uuid}"));
    if !state.store.remove_public_prefix(uuid).await.map_err(store_error)? {
        return Err(missing());
    }
    if let Some(served) = state.model.served.get() {
        let kept = served.prefixes.list().iter().filter(|r| r.id != Some(uuid)).cloned().collect();
        served.prefixes.set(kept);
    }
    Ok(HttpResponse::NoContent().finish())
}

/// Openings that several tenants sent: candidates for the operator to register (nothing becomes
/// public by itself).
#[utoipa::path(get, path = "/admin/public-prefixes/candidates", tag = "admin",
    params(("min_tenants" = Option<usize>, Query, description = "Only openings at least this many tenants sent (default 2)")),
    responses((status = 200, description = "`{\"data\": [{id, tokens, tenants, registered, preview}]}`"),
              (status = 403, description = "Not the operator")),
    security(("bearer" = [])))]
#[get("/admin/public-prefixes/candidates")]
pub async fn candidates(
    state: web::Data<AppState>,
    _op: OperatorAuth,
    query: web::Query<CandidateQuery>,
) -> Result<HttpResponse, ApiError> {
    let served = state.served()?;
    let registered = served.prefixes.list();
    let data: Vec<Value> = served
        .prefixes
        .candidates(query.min_tenants.unwrap_or(2))
        .into_iter()
        .map(|c| {
            let ids = &c.tokens[..c.len];
            // Already shared when a registered prefix covers it.
            let covered =
                registered.iter().any(|r| !r.ids.is_empty() && ids.len() <= r.ids.len() && r.ids.starts_with(ids));
            json!({
                "id": c.id,
                "tokens": c.len,
                "tenants": c.tenants,
                "registered": covered,
                "preview": prefixes::preview(served, ids),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "data": data })))
}
