//! Housekeeping every little while: idle sessions are closed (and their retention in the engine
//! released), idle open tasks are marked abandoned, ledger rows of requests a dead process left
//! are marked interrupted, registrations whose job was lost are taken up again.

use crate::openai::retention_key;
use crate::state::AppState;
use actix_web::web;
use std::time::Duration;

/// A ledger row still `running` this long after its last progress is a request whose process
/// died (a live one reports at least every few dozen tokens; the longest queue waits are minutes).
const STALE_ROW: chrono::TimeDelta = chrono::TimeDelta::minutes(30);

/// Runs until aborted.
pub async fn run(state: web::Data<AppState>) {
    let session_idle = crate::sessions::idle(&state);
    let task_idle = Duration::from_secs(state.settings.tasks.idle_secs.max(1));
    let period = (session_idle.min(task_idle) / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let stale_registration = crate::registration::stale_after(state.settings.context.fetch_timeout_secs);
    loop {
        // First at start: registrations a dead process left are taken up at once.
        crate::registration::resume_abandoned(&state.store, &state.repos, stale_registration).await;
        crate::watch::ensure(&state).await;
        tokio::time::sleep(period).await;
        let now = chrono::Utc::now();
        match state.store.close_idle_sessions(now - session_idle).await {
            Ok(closed) => {
                for s in closed {
                    tracing::debug!(session = %s.id, "session idled out");
                    if let Some(served) = state.model.served.get() {
                        served.engine.release(retention_key(s.tenant, s.id));
                    }
                }
            }
            Err(e) => tracing::warn!("closing idle sessions: {e}"),
        }
        match state.store.interrupt_stale_rows(now - STALE_ROW).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(rows = n, "ledger rows of requests cut off mid-stream marked interrupted"),
            Err(e) => tracing::warn!("marking interrupted ledger rows: {e}"),
        }
        match state.store.abandon_idle_tasks(now - task_idle).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(tasks = n, "idle tasks marked abandoned"),
            Err(e) => tracing::warn!("abandoning idle tasks: {e}"),
        }
    }
}
