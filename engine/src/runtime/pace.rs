//! Pacing prefill around decode: how long a forward pass of `n` tokens takes,
//! and so how many tokens a pass may carry while requests are decoding
//! without stretching their inter-token latency past its target.
//!
//! A pass costs about `fixed + n · per_token`: the fixed part (reading every
//! weight once, launching the layers) dominates decode, the per-token part
//! dominates prefill. Both are fitted online from the passes the engine runs
//! (least squares with exponential forgetting, so the fit follows the load:
//! long contexts make attention dearer per token). Chunking never changes a
//! request's output (batch invariance), so pacing only moves time around:
//! decoders keep their rhythm, a long prompt arrives in smaller chunks.

use super::Engine;
use cachet_kernels::backend::Backend;
use std::time::Duration;

/// Weight of the past per observed pass: about the last 1 / (1 − λ) = 20
/// passes count.
const FORGET: f64 = 0.95;

/// Online fit of pass time against pass size.
#[derive(Clone, Debug, Default)]
pub(crate) struct PassModel {
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
}

impl PassModel {
    /// Records a pass of `tokens` tokens that took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        let n = tokens as f64;
        self.w = self.w * FORGET + 1.0;
        self.n = self.n * FORGET + n;
        self.nn = self.nn * FORGET + n * n;
        self.t = self.t * FORGET + secs;
        self.nt = self.nt * FORGET + n * secs;
    }

    /// `(fixed seconds, seconds per token)`, or None before any pass.
    /// When the passes seen so far were (nearly) all of one size the two
    /// cannot be told apart; the whole cost is then taken as per-token,
    /// which over-estimates big passes and so errs towards smaller chunks.
    pub fn fit(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 || self.n <= 0.0 {
            return None;
        }
        let proportional = (0.0, self.t / self.n);
        let mean = self.n / self.w;
        let var = self.nn / self.w - mean * mean;
        // Sizes must differ by a few tokens on average before the slope means anything.
        if var < 4.0 {
            return Some(proportional);
        }
        let slope = (self.nt / self.w - mean * self.t / self.w) / var;
        let fixed = self.t / self.w - slope * mean;
        if !(slope.is_finite() && slope > 0.0 && fixed.is_finite()) {
            return Some(proportional);
        }
        if fixed < 0.0 {
            // Noise can tilt the line below the origin; keep the slope
            // through the mean point, anchored at zero.
            return Some((0.0, self.t / self.n));
        }
        Some((fixed, slope))
    }

    /// Predicted seconds of a pass of `tokens` tokens.
    pub fn seconds(&self, tokens: usize) -> Option<f64> {
        self.fit().map(|(fixed, per)| fixed + per * tokens as f64)
    }

    /// The most tokens one pass can carry within `target`; None before any
    /// pass. Zero when even a one-token pass takes longer.
    pub fn tokens_within(&self, target: Duration) -> Option<usize> {
        let (fixed, per) = self.fit()?;
        let room = target.as_secs_f64() - fixed;
        if room <= 0.0 {
            return Some(0);
        }
        // The epsilon keeps an exact fit (250 ms at 5 ms a token) from rounding down.
        Some(((room / per + 1e-9).floor() as usize).max(1))
    }
}

impl<B: Backend> Engine<B> {
    /// Tokens the next pass may carry. Without decoding requests (or with
    /// pacing off) that is the configured token budget; while requests decode
    /// it is what fits in `pace_margin` times the tightest inter-token target
    /// among them (the margin absorbs the fit's error and the noise of a
    /// shared machine, so the gaps stay below the target, not at it), but
    /// never less than the decode tokens plus `min_prefill_chunk` (so prompts
    /// keep moving when the decoders alone fill the target) and never more
    /// than the token budget.
    pub(super) fn step_budget(&self) -> usize {
        let max = self.cfg.token_budget;
        if !self.cfg.pace_prefill {
            return max;
        }
        let decoding = self.running.iter().filter(|s| s.first_token.is_some() && s.remaining() == 1);
        let (count, itl) = decoding.fold((0usize, None::<Duration>), |(c, m), s| {
            let itl = self.cfg.targets(s.req.slo).itl;
            (c + 1, Some(m.map_or(itl, |m: Duration| m.min(itl))))
        });
        let Some(itl) = itl else { return max };
        let Some(fits) = self.pace.tokens_within(itl.mul_f64(self.cfg.pace_margin)) else { return max };
        fits.max(count + self.cfg.min_prefill_chunk).min(max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_linear_cost() {
        let mut m = PassModel::default();
        for i in 0..60 {
            let n = [1, 4, 64, 200, 512][i % 5];
            m.observe(n, 0.012 + 0.0025 * n as f64);
        }
        let (fixed, per) = m.fit().unwrap();
        assert!((fixed - 0.012).abs() < 1e-9, "{fixed}");
        assert!((per - 0.0025).abs() < 1e-12, "{per}");
        // (0.25 − 0.012) / 0.0025 = 95.2
        assert_eq!(m.tokens_within(Duration::from_millis(250)), Some(95));
        assert_eq!(m.tokens_within(Duration::from_millis(10)), Some(0));
    }

    #[test]
    fn one_size_only_is_taken_as_per_token_cost() {
        let mut m = PassModel::default();
        assert_eq!(m.fit(), None);
        assert_eq!(m.tokens_within(Duration::from_secs(1)), None);
        for _ in 0..10 {
            m.observe(100, 0.5);
        }
        let (fixed, per) = m.fit().unwrap();
        assert_eq!(fixed, 0.0);
        assert!((per - 0.005).abs() < 1e-12);
        assert_eq!(m.tokens_within(Duration::from_millis(250)), Some(50));
    }

    #[test]
    fn follows_a_change_of_speed() {
        let mut m = PassModel::default();
        for i in 0..100 {
            let n = [1, 300][i % 2];
            m.observe(n, 0.01 + 0.001 * n as f64);
        }
        // Attention over long contexts makes every token three times dearer.
        for i in 0..100 {
            let n = [1, 300][i % 2];
            m.observe(n, 0.01 + 0.003 * n as f64);
        }
        let per = m.fit().unwrap().1;
        assert!((per - 0.003).abs() < 1e-4, "{per}");
    }

    #[test]
    fn ignores_nonsense_and_never_goes_below_zero() {
        let mut m = PassModel::default();
        m.observe(0, 1.0);
        m.observe(10, f64::NAN);
        m.observe(10, -1.0);
        assert_eq!(m.fit(), None);
        // Bigger passes that happen to be faster: no negative slope.
        m.observe(1, 0.5);
        m.observe(100, 0.1);
        let (fixed, per) = m.fit().unwrap();
        assert!(fixed >= 0.0 && per > 0.0);
    }
}
