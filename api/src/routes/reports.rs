//! Usage reports: `GET /v1/reports/usage` (a tenant's own, JSON or CSV), `GET /admin/reports/usage`
//! (the operator's, across tenants) and the browser page `GET /reports` (inline SVG charts).
//! Definitions of every number: `cachet_tenants::report`.

use crate::auth::{cookie_token, header_token, viewer_of, OperatorAuth, TenantAuth, Viewer};
use crate::error::ApiError;
use crate::routes::sign_in::page;
use crate::state::AppState;
use actix_web::http::StatusCode;
use actix_web::{get, web, HttpRequest, HttpResponse};
use cachet_tenants::report::{GroupBy, Report};
use cachet_tenants::TenantId;
use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Deserialize;
use uuid::Uuid;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ReportQuery {
    /// Start (RFC 3339, or a date: its midnight UTC); default 30 days before `to`.
    pub from: Option<String>,
    /// End, exclusive (RFC 3339, or a date: the end of that day UTC); default now.
    pub to: Option<String>,
    /// `day` (default), `session`, `repo` or `task`.
    pub group_by: Option<String>,
    /// `csv` for CSV (as does `Accept: text/csv`).
    pub format: Option<String>,
    /// Operator only: one tenant.
    pub tenant: Option<Uuid>,
}

fn instant(value: &str, end_of_day: bool, param: &'static str) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(value) {
        return Ok(t.with_timezone(&Utc));
    }
    let day = NaiveDate::parse_from_str(value, "%Y-%m-%d")
        .map_err(|_| ApiError::bad_param(param, format!("{param} must be RFC 3339 or YYYY-MM-DD, not {value:?}")))?;
    let start = day.and_hms_opt(0, 0, 0).map(|d| d.and_utc()).ok_or_else(|| ApiError::bad_param(param, "bad date"))?;
    Ok(if end_of_day { start + Duration::days(1) } else { start })
}

/// The window and grouping a query asks for.
pub(crate) fn parse(q: &ReportQuery) -> Result<(DateTime<Utc>, DateTime<Utc>, GroupBy), ApiError> {
    let to = q.to.as_deref().map(|v| instant(v, true, "to")).transpose()?.unwrap_or_else(Utc::now);
    let from = q.from.as_deref().map(|v| instant(v, false, "from")).transpose()?.unwrap_or(to - Duration::days(30));
    if to <= from {
        return Err(ApiError::bad_param("to", "`to` must be after `from`"));
    }
    if to - from > Duration::days(3660) {
        return Err(ApiError::bad_param("from", "a report covers at most ten years"));
    }
    let group =
        q.group_by.as_deref().unwrap_or("day").parse().map_err(|m: String| ApiError::bad_param("group_by", m))?;
    Ok((from, to, group))
}

fn wants_csv(req: &HttpRequest, q: &ReportQuery) -> bool {
    q.format.as_deref() == Some("csv")
        || req
            .headers()
            .get(actix_web::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/csv"))
}

fn respond(req: &HttpRequest, q: &ReportQuery, report: &Report) -> HttpResponse {
    if wants_csv(req, q) {
        HttpResponse::Ok().content_type("text/csv; charset=utf-8").body(report.csv())
    } else {
        HttpResponse::Ok().json(report)
    }
}

async fn report(
    state: &AppState,
    tenant: Option<TenantId>,
    q: &ReportQuery,
    group: Option<GroupBy>,
) -> Result<Report, ApiError> {
    let (from, to, asked) = parse(q)?;
    // Rows still on their way to the database count too.
    state.accounting.ledger.flush().await;
    Ok(state.store.usage_report(tenant, from, to, group.unwrap_or(asked)).await?)
}

/// The calling tenant's usage report.
#[utoipa::path(get, path = "/v1/reports/usage", tag = "reports", params(ReportQuery),
    responses((status = 200, description = "The report (JSON, or CSV with `Accept: text/csv` or `format=csv`)"),
              (status = 400, description = "Bad window or grouping")),
    security(("bearer" = [])))]
#[get("/v1/reports/usage")]
pub async fn tenant_report(
    state: web::Data<AppState>,
    req: HttpRequest,
    auth: TenantAuth,
    q: web::Query<ReportQuery>,
) -> Result<HttpResponse, ApiError> {
    if q.tenant.is_some_and(|t| t != auth.0.id.0) {
        return Err(ApiError::Forbidden("a tenant sees only its own report".into()));
    }
    let report = report(&state, Some(auth.0.id), &q, None).await?;
    Ok(respond(&req, &q, &report))
}

/// The usage report across tenants (or of `tenant`).
#[utoipa::path(get, path = "/admin/reports/usage", tag = "admin", params(ReportQuery),
    responses((status = 200, description = "The report"), (status = 403, description = "Not the operator")),
    security(("bearer" = [])))]
#[get("/admin/reports/usage")]
pub async fn operator_report(
    state: web::Data<AppState>,
    req: HttpRequest,
    _op: OperatorAuth,
    q: web::Query<ReportQuery>,
) -> Result<HttpResponse, ApiError> {
    let report = report(&state, q.tenant.map(TenantId), &q, None).await?;
    Ok(respond(&req, &q, &report))
}

/// The report page for a browser: the tenant's own (or, with the operator's credential, all
/// tenants'), by day. Without a session (or with an invalid one) it answers the sign-in page
/// (`routes::sign_in`); a token in the URL is refused, never used.
#[utoipa::path(get, path = "/reports", tag = "reports", params(ReportQuery),
    responses((status = 200, description = "HTML"), (status = 401, description = "The sign-in page"),
              (status = 400, description = "A token in the URL (refused: sign in instead)")))]
#[get("/reports")]
pub async fn report_page(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<ReportQuery>,
) -> Result<HttpResponse, ApiError> {
    if req.query_string().split('&').any(|kv| kv.starts_with("token=")) {
        return Ok(page(
            StatusCode::BAD_REQUEST,
            "Sign in",
            "Tokens do not go in addresses (they end up in logs and browser histories); this one was not used. \
             Sign in below, or open a one-time link from POST /v1/reports/sign-in-links.",
            true,
            false,
        ));
    }
    let token = header_token(&req).or_else(|| cookie_token(&req));
    let Some(token) = token else {
        return Ok(page(StatusCode::UNAUTHORIZED, "Sign in", "Sign in to see usage reports.", true, false));
    };
    let viewer = match viewer_of(&state, &token).await {
        Ok(v) => v,
        Err(ApiError::Unauthorized(_)) => {
            return Ok(page(
                StatusCode::UNAUTHORIZED,
                "Sign in",
                "Your session has ended or its token is no longer valid.",
                true,
                false,
            ))
        }
        Err(e) => return Err(e),
    };
    let (tenant, title) = match &viewer {
        Viewer::Tenant(t) => (Some(t.id), format!("{} — usage", t.name)),
        Viewer::Operator => match q.tenant {
            Some(t) => (Some(TenantId(t)), format!("tenant {t} — usage")),
            None => (None, "All tenants — usage".to_string()),
        },
    };
    let report = report(&state, tenant, &q, Some(GroupBy::Day)).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'",
        ))
        .insert_header(("Cache-Control", "no-store"))
        .body(crate::reports::render_page(&title, &report)))
}
