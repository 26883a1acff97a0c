//! The engine's disk tier: prompts' K/V written to a local directory in fixed-size chunks and
//! read back instead of recomputed, by this process or by the next one after a restart.
//!
//! **What is written**: when a prompt's K/V goes into the prefix cache (its prompt computed, or
//! the request ended), each whole chunk of [`KvTierConfig::chunk_tokens`] prompt tokens that the
//! tier does not hold yet. The scheduler queues the chunk ([`Save`]: its pool slots and its
//! [`KvRecord`] without rows); the engine copies the rows out of the pool before anything can
//! reuse those slots ([`crate::runtime`]'s step: after planning and after the pass) and hands
//! the record to a writer thread, which writes the file (checksummed, 0600) outside the index's
//! lock. A full writer queue drops the chunk (it is a cache: the next request that computes it
//! offers it again).
//!
//! **What is read**: at admission, after the in-memory match, the chunks that continue it,
//! consecutively, while the tier holds them — each checked against the request's own tokens
//! (the chain key already names them, with the scope and everything before). Their rows go into
//! freshly allocated slots (the engine imports them before the pass) and the positions enter the
//! cache as if computed, carrying the request's provenance tags. At least one prompt token is
//! always left to compute (for the logits).
//!
//! **Scopes**: a chunk's chain key includes its cache scope — the tenant (and salt), or the public
//! prompt of a template for a chunk inside a request's public prefix — so a chunk is only ever
//! found by a request of the same scope with the same tokens from the start. A chunk whose rows
//! are a function of the model and of those tokens alone (causal attention) is therefore valid
//! wherever it is found; invalidation by provenance (a push) and the LRU bound reclaim space.
//! A deleted tenant's chunks are deleted, including those still in the writer's queue.

use super::config::KvTierConfig;
use super::request::Request;
use super::seq::Seq;
use crate::kv_transfer::disk::{DiskTier, Opened};
use crate::kv_transfer::{chain_key, KvRecord, RecordScope, RecordTag};
use std::collections::HashSet;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Chunks the writer may have queued before new ones are dropped: at least this many, and at
/// least a whole context's (a prefill server answers a decode server with every chunk of a
/// prompt, so none of a prompt's may be dropped on the way).
const WRITE_QUEUE: usize = 64;

/// A chunk to write: the pool slots of its tokens, and its record without rows.
pub(super) struct Save {
    pub slots: Vec<u32>,
    pub record: KvRecord,
}

/// Rows to import before the next pass: `skip` rows of the chunk's start are already cached.
pub(super) struct Load {
    /// The sequence it was loaded for.
    pub seq: u64,
    pub slots: Vec<u32>,
    pub record: KvRecord,
    pub skip: usize,
}

/// One chunk of a prompt: its key, the key before it, its scope, its token positions.
struct Chunk {
    key: [u8; 32],
    parent: [u8; 32],
    scope: RecordScope,
    range: std::ops::Range<usize>,
}

/// What the engine thread and the writer share.
struct Shared {
    disk: DiskTier,
    /// Chunks handed to the writer and not indexed yet.
    queued: HashSet<[u8; 32]>,
    /// Tenants deleted while the writer had work: a record of theirs queued before is dropped.
    purged: Vec<(String, u64)>,
    /// Counts records sent to the writer (a purge compares against it).
    sent: u64,
    write_errors: u64,
}

/// Counters for metrics and the snapshot.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct TierCounts {
    pub loaded_tokens: u64,
    pub saved_tokens: u64,
    pub dropped_chunks: u64,
}

pub(super) struct Tier {
    shared: Arc<Mutex<Shared>>,
    tx: Option<SyncSender<(u64, KvRecord)>>,
    writer: Option<JoinHandle<()>>,
    chunk: usize,
    fingerprint: [u8; 32],
    pub counts: TierCounts,
}

impl Tier {
    /// Opens the tier for the model of `fingerprint` and starts its writer.
    pub fn open(
        cfg: &KvTierConfig,
        fingerprint: [u8; 32],
        default_share: f64,
        max_context: usize,
    ) -> std::io::Result<(Tier, Opened)> {
        let (mut disk, opened) = DiskTier::open(&cfg.dir, fingerprint, cfg.max_bytes)?;
        disk.set_default_share(default_share);
        let shared =
            Arc::new(Mutex::new(Shared { disk, queued: HashSet::new(), purged: Vec::new(), sent: 0, write_errors: 0 }));
        let (tx, rx) = sync_channel(WRITE_QUEUE.max(max_context.div_ceil(cfg.chunk_tokens.max(1)) + 1));
        let writer = {
            let shared = shared.clone();
            let dir = cfg.dir.clone();
            std::thread::Builder::new().name("cachet-kv-writer".into()).spawn(move || write_loop(&shared, &dir, &rx))?
        };
        let tier = Tier {
            shared,
            tx: Some(tx),
            writer: Some(writer),
            chunk: cfg.chunk_tokens,
            fingerprint,
            counts: TierCounts::default(),
        };
        Ok((tier, opened))
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The positions of `req`'s prompt before its last token that stored chunks hold, in
    /// consecutive chunks from its start: what its admission would load rather than compute.
    pub fn stored_prefix(&self, req: &Request) -> usize {
        stored_prefix(&self.shared, req, self.chunk)
    }

    /// The tier's index, for the door (which judges requests on the callers' threads).
    pub fn index(&self) -> StoredIndex {
        StoredIndex { shared: self.shared.clone(), chunk: self.chunk }
    }

    /// The chunks of `seq`'s first `n` prompt tokens: whole chunks, and with `tail` the partial
    /// one after them.
    fn chunks(&self, seq: &Seq, n: usize, tail: bool) -> Vec<Chunk> {
        chunks(&seq.req, n, self.chunk, tail)
    }

    /// The stored chunks that continue `seq`'s first `cached` tokens, consecutively, within its
    /// first `limit` tokens: the records (intact and of these very tokens; a corrupt one is
    /// deleted and ends the run) and how many rows of the first are cached already.
    /// A stored partial chunk ending at `limit` (a prefill server's, [`Request::kv_tail`]) comes
    /// last when every whole chunk before it was found.
    pub fn find(&mut self, seq: &Seq, cached: usize, limit: usize) -> (Vec<KvRecord>, usize) {
        let chunks = self.chunks(seq, limit, true);
        let first = cached / self.chunk;
        let mut records = Vec::new();
        let mut shared = self.lock();
        for c in chunks.iter().skip(first) {
            if !shared.disk.contains(&c.key) {
                break;
            }
            let tokens = &seq.tokens[c.range.clone()];
            match shared.disk.get(&c.key) {
                Ok(Some(r)) if r.tokens == tokens && r.parent == c.parent && r.scope == c.scope => records.push(r),
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!("kv tier: reading a chunk failed: {e}");
                    break;
                }
            }
        }
        drop(shared);
        // A load that ends inside a request's public prefix would be cached under the tenant's
        // marker there (see `Seq::key`), where the rest of the prompt never finds it.
        let end = first * self.chunk + records.iter().map(|r| r.tokens.len()).sum::<usize>();
        if seq.req.public.as_ref().is_some_and(|p| p.tokens > 0 && end < p.tokens) {
            records.clear();
        }
        (records, cached - first * self.chunk)
    }

    /// The saves for `seq`'s whole prompt chunks within its first `n` tokens that the tier does
    /// not hold or have queued, whose pool slots (`slots[i]` for position `i`) are given.
    /// With [`Request::kv_tail`], once the whole prompt is in, the partial chunk up to its last
    /// token too.
    pub fn saves(&mut self, seq: &Seq, n: usize, slots: &[u32]) -> Vec<Save> {
        let n = n.min(slots.len());
        let mut chunks = self.chunks(seq, n, false);
        if seq.req.kv_tail && n >= seq.prompt_len.saturating_sub(1) {
            let tail = self.chunks(seq, seq.prompt_len.saturating_sub(1), true).pop();
            chunks.extend(tail.filter(|c| c.range.len() < self.chunk));
        }
        let mut out = Vec::new();
        let mut shared = self.lock();
        for c in chunks {
            if shared.disk.contains(&c.key) || shared.queued.contains(&c.key) {
                continue;
            }
            shared.queued.insert(c.key);
            let range = c.range.clone();
            let tags = seq
                .req
                .spans
                .iter()
                .filter(|s| s.range.start < range.end && s.range.end > range.start)
                .map(|s| RecordTag {
                    range: (s.range.start.max(range.start) - range.start) as u32
                        ..(s.range.end.min(range.end) - range.start) as u32,
                    source: s.tag.source.to_string(),
                    version: s.tag.version.to_string(),
                })
                .collect();
            let record = KvRecord {
                fingerprint: self.fingerprint,
                scope: c.scope,
                parent: c.parent,
                tokens: seq.tokens[range.clone()].to_vec(),
                tags,
                kv_cols: 0,
                layers: Vec::new(),
            };
            out.push(Save { slots: slots[range].to_vec(), record });
        }
        out
    }

    /// Hands a chunk whose rows were copied out to the writer; a full queue drops it.
    pub fn send(&mut self, record: KvRecord) {
        let key = record.key();
        let tokens = record.tokens.len() as u64;
        let mut shared = self.lock();
        shared.sent += 1;
        let n = shared.sent;
        drop(shared);
        let Some(tx) = &self.tx else { return };
        match tx.try_send((n, record)) {
            Ok(()) => self.counts.saved_tokens += tokens,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.dropped_chunks += 1;
                self.lock().queued.remove(&key);
            }
        }
    }

    /// A save whose rows could not be copied out: no longer queued.
    pub fn abandon(&mut self, record: &KvRecord) {
        self.lock().queued.remove(&record.key());
    }

    /// A push: the stored chunks of `source` (but `keep_version`) and those chained after them go.
    pub fn invalidate(&mut self, source: &str, keep_version: Option<&str>) -> usize {
        self.lock().disk.invalidate(source, keep_version).unwrap_or_else(|e| {
            tracing::warn!("kv tier: invalidating {source}: {e}");
            0
        })
    }

    /// A deleted tenant: its stored chunks go, and those the writer has queued are not written.
    pub fn purge_tenant(&mut self, tenant: &str) -> usize {
        let mut shared = self.lock();
        let sent = shared.sent;
        shared.purged.push((tenant.to_string(), sent));
        shared.disk.purge_tenant(tenant).unwrap_or_else(|e| {
            tracing::warn!("kv tier: deleting a tenant's chunks: {e}");
            0
        })
    }

    /// Indexes a record another process wrote into the tier's directory (a chunk fetched from
    /// another replica), unless one of this key is stored or queued already.
    pub fn adopt(&mut self, record: &KvRecord, bytes: u64) -> std::io::Result<()> {
        let mut shared = self.lock();
        let key = record.key();
        if record.fingerprint != self.fingerprint || shared.disk.contains(&key) || shared.queued.contains(&key) {
            return Ok(());
        }
        shared.disk.written(record, bytes)
    }

    pub fn set_share(&mut self, tenant: &str, share: f64) {
        self.lock().disk.set_share(tenant, share);
    }

    /// Bytes stored, chunks stored, writes that failed.
    pub fn usage(&self) -> (u64, usize, u64) {
        let s = self.lock();
        (s.disk.bytes(), s.disk.len(), s.write_errors)
    }

    /// Waits until the writer has written everything sent so far (an orderly stop), at most a
    /// minute (a writer stuck on a dead disk must not hold the engine).
    pub fn flush(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !self.lock().queued.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

impl Drop for Tier {
    /// The writer finishes what it was given (a chunk queued is a chunk on disk after a clean
    /// shutdown).
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The whole chunks of `req`'s first `n` prompt tokens, `chunk` tokens each, and with `tail` the
/// partial chunk after them (when `n` is not a multiple of `chunk`).
fn chunks(req: &Request, n: usize, chunk: usize, tail: bool) -> Vec<Chunk> {
    let n = n.min(req.tokens.len());
    let chunk = chunk.max(1);
    let public = req.public.as_ref().filter(|p| p.tokens > 0);
    let tenant = RecordScope::Tenant { tenant: req.tenant.to_string(), salt: req.salt.as_ref().map(|s| s.to_string()) };
    let mut parent = [0u8; 32];
    let whole = n / chunk;
    let count = if tail && !n.is_multiple_of(chunk) { whole + 1 } else { whole };
    (0..count)
        .map(|k| {
            let range = k * chunk..((k + 1) * chunk).min(n);
            let scope = match public {
                Some(p) if range.end <= p.tokens => RecordScope::Public { template: p.template.to_string() },
                _ => tenant.clone(),
            };
            let key = chain_key(&parent, &scope, &req.tokens[range.clone()]);
            let c = Chunk { key, parent, scope, range };
            parent = key;
            c
        })
        .collect()
}

/// The chain keys of the chunks the disk tier would load for `req` (its whole chunks of
/// `chunk` tokens before its last prompt token): what a replica fetches from another for a
/// session that moved (a warm hand-off).
pub fn chunk_keys(req: &Request, chunk: usize) -> Vec<[u8; 32]> {
    chunks(req, req.tokens.len().saturating_sub(1), chunk, false).into_iter().map(|c| c.key).collect()
}

/// The chain keys and token positions of the chunks the disk tier would load for `req`: its
/// whole chunks of `chunk` tokens before its last prompt token, then the partial one up to that
/// token (which only a prefill server's job stores, see [`Request::kv_tail`]).
pub fn chunk_spans(req: &Request, chunk: usize) -> Vec<([u8; 32], std::ops::Range<usize>)> {
    chunks(req, req.tokens.len().saturating_sub(1), chunk, true).into_iter().map(|c| (c.key, c.range)).collect()
}

/// The disk tier's index, shared with the door: see [`Tier::stored_prefix`].
#[derive(Clone)]
pub(super) struct StoredIndex {
    shared: Arc<Mutex<Shared>>,
    chunk: usize,
}

impl std::fmt::Debug for StoredIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredIndex").field("chunk", &self.chunk).finish_non_exhaustive()
    }
}

impl StoredIndex {
    /// See [`Tier::stored_prefix`].
    pub fn prefix(&self, req: &Request) -> usize {
        stored_prefix(&self.shared, req, self.chunk)
    }
}

/// For tests: a tier in `dir` that holds the first `n` chunks of `req` (with made-up rows), and
/// its index.
#[cfg(test)]
pub(super) fn holding(dir: &std::path::Path, req: &Request, chunk: usize, n: usize) -> (Tier, StoredIndex) {
    let cfg = KvTierConfig { dir: dir.to_path_buf(), max_bytes: 1 << 30, chunk_tokens: chunk };
    let (tier, _) = Tier::open(&cfg, [7; 32], 1.0, 1 << 16).expect("a tier in a temp dir");
    for c in chunks(req, req.tokens.len() - 1, chunk, false).into_iter().take(n) {
        let record = KvRecord {
            fingerprint: [7; 32],
            scope: c.scope,
            parent: c.parent,
            tokens: req.tokens[c.range.clone()].to_vec(),
            tags: Vec::new(),
            kv_cols: 1,
            layers: vec![vec![0; 2 * c.range.len()]],
        };
        tier.lock().disk.put(&record).expect("written");
    }
    let index = tier.index();
    (tier, index)
}

fn stored_prefix(shared: &Mutex<Shared>, req: &Request, chunk: usize) -> usize {
    let chunks = chunks(req, req.tokens.len().saturating_sub(1), chunk, true);
    let s = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    chunks.iter().take_while(|c| s.disk.contains(&c.key)).last().map_or(0, |c| c.range.end)
}

fn write_loop(shared: &Mutex<Shared>, dir: &std::path::Path, rx: &Receiver<(u64, KvRecord)>) {
    let lock = || shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    while let Ok((n, record)) = rx.recv() {
        let key = record.key();
        let written = DiskTier::write(dir, &record);
        let mut s = lock();
        s.queued.remove(&key);
        let tenant = match &record.scope {
            RecordScope::Tenant { tenant, .. } => Some(tenant.as_str()),
            RecordScope::Public { .. } => None,
        };
        let purged = tenant.is_some_and(|t| s.purged.iter().any(|(p, at)| p == t && *at >= n));
        match written {
            Ok(_) if purged => {
                let _ = std::fs::remove_file(DiskTier::file(dir, &key));
            }
            Ok(bytes) => {
                if let Err(e) = s.disk.written(&record, bytes) {
                    tracing::warn!("kv tier: {e}");
                }
            }
            Err(e) => {
                s.write_errors += 1;
                tracing::warn!("kv tier: writing a chunk failed: {e}");
            }
        }
        // Purges older than anything still queued are done with.
        if s.queued.is_empty() {
            s.purged.clear();
        }
    }
}
