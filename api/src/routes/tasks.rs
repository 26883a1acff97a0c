//! `/v1/tasks`: a task is a unit of work an agent attempts; requests carry its id (`task_id` or
//! `X-Cachet-Task`), and its outcome is recorded once. What a *successful* task costs comes from
//! here.

use crate::auth::TenantAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{get, post, web, HttpResponse};
use cachet_tenants::store::{OutcomeError, Task, TaskStatus, CLIENT_SESSION_MAX};
use cachet_tenants::{SessionId, TaskId};
use serde::Deserialize;
use serde_json::json;

/// `POST /v1/tasks`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTask {
    /// The session the task runs in (optional).
    #[serde(default)]
    #[schema(value_type = Option<uuid::Uuid>)]
    pub session_id: Option<SessionId>,
    pub title: String,
}

/// `POST /v1/tasks/{id}/outcome`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// `succeeded`, `failed` or `abandoned`.
    pub status: String,
    /// Anything that shows the outcome (test results, a commit, a link).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub evidence: Option<serde_json::Value>,
}

fn task_json(t: &Task) -> serde_json::Value {
    json!({"id": t.id, "object": "task", "session_id": t.session_id, "title": t.title, "status": t.status,
           "evidence": t.evidence, "client_session": t.client_session, "created_at": t.created_at,
           "closed_at": t.closed_at})
}

/// `GET /v1/tasks` filters.
#[derive(Clone, Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct TaskQuery {
    /// Only the task the server opened for this client session id (e.g. Codex's `session-id`).
    pub client_session: Option<String>,
    /// At most this many, newest first (1 to 1000, default 100).
    pub limit: Option<i64>,
}

/// The tenant's tasks, newest first; with `client_session`, the one opened for that client
/// session (an empty list if none).
#[utoipa::path(get, path = "/v1/tasks", tag = "tasks", params(TaskQuery),
    responses((status = 200, description = "The tasks"), (status = 400, description = "Invalid filter")),
    security(("bearer" = [])))]
#[get("/v1/tasks")]
pub async fn list_tasks(
    state: web::Data<AppState>,
    auth: TenantAuth,
    query: web::Query<TaskQuery>,
) -> Result<HttpResponse, ApiError> {
    let tasks = match &query.client_session {
        Some(id) => state.store.task_by_client_session(auth.0.id, id).await?.into_iter().collect(),
        None => {
            let limit = query.limit.unwrap_or(100);
            if !(1..=1000).contains(&limit) {
                return Err(ApiError::bad_param("limit", "limit is 1 to 1000"));
            }
            state.store.recent_tasks(auth.0.id, limit).await?
        }
    };
    let data: Vec<_> = tasks.iter().map(task_json).collect();
    Ok(HttpResponse::Ok().json(json!({"object": "list", "data": data})))
}

/// The task of the client session a request names by one of `[tasks] client_session_headers`
/// (Codex's `session-id`), opened on its first request: an agent run becomes one task with no
/// change to the client. A value that is not a printable id of 1 to 200 bytes is ignored, and
/// so is the grouping while the database is unreachable (the request goes on without a task).
pub(crate) async fn client_session_task(
    state: &AppState,
    http: &actix_web::HttpRequest,
    tenant: cachet_tenants::TenantId,
) -> Option<TaskId> {
    let id = state.settings.tasks.client_session_headers.iter().find_map(|name| {
        let value = http.headers().get(name.as_str())?.to_str().ok()?.trim();
        let printable = value.bytes().all(|b| b.is_ascii_graphic());
        (printable && !value.is_empty() && value.len() <= CLIENT_SESSION_MAX).then_some(value)
    })?;
    let title = format!("{} session {id}", client_name(http));
    match state.store.task_for_client_session(tenant, id, &title).await {
        Ok(task) => {
            state.auth.known_tasks.insert(tenant, task.id);
            Some(task.id)
        }
        Err(e) => {
            tracing::warn!(client_session = id, "the request goes on without its client session's task: {e}");
            None
        }
    }
}

/// What the client calls itself (`originator`, else the product in `User-Agent`), for a task
/// title: letters, digits, `.`, `_` and `-`, at most 40.
fn client_name(http: &actix_web::HttpRequest) -> String {
    let header = |n: &str| http.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
    let raw = match header("originator") {
        "" => header("user-agent").split(['/', ' ']).next().unwrap_or(""),
        o => o,
    };
    let name: String =
        raw.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')).take(40).collect();
    if name.is_empty() {
        "client".into()
    } else {
        name
    }
}

/// Opens a task.
#[utoipa::path(post, path = "/v1/tasks", tag = "tasks", request_body = NewTask,
    responses((status = 201, description = "The task"), (status = 400, description = "Invalid title"),
              (status = 404, description = "Unknown session")),
    security(("bearer" = [])))]
#[post("/v1/tasks")]
pub async fn create_task(
    state: web::Data<AppState>,
    auth: TenantAuth,
    body: web::Json<NewTask>,
) -> Result<HttpResponse, ApiError> {
    let task = state.store.create_task(auth.0.id, body.session_id, &body.title).await.map_err(|e| match e {
        cachet_tenants::StoreError::NotFound(_) => {
            ApiError::NotFound(format!("session {}", body.session_id.map(|s| s.to_string()).unwrap_or_default()))
        }
        other => other.into(),
    })?;
    Ok(HttpResponse::Created().json(task_json(&task)))
}

/// A task, with what its requests cost so far.
#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks",
    responses((status = 200, description = "The task"), (status = 404, description = "Unknown task")),
    security(("bearer" = [])))]
#[get("/v1/tasks/{id}")]
pub async fn get_task(
    state: web::Data<AppState>,
    auth: TenantAuth,
    id: web::Path<TaskId>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let task = state.store.task(auth.0.id, id).await?.ok_or_else(|| ApiError::NotFound(format!("task {id}")))?;
    // What was recorded so far, including rows still on their way to the database.
    state.accounting.ledger.flush().await;
    let (requests, cost) = state.store.task_cost(auth.0.id, id).await?;
    let mut out = task_json(&task);
    out["requests"] = json!(requests);
    out["cost"] = json!(cost);
    Ok(HttpResponse::Ok().json(out))
}

/// Records a task's outcome (once: a second outcome is a 409).
#[utoipa::path(post, path = "/v1/tasks/{id}/outcome", tag = "tasks", request_body = Outcome,
    responses((status = 200, description = "The closed task"), (status = 400, description = "Unknown status"),
              (status = 404, description = "Unknown task"), (status = 409, description = "It already has an outcome")),
    security(("bearer" = [])))]
#[post("/v1/tasks/{id}/outcome")]
pub async fn task_outcome(
    state: web::Data<AppState>,
    auth: TenantAuth,
    id: web::Path<TaskId>,
    body: web::Json<Outcome>,
) -> Result<HttpResponse, ApiError> {
    let id = id.into_inner();
    let status = match body.status.as_str() {
        "succeeded" => TaskStatus::Succeeded,
        "failed" => TaskStatus::Failed,
        "abandoned" => TaskStatus::Abandoned,
        other => {
            return Err(ApiError::bad_param(
                "status",
                format!("unknown outcome {other:?} (succeeded, failed, abandoned)"),
            ))
        }
    };
    let task = state.store.close_task(auth.0.id, id, status, body.evidence.as_ref()).await.map_err(|e| match e {
        OutcomeError::NotFound => ApiError::NotFound(format!("task {id}")),
        OutcomeError::AlreadyClosed(s) => ApiError::Conflict(format!("task {id} already has its outcome ({s})")),
        OutcomeError::Store(e) => e.into(),
    })?;
    Ok(HttpResponse::Ok().json(task_json(&task)))
}

/// Checks a task id a request carries: the tenant's, and open. While the database is unreachable
/// the request goes on (its ledger row keeps the id).
pub(crate) async fn check_task(state: &AppState, tenant: cachet_tenants::TenantId, id: TaskId) -> Result<(), ApiError> {
    match state.store.task(tenant, id).await {
        Ok(None) => Err(ApiError::NotFound(format!("task {id}"))),
        Ok(Some(t)) if t.status != TaskStatus::Open => {
            Err(ApiError::Conflict(format!("task {id} is closed ({})", t.status.as_str())))
        }
        Ok(Some(t)) => {
            state.auth.known_tasks.insert(tenant, id);
            if let Err(e) = state.store.touch_task(t.owned()).await {
                tracing::warn!(task = %id, "{e}");
            }
            Ok(())
        }
        // A task this replica checked before goes on through an outage; any other is refused,
        // not taken on trust (it could be another tenant's).
        Err(e) if e.is_unavailable() && state.auth.known_tasks.contains(tenant, id) => {
            tracing::warn!(task = %id, "the database is unreachable; the task was checked before: {e}");
            Ok(())
        }
        Err(e) if e.is_unavailable() => Err(ApiError::NotReady(format!(
            "task {id} cannot be checked while the database is unreachable: retry later, or send the request without it"
        ))),
        Err(e) => Err(e.into()),
    }
}
