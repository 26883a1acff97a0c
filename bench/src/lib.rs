//! cachet-bench: replays coding-agent workloads against any OpenAI-compatible
//! endpoint (cachet, llama-server, vLLM, ...) and reports what users feel.
//!
//! Per request it measures the **queue-inclusive TTFT** (from the moment the
//! arrival process scheduled the request, so waiting in the client counts),
//! the inter-token gaps, end-to-end latency, output tokens and the prompt
//! tokens the server says it served from its cache. Per (system, scenario)
//! it reports p50/p95/p99 latencies, throughput, SLO attainment and goodput
//! (see [`stats`]), as JSON, markdown and SVG ([`report`]).
//!
//! Workloads ([`workload`]) are six named scenarios built from real source
//! text of a git repository, deterministic for a seed; arrivals
//! ([`arrival`]) are a closed loop of users or an open Poisson process with
//! bursts.
//!
//! ```no_run
//! use cachet_bench::{run_scenario, RunOptions, Scenario, ScenarioSpec, Target};
//!
//! # async fn example() -> Result<(), cachet_bench::BenchError> {
//! let target = Target {
//!     name: "cachet".into(),
//!     base_url: "http://127.0.0.1:8080".into(),
//!     model: "qwen2.5-0.5b".into(),
//!     api_key: None,
//!     tenant_keys: Vec::new(),
//! };
//! let spec = ScenarioSpec::defaults(Scenario::RepeatedContext).scaled(0.5, 1.0);
//! let result = run_scenario(&target, &spec, &RunOptions { seed: 1, ..RunOptions::default() }).await?;
//! println!("TTFT p50 {:?} ms", result.summary.ttft_ms.map(|p| p.p50));
//! # Ok(())
//! # }
//! ```
//!
//! The command line (`cachet-bench run`, `cachet-bench report`) is in [`cli`].

pub mod arrival;
pub mod calibrate;
pub mod cli;
pub mod client;
mod error;
pub mod push;
pub mod record;
pub mod report;
pub mod rng;
pub mod run;
pub mod sse;
pub mod stats;
pub mod workload;

pub use arrival::{Arrival, Burst};
pub use client::{ChatRequest, Message, Target};
pub use error::BenchError;
pub use record::{RequestRecord, Slo};
pub use report::ResultsFile;
pub use run::{http_client, run_scenario, run_workload, warmup, RunOptions, ScenarioResult};
pub use stats::{attainment, percentile, summarize, Attainment, Percentiles, Summary};
pub use workload::source::SourceCorpus;
pub use workload::{Conversation, Scenario, ScenarioSpec, Workload};
