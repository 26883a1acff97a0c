//! The engine's only door: a cloneable handle that submits requests (each
//! gets its own event stream) and sends control commands. Dropping a
//! request's stream cancels the request and frees its memory.

use super::config::EngineConfig;
use super::kv::KvError;
use super::request::{Completion, Event, Request, RequestError};
use super::stats::Snapshot;
use super::Command;
use crate::chat_template::ChatTemplate;
use crate::constraint::Grammars;
use crate::radix::{RetentionKey, TenantKey};
use crate::tokenizer::Tokenizer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

/// What callers may know about the engine's model.
pub(crate) struct Info {
    pub model_name: String,
    pub tokenizer: Arc<Tokenizer>,
    pub grammars: Arc<Grammars>,
    pub chat_template: Option<Arc<ChatTemplate>>,
    /// Longest sequence (prompt + output) the engine can hold.
    pub max_context: usize,
    pub vocab_size: usize,
    pub config: EngineConfig,
    /// Admission at the door (see `admission`).
    pub door: Arc<super::admission::Door>,
    /// The fingerprint of the K/V records this engine reads and writes.
    pub kv_fingerprint: [u8; 32],
}

/// A cloneable, thread-safe handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Arc<Mutex<Sender<Command>>>,
    info: Arc<Info>,
    /// Cleared when the engine thread ends (a panic included).
    alive: Arc<AtomicBool>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle").field("model", &self.info.model_name).finish()
    }
}

/// The events of one request. Dropping it cancels the request.
#[derive(Debug)]
pub struct RequestStream {
    rx: mpsc::UnboundedReceiver<Event>,
}

/// A whole completion, for callers that do not stream.
#[derive(Clone, Debug, PartialEq)]
pub struct Collected {
    pub tokens: Vec<u32>,
    pub text: String,
    pub result: Result<Completion, RequestError>,
}

impl RequestStream {
    /// The next event; `None` once the request is over.
    pub async fn next(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event if one is there now (never waits).
    pub fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// The next event, blocking the thread (not for async contexts).
    pub fn blocking_next(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }

    /// Waits for the whole completion (blocking).
    pub fn collect_blocking(mut self) -> Collected {
        let mut out = Collected { tokens: Vec::new(), text: String::new(), result: Err(engine_gone()) };
        while let Some(event) = self.blocking_next() {
            match event {
                Event::Token { id, text, .. } => {
                    out.tokens.push(id);
                    out.text.push_str(&text);
                }
                Event::Done(c) => {
                    out.result = Ok(c);
                    break;
                }
                Event::Error(e) => {
                    out.result = Err(e);
                    break;
                }
            }
        }
        out
    }
}

fn engine_gone() -> RequestError {
    RequestError::Engine("the engine stopped".into())
}

impl EngineHandle {
    pub(crate) fn new(tx: Sender<Command>, info: Info, alive: Arc<AtomicBool>) -> EngineHandle {
        EngineHandle { tx: Arc::new(Mutex::new(tx)), info: Arc::new(info), alive }
    }

    /// Ends the engine thread (requests in flight end with an error; later ones fail at once).
    /// For an orderly stop, and for tests of what a server does when its engine is gone.
    pub fn halt(&self) {
        self.send(Command::Halt);
    }

    /// Whether the engine thread still runs: false once it has ended (a panic in a forward pass,
    /// say), after which every request fails. A server should then say it is not ready and exit.
    pub fn is_running(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn send(&self, cmd: Command) -> bool {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).send(cmd).is_ok()
    }

    /// Queues a request; its events arrive on the returned stream.
    ///
    /// A request the engine's last published state already condemns (its tenant's own work
    /// ahead of it would make it miss its time-to-first-token target by more than the overload
    /// factor) is refused here, at once, with [`RequestError::Overloaded`]: it does not wait for
    /// the forward pass in progress to hear it (see `admission`).
    pub fn submit(&self, mut request: Request) -> RequestStream {
        let (tx, rx) = mpsc::unbounded_channel();
        match self.info.door.judge(&request, &self.info.config) {
            Ok(charge) => request.charge = charge,
            Err(predicted) => {
                let error = super::request::overloaded(predicted, self.info.config.targets(request.slo).ttft);
                let labels = super::tenant_labels(self.info.config.tenant_labels, &request.tenant);
                metrics::counter!("cachet:requests_refused_total", labels).increment(1);
                if let Some(hook) = &request.on_complete {
                    hook(super::request::Outcome::Failed, &Completion::refused(request.tokens.len()));
                }
                let _ = tx.send(Event::Error(error));
                return RequestStream { rx };
            }
        }
        if !self.send(Command::Submit(Box::new(request), tx.clone())) {
            let _ = tx.send(Event::Error(engine_gone()));
        }
        RequestStream { rx }
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.info.tokenizer
    }

    /// The model's grammars: compile a request's grammar here (blocking, cached)
    /// before submitting it.
    pub fn grammars(&self) -> &Grammars {
        &self.info.grammars
    }

    /// The model's chat template, if any.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.info.chat_template.as_deref()
    }

    /// The model's display name.
    pub fn model_name(&self) -> &str {
        &self.info.model_name
    }

    /// Longest sequence (prompt plus output) the engine can hold.
    pub fn max_context(&self) -> usize {
        self.info.max_context
    }

    /// Vocabulary size (valid token ids are below it).
    pub fn vocab_size(&self) -> usize {
        self.info.vocab_size
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.info.config
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        if !self.send(make(tx)) {
            return None;
        }
        rx.await.ok()
    }

    fn ask_blocking<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        if !self.send(make(tx)) {
            return None;
        }
        rx.blocking_recv().ok()
    }

    /// Evicts the cached spans of `source` (all versions but `keep_version`);
    /// returns how many slots were freed at once (locked ones go later).
    pub async fn invalidate(&self, source: &str, keep_version: Option<&str>) -> Option<usize> {
        let (source, keep_version) = (source.to_string(), keep_version.map(str::to_string));
        self.ask(|reply| Command::Invalidate { source, keep_version, reply }).await
    }

    /// Blocking form of [`EngineHandle::invalidate`].
    pub fn invalidate_blocking(&self, source: &str, keep_version: Option<&str>) -> Option<usize> {
        let (source, keep_version) = (source.to_string(), keep_version.map(str::to_string));
        self.ask_blocking(|reply| Command::Invalidate { source, keep_version, reply })
    }

    /// Ends a retention key (a session closed).
    pub fn release(&self, key: RetentionKey) {
        self.send(Command::Release(key));
    }

    /// Sets a tenant's share of the pool.
    pub fn set_share(&self, tenant: TenantKey, share: f64) {
        self.send(Command::SetShare(tenant, share));
    }

    /// Drops everything cached for a tenant (a deleted tenant).
    pub fn purge_tenant(&self, tenant: TenantKey) {
        self.send(Command::PurgeTenant(tenant));
    }

    /// A snapshot of the engine's state and counters.
    pub async fn snapshot(&self) -> Option<Snapshot> {
        self.ask(Command::Snapshot).await
    }

    /// Blocking form of [`EngineHandle::snapshot`].
    pub fn snapshot_blocking(&self) -> Option<Snapshot> {
        self.ask_blocking(Command::Snapshot)
    }

    /// The model fingerprint of this engine's K/V records (a record of another is refused).
    pub fn kv_fingerprint(&self) -> [u8; 32] {
        self.info.kv_fingerprint
    }

    /// Indexes a chunk the caller wrote into the disk tier's directory (with
    /// [`crate::kv_transfer::disk::DiskTier::write`], `bytes` long): a chunk fetched from another
    /// replica, which the next request's admission can then load.
    pub async fn adopt_chunk(&self, record: crate::kv_transfer::KvRecord, bytes: u64) -> Result<(), KvError> {
        self.ask(|reply| Command::AdoptChunk(Box::new(record), bytes, reply)).await.unwrap_or(Err(KvError::Stopped))
    }

    /// A feed for a request whose prompt K/V arrives from elsewhere, from prompt position `from`
    /// on: the [`super::RemoteKv`] goes into [`Request::remote_kv`], the chunks into the
    /// [`super::RemoteFeed`].
    pub fn remote_kv(&self, from: usize) -> (super::RemoteFeed, super::RemoteKv) {
        super::RemoteFeed::pair(from, self.tx.clone())
    }

    /// Waits until every chunk handed to the disk tier is on disk (an orderly stop: a restarted
    /// server finds them). Immediate without a tier.
    pub async fn flush_kv_tier(&self) {
        self.ask(Command::FlushTier).await;
    }

    /// Blocking form of [`EngineHandle::flush_kv_tier`].
    pub fn flush_kv_tier_blocking(&self) {
        self.ask_blocking(Command::FlushTier);
    }

    /// Checks the pool, the cache and slot ownership (for tests).
    pub fn check_integrity_blocking(&self) -> Result<(), KvError> {
        self.ask_blocking(Command::CheckIntegrity).unwrap_or(Err(KvError::Stopped))
    }
}
