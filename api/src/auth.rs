//! Who is calling: a tenant (JWT bearer token whose tenant still exists) or
//! the operator (the operator bearer secret, or a JWT with the operator
//! role). The tenant scope of everything a request does comes from here,
//! never from its body.

use crate::error::ApiError;
use crate::state::AppState;
use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};
use cachet_tenants::jwt::Role;
use cachet_tenants::store::StoreError;
use cachet_tenants::{TaskId, Tenant, TenantId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// An authenticated tenant.
#[derive(Clone, Debug)]
pub struct TenantAuth(pub Tenant);

/// The authenticated operator.
#[derive(Clone, Copy, Debug)]
pub struct OperatorAuth;

/// Tenants recently read from the database. Entries are re-read after a few
/// seconds, so a deleted tenant's tokens stop working quickly; while the
/// database is unreachable the last known state is used, so serving (and
/// the ledger's spool) goes on through an outage.
#[derive(Debug, Default)]
pub struct TenantCache {
    entries: Mutex<HashMap<TenantId, (Option<Tenant>, Instant)>>,
}

const FRESH: Duration = Duration::from_secs(5);

impl TenantCache {
    /// Forgets a tenant (after an admin change).
    pub fn forget(&self, id: TenantId) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    pub(crate) async fn get(&self, state: &AppState, id: TenantId) -> Result<Option<Tenant>, ApiError> {
        let cached = self.entries.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
        if let Some((t, at)) = &cached {
            if at.elapsed() < FRESH {
                return Ok(t.clone());
            }
        }
        match state.store.get_tenant(id).await {
            Ok(t) => {
                let live = t.filter(|t| t.deleted_at.is_none());
                self.entries.lock().unwrap_or_else(|e| e.into_inner()).insert(id, (live.clone(), Instant::now()));
                Ok(live)
            }
            Err(StoreError::Unavailable { message: m, .. }) => match cached {
                Some((t, _)) => Ok(t),
                None => Err(ApiError::NotReady(format!("the tenant database is unreachable: {m}"))),
            },
            Err(e) => Err(ApiError::Internal(e.to_string())),
        }
    }
}

/// Ids (tasks) this replica has checked against their tenant, so that requests naming them go on
/// while the database is unreachable; an id it has not checked is refused then (503) rather
/// than taken on trust, because taking it would let a request claim another tenant's task.
#[derive(Debug, Default)]
pub struct KnownIds {
    entries: Mutex<HashMap<(TenantId, TaskId), Instant>>,
}

/// How long a checked id stays known, and how many are kept.
const KNOWN_FOR: Duration = Duration::from_secs(24 * 3600);
const KNOWN_MAX: usize = 100_000;

impl KnownIds {
    /// Remembers that `id` is `tenant`'s.
    pub fn insert(&self, tenant: TenantId, id: TaskId) {
        let mut m = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= KNOWN_MAX {
            m.retain(|_, at| at.elapsed() < KNOWN_FOR);
            if m.len() >= KNOWN_MAX {
                // Still full of fresh ids: forget the oldest half.
                let mut ages: Vec<Instant> = m.values().copied().collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                m.retain(|_, at| *at > cut);
            }
        }
        m.insert((tenant, id), Instant::now());
    }

    /// Whether `id` was checked as `tenant`'s recently.
    pub fn contains(&self, tenant: TenantId, id: TaskId) -> bool {
        let m = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(tenant, id)).is_some_and(|at| at.elapsed() < KNOWN_FOR)
    }
}

fn bearer(req: &HttpRequest) -> Result<String, ApiError> {
    let value = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::Unauthorized("missing bearer token (Authorization: Bearer …)".into()))?;
    let value = value.to_str().map_err(|_| ApiError::Unauthorized("malformed Authorization header".into()))?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .ok_or_else(|| ApiError::Unauthorized("the Authorization header must be `Bearer <token>`".into()))?;
    Ok(token.trim().to_string())
}

fn state(req: &HttpRequest) -> Result<web::Data<AppState>, ApiError> {
    req.app_data::<web::Data<AppState>>().cloned().ok_or_else(|| ApiError::Internal("no application state".into()))
}

/// Constant-time comparison of two secrets.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The live tenant a tenant token names.
async fn tenant_of(state: &AppState, token: &str) -> Result<Tenant, ApiError> {
    let claims = state.auth.jwt.verify(token).map_err(|e| ApiError::Unauthorized(e.to_string()))?;
    if claims.role != Role::Tenant {
        return Err(ApiError::Unauthorized("this endpoint needs a tenant token".into()));
    }
    let id = claims.tenant.ok_or_else(|| ApiError::Unauthorized("the token names no tenant".into()))?;
    state
        .auth
        .tenants
        .get(state, id)
        .await?
        .ok_or_else(|| ApiError::Unauthorized("the token's tenant does not exist".into()))
}

/// Whether `token` is the operator's credential.
fn is_operator(state: &AppState, token: &str) -> bool {
    same(token.as_bytes(), state.auth.operator_token.expose().as_bytes())
        || state.auth.jwt.verify(token).is_ok_and(|c| c.role == Role::Operator)
}

impl FromRequest for TenantAuth {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<TenantAuth, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let (token, state) = (bearer(req), state(req));
        Box::pin(async move {
            let (token, state) = (token?, state?);
            Ok(TenantAuth(tenant_of(&state, &token).await?))
        })
    }
}

/// Who looks at a browser page: a tenant or the operator. The token comes from the
/// `Authorization` header, else the `cachet_token` cookie (set by signing in: `routes::sign_in`).
/// Never from the URL: addresses end up in access logs, proxies' logs and browser histories.
#[derive(Clone, Debug)]
pub enum Viewer {
    Tenant(Tenant),
    Operator,
}

impl Viewer {
    /// "tenant NAME" or "the operator", for pages.
    pub fn describe(&self) -> String {
        match self {
            Viewer::Tenant(t) => format!("tenant {}", t.name),
            Viewer::Operator => "the operator".into(),
        }
    }
}

/// The name of the browser cookie holding a bearer token.
pub const TOKEN_COOKIE: &str = "cachet_token";

/// The bearer token of the `Authorization` header, if there is one.
pub fn header_token(req: &HttpRequest) -> Option<String> {
    bearer(req).ok()
}

/// The session cookie's token, if there is one.
pub fn cookie_token(req: &HttpRequest) -> Option<String> {
    req.cookie(TOKEN_COOKIE).map(|c| c.value().to_string())
}

/// Who `token` is: the operator's credential, or a live tenant's token.
pub async fn viewer_of(state: &AppState, token: &str) -> Result<Viewer, ApiError> {
    if is_operator(state, token) {
        return Ok(Viewer::Operator);
    }
    Ok(Viewer::Tenant(tenant_of(state, token).await?))
}

impl FromRequest for Viewer {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Viewer, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let token = header_token(req)
            .or_else(|| cookie_token(req))
            .ok_or_else(|| ApiError::Unauthorized("sign in (GET /reports) or send Authorization: Bearer …".into()));
        let state = state(req);
        Box::pin(async move {
            let (token, state) = (token?, state?);
            viewer_of(&state, &token).await
        })
    }
}

impl FromRequest for OperatorAuth {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<OperatorAuth, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let (token, state) = (bearer(req), state(req));
        Box::pin(async move {
            let (token, state) = (token?, state?);
            if same(token.as_bytes(), state.auth.operator_token.expose().as_bytes()) {
                return Ok(OperatorAuth);
            }
            match state.auth.jwt.verify(&token) {
                Ok(c) if c.role == Role::Operator => Ok(OperatorAuth),
                Ok(_) => Err(ApiError::Forbidden("this endpoint needs the operator credential".into())),
                Err(e) => Err(ApiError::Unauthorized(e.to_string())),
            }
        })
    }
}
