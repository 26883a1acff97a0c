//! Running a workload against a target: the arrival process drives the
//! client; every request's record is kept.

use crate::arrival::Arrival;
use crate::calibrate::Calibration;
use crate::client::{ms_since, send, ChatRequest, Message, Target};
use crate::error::BenchError;
use crate::record::{RequestRecord, Slo};
use crate::stats::{summarize, Summary};
use crate::workload::source::SourceCorpus;
use crate::workload::{Scenario, ScenarioSpec, Workload};
use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How to run scenarios.
#[derive(Clone, Debug, PartialEq)]
pub struct RunOptions {
    /// Seed of prompts and arrival schedules.
    pub seed: u64,
    /// The objectives for SLO attainment and goodput.
    pub slo: Slo,
    /// Per-request timeout.
    pub timeout: Duration,
    /// The git repository prompts are cut from.
    pub source_repo: PathBuf,
    /// Send one short request before the scenario (not recorded).
    pub warmup: bool,
    /// A free-form label stored with the results ("cachet lpm", ...).
    pub label: Option<String>,
    /// Times a request refused with 429 or 503 is sent again after its `Retry-After`.
    pub retries: u32,
}

impl Default for RunOptions {
    /// Seed 0, default SLOs, 600 s timeout, the current directory's repository, warm-up on, no
    /// retries.
    fn default() -> RunOptions {
        RunOptions {
            seed: 0,
            slo: Slo::default(),
            timeout: Duration::from_secs(600),
            source_repo: PathBuf::from("."),
            warmup: true,
            label: None,
            retries: 0,
        }
    }
}

/// One (system, scenario) run: what was run, every request, and the summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioResult {
    /// The target's name.
    pub system: String,
    /// The run's label, if any.
    #[serde(default)]
    pub label: Option<String>,
    /// The model name sent.
    pub model: String,
    /// Which scenario.
    pub scenario: Scenario,
    /// Its parameters.
    pub spec: ScenarioSpec,
    /// The seed.
    pub seed: u64,
    /// When the scenario started.
    pub started_at: DateTime<Utc>,
    /// The summary.
    pub summary: Summary,
    /// Every request, in (conversation, turn) order; may be left out of files.
    #[serde(default)]
    pub records: Vec<RequestRecord>,
    /// The SLO calibrated to the machine before the scenario, when it was.
    #[serde(default)]
    pub calibration: Option<Calibration>,
}

impl ScenarioResult {
    /// Adds the calibration and the attainment against its SLO.
    pub fn calibrated(mut self, calibration: Calibration) -> ScenarioResult {
        self.summary.calibrated = Some(crate::stats::attainment(&self.records, &calibration.slo));
        self.calibration = Some(calibration);
        self
    }

    /// The name this result is compared under: the system, with the label when there is one.
    pub fn configuration(&self) -> String {
        match &self.label {
            Some(l) if !l.is_empty() && l != &self.system => format!("{} ({l})", self.system),
            _ => self.system.clone(),
        }
    }
}

/// A reqwest client for benchmarking (no overall timeout: each request has its own).
///
/// # Errors
/// [`BenchError::Client`] when the TLS/HTTP stack cannot be set up.
///
/// A fresh connection per request: servers close idle keep-alive connections on their own clock
/// (llama-server's after 5 s), and a request written into a connection the server is closing
/// fails with "connection closed before message completed" — the client's fault, not the
/// server's. Connecting on localhost costs well under a millisecond.
pub fn http_client() -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder().tcp_nodelay(true).pool_max_idle_per_host(0).build().map_err(BenchError::Client)
}

/// Opens `opts.source_repo`, builds `spec`'s workload for `opts.seed`, warms
/// up and runs it against `target`.
///
/// # Errors
/// The repository cannot be read, the spec is invalid, or the warm-up fails.
/// Failed requests are not errors: they are in the result.
pub async fn run_scenario(
    target: &Target,
    spec: &ScenarioSpec,
    opts: &RunOptions,
) -> Result<ScenarioResult, BenchError> {
    let workload = {
        let corpus = SourceCorpus::open(&opts.source_repo)?;
        Workload::build(spec, &corpus, opts.seed)?
    };
    let client = http_client()?;
    if opts.warmup {
        warmup(&client, target, opts.timeout).await?;
    }
    Ok(run_workload(&client, target, &workload, opts).await)
}

/// One short request, so connection setup and lazy server work are not
/// measured.
///
/// # Errors
/// [`BenchError::Warmup`] when it does not complete.
pub async fn warmup(client: &reqwest::Client, target: &Target, timeout: Duration) -> Result<(), BenchError> {
    let req =
        ChatRequest { messages: vec![Message::new("user", "Say hello.")], max_tokens: 4, ignore_eos: true }.http();
    let now = Instant::now();
    let out = send(client, target, &req, now, now, timeout, 3).await;
    match out.record.error {
        None => Ok(()),
        Some(message) => Err(BenchError::Warmup { target: target.name.clone(), message }),
    }
}

/// Runs a built workload against `target` (no warm-up) and summarises it.
pub async fn run_workload(
    client: &reqwest::Client,
    target: &Target,
    workload: &Workload,
    opts: &RunOptions,
) -> ScenarioResult {
    let started_at = Utc::now();
    let origin = Instant::now();
    let runner = Runner {
        client,
        target,
        workload,
        timeout: opts.timeout,
        retries: opts.retries,
        origin,
        in_flight: match &workload.spec.arrival {
            Arrival::Open { max_in_flight: Some(n), .. } => Some(Semaphore::new(*n)),
            _ => None,
        },
    };
    let mut records: Vec<RequestRecord> = match (&workload.spec.arrival, &workload.start_times_s) {
        (Arrival::Open { .. }, Some(times)) => {
            let starts = times.iter().enumerate().map(|(i, &t)| {
                let at = origin + Duration::from_secs_f64(t);
                let runner = &runner;
                async move {
                    tokio::time::sleep_until(at.into()).await;
                    runner.conversation(i, Some(at)).await
                }
            });
            join_all(starts).await.into_iter().flatten().collect()
        }
        _ => {
            let users = match workload.spec.arrival {
                Arrival::Closed { users } => users.max(1),
                Arrival::Open { .. } => 1,
            };
            let next = AtomicUsize::new(0);
            let user = || async {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= workload.conversations.len() {
                        return out;
                    }
                    out.extend(runner.conversation(i, None).await);
                }
            };
            join_all((0..users).map(|_| user())).await.into_iter().flatten().collect()
        }
    };
    records.sort_by_key(|r| (r.conversation, r.turn));
    ScenarioResult {
        system: target.name.clone(),
        label: opts.label.clone(),
        model: target.model.clone(),
        scenario: workload.spec.scenario,
        spec: workload.spec.clone(),
        seed: workload.seed,
        started_at,
        summary: summarize(&records, &opts.slo),
        records,
        calibration: None,
    }
}

/// What the arrival tasks share.
struct Runner<'a> {
    client: &'a reqwest::Client,
    target: &'a Target,
    workload: &'a Workload,
    timeout: Duration,
    retries: u32,
    origin: Instant,
    in_flight: Option<Semaphore>,
}

impl Runner<'_> {
    /// Runs conversation `i`, its first turn scheduled at `first` (now when
    /// `None`), each later turn as soon as the previous one ends. When a turn
    /// fails the rest are recorded as not sent.
    async fn conversation(&self, i: usize, first: Option<Instant>) -> Vec<RequestRecord> {
        let conv = &self.workload.conversations[i];
        let target = self.target.for_conversation(i);
        let turns = conv.turns.len() + conv.replay.len();
        let mut messages = conv.preamble.clone();
        let mut out = Vec::with_capacity(turns);
        for k in 0..turns {
            // A recorded request goes as it was recorded; a chat turn follows the answers so far.
            let req = match conv.replay.get(k) {
                Some(r) => r.clone(),
                None => {
                    messages.push(Message::new("user", conv.turns[k - conv.replay.len()].clone()));
                    ChatRequest {
                        messages: messages.clone(),
                        max_tokens: self.workload.spec.max_tokens,
                        ignore_eos: self.workload.spec.ignore_eos,
                    }
                    .http()
                }
            };
            let scheduled = match (k, first) {
                (0, Some(at)) => at,
                _ => Instant::now(),
            };
            let permit = match &self.in_flight {
                Some(s) => s.acquire().await.ok(),
                None => None,
            };
            let outcome = send(self.client, &target, &req, self.origin, scheduled, self.timeout, self.retries).await;
            drop(permit);
            let mut record = outcome.record;
            record.conversation = i;
            record.turn = k;
            let failed = !record.completed();
            out.push(record);
            if failed {
                let now = ms_since(self.origin, Instant::now());
                for skipped in k + 1..turns {
                    out.push(not_sent(i, skipped, now, k));
                }
                break;
            }
            if k >= conv.replay.len() {
                messages.push(Message::new("assistant", outcome.text));
            }
        }
        out
    }
}

/// The record of a turn never sent because turn `failed` of its conversation failed.
fn not_sent(conversation: usize, turn: usize, now_ms: f64, failed: usize) -> RequestRecord {
    RequestRecord {
        error: Some(format!("not sent: turn {failed} of this conversation failed")),
        ..RequestRecord::new(conversation, turn, now_ms, 0)
    }
}
