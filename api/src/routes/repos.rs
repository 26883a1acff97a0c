//! `/v1/repos`: a tenant registers, lists and deletes repositories. The
//! webhook secret is returned once, at registration.

use crate::auth::TenantAuth;
use crate::context::{mirror_id, RepoOptions};
use crate::error::ApiError;
use crate::openai::retention_key;
use crate::state::AppState;
use actix_web::{delete, get, post, web, HttpResponse};
use cachet_context::{ContextError, Mirror};
use cachet_tenants::store::{NewRepository, Repository};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

/// `POST /v1/repos`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRepo {
    /// A clone URL (https, ssh, git; `file://` and plain paths under the
    /// server's allowed root).
    pub url: String,
    /// Default: the last part of the URL.
    #[serde(default)]
    pub name: Option<String>,
    /// Default: `main`, else `master`.
    #[serde(default)]
    pub default_branch: Option<String>,
    #[serde(flatten)]
    pub options: RepoOptions,
}

fn name_from(url: &str) -> String {
    let last = url.trim_end_matches('/').rsplit(['/', ':']).next().unwrap_or(url);
    let name = last.strip_suffix(".git").unwrap_or(last);
    if name.is_empty() {
        "repository".into()
    } else {
        name.chars().take(200).collect()
    }
}

fn repo_json(r: &Repository) -> serde_json::Value {
    json!({"id": r.id, "object": "repository", "name": r.name, "url": r.source,
           "default_branch": r.default_branch, "options": r.options, "created_at": r.created_at})
}

/// The push webhook to configure at the git host (its secret is shown only in this answer).
fn webhook_json(repo: Uuid, secret: &str) -> serde_json::Value {
    json!({"url": format!("/v1/webhooks/git/{repo}"), "secret": secret,
           "content_type": "application/json", "events": ["push"]})
}

/// A new webhook secret.
fn new_secret() -> Result<String, ApiError> {
    Ok(format!("whsec_{}", cachet_tenants::random_hex(32).map_err(|e| ApiError::Internal(e.to_string()))?))
}

/// `main`, else `master`, when the tenant named no default branch.
fn default_branch(mirror: &Mirror, asked: Option<&str>) -> Result<(String, String), ApiError> {
    if let Some(b) = asked {
        return Ok((b.to_string(), mirror.branch_head(b)?.to_string()));
    }
    for b in ["main", "master"] {
        match mirror.branch_head(b) {
            Ok(head) => return Ok((b.to_string(), head.to_string())),
            Err(ContextError::UnknownRef(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::bad_param("default_branch", "the repository has no main or master branch: name its default_branch"))
}

/// Registers a repository: validates the source, mirrors it, and returns
/// the push webhook's URL and secret (shown only here).
#[utoipa::path(post, path = "/v1/repos", tag = "repositories", request_body = NewRepo,
    responses((status = 201, description = "Registered; the body holds the webhook secret, shown once"),
              (status = 400, description = "Refused source, path outside the allowed root, unknown branch"),
              (status = 409, description = "A repository with that name exists"),
              (status = 502, description = "The repository could not be fetched")),
    security(("bearer" = [])))]
#[post("/v1/repos")]
pub async fn create_repo(
    state: web::Data<AppState>,
    auth: TenantAuth,
    body: web::Json<NewRepo>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    state.repos.check_options(&body.options).map_err(ApiError::bad)?;
    let source = state.repos.store.validate(&body.url)?;
    let id = Uuid::new_v4();
    let (repos, asked) = (state.repos.clone(), body.default_branch.clone());
    let (branch, head) = web::block(move || -> Result<_, ApiError> {
        let mirror = repos.store.create_mirror(&mirror_id(id), &source)?;
        let found = default_branch(&mirror, asked.as_deref());
        if found.is_err() {
            let _ = repos.store.remove(&mirror_id(id));
        }
        found
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let secret = new_secret()?;
    let options = serde_json::to_value(&body.options).unwrap_or_default();
    let name = body.name.clone().unwrap_or_else(|| name_from(&body.url));
    let new = NewRepository {
        id,
        tenant: auth.0.id,
        name: &name,
        source: &body.url,
        default_branch: &branch,
        webhook_secret: &secret,
        options: &options,
    };
    let repo = match state.store.create_repository(&new).await {
        Ok(r) => r,
        Err(e) => {
            let repos = state.repos.clone();
            let _ = web::block(move || repos.store.remove(&mirror_id(id))).await;
            return Err(e.into());
        }
    };
    let mut out = repo_json(&repo);
    out["head"] = json!(head);
    out["webhook"] = webhook_json(repo.id, &secret);
    Ok(HttpResponse::Created().json(out))
}

/// Issues a new webhook secret for a repository (the old one stops working at once): the way back
/// when the secret shown at registration was lost (a client that gave up before the answer, a
/// leak).
#[utoipa::path(post, path = "/v1/repos/{id}/webhook-secret", tag = "repositories",
    responses((status = 200, description = "The new secret, shown once"), (status = 404, description = "Unknown repository")),
    security(("bearer" = [])))]
#[post("/v1/repos/{id}/webhook-secret")]
pub async fn rotate_webhook_secret(
    state: web::Data<AppState>,
    auth: TenantAuth,
    id: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let secret = new_secret()?;
    if !state.store.set_webhook_secret(auth.0.id, id, &secret).await? {
        return Err(ApiError::NotFound(format!("repository {id}")));
    }
    Ok(HttpResponse::Ok().json(json!({"id": id, "object": "repository.webhook", "webhook": webhook_json(id, &secret)})))
}

/// The tenant's repositories.
#[utoipa::path(get, path = "/v1/repos", tag = "repositories", responses((status = 200, description = "A list")),
    security(("bearer" = [])))]
#[get("/v1/repos")]
pub async fn list_repos(state: web::Data<AppState>, auth: TenantAuth) -> Result<HttpResponse, ApiError> {
    let repos = state.store.repositories(auth.0.id).await?;
    Ok(HttpResponse::Ok().json(json!({"object": "list", "data": repos.iter().map(repo_json).collect::<Vec<_>>()})))
}

/// One repository, with its latest invalidations.
#[utoipa::path(get, path = "/v1/repos/{id}", tag = "repositories",
    responses((status = 200, description = "The repository"), (status = 404, description = "Unknown repository")),
    security(("bearer" = [])))]
#[get("/v1/repos/{id}")]
pub async fn get_repo(
    state: web::Data<AppState>,
    auth: TenantAuth,
    id: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let repo =
        state.store.repository(auth.0.id, id).await?.ok_or_else(|| ApiError::NotFound(format!("repository {id}")))?;
    let invalidations = state.store.invalidations(auth.0.id, id, 20).await?;
    let mut out = repo_json(&repo);
    out["invalidations"] = json!(invalidations
        .iter()
        .map(|i| json!({"delivery_id": i.delivery_id, "ref": i.git_ref, "before": i.before, "after": i.after,
                        "paths": i.paths, "evicted_tokens": i.evicted_tokens, "prewarmed": i.prewarmed}))
        .collect::<Vec<_>>());
    Ok(HttpResponse::Ok().json(out))
}

/// Deletes a repository: its sessions close and its mirror is removed.
#[utoipa::path(delete, path = "/v1/repos/{id}", tag = "repositories",
    responses((status = 200, description = "Deleted"), (status = 404, description = "Unknown repository")),
    security(("bearer" = [])))]
#[delete("/v1/repos/{id}")]
pub async fn delete_repo(
    state: web::Data<AppState>,
    auth: TenantAuth,
    id: web::Path<Uuid>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let closed = state
        .store
        .delete_repository(auth.0.id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("repository {id}")))?;
    if let Some(served) = state.served.get() {
        for session in &closed {
            served.engine.release(retention_key(auth.0.id, *session));
        }
    }
    let repos = state.repos.clone();
    if let Ok(Err(e)) = web::block(move || repos.store.remove(&mirror_id(id))).await {
        tracing::warn!(repo = %id, "removing the mirror failed: {e}");
    }
    Ok(HttpResponse::Ok()
        .json(json!({"id": id, "object": "repository", "deleted": true, "sessions_closed": closed.len()})))
}
