//! Sessions: a tenant working on one branch of one repository. The server
//! assembles each turn's prompt itself (see [`assemble`]) and keeps the
//! session's prefix retained in the engine while the session lives.

pub mod assemble;
pub mod message;
pub mod overlay;
pub mod prompt;
pub mod rebase;

pub use message::{post_message, MessageRequest};

use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::openai::retention_key;
use crate::state::AppState;
use actix_web::{delete, get, post, web, HttpResponse};
use cachet_tenants::store::Session;
use cachet_tenants::{RepoId, SessionId};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::time::Duration;

/// `POST /v1/sessions`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// The repository id.
    #[schema(value_type = uuid::Uuid)]
    pub repo: RepoId,
    /// The branch (default: the repository's default branch).
    #[serde(default)]
    pub branch: Option<String>,
}

#[derive(Debug, Serialize)]
struct SessionOut<'a> {
    id: SessionId,
    object: &'static str,
    repo: RepoId,
    branch: &'a str,
    created_at: chrono::DateTime<chrono::Utc>,
    last_active_at: chrono::DateTime<chrono::Utc>,
    closed_at: Option<chrono::DateTime<chrono::Utc>>,
}

fn session_out(s: &Session) -> SessionOut<'_> {
    SessionOut {
        id: s.id,
        object: "session",
        repo: s.repo,
        branch: &s.branch,
        created_at: s.created_at,
        last_active_at: s.last_active_at,
        closed_at: s.closed_at,
    }
}

/// How long a session may idle.
pub(crate) fn idle(state: &AppState) -> Duration {
    Duration::from_secs(state.settings.context.session_idle_secs.max(1))
}

/// A session of the tenant that is open: 404 if unknown (or another
/// tenant's), 409 if closed or idled out (which closes it).
pub(crate) async fn open_session(state: &AppState, auth: &TenantAuth, id: SessionId) -> Result<Session, ApiError> {
    let tenant = &auth.0;
    let session =
        state.store.session(tenant.id, id).await?.ok_or_else(|| ApiError::NotFound(format!("session {id}")))?;
    if session.closed_at.is_some() {
        return Err(ApiError::Conflict(format!("session {id} is closed")));
    }
    let cutoff = chrono::Utc::now() - idle(state);
    if session.last_active_at < cutoff {
        close(state, tenant.id, id).await?;
        return Err(ApiError::Conflict(format!("session {id} idled out and is closed")));
    }
    Ok(session)
}

async fn close(state: &AppState, tenant: cachet_tenants::TenantId, id: SessionId) -> Result<bool, ApiError> {
    let closed = state.store.close_session(tenant, id).await?;
    state.replica.bases.forget(id);
    if let Some(served) = state.model.served.get() {
        served.engine.release(retention_key(tenant, id));
    }
    Ok(closed)
}

/// Opens a session on a branch of a repository.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = NewSession,
    responses((status = 201, description = "The session, with the branch's head commit"),
              (status = 400, description = "Unknown branch"), (status = 404, description = "Unknown repository")),
    security(("bearer" = [])))]
#[post("/v1/sessions")]
pub async fn create_session(
    state: web::Data<AppState>,
    auth: TenantAuth,
    body: web::Json<NewSession>,
) -> Result<HttpResponse, ApiError> {
    let tenant = &auth.0;
    let repo = state
        .store
        .repository(tenant.id, body.repo)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("repository {}", body.repo)))?;
    let default_branch = crate::registration::ready(&repo)?;
    let branch = body.branch.clone().unwrap_or_else(|| default_branch.to_string());
    let (repos, r, b) = (state.repos.clone(), repo.clone(), branch.clone());
    // Fetch on demand: a session starts from the branch as it is now.
    let commit = web::block(move || -> Result<_, ApiError> {
        let mirror = repos.mirror(&r)?;
        if let Err(e) = mirror.fetch() {
            tracing::warn!(repo = %r.id, "fetch failed, using the mirror as it is: {e}");
        }
        Ok(repos.head(&r, &mirror, &b)?)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let session = state.store.create_session(tenant.id, repo.id, &branch).await?;
    let mut out = serde_json::to_value(session_out(&session)).unwrap_or_default();
    out["commit"] = json!(commit.to_string());
    Ok(HttpResponse::Created().json(out))
}

/// A session and its history.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    responses((status = 200, description = "The session and its turns"), (status = 404, description = "Unknown session")),
    security(("bearer" = [])))]
#[get("/v1/sessions/{id}")]
pub async fn get_session(
    state: web::Data<AppState>,
    auth: TenantAuth,
    id: web::Path<SessionId>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let session =
        state.store.session(auth.0.id, id).await?.ok_or_else(|| ApiError::NotFound(format!("session {id}")))?;
    let turns: Vec<_> = state
        .store
        .turns(session.owned())
        .await?
        .into_iter()
        .map(|t| {
            let mut turn = json!({"seq": t.seq, "role": t.role.as_str(), "content": t.content, "commit": t.commit,
                                  "request_id": t.request_id, "created_at": t.created_at});
            if let Some(id) = &t.tool_call_id {
                turn["tool_call_id"] = json!(id);
            }
            turn
        })
        .collect();
    let mut out = serde_json::to_value(session_out(&session)).unwrap_or_default();
    out["turns"] = json!(turns);
    Ok(HttpResponse::Ok().json(out))
}

/// Closes a session: its prefix is no longer retained.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    responses((status = 200, description = "Closed (or already closed)"), (status = 404, description = "Unknown session")),
    security(("bearer" = [])))]
#[delete("/v1/sessions/{id}")]
pub async fn delete_session(
    state: web::Data<AppState>,
    auth: TenantAuth,
    id: web::Path<SessionId>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    if state.store.session(auth.0.id, id).await?.is_none() {
        return Err(ApiError::NotFound(format!("session {id}")));
    }
    close(&state, auth.0.id, id).await?;
    Ok(HttpResponse::Ok().json(json!({"id": id, "object": "session", "closed": true})))
}
