//! What every handler can reach: the engine (once its model is loaded), the
//! store, auth, the ledger and limits.

use crate::auth::TenantCache;
use crate::config::Settings;
use crate::ledger::Ledger;
use crate::ratelimit::RateLimiter;
use cachet_engine::runtime::EngineHandle;
use cachet_tenants::jwt::Jwt;
use cachet_tenants::store::OwnedSession;
use cachet_tenants::store::Store;
use cachet_tenants::{RepoId, Secret};
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::{Mutex, OnceLock};

/// The model as served: the engine, its id, and the public prefix.
#[derive(Debug)]
pub struct Served {
    pub engine: EngineHandle,
    /// The `model` id clients send.
    pub id: String,
    /// The operator's public system prompt, and its tokens when rendered
    /// alone as the first system message (the prefix every tenant shares).
    pub public: Option<(String, Vec<u32>)>,
    /// Every public prefix registered (the system prompt's among them) and the discovery counts.
    pub prefixes: crate::prefixes::PublicPrefixes,
    /// Unix time the model was loaded (for `/v1/models`).
    pub created: i64,
    /// Sampling for the fields a request leaves out.
    pub sampling: crate::config::SamplingDefaults,
}

/// Shared application state, in groups: a handler reaches the group it uses
/// (`state.model.served`, `state.auth.jwt`, `state.accounting.ledger`, …).
pub struct AppState {
    pub settings: Settings,
    /// The model: served once loaded, or why it failed to load.
    pub model: ModelSlot,
    pub store: Store,
    /// Who may call: credentials, and ids checked against their tenants.
    pub auth: Credentials,
    /// What requests cost and may use: the ledger, the rate limits, the KV shares.
    pub accounting: Accounting,
    /// Mirrors and repository contexts.
    pub repos: std::sync::Arc<crate::context::Repos>,
    /// This process as one of the replicas sharing the database.
    pub replica: Replica,
    /// Metrics and the operator's signals.
    pub ops: Ops,
}

/// The model slot: empty until the model is loaded in the background.
#[derive(Debug, Default)]
pub struct ModelSlot {
    pub served: OnceLock<Served>,
    /// Why the model failed to load, if it did.
    pub load_error: Mutex<Option<String>>,
}

/// Credentials and what was checked against them.
#[derive(Debug)]
pub struct Credentials {
    pub jwt: Jwt,
    pub operator_token: Secret,
    /// Tenants by id, as the token verification last read them.
    pub tenants: TenantCache,
    /// Task ids checked against their tenants (see [`crate::auth::KnownIds`]).
    pub known_tasks: crate::auth::KnownIds,
}

/// What requests cost and may use.
#[derive(Debug)]
pub struct Accounting {
    pub ledger: Ledger,
    pub limiter: RateLimiter,
    /// The KV share the engine last heard for each tenant (its plan's).
    pub shares: Mutex<std::collections::HashMap<cachet_tenants::TenantId, f64>>,
}

/// This replica: its id, its turns and sessions, and what reached it from the others.
#[derive(Debug, Default)]
pub struct Replica {
    /// This process among the replicas sharing the database (fan-out notices name it).
    pub id: uuid::Uuid,
    /// This replica's turns.
    pub turns: std::sync::Arc<Mutex<Turns>>,
    /// When this replica last assembled a prompt on each (repository, branch): a push another
    /// replica received is pre-warmed here only where this replica serves the branch.
    pub branches_served: Mutex<std::collections::HashMap<(RepoId, String), std::time::Instant>>,
    /// Each session's base commit on this replica (overlay after a push: `crate::sessions::overlay`).
    pub bases: crate::sessions::overlay::SessionBases,
    /// Changes made elsewhere (pushes other replicas received, deletions) applied here.
    pub changes_applied: std::sync::atomic::AtomicU64,
    /// The preambles of bound requests on each branch (`crate::openai::binding`), which a push
    /// pre-warms the new context behind.
    pub preambles: crate::openai::binding::Preambles,
    /// The working trees this replica watches (`crate::watch`).
    pub watches: crate::watch::Watches,
}

/// Metrics and the operator's signals.
pub struct Ops {
    pub metrics: PrometheusHandle,
    /// The address of the metrics listener (`server.metrics_bind`), where `/metrics` needs no
    /// credential.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Tells [`crate::prefixes::keep_loaded`] to reload the public prefixes.
    pub prefix_changes: tokio::sync::mpsc::UnboundedSender<()>,
}

impl std::fmt::Debug for Ops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ops").field("metrics_addr", &self.metrics_addr).finish_non_exhaustive()
    }
}

/// This replica's turns: the sessions with a turn running, and the leases of ended turns whose
/// release is still on its way to Postgres (the next turn here takes those over, so a client's
/// next message never waits for that release).
#[derive(Debug, Default)]
pub struct Turns {
    running: std::collections::HashSet<OwnedSession>,
    releasing: std::collections::HashMap<OwnedSession, uuid::Uuid>,
}

/// Holds a session's one turn in progress; dropping it ends the turn. Within a replica
/// [`Turns`] says so at once; across replicas a lease in Postgres does, renewed while the guard
/// lives (so a replica that dies frees the session within [`TURN_LEASE`]).
#[derive(Debug)]
pub struct TurnGuard {
    turns: std::sync::Arc<Mutex<Turns>>,
    session: OwnedSession,
    holder: uuid::Uuid,
    store: Store,
    renew: tokio::task::JoinHandle<()>,
}

/// How long a turn's lease lasts without renewal; it is renewed every third of that.
pub const TURN_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

impl Drop for TurnGuard {
    fn drop(&mut self) {
        {
            let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            turns.running.remove(&self.session);
            turns.releasing.insert(self.session, self.holder);
        }
        self.renew.abort();
        // Give the lease back now; without a runtime (shutting down) it simply expires.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (turns, store, session, holder) = (self.turns.clone(), self.store.clone(), self.session, self.holder);
            rt.spawn(async move {
                if let Err(e) = store.end_turn(session, holder).await {
                    tracing::warn!(session = %session.id(), "releasing the turn lease (it expires by itself): {e}");
                }
                let mut turns = turns.lock().unwrap_or_else(|e| e.into_inner());
                if turns.releasing.get(&session) == Some(&holder) {
                    turns.releasing.remove(&session);
                }
            });
        }
    }
}

impl Turns {
    /// Turn leases given back but maybe not yet released in the database: `(session, holder)`.
    pub fn releasing(&self) -> Vec<(OwnedSession, uuid::Uuid)> {
        self.releasing.iter().map(|(s, h)| (*s, *h)).collect()
    }
}

/// The engine's key for a tenant: its cache scope, fair share and KV share. The one place the
/// service makes it, so every request, pre-warm, share and purge of a tenant names the same
/// scope.
pub fn engine_tenant(id: cachet_tenants::TenantId) -> cachet_engine::radix::TenantKey {
    cachet_engine::radix::TenantKey::new(id.to_string())
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("served", &self.model.served.get().map(|s| &s.id)).finish_non_exhaustive()
    }
}

impl AppState {
    /// Notes that this replica served a prompt on `branch` of `repo`.
    pub fn note_branch_served(&self, repo: RepoId, branch: &str) {
        let mut served = self.replica.branches_served.lock().unwrap_or_else(|e| e.into_inner());
        served.insert((repo, branch.to_string()), std::time::Instant::now());
    }

    /// Whether this replica served a prompt on `branch` of `repo` within `within`.
    pub fn served_branch_within(&self, repo: RepoId, branch: &str, within: std::time::Duration) -> bool {
        let served = self.replica.branches_served.lock().unwrap_or_else(|e| e.into_inner());
        served.get(&(repo, branch.to_string())).is_some_and(|t| t.elapsed() <= within)
    }

    /// Tells the engine a tenant's KV share when it is new or changed.
    pub fn sync_share(&self, served: &Served, tenant: &cachet_tenants::Tenant) {
        let mut shares = self.accounting.shares.lock().unwrap_or_else(|e| e.into_inner());
        if shares.get(&tenant.id) != Some(&tenant.plan.kv_share) {
            shares.insert(tenant.id, tenant.plan.kv_share);
            served.engine.set_share(engine_tenant(tenant.id), tenant.plan.kv_share);
        }
    }

    /// Starts a turn of `session`; `None` if one is already in progress, here or on another
    /// replica.
    pub async fn begin_turn(&self, session: OwnedSession) -> Result<Option<TurnGuard>, cachet_tenants::StoreError> {
        let ended_here = {
            let mut turns = self.replica.turns.lock().unwrap_or_else(|e| e.into_inner());
            if !turns.running.insert(session) {
                return Ok(None);
            }
            turns.releasing.get(&session).copied()
        };
        let holder = uuid::Uuid::new_v4();
        let taken = self.store.begin_turn(session, holder, TURN_LEASE, ended_here).await;
        {
            let mut turns = self.replica.turns.lock().unwrap_or_else(|e| e.into_inner());
            if !matches!(taken, Ok(true)) {
                turns.running.remove(&session);
                return taken.map(|_| None);
            }
            if ended_here.is_some() && turns.releasing.get(&session) == ended_here.as_ref() {
                turns.releasing.remove(&session);
            }
        }
        let store = self.store.clone();
        let renew = tokio::spawn(async move {
            loop {
                tokio::time::sleep(TURN_LEASE / 3).await;
                match store.renew_turn(session, holder, TURN_LEASE).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(
                            session = %session.id(),
                            "the turn lease was lost (it expired); another turn may start"
                        );
                        return;
                    }
                    Err(e) => tracing::warn!(session = %session.id(), "renewing the turn lease: {e}"),
                }
            }
        });
        Ok(Some(TurnGuard { turns: self.replica.turns.clone(), session, holder, store: self.store.clone(), renew }))
    }

    /// The served model, or a 503 while it loads (or if it failed to).
    pub fn served(&self) -> Result<&Served, crate::error::ApiError> {
        self.model.served.get().ok_or_else(|| {
            let why = self.model.load_error.lock().unwrap_or_else(|e| e.into_inner()).clone();
            crate::error::ApiError::NotReady(match why {
                Some(e) => format!("the model failed to load: {e}"),
                None => "the model is still loading".into(),
            })
        })
    }
}
