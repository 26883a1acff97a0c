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
//! tenants or models). The decode server checks each record against the key it expects and hands
//! it on as the chunks arrive (see **Slots**); its engine computes only the last prompt token
//! before decoding.
//!
//! **Slots** (`[disagg] reserve`, SGLang's two policies): with `prefill_complete` (the default)
//! the decode server writes the chunks into its disk tier as they arrive and the request enters
//! its engine when the transfer is complete, which loads them then: a long prefill holds no
//! decode memory, and the load is on the first token's path. With `early` the request enters
//! the engine at once; it reserves the slots of every prompt position before the last token at
//! admission and copies each chunk into them as it arrives (no disk on the way): the load
//! overlaps the prefill, and the decode memory is held for all of it.
//!
//! **Faults**: a prefill server that is down, slow (past `timeout_secs`), dies mid-transfer or
//! answers nonsense costs the request only the attempt: what arrived and checked out is used, the
//! rest is computed locally. Nothing here can fail a request.

use crate::auth::OperatorAuth;
use crate::error::ApiError;
use crate::state::AppState;
use actix_web::{post, web, HttpResponse};
use cachet_engine::kv_transfer::disk::DiskTier;
use cachet_engine::kv_transfer::KvRecord;
use cachet_engine::radix::{Tag, TenantKey};
use cachet_engine::runtime::{chunk_spans, EngineHandle, Event, PublicPrefix, RemoteFeed, Request, TokenSpan};
use futures_util::future::BoxFuture;
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
    /// Chunks received, checked and handed on.
    pub chunks: usize,
    /// Their prompt positions.
    pub tokens: usize,
    /// Their bytes on the wire.
    pub bytes: u64,
    /// From the job's sending to the last chunk's indexing (the prefill server's queue and
    /// compute included).
    pub elapsed: Duration,
    /// Of `elapsed`, what the prefill server's engine took (from the answer's trailer): the rest
    /// is the transfer that did not overlap the computation, and the job's way there.
    pub remote: Duration,
}

/// What a decode server asks of which prefill server for a request.
struct Ask {
    job: PrefillJob,
    url: String,
    /// The chain keys and prompt positions of the chunks wanted, in order.
    keys: Vec<([u8; 32], std::ops::Range<usize>)>,
    /// The prompt position of the first one's first row.
    from_token: usize,
    transport: Box<dyn KvTransport>,
}

/// Where the chunks received go.
enum Sink {
    /// Into the disk tier, indexed: the request's admission loads them (`prefill_complete`).
    Tier(cachet_engine::runtime::KvTierConfig),
    /// Straight into the slots the engine reserved for the request (`early`).
    Feed(RemoteFeed),
}

/// On a decode server: whether `req`'s uncached chunks go to a prefill server, and which.
fn ask(state: &AppState, engine: &EngineHandle, req: &Request) -> Option<(Ask, cachet_engine::runtime::KvTierConfig)> {
    let d = &state.settings.disagg;
    if d.role != crate::config::Role::Decode || d.prefill_urls.is_empty() {
        return None;
    }
    let tier = engine.config().kv_tier.clone()?;
    let spans = chunk_spans(req, tier.chunk_tokens);
    let from = spans.iter().position(|(k, _)| !DiskTier::file(&tier.dir, k).exists())?;
    let from_token = spans[from].1.start;
    if req.tokens.len().saturating_sub(1) - from_token < d.min_remote_tokens.max(1) {
        return None;
    }
    let keys: Vec<_> = spans.into_iter().skip(from).collect();
    let url = d.prefill_urls[affinity(&keys[0].0, d.prefill_urls.len())].clone();
    let ask = Ask {
        job: PrefillJob::of(req, tier.chunk_tokens, from),
        url,
        keys,
        from_token,
        transport: Box::new(HttpTransport::new(
            Duration::from_secs(d.timeout_secs),
            state.auth.operator_token.expose().to_string(),
        )),
    };
    Some((ask, tier))
}

/// On a decode server with `reserve = "prefill_complete"`: has a prefill server compute `req`'s
/// uncached chunks and indexes what it sends back in the disk tier, before the request enters
/// the engine. `None` when nothing was asked (not a decode server, or too little to compute).
pub async fn remote_prefill(state: &AppState, engine: &EngineHandle, req: &Request) -> Option<Transfer> {
    let (ask, tier) = ask(state, engine, req)?;
    Some(run(engine, ask, Sink::Tier(tier), None).await)
}

/// On a decode server with `reserve = "early"`: gives `req` (not submitted yet) a
/// [`Request::remote_kv`] feed and starts having a prefill server compute its uncached chunks
/// into it; the engine reserves the request's slots at admission and copies each chunk in as it
/// arrives. `done` gets the time from the job's sending to the last chunk's handing over (or to
/// the end of a transfer that failed), before the engine can have finished the request; the
/// task's result is the transfer. `None` when nothing was asked.
pub fn remote_prefill_early(
    state: &AppState,
    engine: &EngineHandle,
    req: &mut Request,
    done: impl FnOnce(Duration) + Send + 'static,
) -> Option<tokio::task::JoinHandle<Transfer>> {
    let (ask, _) = ask(state, engine, req)?;
    let (feed, remote) = engine.remote_kv(ask.from_token);
    req.remote_kv = Some(remote);
    let engine = engine.clone();
    Some(tokio::spawn(async move { run(&engine, ask, Sink::Feed(feed), Some(Box::new(done))).await }))
}

/// Sends the job, receives the chunks into `sink`, and accounts for it (a failure is logged
/// and counted: the engine computes what did not arrive).
async fn run(engine: &EngineHandle, ask: Ask, sink: Sink, done: Option<Done>) -> Transfer {
    let started = Instant::now();
    let mut t = Transfer::default();
    let url = ask.url.clone();
    let mut done = done.map(|f| (f, started));
    match receive(engine, &ask, sink, &mut done, &mut t).await {
        Ok(()) => tracing::debug!(chunks = t.chunks, bytes = t.bytes, url, "prefilled remotely"),
        Err(e) => {
            metrics::counter!("cachet:disagg_fallbacks_total").increment(1);
            tracing::warn!(chunks = t.chunks, url, "remote prefill: {e}; computing the rest here");
        }
    }
    t.elapsed = started.elapsed();
    if let Some((f, started)) = done {
        f(started.elapsed());
    }
    metrics::histogram!("cachet:disagg_remote_prefill_seconds").record(t.remote.as_secs_f64());
    metrics::histogram!("cachet:disagg_transfer_seconds").record(t.elapsed.saturating_sub(t.remote).as_secs_f64());
    metrics::counter!("cachet:disagg_transfer_bytes_total").increment(t.bytes);
    metrics::counter!("cachet:disagg_transfer_chunks_total").increment(t.chunks as u64);
    t
}

/// Told how long the remote part took (see [`remote_prefill_early`]).
type Done = Box<dyn FnOnce(Duration) + Send>;

/// The prefill server for a prompt whose first chunk has `key`: the same for every request that
/// shares that chunk (a repository context's requests meet one prefill cache).
fn affinity(key: &[u8; 32], servers: usize) -> usize {
    let h = u64::from_le_bytes(key[..8].try_into().unwrap_or_default());
    (h % servers.max(1) as u64) as usize
}

async fn receive(
    engine: &EngineHandle,
    ask: &Ask,
    sink: Sink,
    done: &mut Option<(Done, Instant)>,
    t: &mut Transfer,
) -> Result<(), TransferError> {
    let mut frames = ask.transport.prefill(&ask.url, &ask.job).await?;
    let fingerprint = engine.kv_fingerprint();
    let expected = ask.keys.len();
    let mut wanted = ask.keys.iter();
    let mut ended = false;
    while let Some(frame) = frames.next().await {
        let bytes = match frame? {
            Frame::Done { engine } => {
                t.remote = engine;
                ended = true;
                break;
            }
            Frame::Chunk(bytes) => bytes,
        };
        let (key, range) = wanted.next().ok_or("more chunks than asked for")?;
        match &sink {
            Sink::Tier(tier) => crate::handoff::adopt(engine, tier, &fingerprint, &bytes, key).await?,
            Sink::Feed(feed) => {
                let record = KvRecord::decode(&bytes, &fingerprint).map_err(|e| e.to_string())?;
                if record.key() != *key {
                    return Err(crate::handoff::AdoptError::OtherChunk.into());
                }
                if t.chunks + 1 == expected {
                    // The last one: the time is told before the engine can finish with it.
                    if let Some((f, started)) = done.take() {
                        f(started.elapsed());
                    }
                }
                feed.push(record);
            }
        }
        t.chunks += 1;
        t.tokens += range.len();
        t.bytes += 8 + bytes.len() as u64;
    }
    if !ended {
        return Err(format!("the answer ended after {} of {expected} chunks, without its trailer", t.chunks).into());
    }
    if t.chunks < expected {
        return Err(format!("the prefill server had {} of the {expected} chunks", t.chunks).into());
    }
    Ok(())
}

/// Why K/V from a prefill server did not arrive whole: the transport failed, the answer broke
/// off or was not frames, or a chunk was not what was asked for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TransferError(pub String);

impl From<String> for TransferError {
    fn from(m: String) -> TransferError {
        TransferError(m)
    }
}

impl From<&str> for TransferError {
    fn from(m: &str) -> TransferError {
        TransferError(m.into())
    }
}

impl From<crate::handoff::AdoptError> for TransferError {
    fn from(e: crate::handoff::AdoptError) -> TransferError {
        TransferError(e.to_string())
    }
}

/// One piece of a prefill server's answer.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// The next chunk's K/V record, encoded ([`KvRecord::encode`]), in prompt order.
    Chunk(Vec<u8>),
    /// The end of the answer: how long the prefill server's engine took.
    Done { engine: Duration },
}

/// The frames of an answer, as they arrive; an `Err` ends it (the transfer broke off, or what came
/// is not a frame).
pub type Frames = futures_util::stream::BoxStream<'static, Result<Frame, TransferError>>;

/// The data path from prefill servers: sends a job (the control path: what to compute, in which
/// cache scope) and yields the answer's frames as they arrive, the chunks in prompt order while
/// the prefill server still computes the next. HTTP on TCP ([`HttpTransport`]) is the one there
/// is; an RDMA or NIXL transport (writing into registered memory instead of framing bytes) would
/// implement this, and the checks and hand-over after it stay the same.
pub trait KvTransport: Send + Sync {
    fn prefill<'a>(&'a self, url: &'a str, job: &'a PrefillJob) -> BoxFuture<'a, Result<Frames, TransferError>>;
}

/// [`KvTransport`] over HTTP on TCP: `POST {url}/v1/internal/prefill` with the operator's
/// credential; the answer's body is the frames, each an 8-byte little-endian length and a
/// record, then a zero length and the engine's milliseconds (an `f64`).
pub struct HttpTransport {
    client: Result<reqwest::Client, TransferError>,
    token: String,
}

impl std::fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTransport").finish_non_exhaustive()
    }
}

impl HttpTransport {
    /// A transport whose answers may take at most `timeout` in all.
    pub fn new(timeout: Duration, token: String) -> HttpTransport {
        let client = reqwest::Client::builder().timeout(timeout).build().map_err(|e| TransferError(e.to_string()));
        HttpTransport { client, token }
    }
}

impl KvTransport for HttpTransport {
    fn prefill<'a>(&'a self, url: &'a str, job: &'a PrefillJob) -> BoxFuture<'a, Result<Frames, TransferError>> {
        Box::pin(async move {
            let client = self.client.as_ref().map_err(Clone::clone)?;
            let r = client
                .post(format!("{}/v1/internal/prefill", url.trim_end_matches('/')))
                .bearer_auth(&self.token)
                .json(job)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !r.status().is_success() {
                let status = r.status();
                return Err(format!("HTTP {status}: {}", r.text().await.unwrap_or_default()).into());
            }
            let body = r.bytes_stream().map(|p| p.map_err(|e| e.to_string())).boxed();
            Ok(frames(body))
        })
    }
}

/// The frames in a byte stream cut anywhere.
fn frames(body: futures_util::stream::BoxStream<'static, Result<web::Bytes, String>>) -> Frames {
    futures_util::stream::unfold((body, Vec::<u8>::new(), false), |(mut body, mut buf, over)| async move {
        if over {
            return None;
        }
        loop {
            if let Some(frame) = next_frame(&mut buf) {
                let over = !matches!(frame, Ok(Frame::Chunk(_)));
                return Some((frame, (body, buf, over)));
            }
            match body.next().await {
                Some(Ok(piece)) => buf.extend_from_slice(&piece),
                Some(Err(e)) => return Some((Err(format!("the transfer broke off: {e}").into()), (body, buf, true))),
                None if buf.is_empty() => return None,
                None => return Some((Err("the answer ended inside a frame".into()), (body, buf, true))),
            }
        }
    })
    .boxed()
}

/// The whole frame at the front of `buf`, taken off it; `None` until one is there.
fn next_frame(buf: &mut Vec<u8>) -> Option<Result<Frame, TransferError>> {
    let len = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?);
    if len == 0 {
        let ms = f64::from_le_bytes(buf.get(8..16)?.try_into().ok()?);
        buf.drain(..16);
        let engine = if ms.is_finite() && ms >= 0.0 { Duration::from_secs_f64(ms / 1e3) } else { Duration::ZERO };
        return Some(Ok(Frame::Done { engine }));
    }
    if len > MAX_CHUNK_BYTES {
        return Some(Err(format!("a {len}-byte chunk").into()));
    }
    let end = 8 + len as usize;
    if buf.len() < end {
        return None;
    }
    let chunk = buf[8..end].to_vec();
    buf.drain(..end);
    Some(Ok(Frame::Chunk(chunk)))
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

    /// The frames of an answer come out whole however its bytes are cut, and a length past the
    /// limit is an error, not an allocation.
    #[test]
    fn frames_come_out_whole_however_the_bytes_are_cut() {
        let chunks: Vec<Vec<u8>> = vec![vec![1; 5], (0..=255).collect(), vec![9]];
        let mut answer = Vec::new();
        for c in &chunks {
            answer.extend_from_slice(&(c.len() as u64).to_le_bytes());
            answer.extend_from_slice(c);
        }
        answer.extend_from_slice(&0u64.to_le_bytes());
        answer.extend_from_slice(&1500.0f64.to_le_bytes());
        let mut want: Vec<Frame> = chunks.into_iter().map(Frame::Chunk).collect();
        want.push(Frame::Done { engine: Duration::from_millis(1500) });
        for cut in [1, 3, 7, 8, 9, 64, answer.len()] {
            let (mut buf, mut got) = (Vec::new(), Vec::new());
            for piece in answer.chunks(cut) {
                buf.extend_from_slice(piece);
                while let Some(f) = next_frame(&mut buf) {
                    got.push(f.unwrap());
                }
            }
            assert_eq!(got, want, "cut every {cut} bytes");
            assert!(buf.is_empty());
        }
        let mut huge = (MAX_CHUNK_BYTES + 1).to_le_bytes().to_vec();
        assert!(next_frame(&mut huge).unwrap().is_err());
        // A trailer with a nonsense time is still the end, with no time.
        let mut odd = 0u64.to_le_bytes().to_vec();
        odd.extend_from_slice(&f64::NAN.to_le_bytes());
        assert_eq!(next_frame(&mut odd), Some(Ok(Frame::Done { engine: Duration::ZERO })));
    }
}
