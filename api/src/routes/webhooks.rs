//! `POST /v1/webhooks/git/{repo}`: push events. Authenticated by the
//! repository's secret (HMAC-SHA256 of the raw body in
//! `X-Hub-Signature-256`, compared in constant time) before anything else is
//! said: an unknown repository answers exactly as a bad signature does (401),
//! so the endpoint tells nobody which repository ids exist. De-duplicated by
//! the SHA-256 of the signed body, not by the unsigned `X-GitHub-Delivery`
//! header (changing that header must not replay a captured delivery; a
//! redelivery of the same event has the same body). A push fetches the mirror, invalidates the cached spans
//! of changed and deleted files, records that, and pre-warms the new
//! repository context for the branch's active sessions.
//!
//! The delivery is recorded in the same transaction that records the
//! invalidation, committed only once the push is applied: a failed attempt
//! can be redelivered, a successful one is applied once. Other replicas on
//! the same database hear of it at commit and apply it too (`crate::fanout`).

use crate::config::AfterPush;
use crate::context::tag_source;
use crate::error::ApiError;
use crate::openai::retention_key;
use crate::sessions::assemble::session_prompt;
use crate::sessions::overlay::At;
use crate::state::{AppState, Served};
use actix_web::{post, web, HttpRequest, HttpResponse};
use cachet_context::CommitId;
use cachet_engine::generate::GenerateParams;
use cachet_engine::runtime::{Request, SloClass};
use cachet_tenants::store::{Invalidation, Repository, Store};
use cachet_tenants::RepoId;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::json;
use sha2::Sha256;
use std::collections::HashMap;
use uuid::Uuid;

/// A push: the ref and its old and new commit.
#[derive(Debug, Deserialize)]
pub(crate) struct Push {
    #[serde(rename = "ref")]
    pub git_ref: String,
    pub before: String,
    pub after: String,
}

fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// Checks `sha256=<hex>` against the HMAC of `body`.
pub(crate) fn verify(secret: &str, body: &[u8], signature: Option<&str>) -> Result<(), ApiError> {
    let unauthorized = || ApiError::Unauthorized("missing or invalid X-Hub-Signature-256".into());
    let hex = signature.and_then(|s| s.strip_prefix("sha256=")).ok_or_else(unauthorized)?;
    if hex.len() != 64 {
        return Err(unauthorized());
    }
    let mut given = [0u8; 32];
    for (i, byte) in given.iter_mut().enumerate() {
        *byte =
            u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(unauthorized)?, 16).map_err(|_| unauthorized())?;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).map_err(|_| unauthorized())?;
    mac.update(body);
    mac.verify_slice(&given).map_err(|_| unauthorized())
}

/// A webhook secret nobody has (random per process), for repository ids that do not exist.
fn unknown_secret() -> String {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET
        .get_or_init(|| {
            cachet_tenants::random_hex(32)
                .unwrap_or_else(|_| format!("{:x}{:x}", Uuid::new_v4().as_u128(), Uuid::new_v4().as_u128()))
        })
        .clone()
}

fn is_zero(oid: &str) -> bool {
    !oid.is_empty() && oid.bytes().all(|b| b == b'0')
}

fn is_oid(oid: &str) -> bool {
    (4..=64).contains(&oid.len()) && oid.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Receives a push webhook.
#[utoipa::path(post, path = "/v1/webhooks/git/{repo}", tag = "repositories",
    responses((status = 200, description = "Applied, a redelivery, or an event that is ignored"),
              (status = 400, description = "Malformed push"),
              (status = 401, description = "Bad signature, or no such repository (the same answer)"),
              (status = 502, description = "The fetch failed")))]
#[post("/v1/webhooks/git/{repo}")]
pub async fn git_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    repo: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let found = match repo.parse::<RepoId>() {
        Ok(id) => state.store.repository_for_webhook(id).await?,
        Err(_) => None,
    };
    // An unknown repository is checked against a secret nobody has: the same work and the same
    // 401 as a wrong signature.
    let secret = found.as_ref().map_or_else(unknown_secret, |r| r.webhook_secret.expose().to_owned());
    verify(&secret, &body, header(&req, "x-hub-signature-256"))?;
    let repo = found.ok_or_else(|| ApiError::Unauthorized("missing or invalid X-Hub-Signature-256".into()))?;

    let event = header(&req, "x-github-event").unwrap_or("push").to_string();
    if event != "push" {
        return Ok(HttpResponse::Ok().json(json!({"event": event, "ignored": true})));
    }
    if repo.status == cachet_tenants::store::RepoStatus::Fetching {
        // Its registration's fetch may have started before this push: the git host redelivers.
        return Err(ApiError::NotReady(format!(
            "repository {} is still being fetched; deliver the push again later",
            repo.id
        )));
    }
    crate::registration::ready(&repo)?;
    let push: Push = serde_json::from_slice(&body).map_err(|e| ApiError::bad(format!("invalid push body: {e}")))?;
    if !is_oid(&push.before) || !is_oid(&push.after) {
        return Err(ApiError::bad("before and after must be commit ids"));
    }
    let delivery = {
        use sha2::Digest;
        let digest = Sha256::digest(&body);
        format!("sha256:{}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
    };
    let Some(branch) = push.git_ref.strip_prefix("refs/heads/").map(str::to_string) else {
        return Ok(HttpResponse::Ok().json(json!({"event": "push", "ref": push.git_ref, "ignored": true})));
    };

    let duplicate = || Ok(HttpResponse::Ok().json(json!({"event": "push", "delivery": delivery, "duplicate": true})));
    if state.store.delivery_recorded(repo.id, &delivery).await? {
        return duplicate();
    }
    // The fetch runs with no transaction open and no pooled connection held: a slow remote must
    // not take the database from everyone else. Applying a push is idempotent (a fetch, cache
    // invalidations, a pre-warm), so a concurrent copy of this delivery may apply it too; the
    // transaction below records it once, and a failure before that records nothing, so the
    // sender's retry applies it again.
    let applied = apply(&state, &repo, &branch, &push, Received::Here).await?;
    let mut tx = state.store.pool().begin().await.map_err(cachet_tenants::StoreError::from)?;
    if !Store::record_delivery(&mut tx, repo.id, &delivery, &event).await? {
        return duplicate();
    }
    let inv = Invalidation {
        repo: repo.id,
        delivery_id: delivery.clone(),
        git_ref: push.git_ref.clone(),
        before: push.before.clone(),
        after: push.after.clone(),
        paths: applied.paths.clone(),
        evicted_tokens: applied.evicted as i64,
        prewarmed: applied.prewarmed as i32,
    };
    Store::record_invalidation(&mut tx, &inv, state.replica.id).await?;
    tx.commit().await.map_err(cachet_tenants::StoreError::from)?;
    tracing::info!(repo = %repo.id, %branch, paths = applied.paths.len(), evicted = applied.evicted,
                   prewarmed = applied.prewarmed, bound_prewarmed = applied.bound, "push applied");
    Ok(HttpResponse::Ok().json(json!({
        "event": "push", "delivery": delivery, "ref": push.git_ref, "before": push.before, "after": push.after,
        "changed_paths": applied.paths, "evicted_tokens": applied.evicted, "prewarmed": applied.prewarmed,
        "overlays_prewarmed": applied.overlays, "bound_prewarmed": applied.bound,
    })))
}

/// What a push did.
pub(crate) struct Applied {
    pub paths: Vec<String>,
    pub evicted: usize,
    pub prewarmed: usize,
    /// Sessions left behind whose next turn's prefix (with its overlay) was computed before the
    /// webhook answered.
    pub overlays: usize,
    /// Pre-warm requests sent for the preambles of bound requests (`crate::openai::binding`).
    pub bound: usize,
}

/// Which replica received a push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// This one (the webhook).
    Here,
    /// Another (heard through the fan-out).
    Elsewhere,
}

/// Applies a push to this replica: fetches the mirror, invalidates the changed files' cached
/// spans, pre-warms the branch's context if a session on it is active — for a push another
/// replica received, only if this replica served that branch within the session idle time
/// (behind an affinity proxy the others would compute a context nobody asks them for).
pub(crate) async fn apply(
    state: &web::Data<AppState>,
    repo: &Repository,
    branch: &str,
    push: &Push,
    received: Received,
) -> Result<Applied, ApiError> {
    let (st, r, before, after) = (state.clone(), repo.clone(), push.before.clone(), push.after.clone());
    // Fetch, diff, and the new context's block versions (to keep what did not change).
    let (paths, versions) = web::block(move || -> Result<_, ApiError> {
        let mirror = st.repos.mirror(&r)?;
        mirror.fetch()?;
        if is_zero(&after) {
            return Ok((Vec::new(), HashMap::new()));
        }
        let after = mirror.resolve(&after)?;
        let before = if is_zero(&before) { None } else { mirror.resolve(&before).ok() };
        let paths: Vec<String> = match &before {
            Some(before) => mirror.changed_paths(before, &after)?.into_iter().map(|c| c.path).collect(),
            None => Vec::new(),
        };
        let mut versions = HashMap::new();
        if let Some(served) = st.model.served.get() {
            let ctx = st.repos.context(&r, &mirror, &after, served.engine.tokenizer())?;
            for s in &ctx.segments {
                if let Some(p) = &s.path {
                    versions.insert(p.clone(), s.version.clone());
                }
            }
        }
        Ok((paths, versions))
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;

    let Some(served) = state.model.served.get() else {
        return Ok(Applied { paths, evicted: 0, prewarmed: 0, overlays: 0, bound: 0 });
    };
    let mut evicted = 0;
    // With overlays, the sessions this replica serves on the branch keep using their warm
    // prefix, stale blocks and all (their turns carry the new versions after it): nothing is
    // evicted for them; what they no longer use after their rebase is ordinary cache.
    let spare = state.repos.after_push(repo) == AfterPush::Overlay
        && state.replica.bases.serving(repo.id, branch, crate::sessions::idle(state));
    for path in paths.iter().filter(|_| !spare) {
        let source = tag_source(repo.id, branch, path);
        evicted += served.engine.invalidate(&source, versions.get(path).map(String::as_str)).await.unwrap_or(0);
    }
    let serves_branch = || state.served_branch_within(repo.id, branch, crate::sessions::idle(state));
    let (prewarmed, overlays, bound) = if is_zero(&push.after) || (received == Received::Elsewhere && !serves_branch())
    {
        (0, 0, 0)
    } else {
        let (prewarmed, overlays) = prewarm(state, served, repo, branch).await?;
        (prewarmed, overlays, crate::openai::binding::prewarm(state, served, repo, branch).await)
    };
    Ok(Applied { paths, evicted, prewarmed, overlays, bound })
}

/// Pre-warms the branch's repository context if a session on it is active; with overlays,
/// first the next turn's prefix of each session the push left behind (waiting for those, up to
/// `overlay_prewarm_wait_ms`). Returns the number of context pre-warm requests sent (0 or 1:
/// every session on a branch shares one context) and of overlays pre-warmed.
async fn prewarm(
    state: &web::Data<AppState>,
    served: &Served,
    repo: &Repository,
    branch: &str,
) -> Result<(usize, usize), ApiError> {
    let since = chrono::Utc::now() - crate::sessions::idle(state);
    let sessions = state.store.active_sessions(repo.id, branch, since).await?;
    let Some(latest) = sessions.first() else { return Ok((0, 0)) };
    let (st, r, b) = (state.clone(), repo.clone(), branch.to_string());
    let prompt = web::block(move || {
        let served = st.served()?;
        let commit: CommitId = st.repos.head(&r, &st.repos.mirror(&r)?, &b)?;
        session_prompt(&st.repos, served, &r, &b, &At::head(commit), &[], None)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    // With overlays, the sessions this replica serves on the branch are rebased after it (their
    // turns meanwhile start from their warm base, with the changes in an overlay).
    let behind = match state.repos.after_push(repo) {
        AfterPush::Overlay => {
            state.replica.bases.behind(repo.id, branch, &prompt.at.head, crate::sessions::idle(state))
        }
        AfterPush::Rebuild => Vec::new(),
    };
    // The turns right after the push start from each session's warm prefix and its overlay:
    // compute those first (a few hundred tokens each), before the new context (thousands).
    let wait = std::time::Duration::from_millis(state.settings.context.overlay_prewarm_wait_ms);
    let overlays = match behind.is_empty() {
        true => 0,
        false => crate::sessions::rebase::prewarm_overlays(state, repo, branch, &behind, wait).await,
    };
    // Those turns are served warm from their base: the new context (for their rebases and for
    // new sessions) is computed `rebase_delay_ms` later, so that they do not share the machine
    // with it (a pass of it in progress delayed them by up to 350 ms).
    let delay = match behind.is_empty() {
        true => std::time::Duration::ZERO,
        false => std::time::Duration::from_millis(state.settings.context.rebase_delay_ms),
    };
    let end = prompt.context_end;
    if end == 0 {
        crate::sessions::rebase::spawn(state.clone(), repo.clone(), branch.to_string(), behind, delay);
        return Ok((0, overlays));
    }
    let mut request = Request::new(
        crate::state::engine_tenant(repo.tenant),
        prompt.assembled.tokens[..end].to_vec(),
        GenerateParams::default(),
    );
    request.prewarm = true;
    request.slo = SloClass::Batch;
    request.public = prompt.public;
    request.spans = prompt.spans.into_iter().filter(|s| s.range.end <= end).collect();
    request.retention = Some((retention_key(repo.tenant, latest.id), crate::sessions::idle(state)));
    // Dropping the stream would cancel the request: drain it; then the rebases, which start
    // with this context. Without a delay it is submitted before the webhook answers.
    // A decode server has its prefill server compute the context first (`crate::disagg`).
    let remote = state.settings.disagg.role == crate::config::Role::Decode;
    let (st, r, b) = (state.clone(), repo.clone(), branch.to_string());
    let pending = if delay.is_zero() && !remote { Ok(served.engine.submit(request)) } else { Err(request) };
    let engine = served.engine.clone();
    tokio::spawn(async move {
        let mut events = match pending {
            Ok(events) => events,
            Err(request) => {
                tokio::time::sleep(delay).await;
                crate::disagg::remote_prefill(&st, &engine, &request).await;
                engine.submit(request)
            }
        };
        while events.next().await.is_some() {}
        crate::sessions::rebase::spawn(st, r, b, behind, std::time::Duration::ZERO);
    });
    Ok((1, overlays))
}
