//! Operations: liveness, readiness, Prometheus metrics, the OpenAPI document.

use crate::auth::OperatorAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::dev::Payload;
use actix_web::{get, web, FromRequest, HttpRequest, HttpResponse};

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "Alive")))]
#[get("/healthz")]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// Ready to serve: the model is loaded and the database answers.
#[utoipa::path(get, path = "/readyz", tag = "ops",
    responses((status = 200, description = "Ready"), (status = 503, description = "Not ready, with the reason")))]
#[get("/readyz")]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let model = state.served().map_err(|e| e.to_string()).and_then(|s| {
        if s.engine.is_running() {
            Ok(s.id.clone())
        } else {
            Err("the engine thread has stopped; the server is exiting".to_string())
        }
    });
    let database = state.store.ping().await.map_err(|e| e.to_string());
    let ready = model.is_ok() && database.is_ok();
    let body = serde_json::json!({
        "ready": ready,
        "model": model.as_ref().map_or_else(|e| serde_json::json!({ "error": e }), |m| serde_json::json!(m)),
        "database": database.as_ref().map_or_else(|e| serde_json::json!({ "error": e }), |_| serde_json::json!("ok")),
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Prometheus metrics (text format): the operator's (bearer operator secret or operator JWT), or
/// anyone's on the metrics listener (`server.metrics_bind`, an address the operator keeps on a
/// private network).
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text format"),
              (status = 401, description = "No operator credential"),
              (status = 403, description = "A tenant's credential")),
    security(("bearer" = [])))]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    if state.ops.metrics_addr.is_none_or(|a| a != req.app_config().local_addr()) {
        OperatorAuth::from_request(&req, &mut Payload::None).await?;
    }
    if let Some(served) = state.model.served.get() {
        if let Some(s) = served.engine.snapshot().await {
            ::metrics::gauge!("cachet:prefix_cache_slots").set(s.cached_slots as f64);
            ::metrics::gauge!("cachet:kv_cache_usage_ratio").set(s.kv_used as f64 / s.kv_capacity.max(1) as f64);
            ::metrics::gauge!("cachet:kv_cache_capacity_tokens").set(s.kv_capacity as f64);
        }
    }
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(state.ops.metrics.render()))
}

/// This document.
#[get("/openapi.json")]
pub async fn openapi() -> HttpResponse {
    use utoipa::OpenApi;
    HttpResponse::Ok().json(super::ApiDoc::openapi())
}
