//! SLOs calibrated to the machine. A fixed SLO (TTFT ≤ 3 s) means different things on
//! different hardware: on a 2-core CPU a lone 600-token prompt already takes longer than
//! that, so every configuration scores 0 and a comparison measures nothing; on a GPU every
//! configuration meets it. Before each scenario, every target serves a few lone requests of
//! the scenario's size (a fresh prompt, nothing else running); the calibrated SLO is
//! relative to the fastest target's lone figures, so it is the same for every system of a
//! run and means the same on every machine:
//!
//! - **TTFT ≤ [`TTFT_FACTOR`] (3) × the lone TTFT** of a prompt of the scenario's size: the
//!   slowdown a person accepts before a queue feels broken, and what prefill-side SLOs of
//!   serving research (SLOs-Serve's "3× slowdown") use.
//! - **Mean ITL ≤ [`ITL_FACTOR`] (5) × the lone ITL**: Sarathi-Serve's *strict* time-between-
//!   tokens target (5× a decode iteration of a lone request): room for batching and for
//!   prefill chunks paced between decode steps, none for a whole prompt's prefill stalling
//!   the decoders.
//!
//! The lone figures also give the machine's capacity for the scenario (one request at a
//! time), from which open-loop arrivals are scaled ([`ScenarioSpec::at_capacity`]), so that
//! `peak` is the same multiple of what the machine serves everywhere.
//!
//! [`ScenarioSpec::at_capacity`]: crate::workload::ScenarioSpec::at_capacity

use crate::client::{send, ChatRequest, Message, Target};
use crate::error::BenchError;
use crate::record::Slo;
use crate::workload::source::SourceCorpus;
use crate::workload::{lone_prompt, Workload};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Calibrated TTFT objective, as a multiple of the fastest lone TTFT.
pub const TTFT_FACTOR: f64 = 3.0;
/// Calibrated mean inter-token objective, as a multiple of the fastest lone ITL.
pub const ITL_FACTOR: f64 = 5.0;
/// Lone requests per target (alternating targets); the fastest of them counts, as noise on a
/// shared machine only ever makes a request slower.
pub const ROUNDS: usize = 2;
/// Output tokens of a lone request (its ITL is their mean gap).
const LONE_TOKENS: u32 = 32;

/// One target's lone figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lone {
    /// The target's name.
    pub system: String,
    /// Time to first token of a lone request (ms), the fastest round.
    pub ttft_ms: f64,
    /// Its mean inter-token gap (ms), the fastest round.
    pub itl_ms: f64,
}

/// The calibration of one scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Prompt size of the lone requests (approximate tokens): the median first request of
    /// the scenario's workload.
    pub prompt_tokens: usize,
    /// Every target's figures.
    pub lone: Vec<Lone>,
    /// The calibrated SLO.
    pub slo: Slo,
    /// Requests per second the fastest target serves one at a time: 1 / (lone TTFT + the
    /// scenario's other output tokens at the lone ITL).
    pub capacity_per_s: f64,
}

impl Calibration {
    /// The calibration from every target's lone figures, for a scenario whose requests ask for
    /// `max_tokens`; None without figures.
    pub fn from_lone(prompt_tokens: usize, max_tokens: u32, lone: Vec<Lone>) -> Option<Calibration> {
        let min = |f: fn(&Lone) -> f64| lone.iter().map(f).filter(|x| x.is_finite()).fold(f64::INFINITY, f64::min);
        let (ttft, itl) = (min(|l| l.ttft_ms), min(|l| l.itl_ms));
        if !ttft.is_finite() || !itl.is_finite() {
            return None;
        }
        let service_ms = lone
            .iter()
            .map(|l| l.ttft_ms + f64::from(max_tokens.saturating_sub(1)) * l.itl_ms)
            .fold(f64::INFINITY, f64::min);
        Some(Calibration {
            prompt_tokens,
            slo: Slo { ttft_ms: (TTFT_FACTOR * ttft).round(), itl_ms: (ITL_FACTOR * itl).round() },
            capacity_per_s: 1000.0 / service_ms.max(1.0),
            lone,
        })
    }
}

/// Measures every target's lone figures for `workload`, with prompts of the size of its
/// median first request ([`Workload::first_request_tokens`]): [`ROUNDS`] rounds, targets
/// alternating, each request alone and fresh (nothing cached).
///
/// # Errors
/// [`BenchError::Warmup`] when a lone request fails: without its figures the SLO would be
/// calibrated on the other targets alone.
pub async fn calibrate(
    client: &reqwest::Client,
    targets: &[Target],
    corpus: &SourceCorpus,
    seed: u64,
    workload: &Workload,
    timeout: Duration,
) -> Result<Option<Calibration>, BenchError> {
    let (scenario, prompt_tokens) = (workload.spec.scenario, workload.first_request_tokens());
    let mut lone: Vec<Lone> = targets
        .iter()
        .map(|t| Lone { system: t.name.clone(), ttft_ms: f64::INFINITY, itl_ms: f64::INFINITY })
        .collect();
    for round in 0..ROUNDS {
        for (target, figures) in targets.iter().zip(lone.iter_mut()) {
            let label = format!("lone {scenario} {} {round}", target.name);
            let text = lone_prompt(corpus, seed, &label, prompt_tokens.max(16));
            let req =
                ChatRequest { messages: vec![Message::new("user", text)], max_tokens: LONE_TOKENS, ignore_eos: true };
            let now = Instant::now();
            let out = send(client, target, &req.http(), now, now, timeout, 3).await;
            let r = out.record;
            if let Some(message) = r.error {
                return Err(BenchError::Warmup {
                    target: target.name.clone(),
                    message: format!("lone request: {message}"),
                });
            }
            if let Some(ttft) = r.ttft_ms {
                figures.ttft_ms = figures.ttft_ms.min(ttft);
            }
            if !r.itl_ms.is_empty() {
                figures.itl_ms = figures.itl_ms.min(r.itl_ms.iter().sum::<f64>() / r.itl_ms.len() as f64);
            }
        }
    }
    Ok(Calibration::from_lone(prompt_tokens, workload.spec.max_tokens, lone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slo_is_relative_to_the_fastest_target() {
        let lone = vec![
            Lone { system: "a".into(), ttft_ms: 4000.0, itl_ms: 30.0 },
            Lone { system: "b".into(), ttft_ms: 5000.0, itl_ms: 25.0 },
        ];
        let c = Calibration::from_lone(600, 32, lone).unwrap();
        assert_eq!(c.slo, Slo { ttft_ms: 12_000.0, itl_ms: 125.0 });
        // Service alone: a 4000 + 31 × 30 = 4930 ms, b 5000 + 31 × 25 = 5775 ms.
        assert!((c.capacity_per_s - 1000.0 / 4930.0).abs() < 1e-12);
        let none = vec![Lone { system: "a".into(), ttft_ms: f64::INFINITY, itl_ms: 30.0 }];
        assert_eq!(Calibration::from_lone(600, 32, none), None);
    }
}
