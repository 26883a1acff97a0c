//! Warm hand-off between replicas: a session whose turn lands on another replica than its last
//! one fetches its prefix's K/V from that replica's disk tier instead of recomputing it.
//!
//! Each replica with the disk tier on and `[server] advertise_url` set records that URL in
//! Postgres (`replicas`, refreshed every 30 s) and serves its stored chunks at
//! `GET /v1/internal/kv/{chain key}` to the operator's credential (every replica has it). A
//! session's turn notes which replica runs it (`sessions.last_replica`); when that was another
//! replica seen within two minutes, the turn's prompt chunks that the local tier lacks are
//! fetched from it in order, each checked (checksum, this model's fingerprint, the chain key it
//! was asked for) before it is written into the local tier, until the first one the other lacks.
//! The engine then loads them at admission like any stored chunk. A peer that is slow, gone or
//! answers nonsense costs at most [`FETCH_TIMEOUT`] per chunk and the turn computes what it did
//! not get: a hand-off never fails a turn.

use crate::auth::OperatorAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{get, web, HttpResponse};
use cachet_engine::kv_transfer::disk::{from_hex as unhex, hex, DiskTier};
use cachet_engine::kv_transfer::KvRecord;
use cachet_engine::runtime::{EngineHandle, KvTierConfig, Request};
use std::time::Duration;

/// How long one chunk may take to arrive.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// A replica not seen for this long is not asked.
pub const SEEN_WITHIN: Duration = Duration::from_secs(120);
/// How often a replica refreshes its row.
const ANNOUNCE_EVERY: Duration = Duration::from_secs(30);
/// The largest chunk accepted (a 4,096-token chunk of a large model's K/V is far below it).
const MAX_CHUNK_BYTES: usize = 1 << 30;

/// Keeps this replica's row in `replicas` fresh while the server runs, when it has a disk tier
/// and an advertised URL.
pub fn announce(state: web::Data<AppState>) -> Option<tokio::task::JoinHandle<()>> {
    let url = state.settings.server.advertise_url.trim_end_matches('/').to_string();
    if url.is_empty() {
        return None;
    }
    Some(tokio::spawn(async move {
        loop {
            // Every second until the model is loaded and the row written, then every 30 s.
            let tiered = state.model.served.get().is_some_and(|s| s.engine.config().kv_tier.is_some());
            let announced = tiered
                && match state.store.announce_replica(state.replica.id, &url).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!("announcing this replica's KV tier: {e}");
                        false
                    }
                };
            tokio::time::sleep(if announced { ANNOUNCE_EVERY } else { Duration::from_secs(1) }).await;
        }
    }))
}

/// Whether this replica takes part in hand-offs: a disk tier and an advertised URL.
pub fn enabled(state: &AppState, engine: &EngineHandle) -> bool {
    !state.settings.server.advertise_url.is_empty() && engine.config().kv_tier.is_some()
}

/// A stored chunk of this replica's disk tier, for another replica (operator credential).
#[get("/v1/internal/kv/{key}")]
pub async fn get_chunk(
    state: web::Data<AppState>,
    _operator: OperatorAuth,
    key: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let key = unhex(&key).ok_or_else(|| ApiError::bad("a chunk key is 64 hex digits"))?;
    let dir = state
        .model
        .served
        .get()
        .and_then(|s| s.engine.config().kv_tier.as_ref().map(|t| t.dir.clone()))
        .ok_or_else(|| ApiError::NotFound("this replica has no KV disk tier".into()))?;
    let read = web::block(move || std::fs::read(DiskTier::file(&dir, &key)))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    match read {
        Ok(bytes) => Ok(HttpResponse::Ok().content_type("application/octet-stream").body(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(ApiError::NotFound(format!("no chunk {}", hex(&key))))
        }
        Err(e) => Err(ApiError::Internal(format!("reading a chunk: {e}"))),
    }
}

/// Fetches `req`'s prompt chunks that the local disk tier lacks from the replica at `from`, in
/// order, until the first it cannot give; returns how many were adopted.
pub async fn fetch(engine: &EngineHandle, req: &Request, from: &str, operator_token: &str) -> usize {
    let Some(tier) = engine.config().kv_tier.clone() else { return 0 };
    let fingerprint = engine.kv_fingerprint();
    let client = match reqwest::Client::builder().timeout(FETCH_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("hand-off: {e}");
            return 0;
        }
    };
    let mut adopted = 0;
    for key in cachet_engine::runtime::chunk_keys(req, tier.chunk_tokens) {
        if DiskTier::file(&tier.dir, &key).exists() {
            continue;
        }
        let url = format!("{}/v1/internal/kv/{}", from.trim_end_matches('/'), hex(&key));
        let bytes = match client.get(&url).bearer_auth(operator_token).send().await {
            Ok(r) if r.status().is_success() && r.content_length().is_none_or(|n| n as usize <= MAX_CHUNK_BYTES) => {
                match r.bytes().await {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::info!("hand-off from {from}: {e}");
                        break;
                    }
                }
            }
            Ok(r) => {
                tracing::debug!("hand-off from {from}: HTTP {} for a chunk", r.status());
                break;
            }
            Err(e) => {
                tracing::info!("hand-off from {from}: {e}");
                break;
            }
        };
        if let Err(e) = adopt(engine, &tier, &fingerprint, &bytes, &key).await {
            tracing::warn!("hand-off from {from}: {e}");
            break;
        }
        adopted += 1;
    }
    if adopted > 0 {
        metrics::counter!("cachet:kv_handoff_chunks_total").increment(adopted as u64);
        tracing::debug!(chunks = adopted, from, "prefix fetched from another replica");
    }
    adopted
}

/// Why a chunk another server sent was not taken.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// Not a record of this model, or damaged.
    #[error(transparent)]
    Record(#[from] cachet_engine::kv_transfer::RecordError),
    /// A record of another chunk than the one asked for.
    #[error("a chunk other than the one asked for")]
    OtherChunk,
    /// The disk tier's directory could not take it.
    #[error("writing a chunk: {0}")]
    Write(String),
    /// The engine could not index it.
    #[error(transparent)]
    Engine(#[from] cachet_engine::runtime::KvError),
}

/// Checks a chunk record another server sent (its checksum, this model's fingerprint, the chain
/// key asked for), writes it into the local disk tier and indexes it, so that the next
/// admission loads it.
pub(crate) async fn adopt(
    engine: &EngineHandle,
    tier: &KvTierConfig,
    fingerprint: &[u8; 32],
    bytes: &[u8],
    key: &[u8; 32],
) -> Result<(), AdoptError> {
    let record = KvRecord::decode(bytes, fingerprint)?;
    if record.key() != *key {
        return Err(AdoptError::OtherChunk);
    }
    let dir = tier.dir.clone();
    let (n, record) = web::block(move || DiskTier::write(&dir, &record).map(|n| (n, record)))
        .await
        .map_err(|e| AdoptError::Write(e.to_string()))?
        .map_err(|e| AdoptError::Write(e.to_string()))?;
    Ok(engine.adopt_chunk(record, n).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_keys_round_trip_through_their_text_and_nonsense_is_refused() {
        let key: [u8; 32] = std::array::from_fn(|i| (i * 37 + 5) as u8);
        assert_eq!(unhex(&hex(&key)), Some(key));
        for bad in ["", "zz", &"g".repeat(64), &"0".repeat(63), &"0".repeat(65), "../../etc/passwd"] {
            assert_eq!(unhex(bad), None, "{bad:?}");
        }
    }
}
