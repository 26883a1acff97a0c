//! Summaries of a scenario run: percentiles, throughput, SLO attainment,
//! goodput and the cached-token ratio.
//!
//! **Percentiles** use linear interpolation between closest ranks, numpy's
//! default (`method="linear"`): for sorted samples `x[0..n]` and `p` in
//! `[0, 100]`, `h = (n - 1) * p / 100` and the result is
//! `x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)])`.
//! TTFT and end-to-end percentiles are over completed requests (one sample
//! each); ITL percentiles pool every inter-token gap of every completed
//! request. Failed requests count in totals and in the SLO denominator but
//! never in latency percentiles.

use crate::record::{RequestRecord, Slo};
use serde::{Deserialize, Serialize};

/// The `p`-th percentile (`0..=100`) of `samples` by linear interpolation
/// between closest ranks; `None` for no samples. The input need not be sorted;
/// NaNs sort last.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(percentile_sorted(&sorted, p))
}

/// [`percentile`] of already sorted, non-empty samples.
fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * p.clamp(0.0, 100.0) / 100.0;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// p50, p95 and p99 of a set of samples (ms).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
    /// Number of samples.
    pub n: usize,
}

impl Percentiles {
    /// The percentiles of `samples`; `None` for no samples.
    pub fn of(samples: &[f64]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Percentiles {
            p50: percentile_sorted(&sorted, 50.0),
            p95: percentile_sorted(&sorted, 95.0),
            p99: percentile_sorted(&sorted, 99.0),
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
            n: sorted.len(),
        })
    }
}

/// The summary of one (system, scenario) run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests in the workload (completed + failed).
    pub requests: usize,
    /// Requests that completed.
    pub completed: usize,
    /// Requests that failed (or were never sent because an earlier turn failed).
    pub failed: usize,
    /// Queue-inclusive time to first token (ms).
    pub ttft_ms: Option<Percentiles>,
    /// Inter-token latency (ms), all gaps pooled.
    pub itl_ms: Option<Percentiles>,
    /// End-to-end latency (ms).
    pub e2e_ms: Option<Percentiles>,
    /// Seconds from the first send to the last completion.
    pub wall_s: f64,
    /// Completed requests per second of wall time.
    pub requests_per_s: f64,
    /// Output tokens of completed requests per second of wall time.
    pub output_tokens_per_s: f64,
    /// The objectives used.
    pub slo: Slo,
    /// Requests that met the SLO.
    pub slo_met: usize,
    /// `slo_met / requests` (0 when there are no requests).
    pub slo_attainment: f64,
    /// Requests per second that met the SLO: `slo_met / wall_s`.
    pub goodput_per_s: f64,
    /// Sum of server-reported prompt tokens of completed requests.
    pub prompt_tokens: u64,
    /// Sum of output tokens of completed requests.
    pub output_tokens: u64,
    /// Sum of cached tokens / sum of prompt tokens over the completed requests
    /// that report both; `None` when none does.
    pub cached_ratio: Option<f64>,
    /// Speculative decoding over the completed requests that report it: tokens drafted and
    /// confirmed; `None` when none does.
    #[serde(default)]
    pub drafts: Option<Drafts>,
    /// Attempts repeated after a 429 or 503, over all requests.
    #[serde(default)]
    pub retries: u64,
    /// SLO attainment and goodput against the SLO calibrated to the machine (see
    /// [`crate::calibrate`]), when the run was calibrated.
    #[serde(default)]
    pub calibrated: Option<Attainment>,
}

/// Speculative decoding's drafts over a scenario's requests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Drafts {
    /// Tokens the server drafted.
    pub drafted: u64,
    /// Of them, those the model confirmed.
    pub accepted: u64,
}

/// How many requests met an SLO, and the goodput.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attainment {
    /// The objectives.
    pub slo: Slo,
    /// Requests that met them.
    pub slo_met: usize,
    /// `slo_met / requests` (0 when there are no requests).
    pub slo_attainment: f64,
    /// `slo_met` per second of wall time.
    pub goodput_per_s: f64,
}

/// `records` against `slo`.
pub fn attainment(records: &[RequestRecord], slo: &Slo) -> Attainment {
    let wall_s = wall_seconds(records);
    let slo_met = records.iter().filter(|r| r.meets(slo)).count();
    Attainment {
        slo: *slo,
        slo_met,
        slo_attainment: if records.is_empty() { 0.0 } else { slo_met as f64 / records.len() as f64 },
        goodput_per_s: if wall_s > 0.0 { slo_met as f64 / wall_s } else { 0.0 },
    }
}

/// Summarises `records` against `slo`.
pub fn summarize(records: &[RequestRecord], slo: &Slo) -> Summary {
    let done: Vec<&RequestRecord> = records.iter().filter(|r| r.completed()).collect();
    let ttft: Vec<f64> = done.iter().filter_map(|r| r.ttft_ms).collect();
    let itl: Vec<f64> = done.iter().flat_map(|r| r.itl_ms.iter().copied()).collect();
    let e2e: Vec<f64> = done.iter().map(|r| r.e2e_ms).collect();
    let wall_s = wall_seconds(records);
    let per_s = |x: f64| if wall_s > 0.0 { x / wall_s } else { 0.0 };
    let output_tokens: u64 = done.iter().map(|r| r.output_tokens).sum();
    let met = attainment(records, slo);
    Summary {
        requests: records.len(),
        completed: done.len(),
        failed: records.len() - done.len(),
        ttft_ms: Percentiles::of(&ttft),
        itl_ms: Percentiles::of(&itl),
        e2e_ms: Percentiles::of(&e2e),
        wall_s,
        requests_per_s: per_s(done.len() as f64),
        output_tokens_per_s: per_s(output_tokens as f64),
        slo: *slo,
        slo_met: met.slo_met,
        slo_attainment: met.slo_attainment,
        goodput_per_s: met.goodput_per_s,
        prompt_tokens: done.iter().filter_map(|r| r.prompt_tokens).sum(),
        output_tokens,
        cached_ratio: cached_ratio(&done),
        drafts: drafts(&done),
        retries: records.iter().map(|r| u64::from(r.retries)).sum(),
        calibrated: None,
    }
}

/// Seconds from the first send to the last end among sent requests.
fn wall_seconds(records: &[RequestRecord]) -> f64 {
    let sent = records.iter().filter_map(|r| r.sent_ms.map(|s| (s, r.end_ms)));
    let (first, last) = sent.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), (s, e)| (a.min(s), b.max(e)));
    if first.is_finite() && last > first {
        (last - first) / 1000.0
    } else {
        0.0
    }
}

fn drafts(done: &[&RequestRecord]) -> Option<Drafts> {
    let reported: Vec<(u64, u64)> =
        done.iter().filter_map(|r| Some((r.drafted_tokens?, r.accepted_tokens.unwrap_or(0)))).collect();
    (!reported.is_empty())
        .then(|| Drafts { drafted: reported.iter().map(|d| d.0).sum(), accepted: reported.iter().map(|d| d.1).sum() })
}

fn cached_ratio(done: &[&RequestRecord]) -> Option<f64> {
    let (mut cached, mut prompt, mut any) = (0u64, 0u64, false);
    for r in done {
        if let (Some(c), Some(p)) = (r.cached_tokens, r.prompt_tokens) {
            cached += c;
            prompt += p;
            any = true;
        }
    }
    match (any, prompt) {
        (false, _) => None,
        (true, 0) => Some(0.0),
        (true, p) => Some(cached as f64 / p as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::gaps;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_by_linear_interpolation() {
        assert_eq!(percentile(&[], 50.0), None);
        // One element: every percentile is it.
        for p in [0.0, 50.0, 99.0, 100.0] {
            assert_eq!(percentile(&[7.0], p), Some(7.0));
        }
        // Two elements: h = p / 100.
        assert_eq!(percentile(&[10.0, 20.0], 50.0), Some(15.0));
        assert!(close(percentile(&[10.0, 20.0], 95.0).unwrap(), 19.5));
        assert!(close(percentile(&[20.0, 10.0], 99.0).unwrap(), 19.9));
        // p0 / p100 are min / max, whatever the order.
        let xs = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&xs, 0.0), Some(1.0));
        assert_eq!(percentile(&xs, 100.0), Some(5.0));
        assert_eq!(percentile(&xs, 50.0), Some(3.0));
        // numpy.percentile([1, 2, 3, 4, 5], 95) = 4.8 (h = 3.8); 99 -> 4.96.
        assert!(close(percentile(&xs, 95.0).unwrap(), 4.8));
        assert!(close(percentile(&xs, 99.0).unwrap(), 4.96));
        // numpy.percentile([1, 2, 3, 4], 50) = 2.5; 25 -> 1.75 (h = 0.75).
        assert!(close(percentile(&[4.0, 3.0, 2.0, 1.0], 50.0).unwrap(), 2.5));
        assert!(close(percentile(&[4.0, 3.0, 2.0, 1.0], 25.0).unwrap(), 1.75));
        // Out-of-range p is clamped.
        assert_eq!(percentile(&xs, 150.0), Some(5.0));
        let p = Percentiles::of(&xs).unwrap();
        assert_eq!((p.p50, p.n, p.mean), (3.0, 5, 3.0));
    }

    #[test]
    fn itl_are_gaps_between_token_events() {
        assert_eq!(gaps(&[100.0, 130.0, 190.0, 200.0]), vec![30.0, 60.0, 10.0]);
        assert!(gaps(&[100.0]).is_empty());
        assert!(gaps(&[]).is_empty());
    }

    /// A completed record sent at `sent` with the given token times.
    pub(crate) fn ok(sent: f64, tokens: &[f64], prompt: Option<u64>, cached: Option<u64>) -> RequestRecord {
        let end = tokens.last().copied().unwrap_or(0.0) + 5.0;
        RequestRecord {
            conversation: 0,
            turn: 0,
            scheduled_ms: sent,
            sent_ms: Some(sent),
            end_ms: sent + end,
            ttft_ms: tokens.first().copied(),
            itl_ms: gaps(tokens),
            e2e_ms: end,
            output_tokens: tokens.len() as u64,
            prompt_tokens: prompt,
            cached_tokens: cached,
            drafted_tokens: None,
            accepted_tokens: None,
            approx_prompt_tokens: 0,
            status: Some(200),
            retries: 0,
            error: None,
        }
    }

    fn failed(sent: f64, end: f64) -> RequestRecord {
        RequestRecord {
            status: Some(503),
            retries: 0,
            error: Some("overloaded".into()),
            ttft_ms: None,
            itl_ms: vec![],
            output_tokens: 0,
            e2e_ms: end - sent,
            end_ms: end,
            ..ok(sent, &[], None, None)
        }
    }

    #[test]
    fn slo_attainment_and_goodput_with_failures() {
        let slo = Slo { ttft_ms: 1000.0, itl_ms: 100.0 };
        let records = vec![
            // Meets: TTFT 500, mean ITL 50.
            ok(0.0, &[500.0, 550.0, 600.0], Some(100), Some(80)),
            // TTFT too slow.
            ok(1000.0, &[1500.0, 1510.0], Some(100), None),
            // ITL mean (150) too slow, though one gap is fast.
            ok(2000.0, &[100.0, 110.0, 400.0], Some(100), Some(20)),
            // One token: mean ITL 0, meets.
            ok(3000.0, &[900.0], Some(50), Some(0)),
            // Failure that ends last: counts in totals and wall time, never meets.
            failed(4000.0, 10_000.0),
        ];
        let s = summarize(&records, &slo);
        assert_eq!((s.requests, s.completed, s.failed, s.slo_met), (5, 4, 1, 2));
        assert!(close(s.slo_attainment, 0.4));
        // Wall: first send 0 ms to last end 10,000 ms.
        assert!(close(s.wall_s, 10.0));
        assert!(close(s.goodput_per_s, 0.2));
        assert!(close(s.requests_per_s, 0.4));
        // Output tokens 3 + 2 + 3 + 1 = 9.
        assert_eq!(s.output_tokens, 9);
        assert!(close(s.output_tokens_per_s, 0.9));
        // TTFT over completed only: 500, 1500, 100, 900.
        let ttft = s.ttft_ms.unwrap();
        assert_eq!((ttft.n, ttft.p50), (4, 700.0));
        // ITL pooled: 50, 50, 10, 10, 290.
        let itl = s.itl_ms.unwrap();
        assert_eq!((itl.n, itl.p50), (5, 50.0));
        // Cached ratio over the three that report it: (80 + 20 + 0) / (100 + 100 + 50).
        assert!(close(s.cached_ratio.unwrap(), 0.4));
        assert_eq!(s.prompt_tokens, 350);
    }

    #[test]
    fn cached_ratio_is_none_when_nobody_reports_it() {
        let records = vec![ok(0.0, &[10.0], Some(10), None), ok(0.0, &[10.0], None, Some(3))];
        assert_eq!(summarize(&records, &Slo::default()).cached_ratio, None);
    }

    #[test]
    fn an_empty_or_all_failed_run() {
        let s = summarize(&[], &Slo::default());
        assert_eq!((s.requests, s.wall_s, s.slo_attainment, s.goodput_per_s), (0, 0.0, 0.0, 0.0));
        let s = summarize(&[failed(0.0, 100.0)], &Slo::default());
        assert_eq!((s.completed, s.failed, s.ttft_ms, s.cached_ratio), (0, 1, None, None));
        assert!(close(s.wall_s, 0.1));
    }
}
