//! Signing in to the report page without a token in any URL (addresses end up in access logs,
//! proxies' logs and browser histories):
//!
//! - **A one-time link**: `POST /v1/reports/sign-in-links` with the bearer token (tenant or
//!   operator) answers a link `/reports/sign-in?code=…`, good once for five minutes; a browser
//!   that opens it gets a session cookie. Only the code's SHA-256 is stored.
//! - **The form** of `GET /reports` (`POST /reports/sign-in`, the token in the body).
//!
//! Either way the cookie holds a token minted for the browser session (12 hours), HTTP-only,
//! `SameSite=Strict`. A link never silently replaces a signed-in account with another (a link
//! sent by someone else would otherwise sign the victim into the sender's account): the browser
//! must sign out first. The form and sign-out accept only same-origin posts.

use crate::auth::{cookie_token, viewer_of, Viewer, TOKEN_COOKIE};
use crate::error::ApiError;
use crate::reports::format::escape;
use crate::state::AppState;
use actix_web::cookie::{time, Cookie, SameSite};
use actix_web::http::StatusCode;
use actix_web::{get, post, web, HttpRequest, HttpResponse};
use cachet_tenants::store::SignInSubject;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// How long a sign-in link is good for.
pub const LINK_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a browser session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

fn sha256(code: &str) -> [u8; 32] {
    Sha256::digest(code.as_bytes()).into()
}

/// Whether a state-changing browser request comes from this site's own pages: `Sec-Fetch-Site`
/// when the browser sends it, else `Origin`. A request with neither is not from a browser form
/// (browsers send `Origin` with every POST), so it cannot be a cross-site forgery.
fn same_origin(req: &HttpRequest) -> bool {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        return site == "same-origin" || site == "none";
    }
    match header("origin") {
        None => true,
        Some(origin) => {
            let info = req.connection_info();
            origin == format!("{}://{}", info.scheme(), info.host())
        }
    }
}

/// A small HTML page with `status`: a heading, a message and, if `form`, the sign-in form.
pub(crate) fn page(status: StatusCode, heading: &str, message: &str, form: bool, offer_sign_out: bool) -> HttpResponse {
    let mut body = format!(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>{h}</title><style>body{{font:15px/1.5 system-ui,sans-serif;max-width:560px;margin:48px auto;padding:0 16px;color:#1f2328}}input[type=password]{{width:100%;padding:6px;font:inherit;box-sizing:border-box}}button{{margin-top:10px;padding:6px 14px;font:inherit}}.msg{{color:#59636e}}</style></head><body><h1>{h}</h1><p class="msg">{m}</p>"#,
        h = escape(heading),
        m = escape(message),
    );
    if form {
        body.push_str(r#"<form method="post" action="/reports/sign-in"><label for="token">Token (a tenant's, or the operator's)</label><input type="password" id="token" name="token" autocomplete="off" required><button type="submit">Sign in</button></form><p class="msg">Or open a one-time link: <code>POST /v1/reports/sign-in-links</code> with your token.</p>"#);
    }
    if offer_sign_out {
        body.push_str(
            r#"<form method="post" action="/reports/sign-out"><button type="submit">Sign out</button></form>"#,
        );
    }
    body.push_str("</body></html>");
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'"))
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .body(body)
}

/// The cookie of a browser session for `viewer`, with a freshly minted token.
fn session_cookie(state: &AppState, req: &HttpRequest, viewer: &Viewer) -> Result<Cookie<'static>, ApiError> {
    let token = match viewer {
        Viewer::Operator => state.auth.jwt.issue_operator(SESSION_TTL),
        Viewer::Tenant(t) => state.auth.jwt.issue(t.id, SESSION_TTL),
    }
    .map_err(|e| ApiError::Internal(format!("minting a session token: {e}")))?;
    Ok(Cookie::build(TOKEN_COOKIE, token)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(req.connection_info().scheme() == "https")
        .max_age(time::Duration::seconds(SESSION_TTL.as_secs() as i64))
        .finish())
}

/// `location` after signing in: the report page with the query the link carried (without its
/// code).
fn report_location(req: &HttpRequest) -> String {
    let rest: Vec<&str> =
        req.query_string().split('&').filter(|kv| !kv.is_empty() && !kv.starts_with("code=")).collect();
    if rest.is_empty() {
        "/reports".into()
    } else {
        format!("/reports?{}", rest.join("&"))
    }
}

/// Who the browser's cookie signs in, if it holds a valid one.
async fn signed_in(state: &AppState, req: &HttpRequest) -> Option<Viewer> {
    let token = cookie_token(req)?;
    viewer_of(state, &token).await.ok()
}

/// A new one-time sign-in link for the caller (bearer token: a tenant's or the operator's).
#[utoipa::path(post, path = "/v1/reports/sign-in-links", tag = "reports",
    responses((status = 201, description = "`{\"url\": \"/reports/sign-in?code=…\", \"expires_at\": …}`: open the URL in a browser, once, within five minutes; append `&from=…&to=…` to choose the window"),
              (status = 401, description = "No valid bearer token")),
    security(("bearer" = [])))]
#[post("/v1/reports/sign-in-links")]
pub async fn create_link(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    // The bearer header only: a cookie must not be able to mint links.
    let token = crate::auth::header_token(&req)
        .ok_or_else(|| ApiError::Unauthorized("missing bearer token (Authorization: Bearer …)".into()))?;
    let subject = match viewer_of(&state, &token).await? {
        Viewer::Operator => SignInSubject::Operator,
        Viewer::Tenant(t) => SignInSubject::Tenant(t.id),
    };
    let code = cachet_tenants::random_hex(32).map_err(|e| ApiError::Internal(format!("randomness: {e}")))?;
    let expires_at = state.store.create_sign_in_code(&sha256(&code), subject, LINK_TTL).await?;
    Ok(HttpResponse::Created()
        .insert_header(("Cache-Control", "no-store"))
        .json(serde_json::json!({"url": format!("/reports/sign-in?code={code}"), "expires_at": expires_at})))
}

#[derive(Debug, Deserialize)]
pub struct CodeQuery {
    code: Option<String>,
}

/// Opens a one-time sign-in link: the code is exchanged for a session cookie, then the report
/// page. A browser signed in as another account must sign out first (409).
#[get("/reports/sign-in")]
pub async fn sign_in_with_code(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<CodeQuery>,
) -> Result<HttpResponse, ApiError> {
    let invalid = || {
        page(
            StatusCode::UNAUTHORIZED,
            "Sign-in link not valid",
            "This link is unknown, already used or expired. Ask for a new one, or sign in with your token.",
            true,
            false,
        )
    };
    let Some(code) = q.code.as_deref().filter(|c| c.len() <= 128) else {
        return Ok(invalid());
    };
    let hash = sha256(code);
    if let Some(current) = signed_in(&state, &req).await {
        let Some(subject) = state.store.peek_sign_in_code(&hash).await? else { return Ok(invalid()) };
        let same = match (&current, subject) {
            (Viewer::Operator, SignInSubject::Operator) => true,
            (Viewer::Tenant(t), SignInSubject::Tenant(id)) => t.id == id,
            _ => false,
        };
        if !same {
            return Ok(page(
                StatusCode::CONFLICT,
                "Signed in as another account",
                &format!(
                    "This browser is signed in as {}, and the link is for another account. Sign out first, then open the link again.",
                    current.describe()
                ),
                false,
                true,
            ));
        }
    }
    let Some(subject) = state.store.redeem_sign_in_code(&hash).await? else { return Ok(invalid()) };
    let viewer = match subject {
        SignInSubject::Operator => Viewer::Operator,
        SignInSubject::Tenant(id) => match state.auth.tenants.get(&state, id).await? {
            Some(t) => Viewer::Tenant(t),
            None => return Ok(invalid()),
        },
    };
    let cookie = session_cookie(&state, &req, &viewer)?;
    Ok(HttpResponse::SeeOther()
        .cookie(cookie)
        .insert_header(("Location", report_location(&req)))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .insert_header(("Cache-Control", "no-store"))
        .finish())
}

#[derive(Debug, Deserialize)]
pub struct SignInForm {
    token: cachet_tenants::Secret,
}

/// The sign-in form's target: a same-origin post with the token in its body.
#[post("/reports/sign-in")]
pub async fn sign_in_with_form(
    state: web::Data<AppState>,
    req: HttpRequest,
    form: web::Form<SignInForm>,
) -> Result<HttpResponse, ApiError> {
    if !same_origin(&req) {
        return Ok(page(StatusCode::FORBIDDEN, "Sign in", "Sign in from this site's own page.", true, false));
    }
    let viewer = match viewer_of(&state, form.token.expose().trim()).await {
        Ok(v) => v,
        Err(ApiError::Unauthorized(_)) => {
            return Ok(page(StatusCode::UNAUTHORIZED, "Sign in", "That token is not valid.", true, false))
        }
        Err(e) => return Err(e),
    };
    let cookie = session_cookie(&state, &req, &viewer)?;
    Ok(HttpResponse::SeeOther()
        .cookie(cookie)
        .insert_header(("Location", "/reports"))
        .insert_header(("Cache-Control", "no-store"))
        .finish())
}

/// Ends the browser session (same-origin posts only).
#[post("/reports/sign-out")]
pub async fn sign_out(req: HttpRequest) -> HttpResponse {
    if !same_origin(&req) {
        return page(StatusCode::FORBIDDEN, "Sign out", "Sign out from this site's own page.", false, true);
    }
    let mut gone = Cookie::build(TOKEN_COOKIE, "").path("/").http_only(true).same_site(SameSite::Strict).finish();
    gone.make_removal();
    HttpResponse::SeeOther().cookie(gone).insert_header(("Location", "/reports")).finish()
}
