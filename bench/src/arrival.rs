//! Arrival processes: when each conversation of a workload starts.
//!
//! * **Closed loop**: `users` simulated users; each takes the next
//!   conversation as soon as its previous one is finished, so there are never
//!   more than `users` requests in flight.
//! * **Open loop**: conversations start at times drawn from a Poisson process
//!   (exponential gaps with mean `1 / rate`), whatever the server's state,
//!   plus optional bursts of simultaneous arrivals. A request's latency is
//!   measured from its *scheduled* time, so any client-side delay counts.

use crate::rng::Rng;
use serde::{Deserialize, Serialize};

/// `count` conversations that all arrive at `at_s` seconds after the start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    /// Seconds after the scenario's start.
    pub at_s: f64,
    /// How many conversations arrive at once.
    pub count: usize,
}

/// How conversations are started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrival {
    /// `users` concurrent users, each running one conversation after another
    /// with no think time.
    Closed {
        /// Concurrent users (at least 1).
        users: usize,
    },
    /// Poisson arrivals at `rate_per_s` plus `bursts`.
    Open {
        /// Mean arrivals per second of the steady (Poisson) part.
        rate_per_s: f64,
        /// Extra simultaneous arrivals.
        #[serde(default)]
        bursts: Vec<Burst>,
        /// At most this many requests in flight; later arrivals wait in the
        /// client (and that wait counts in their TTFT). `None`: unlimited.
        #[serde(default)]
        max_in_flight: Option<usize>,
    },
}

impl Arrival {
    /// A short human description ("closed, 4 users"; "Poisson 0.2/s + 16 at 10 s").
    pub fn describe(&self) -> String {
        match self {
            Arrival::Closed { users } => format!("closed loop, {users} users"),
            Arrival::Open { rate_per_s, bursts, max_in_flight } => {
                let mut s = format!("open loop, Poisson {rate_per_s}/s");
                for b in bursts {
                    s.push_str(&format!(" + burst of {} at {} s", b.count, b.at_s));
                }
                if let Some(m) = max_in_flight {
                    s.push_str(&format!(", at most {m} in flight"));
                }
                s
            }
        }
    }
}

/// `n` arrival times (seconds, ascending, the first after one gap) of a
/// Poisson process with `rate_per_s`, deterministic for `seed`.
///
/// A non-positive or non-finite rate puts every arrival at `0`.
pub fn poisson_schedule(rate_per_s: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = Rng::derive(seed, "arrivals");
    let mean = if rate_per_s.is_finite() && rate_per_s > 0.0 { 1.0 / rate_per_s } else { 0.0 };
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            t += rng.exponential(mean);
            t
        })
        .collect()
}

/// The open-loop schedule: `steady` Poisson arrivals merged with the bursts'
/// arrivals, ascending. Ties keep steady arrivals first.
pub fn open_schedule(rate_per_s: f64, steady: usize, bursts: &[Burst], seed: u64) -> Vec<f64> {
    let mut times = poisson_schedule(rate_per_s, steady, seed);
    for b in bursts {
        times.extend(std::iter::repeat_n(b.at_s.max(0.0), b.count));
    }
    times.sort_by(f64::total_cmp);
    times
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_is_deterministic_for_a_seed() {
        assert_eq!(poisson_schedule(2.0, 100, 42), poisson_schedule(2.0, 100, 42));
        assert_ne!(poisson_schedule(2.0, 100, 42), poisson_schedule(2.0, 100, 43));
    }

    #[test]
    fn poisson_mean_gap_is_one_over_the_rate() {
        // 10,000 exponential gaps with mean 0.5 s: the sample mean's standard
        // error is 0.5 / 100 = 0.005, so ±0.025 is a 5-sigma bound.
        let times = poisson_schedule(2.0, 10_000, 1);
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        let mean_gap = times[times.len() - 1] / times.len() as f64;
        assert!((mean_gap - 0.5).abs() < 0.025, "mean gap {mean_gap}");
        // The coefficient of variation of exponential gaps is 1.
        let gaps: Vec<f64> = std::iter::once(times[0]).chain(times.windows(2).map(|w| w[1] - w[0])).collect();
        let var = gaps.iter().map(|g| (g - mean_gap).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((var.sqrt() / mean_gap - 1.0).abs() < 0.1, "cv {}", var.sqrt() / mean_gap);
    }

    #[test]
    fn bursts_insert_their_count_at_their_time() {
        let bursts = [Burst { at_s: 10.0, count: 16 }, Burst { at_s: 3.0, count: 2 }];
        let times = open_schedule(0.2, 8, &bursts, 5);
        assert_eq!(times.len(), 8 + 16 + 2);
        assert_eq!(times.iter().filter(|&&t| t == 10.0).count(), 16);
        assert_eq!(times.iter().filter(|&&t| t == 3.0).count(), 2);
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        // The steady part is exactly the Poisson schedule.
        let steady: Vec<f64> = times.iter().copied().filter(|&t| t != 10.0 && t != 3.0).collect();
        assert_eq!(steady, poisson_schedule(0.2, 8, 5));
    }

    #[test]
    fn zero_rate_puts_everything_at_the_start() {
        assert_eq!(poisson_schedule(0.0, 3, 1), vec![0.0, 0.0, 0.0]);
    }
}
