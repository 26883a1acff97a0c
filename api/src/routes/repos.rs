//! `/v1/repos`: a tenant registers, lists and deletes repositories. The
//! webhook secret is returned once, at registration (a new one replaces it on request).
//! Registration itself is a job (see `registration`).

use crate::auth::TenantAuth;
use crate::context::{mirror_id, RepoOptions};
use crate::error::ApiError;
use crate::openai::retention_key;
use crate::registration;
use crate::state::AppState;
use actix_web::http::header;
use actix_web::{delete, get, post, web, HttpResponse};
use cachet_tenants::store::{NewRepository, RepoStatus, Repository};
use cachet_tenants::RepoId;
use serde::Deserialize;
use serde_json::json;
use std::time::Duration;

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
    let mut out = json!({"id": r.id, "object": "repository", "name": r.name, "url": r.source,
                         "default_branch": r.default_branch, "options": r.options, "created_at": r.created_at,
                         "status": r.status.as_str()});
    if let Some(e) = &r.error {
        out["error"] = json!(e);
    }
    out
}

/// The push webhook to configure at the git host (its secret is shown only in this answer).
fn webhook_json(repo: RepoId, secret: &str) -> serde_json::Value {
    json!({"url": format!("/v1/webhooks/git/{repo}"), "secret": secret,
           "content_type": "application/json", "events": ["push"]})
}

/// A new webhook secret.
fn new_secret() -> Result<String, ApiError> {
    Ok(format!("whsec_{}", cachet_tenants::random_hex(32).map_err(|e| ApiError::Internal(e.to_string()))?))
}

/// Registers a repository: validates the source, writes the repository (with its webhook
/// secret), then fetches its mirror as a job of its own (`registration`) and waits for it up to
/// `context.registration_wait_secs`. Answers `201` with the head found, or `202` while the fetch
/// goes on (`status: "fetching"`: poll `GET /v1/repos/{id}`); the webhook secret is in either
/// answer, shown only there.
#[utoipa::path(post, path = "/v1/repos", tag = "repositories", request_body = NewRepo,
    responses((status = 201, description = "Registered; the body holds the webhook secret, shown once"),
              (status = 202, description = "Registered, still fetching; the body holds the webhook secret, shown once"),
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
    state.repos.check_options(&body.options)?;
    let source = state.repos.store.validate(&body.url)?;
    if body.options.watch && !matches!(source, cachet_context::Source::Local(_)) {
        return Err(ApiError::bad_param("watch", "only a repository registered from a local path can be watched"));
    }
    let secret = new_secret()?;
    let options = serde_json::to_value(&body.options).unwrap_or_default();
    let name = body.name.clone().unwrap_or_else(|| name_from(&body.url));
    let new = NewRepository {
        id: RepoId::random(),
        tenant: auth.0.id,
        name: &name,
        source: &body.url,
        default_branch: body.default_branch.as_deref(),
        webhook_secret: &secret,
        options: &options,
    };
    let repo = state.store.create_repository(&new).await?;
    let job = registration::start(state.store.clone(), state.repos.clone(), repo.clone());
    let wait = Duration::from_secs(state.settings.context.registration_wait_secs);
    let mut out = repo_json(&repo);
    out["webhook"] = webhook_json(repo.id, &secret);
    match tokio::time::timeout(wait, job).await {
        Ok(Ok(Ok(fetched))) => {
            out["status"] = json!(RepoStatus::Ready.as_str());
            out["default_branch"] = json!(fetched.default_branch);
            out["head"] = json!(fetched.head);
            // The sweeper starts the watch of a registration that finishes later.
            if let Ok(Some(ready)) = state.store.repository(auth.0.id, repo.id).await {
                crate::watch::start(&state, &ready).await?;
            }
            Ok(HttpResponse::Created().json(out))
        }
        Ok(Ok(Err(e))) => {
            // The tenant hears of the failure here: the row need not stay.
            let _ = state.store.delete_repository(auth.0.id, repo.id).await;
            Err(e)
        }
        Ok(Err(_)) => Err(ApiError::Internal("the registration's job stopped without an answer".into())),
        Err(_) => {
            Ok(HttpResponse::Accepted().insert_header((header::LOCATION, format!("/v1/repos/{}", repo.id))).json(out))
        }
    }
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
    id: web::Path<RepoId>,
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
    id: web::Path<RepoId>,
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
    id: web::Path<RepoId>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let closed = state
        .store
        .delete_repository(auth.0.id, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("repository {id}")))?;
    state.replica.watches.stop(id);
    if let Some(served) = state.model.served.get() {
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
