//! Prefill/decode disaggregation: a decode server has a prefill server compute the K/V of a
//! request's prompt and receives it, so that a long prompt's computation does not stall the
//! decode server's running generations.
//!
//! **Control path**: the decode server (`[disagg] role = "decode"`) works out which prompt chunks
//! (the disk tier's, [`cachet_engine::runtime::KvTierConfig::chunk_tokens`] tokens each, and the
//! partial one up to the last prompt token) its disk does not hold; when they make at least
//! `min_remote_tokens`, it sends
//! the request's cache scope, tokens and provenance spans to one prefill server
//! (`POST /v1/internal/prefill`, the operator's credential) — the one its first chunk's chain key
//! picks, so that the requests of a repository context meet the same prefill cache.
//!
//! **Data path**: the prefill server runs the prompt through its engine (reusing its own prefix
//! cache; its tier takes each whole chunk as the prefill computes it, and the partial last one,
//! [`Request::kv_tail`], when the prompt is done) and answers with the chunks in order as they
//! reach its disk — the transfer overlaps the prefill — each a length-prefixed [`KvRecord`] (checksummed, versioned, with the model's fingerprint and the
//! chunk's chain key, which names the scope and every token before it: a transfer cannot cross
//! tenants or models). The decode server checks each record against the key it expects, writes it
//! into its own tier and indexes it as the chunks arrive; its engine then admits the request,
//! loads them, and computes only the last prompt token before decoding.
//!
//! **Slots**: the decode server reserves its K/V slots when the transfer is complete (SGLang's
//! `prefill_complete` policy): the request enters its engine only then, so a long transfer holds
//! no decode memory. Reserving early (slots held while the prefill runs, rows imported as they
//! arrive) is not built yet.
//!
//! **Faults**: a prefill server that is down, slow (past `timeout_secs`), dies mid-transfer or
//! answers nonsense costs the request only the attempt: what arrived and checked out is used, the
//! rest is computed locally. Nothing here can fail a request.

use crate::auth::OperatorAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{post, web, HttpResponse};
use cachet_engine::kv_transfer::disk::DiskTier;
use cachet_engine::radix::{Tag, TenantKey};
use cachet_engine::runtime::{chunk_spans, EngineHandle, Event, PublicPrefix, Request, TokenSpan};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a decode server asks a prefill server to compute: a request's cache scope, tokens and
/// provenance, and the first chunk it wants back.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillJob {
    /// The engine's tenant key (the cache scope; never a database id of the prefill server's).
    pub tenant: String,
    pub salt: Option<String>,
    /// The public prompt template and how many leading tokens it covers.
    pub public: Option<(String, usize)>,
    pub tokens: Vec<u32>,
    /// Provenance spans: `(start, end, source, version)`.
    pub spans: Vec<(usize, usize, String, String)>,
    /// The decode server's chunk size (both sides must use the same).
    pub chunk_tokens: usize,
    /// The first chunk wanted (the decode server holds those before it).
    pub from_chunk: usize,
}

impl PrefillJob {
    fn of(req: &Request, chunk_tokens: usize, from_chunk: usize) -> PrefillJob {
        PrefillJob {
            tenant: req.tenant.to_string(),
            salt: req.salt.as_ref().map(|s| s.to_string()),
            public: req.public.as_ref().map(|p| (p.template.to_string(), p.tokens)),
            tokens: req.tokens.clone(),
            spans: req
                .spans
                .iter()
                .map(|s| (s.range.start, s.range.end, s.tag.source.to_string(), s.tag.version.to_string()))
                .collect(),
            chunk_tokens,
            from_chunk,
        }
    }

    /// The engine request that computes this prompt (one token generated and dropped).
    fn request(&self, engine: &EngineHandle) -> Result<Request, ApiError> {
        let n = self.tokens.len();
        if n < 2 {
            return Err(ApiError::bad("a prefill job needs at least two prompt tokens"));
        }
        if n >= engine.max_context() {
            return Err(ApiError::ContextTooLong { tokens: n, limit: engine.max_context() });
        }
        let vocab = engine.vocab_size();
        if let Some(t) = self.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::bad(format!("token {t} is outside the vocabulary ({vocab})")));
        }
        if self.tenant.is_empty() {
            return Err(ApiError::bad("a prefill job names its tenant scope"));
        }
        let mut spans = Vec::with_capacity(self.spans.len());
        for (start, end, source, version) in &self.spans {
            if start >= end || *end > n {
                return Err(ApiError::bad(format!("span {start}..{end} is not within the {n} prompt tokens")));
            }
            let tag = Tag { source: source.as_str().into(), version: version.as_str().into() };
            spans.push(TokenSpan { range: *start..*end, tag });
        }
        let params = cachet_engine::generate::GenerateParams { max_tokens: 1, ignore_eos: true, ..Default::default() };
        let mut req = Request::new(TenantKey::new(self.tenant.as_str()), self.tokens.clone(), params);
        req.salt = self.salt.as_deref().map(Arc::from);
        req.public = match &self.public {
            Some((template, tokens)) if *tokens <= n => {
                Some(PublicPrefix { template: template.as_str().into(), tokens: *tokens })
            }
            Some(_) => return Err(ApiError::bad("the public prefix is longer than the prompt")),
            None => None,
        };
        req.spans = spans;
        req.kv_tail = true;
        Ok(req)
    }
}

/// Computes a decode server's prompt and answers with its chunks' records, in order, each as an
/// 8-byte little-endian length and the record, as they reach the disk tier; then a trailer (a
/// zero length and the engine's time in milliseconds, an `f64`). Operator credential; a server
/// with a disk tier.
#[post("/v1/internal/prefill")]
pub async fn prefill(
    state: web::Data<AppState>,
    _operator: OperatorAuth,
    job: web::Json<PrefillJob>,
) -> Result<HttpResponse, ApiError> {
    let served = state.served()?;
    let engine = served.engine.clone();
    let tier = engine
        .config()
        .kv_tier
        .clone()
        .ok_or_else(|| ApiError::NotFound("this server has no KV disk tier to prefill into".into()))?;
    if job.chunk_tokens != tier.chunk_tokens {
        return Err(ApiError::Conflict(format!(
            "this server's chunks are {} tokens, the job's {}",
            tier.chunk_tokens, job.chunk_tokens
        )));
    }
    let req = job.request(&engine)?;
    let keys: Vec<[u8; 32]> =
        chunk_spans(&req, tier.chunk_tokens).into_iter().skip(job.from_chunk).map(|(k, _)| k).collect();
    // The engine computes the prompt in the background; its tier writes each whole chunk as the
    // prefill computes it, and the answer sends each as soon as it is on disk (the transfer
    // overlaps the rest of the prefill). When the request is over and the tier flushed, a chunk
    // still missing (dropped, evicted, or the engine refused the request) ends the answer.
    let done = Arc::new(std::sync::OnceLock::<f64>::new());
    let started = Instant::now();
    let mut events = engine.submit(req);
    {
        let (engine, done) = (engine.clone(), done.clone());
        tokio::spawn(async move {
            while let Some(e) = events.next().await {
                match e {
                    Event::Error(e) => {
                        tracing::warn!("prefill job: {e}");
                        break;
                    }
                    Event::Done(_) => break,
                    Event::Token { .. } => {}
                }
            }
            engine.flush_kv_tier().await;
            let computed = started.elapsed();
            metrics::histogram!("cachet:disagg_prefill_seconds").record(computed.as_secs_f64());
            let _ = done.set(computed.as_secs_f64() * 1e3);
        });
    }
    let dir = tier.dir.clone();
    let frames = futures_util::stream::unfold((keys.into_iter(), false), move |(mut keys, ended)| {
        let (dir, done) = (dir.clone(), done.clone());
        async move {
            if ended {
                return None;
            }
            let Some(key) = keys.next() else {
                // The trailer: a zero length, then the engine's time in milliseconds.
                while done.get().is_none() {
                    tokio::time::sleep(POLL).await;
                }
                let ms = done.get().copied().unwrap_or(0.0);
                let mut frame = 0u64.to_le_bytes().to_vec();
                frame.extend_from_slice(&ms.to_le_bytes());
                return Some((Ok::<_, actix_web::Error>(web::Bytes::from(frame)), (keys, true)));
            };
            let path = DiskTier::file(&dir, &key);
            loop {
                let finished = done.get().is_some();
                match tokio::fs::read(&path).await {
                    Ok(bytes) => {
                        let mut frame = Vec::with_capacity(8 + bytes.len());
                        frame.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
                        frame.extend_from_slice(&bytes);
                        return Some((Ok(web::Bytes::from(frame)), (keys, false)));
                    }
                    Err(_) if finished => return None,
                    Err(_) => tokio::time::sleep(POLL).await,
                }
            }
        }
    });
    Ok(HttpResponse::Ok().content_type("application/octet-stream").streaming(frames))
}

/// How often the prefill answer looks for the next chunk on disk.
const POLL: Duration = Duration::from_millis(2);

/// What a remote prefill gave a request.
#[derive(Clone, Copy, Debug, Default)]
pub struct Transfer {
    /// Chunks received, checked and indexed.
    pub chunks: usize,
    /// Their bytes on the wire.
    pub bytes: u64,
    /// From the job's sending to the last chunk's indexing (the prefill server's queue and
    /// compute included).
    pub elapsed: Duration,
    /// Of `elapsed`, what the prefill server's engine took (from the answer's trailer): the rest
    /// is the transfer that did not overlap the computation, and the job's way there.
    pub remote: Duration,
}

/// On a decode server: has a prefill server compute `req`'s uncached chunks and indexes
/// what it sends back. `None` when nothing was asked (not a decode server, or too little to
/// compute).
pub async fn remote_prefill(state: &AppState, engine: &EngineHandle, req: &Request) -> Option<Transfer> {
    let d = &state.settings.disagg;
    if d.role != crate::config::Role::Decode || d.prefill_urls.is_empty() {
        return None;
    }
    let tier = engine.config().kv_tier.clone()?;
    let spans = chunk_spans(req, tier.chunk_tokens);
    let from = spans.iter().position(|(k, _)| !DiskTier::file(&tier.dir, k).exists())?;
    if req.tokens.len().saturating_sub(1) - spans[from].1.start < d.min_remote_tokens.max(1) {
        return None;
    }
    let keys: Vec<[u8; 32]> = spans.into_iter().map(|(k, _)| k).collect();
    let url = &d.prefill_urls[affinity(&keys[0], d.prefill_urls.len())];
    let started = Instant::now();
    let mut t = Transfer::default();
    match receive(state, engine, &tier, req, url, &keys, from, &mut t).await {
        Ok(()) => tracing::debug!(chunks = t.chunks, bytes = t.bytes, url, "prefilled remotely"),
        Err(e) => {
            metrics::counter!("cachet:disagg_fallbacks_total").increment(1);
            tracing::warn!(chunks = t.chunks, url, "remote prefill: {e}; computing the rest here");
        }
    }
    t.elapsed = started.elapsed();
    metrics::histogram!("cachet:disagg_remote_prefill_seconds").record(t.remote.as_secs_f64());
    metrics::histogram!("cachet:disagg_transfer_seconds").record(t.elapsed.saturating_sub(t.remote).as_secs_f64());
    metrics::counter!("cachet:disagg_transfer_bytes_total").increment(t.bytes);
    metrics::counter!("cachet:disagg_transfer_chunks_total").increment(t.chunks as u64);
    Some(t)
}

/// The prefill server for a prompt whose first chunk has `key`: the same for every request that
/// shares that chunk (a repository context's requests meet one prefill cache).
fn affinity(key: &[u8; 32], servers: usize) -> usize {
    let h = u64::from_le_bytes(key[..8].try_into().unwrap_or_default());
    (h % servers.max(1) as u64) as usize
}

#[allow(clippy::too_many_arguments)]
async fn receive(
    state: &AppState,
    engine: &EngineHandle,
    tier: &cachet_engine::runtime::KvTierConfig,
    req: &Request,
    url: &str,
    keys: &[[u8; 32]],
    from: usize,
    t: &mut Transfer,
) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(state.settings.disagg.timeout_secs))
        .build()
        .map_err(|e| e.to_string())?;
    let job = PrefillJob::of(req, tier.chunk_tokens, from);
    let r = client
        .post(format!("{}/v1/internal/prefill", url.trim_end_matches('/')))
        .bearer_auth(state.operator_token.expose())
        .json(&job)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        let status = r.status();
        return Err(format!("HTTP {status}: {}", r.text().await.unwrap_or_default()));
    }
    let fingerprint = engine.kv_fingerprint();
    let mut wanted = keys[from..].iter();
    let mut buf: Vec<u8> = Vec::new();
    let mut body = r.bytes_stream();
    let mut trailer = false;
    while let Some(piece) = body.next().await {
        buf.extend_from_slice(&piece.map_err(|e| format!("the transfer broke off: {e}"))?);
        while buf.len() >= 8 && !trailer {
            let len = u64::from_le_bytes(buf[..8].try_into().unwrap_or_default());
            if len == 0 {
                // The trailer: the prefill server's engine time.
                if buf.len() < 16 {
                    break;
                }
                let ms = f64::from_le_bytes(buf[8..16].try_into().unwrap_or_default());
                if ms.is_finite() && ms >= 0.0 {
                    t.remote = Duration::from_secs_f64(ms / 1e3);
                }
                buf.drain(..16);
                trailer = true;
                break;
            }
            if len > MAX_CHUNK_BYTES {
                return Err(format!("a {len}-byte chunk"));
            }
            let len = len as usize;
            if buf.len() < 8 + len {
                break;
            }
            let key = wanted.next().ok_or("more chunks than asked for")?;
            crate::handoff::adopt(engine, tier, &fingerprint, &buf[8..8 + len], key).await?;
            t.chunks += 1;
            t.bytes += 8 + len as u64;
            buf.drain(..8 + len);
        }
    }
    if !trailer || !buf.is_empty() {
        return Err(format!(
            "the answer ended after {} of {} chunks, without its trailer",
            t.chunks,
            keys.len() - from
        ));
    }
    if t.chunks < keys.len() - from {
        return Err(format!("the prefill server had {} of the {} chunks", t.chunks, keys.len() - from));
    }
    Ok(())
}

/// The largest chunk accepted.
const MAX_CHUNK_BYTES: u64 = 1 << 30;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affinity_is_stable_and_spreads() {
        let keys: Vec<[u8; 32]> =
            (0..64u8).map(|i| std::array::from_fn(|j| i.wrapping_mul(31).wrapping_add(j as u8))).collect();
        for k in &keys {
            assert_eq!(affinity(k, 3), affinity(k, 3));
            assert!(affinity(k, 3) < 3);
            assert_eq!(affinity(k, 1), 0);
        }
        let used: std::collections::HashSet<usize> = keys.iter().map(|k| affinity(k, 3)).collect();
        assert_eq!(used.len(), 3);
    }
}
