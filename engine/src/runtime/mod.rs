//! The engine loop. One thread owns the model, the KV pool, the radix cache
//! and every running request by value; everything else talks to it through
//! an [`EngineHandle`] (a channel in, one channel out per request). Each
//! iteration takes the commands that arrived and runs one step in three parts:
//! the [`Scheduler`] plans a batch (decode tokens first, then prefill chunks,
//! then admissions), the [`runner::Runner`] runs one forward pass over it and
//! samples, and the scheduler hands out the tokens and does the accounting.
//!
//! The scheduler knows no model: its queues, admission, ordering, pacing, fair
//! share, KV slots and prefix cache are tested without one (`sched_tests.rs`).

mod admission;
mod clock;
mod config;
mod draft;
mod express;
mod handle;
mod kv;
mod masks;
mod pace;
mod plan;
mod remote;
mod request;
mod runner;
mod sched;
#[cfg(test)]
mod sched_tests;
mod seq;
mod stats;
mod step;
mod tier;

pub use config::{resolve_kv_format, ConfigError, EngineConfig, KvTierConfig, Policy, SloClass, SloTargets};
pub use handle::{EngineHandle, RequestStream};
pub use kv::KvError;
pub use remote::{RemoteFeed, RemoteKv};
pub use request::{
    Completion, Event, OnComplete, OnProgress, Outcome, PublicPrefix, Request, RequestError, StopWhen, TokenSpan,
    PROGRESS_TOKENS,
};
pub use stats::Snapshot;
pub use tier::{chunk_keys, chunk_spans};

use crate::kv_pool::{KvPool, PoolSize, Slots};
use crate::loader::LoadedModel;
use crate::model::{LogitsFor, SeqChunk};
use crate::output::Output;
use crate::radix::{RetentionKey, TenantKey};
use crate::tokenizer::Tokenizer;
use cachet_kernels::backend::Backend;
use seq::Seq;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A configuration value out of range.
    #[error("engine config: {0}")]
    Config(String),
    /// The model and the KV pool do not fit in memory.
    #[error("{0}")]
    Memory(String),
    /// The backend failed (allocation, first forward pass).
    #[error("backend: {0}")]
    Backend(String),
}

pub(crate) enum Command {
    Submit(Box<Request>, UnboundedSender<Event>),
    Invalidate {
        source: String,
        keep_version: Option<String>,
        reply: oneshot::Sender<usize>,
    },
    Release(RetentionKey),
    SetShare(TenantKey, f64),
    PurgeTenant(TenantKey),
    Snapshot(oneshot::Sender<Snapshot>),
    /// Reply once every chunk the disk tier was given is written (an orderly stop).
    FlushTier(oneshot::Sender<()>),
    /// Index a chunk written into the disk tier's directory by the service (a hand-off).
    AdoptChunk(Box<crate::kv_transfer::KvRecord>, u64, oneshot::Sender<Result<(), KvError>>),
    CheckIntegrity(oneshot::Sender<Result<(), KvError>>),
    /// Remote K/V arrived for a request (see [`remote`]): nothing to do but step.
    Wake,
    /// End the engine thread now (requests in flight end with an error).
    Halt,
}

/// Everything the engine thread owns: the scheduler and the model runner.
pub(crate) struct Engine<B: Backend> {
    sched: Scheduler,
    runner: runner::Runner<B>,
}

/// Queues, admission, ordering, pacing, fair share, KV slots and the prefix cache: everything of
/// a step but the model. Tokens come in from the runner ([`Scheduler::postprocess`]).
pub(crate) struct Scheduler {
    /// Where requests come in: the door's admission state and the ids given out.
    intake: admission::Intake,
    cfg: EngineConfig,
    /// The model's tokenizer and limits.
    model: ModelFacts,
    /// The pool, the prefix cache and the disk tier: all K/V memory.
    kv: kv::KvManager,
    waiting: Vec<Seq>,
    running: Vec<Seq>,
    /// Virtual token counters: tokens processed per tenant (fair share).
    vtc: HashMap<TenantKey, f64>,
    /// Pass time against pass size (pacing prefill around decode) and throughput (admission).
    pace: pace::PassModel,
    /// Each tenant's recent answers, where drafts may also come from.
    recent: draft::Recent,
    stats: stats::Stats,
    /// What "now" is for every decision and reported time.
    clock: clock::Clock,
}

/// What the scheduler knows of the model it serves.
pub(crate) struct ModelFacts {
    tokenizer: Tokenizer,
    eos_ids: Vec<u32>,
    /// Token ids the model knows.
    vocab_size: usize,
    /// The longest sequence: the model's context, within the pool.
    max_context: usize,
}

/// Starts the engine thread for a loaded model; the handle is its only door.
pub fn start<B: Backend + 'static>(
    backend: B,
    loaded: LoadedModel<B>,
    cfg: EngineConfig,
) -> Result<EngineHandle, StartError> {
    let (engine, info) = Engine::build(backend, loaded, cfg)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let alive = Arc::new(AtomicBool::new(true));
    let flag = Alive(alive.clone());
    std::thread::Builder::new()
        .name("cachet-engine".into())
        .spawn(move || {
            // Dropped when the loop ends, by returning or by a panic's unwinding.
            let _flag = flag;
            engine.run(rx)
        })
        .map_err(|e| StartError::Backend(format!("engine thread: {e}")))?;
    Ok(EngineHandle::new(tx, info, alive))
}

/// Clears the engine's liveness flag when the engine thread ends, however it ends.
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl<B: Backend> Engine<B> {
    /// The engine, warmed up, and what its handle knows about it.
    fn build(backend: B, loaded: LoadedModel<B>, cfg: EngineConfig) -> Result<(Engine<B>, handle::Info), StartError> {
        cfg.validate().map_err(|e| StartError::Config(e.0))?;
        let config = loaded.model.config().clone();
        let mut cfg = cfg;
        let format = config::resolve_kv_format(cfg.kv_format, &backend, &config);
        if cfg.kv_format.is_none() {
            tracing::info!("K/V stored as {} (kv_format = \"auto\")", format.name());
        }
        if let PoolSize::Contexts(n) = cfg.pool {
            cfg.pool = cfg.pool.fit(&config, format, backend.memory_available());
            let slots = cfg.pool.slots(&config, format);
            let what = if slots >= n * config.max_context {
                format!("the model's whole {}-token context {n} times over", config.max_context)
            } else {
                format!(
                    "{:.2}× the model's {}-token context: half the free memory holds no more",
                    slots as f64 / config.max_context as f64,
                    config.max_context
                )
            };
            tracing::info!("KV pool: {slots} tokens ({}), {what}", format.name());
        }
        if let PoolSize::Bytes(b) = cfg.pool {
            let slots = cfg.pool.slots(&config, format);
            tracing::info!("KV pool: {slots} tokens ({}) in {} MiB", format.name(), b >> 20);
        }
        let pool_bytes = crate::kv_pool::kv_layout(&config, cfg.pool.slots(&config, format), format).bytes() as u64;
        if let Some(available) = backend.memory_available() {
            if pool_bytes > available {
                return Err(StartError::Memory(format!(
                "a KV pool of {} MiB ({} tokens) does not fit next to the {} MiB model: {} MiB of memory are available; \
                 make the pool smaller",
                pool_bytes >> 20,
                cfg.pool.slots(&config, format),
                loaded.file_bytes >> 20,
                available >> 20
            )));
            }
        }
        let pool =
            KvPool::with_format(&backend, &config, cfg.pool, format).map_err(|e| StartError::Backend(e.to_string()))?;
        let layout = pool.layout();
        let (slots, kv) = pool.into_parts();
        let max_context = config.max_context.min(slots.capacity());
        let tokenizer = std::sync::Arc::new(loaded.tokenizer.clone());
        let mut sched = Scheduler::new(cfg.clone(), loaded.tokenizer, config.vocab_size, max_context, slots);
        let fingerprint = crate::kv_transfer::model_fingerprint(
            &loaded.fingerprint,
            config.n_layers,
            config.n_kv_heads,
            config.head_dim,
            format,
        );
        if let Some(t) = &cfg.kv_tier {
            let (tier, opened) = tier::Tier::open(t, fingerprint, cfg.default_share, max_context)
                .map_err(|e| StartError::Config(format!("kv tier {}: {e}", t.dir.display())))?;
            tracing::info!(
                dir = %t.dir.display(),
                records = opened.records,
                discarded = opened.discarded,
                ignored = opened.ignored,
                "KV disk tier open"
            );
            sched.intake.door.set_tier(tier.index());
            sched.kv.set_tier(tier);
        }
        let info = handle::Info {
            model_name: loaded.name.clone(),
            grammars: std::sync::Arc::new(crate::constraint::Grammars::new(tokenizer.clone(), config.vocab_size)),
            tokenizer,
            chat_template: loaded.chat_template.map(std::sync::Arc::new),
            max_context,
            vocab_size: config.vocab_size,
            config: cfg,
            door: sched.intake.door.clone(),
            kv_fingerprint: fingerprint,
        };
        let mut engine = Engine { sched, runner: runner::Runner::new(backend, loaded.model, kv, layout) };
        engine.warm_up()?;
        engine.sched.publish_admission();
        Ok((engine, info))
    }
}

impl Scheduler {
    /// A scheduler for a model of `vocab_size` tokens and sequences shorter than `max_context`,
    /// over a pool of `slots` (the K/V storage is the runner's).
    pub(crate) fn new(
        cfg: EngineConfig,
        tokenizer: Tokenizer,
        vocab_size: usize,
        max_context: usize,
        slots: Slots,
    ) -> Scheduler {
        Scheduler {
            intake: admission::Intake::default(),
            kv: kv::KvManager::new(slots, cfg.default_share),
            cfg,
            model: ModelFacts { eos_ids: tokenizer.eos_ids(), tokenizer, vocab_size, max_context },
            waiting: Vec::new(),
            running: Vec::new(),
            vtc: HashMap::new(),
            pace: pace::PassModel::default(),
            recent: draft::Recent::default(),
            stats: stats::Stats::default(),
            clock: clock::Clock::System,
        }
    }
}

/// The labels of a per-tenant metric: the tenant's id where the operator turned tenant labels on
/// (`on`: [`EngineConfig::tenant_labels`]), none otherwise.
fn tenant_labels(on: bool, tenant: &TenantKey) -> Vec<metrics::Label> {
    if on {
        vec![metrics::Label::new("tenant", tenant.to_string())]
    } else {
        Vec::new()
    }
}

impl<B: Backend> Engine<B> {
    /// One forward pass over a short prompt: faults the weights in, sizes the
    /// buffers and gives admission control its first throughput estimate.
    fn warm_up(&mut self) -> Result<(), StartError> {
        let s = &mut self.sched;
        let n = 64.min(s.model.max_context - 1).max(1);
        let slots = s.kv.allocate_loose(n + 1).map_err(|e| StartError::Backend(e.to_string()))?;
        let tokens: Vec<u32> = (0..=n as u32).map(|i| i % s.model.vocab_size as u32).collect();
        let raw = crate::kv_pool::SlotId::raw(&slots);
        let prompt = [SeqChunk { tokens: &tokens[..n], start_pos: 0, slots: &raw[..n], logits: LogitsFor::Last }];
        // The first pass faults the weights in and sizes the buffers; the second, warm one gives
        // the estimate (a cold estimate would make admission control refuse what it could serve).
        // A one-token pass after it gives pacing the fixed cost of a pass.
        let decode = [SeqChunk { tokens: &tokens[n..], start_pos: n, slots: raw, logits: LogitsFor::Last }];
        let mut r = Ok(());
        for (i, pass) in [&prompt, &prompt, &decode].into_iter().enumerate() {
            let start = Instant::now();
            r = self.runner.forward(pass);
            let secs = start.elapsed().as_secs_f64();
            if r.is_err() {
                break;
            }
            let tokens = pass[0].tokens.len();
            if tokens == n {
                s.pace.throughput = n as f64 / secs.max(1e-6);
            }
            if i > 0 {
                s.pace.observe(tokens, secs);
            }
        }
        s.kv.free_loose(&slots).map_err(|e| StartError::Backend(e.to_string()))?;
        r.map_err(|e| StartError::Backend(e.to_string()))
    }

    /// One step: the scheduler plans, the runner runs the forward pass and samples, the
    /// scheduler hands out what came of it. False when no pass ran.
    fn step(&mut self) -> bool {
        let now = self.sched.clock.now();
        let plan = self.sched.schedule(now);
        let failed = self.move_kv();
        let mut ran = false;
        if let Some(mut plan) = plan {
            plan.retain(|p| !failed.contains(&p.seq));
            if !plan.is_empty() {
                let out = self.runner.run(&plan, &mut self.sched.running);
                self.sched.postprocess(&plan, out, now);
                self.move_kv();
                ran = true;
            }
        }
        self.sched.publish_stats();
        ran
    }

    /// The disk tier's copies, before anything can write the slots they name: first the chunks
    /// to save (out of the pool; their slots may be a load's next), then the chunks loaded (into
    /// it). A load that cannot be copied in fails its request and drops its tenant's cache
    /// (those positions were cached as computed); returns the failed requests.
    fn move_kv(&mut self) -> Vec<u64> {
        let failed = self.sched.kv.copy(&mut self.runner);
        if !failed.is_empty() {
            self.sched.fail_loaded(&failed);
        }
        failed
    }

    fn run(mut self, rx: Receiver<Command>) {
        loop {
            if self.sched.idle() {
                match rx.recv() {
                    Ok(Command::Halt) | Err(_) => return,
                    Ok(cmd) => self.sched.command(cmd),
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(Command::Halt) => return,
                    Ok(cmd) => self.sched.command(cmd),
                    Err(std::sync::mpsc::TryRecvError::Empty) => break,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                        if self.sched.idle() {
                            return;
                        }
                        break;
                    }
                }
            }
            let ran = self.step();
            self.sched.after_step();
            if !ran && self.sched.awaiting_kv() {
                // Nothing to compute until a request's remote K/V arrives (its feed wakes the
                // loop); a cancelled stream or a deadline is still seen within the timeout.
                match rx.recv_timeout(std::time::Duration::from_millis(100)) {
                    Ok(Command::Halt) => return,
                    Ok(cmd) => self.sched.command(cmd),
                    Err(_) => {}
                }
            }
        }
    }
}

impl Scheduler {
    /// Nothing queued or running.
    fn idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Some admitted request waits for its remote K/V.
    fn awaiting_kv(&self) -> bool {
        self.running.iter().any(|s| s.receiving)
    }

    /// Housekeeping after a step: the interning tables, and what the door needs.
    fn after_step(&mut self) {
        // Queued and running requests hold their keys' scope markers.
        let (running, waiting) = (&self.running, &self.waiting);
        self.kv.compact(self.clock.now(), || running.iter().chain(waiting).flat_map(Seq::scopes));
        self.publish_admission();
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req, tx) => self.submit(*req, tx),
            Command::Invalidate { source, keep_version, reply } => {
                let _ = reply.send(self.kv.invalidate(&source, keep_version.as_deref()));
            }
            Command::Release(key) => self.kv.release_retention(&key),
            Command::SetShare(tenant, share) => self.kv.set_share(&tenant, share),
            Command::PurgeTenant(tenant) => {
                self.intake.door.forget(&tenant);
                self.kv.purge_tenant(&tenant);
            }
            Command::Snapshot(reply) => {
                let _ = reply.send(self.snapshot());
            }
            Command::AdoptChunk(record, bytes, reply) => {
                let _ = reply.send(self.kv.adopt(&record, bytes));
            }
            Command::FlushTier(reply) => {
                self.kv.flush_tier();
                let _ = reply.send(());
            }
            Command::CheckIntegrity(reply) => {
                let _ = reply.send(self.check_integrity());
            }
            // `run` ends the thread before a halt gets here.
            Command::Halt | Command::Wake => {}
        }
    }

    /// Validates a request, refuses it if the engine cannot meet its
    /// latency target, else queues it.
    fn submit(&mut self, req: Request, tx: UnboundedSender<Event>) {
        let now = self.clock.now();
        self.intake.taken = self.intake.taken.max(req.charge.seq);
        if let Err(e) = self.validate(&req) {
            let _in = req.span.enter();
            tracing::debug!(error = %e, "invalid request");
            if let Some(hook) = &req.on_complete {
                let e2e = self.clock.now().saturating_duration_since(now);
                let nothing = Completion { e2e, ..Completion::refused(req.tokens.len()) };
                hook(Outcome::Failed, &nothing);
            }
            let _ = tx.send(Event::Error(e));
            return;
        }
        let targets = self.cfg.targets(req.slo);
        let output = Output::new(&req.params, &self.model.eos_ids);
        let id = self.intake.next_id;
        self.intake.next_id += 1;
        let kv = &mut self.kv;
        let mut seq = Seq::new(id, req, tx, output, now, targets.ttft, |s| kv.scope(s));
        seq.stored = self.kv.stored_prefix(&seq.req);
        // An idle engine never refuses: with nothing ahead, waiting would not make the request
        // any faster (and a refusal would leave the throughput estimate without new passes).
        let idle = self.running.iter().chain(&self.waiting).all(|w| w.req.prewarm);
        if !seq.req.prewarm && !idle && self.cfg.overload_factor > 0.0 {
            let predicted = self.predict_ttft(&seq, now);
            // Refused only if waiting would fix it: a request too long for its target even
            // served alone is admitted (and served behind those that can still make theirs).
            // The door judged it already: only a clear misprediction refuses it now.
            if predicted > self.refusal_limit(seq.req.slo) && !self.beyond_reach(&seq, now) {
                self.refuse(seq, predicted);
                return;
            }
        }
        if let Some((key, ttl)) = &seq.req.retention {
            self.kv.retain(key, now + *ttl);
        }
        self.lift_vtc(&seq.req.tenant);
        seq.req.span.in_scope(
            || tracing::debug!(prompt_tokens = seq.prompt_len, slo = ?seq.req.slo, prewarm = seq.req.prewarm, "queued"),
        );
        self.waiting.push(seq);
    }

    fn validate(&self, req: &Request) -> Result<(), RequestError> {
        let limit = self.model.max_context;
        if req.tokens.is_empty() {
            return Err(RequestError::Invalid("the prompt is empty".into()));
        }
        if let Some(&t) = req.tokens.iter().find(|&&t| t as usize >= self.model.vocab_size) {
            return Err(RequestError::Invalid(format!(
                "token id {t} is outside the vocabulary ({} tokens)",
                self.model.vocab_size
            )));
        }
        if req.tokens.len() >= limit {
            return Err(RequestError::TooLong { tokens: req.tokens.len(), limit });
        }
        req.params.sampling.validate().map_err(|e| RequestError::Invalid(e.0))?;
        if req.grammar.is_some() && req.params.ignore_eos {
            return Err(RequestError::Invalid("ignore_eos cannot be combined with a grammar".into()));
        }
        if req.public.as_ref().is_some_and(|p| p.tokens > req.tokens.len()) {
            return Err(RequestError::Invalid("the public prefix is longer than the prompt".into()));
        }
        if req.spans.iter().any(|s| s.range.end > req.tokens.len() || s.range.start > s.range.end) {
            return Err(RequestError::Invalid("a provenance span lies outside the prompt".into()));
        }
        Ok(())
    }

    /// Checks the pool, the cache, and that every slot in use belongs to exactly one of: the
    /// cache, or one queued or running sequence.
    fn check_integrity(&self) -> Result<(), KvError> {
        self.kv.check_integrity(self.running.iter().chain(&self.waiting))
    }
}
