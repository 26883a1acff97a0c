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
//!
//! The fit is a mean; the gaps a decoder sees are as long as the slow passes.
//! So the model also tracks how far actual passes run over their prediction
//! (an online 95th percentile of actual ÷ predicted) and sizes passes so that
//! the slow ones, not the average ones, fit the target.

use super::Scheduler;
use std::time::{Duration, Instant};

/// Weight of the past per observed pass: about the last 1 / (1 − λ) = 20
/// passes count.
const FORGET: f64 = 0.95;

/// The quantile of actual ÷ predicted pass time that pacing aims with.
const TAIL: f64 = 0.95;

/// Step of the quantile estimate per pass: after a pass over it, it rises by
/// `STEP × TAIL`; after one under it, it falls by `STEP × (1 − TAIL)`.
const STEP: f64 = 0.05;

/// Passes the fit must have seen before its errors are tracked (the errors
/// of a line through two or three points say nothing about the noise).
const WARM_UP: u32 = 8;

/// Online fit of pass time against pass size.
#[derive(Clone, Debug, Default)]
pub(crate) struct PassModel {
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
    /// Passes observed.
    seen: u32,
    /// Running estimate of the [`TAIL`] quantile of actual ÷ predicted pass
    /// time of the passes decoders waited for, never below 1 (the fit's line
    /// is the least pacing aims below); 0 before any was checked.
    slow: f64,
    /// Tokens per second of a forward pass (a moving average over passes of 16 tokens and
    /// more), for admission's predictions.
    pub throughput: f64,
    /// Passes of up to [`SMALL`] tokens timed by size: (moving average of seconds, passes
    /// seen). The line above is a fit over all sizes; at a few tokens a CPU's matrix kernels
    /// are far from their large-batch efficiency, which is what the choice of a draft's length
    /// has to know (see [`PassModel::cost`]).
    small: Vec<(f64, u32)>,
}

/// Passes up to this size are also timed by size.
const SMALL: usize = 80;

/// Passes of a size seen before its own average counts instead of the fit.
const SMALL_SEEN: u32 = 3;

impl PassModel {
    /// Checks a pass that decoders waited for (its length is their inter-token gap) against the
    /// fit's prediction, before [`PassModel::observe`] adds it to the fit: the running 95th
    /// percentile of actual ÷ predicted moves towards it. Only such passes are checked: they
    /// are the ones pacing sizes, and the fit's relative error elsewhere (a big prefill pass)
    /// says nothing about them.
    pub fn check(&mut self, tokens: usize, secs: f64) {
        if self.seen < WARM_UP || !secs.is_finite() || secs < 0.0 {
            return;
        }
        let Some(predicted) = self.seconds(tokens).filter(|&p| p > 0.0) else { return };
        // Stochastic gradient step on the pinball loss: settles where a pass runs over the
        // estimate one time in twenty (a pass within a thousandth of it is not over: rounding
        // is not noise).
        let q = self.slow_factor();
        let over = secs / predicted > q * 1.001;
        self.slow = (q + STEP * if over { TAIL } else { TAIL - 1.0 }).clamp(1.0, 4.0);
    }

    /// Moves the throughput estimate towards a pass's `rate` (tokens per second).
    pub fn note_throughput(&mut self, rate: f64) {
        self.throughput = if self.throughput > 0.0 { 0.8 * self.throughput + 0.2 * rate } else { rate };
    }

    /// Records a pass of `tokens` tokens that took `secs`.
    pub fn observe(&mut self, tokens: usize, secs: f64) {
        if tokens == 0 || !secs.is_finite() || secs < 0.0 {
            return;
        }
        self.seen = self.seen.saturating_add(1);
        if tokens <= SMALL {
            if self.small.is_empty() {
                self.small = vec![(0.0, 0); SMALL + 1];
            }
            let (mean, seen) = &mut self.small[tokens];
            *mean = if *seen == 0 { secs } else { 0.8 * *mean + 0.2 * secs };
            *seen = seen.saturating_add(1);
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

    /// Seconds a pass of `tokens` takes: the recent average of passes of that size where
    /// enough were seen (small passes), else the fit's prediction (which, at a few tokens on a
    /// CPU, is optimistic: a draft length the average does not know yet gets tried).
    pub fn cost(&self, tokens: usize) -> Option<f64> {
        match self.small.get(tokens) {
            Some(&(mean, seen)) if seen >= SMALL_SEEN => Some(mean),
            _ => self.seconds(tokens),
        }
    }

    /// How much longer than predicted the slow passes run (the 95th
    /// percentile of actual ÷ predicted, at least 1).
    pub fn slow_factor(&self) -> f64 {
        self.slow.max(1.0)
    }

    /// The most tokens one pass can carry so that even a slow pass (see
    /// [`PassModel::slow_factor`]) stays within `target`; None before any
    /// pass. Zero when even a one-token pass takes longer.
    pub fn tokens_within(&self, target: Duration) -> Option<usize> {
        let (fixed, per) = self.fit()?;
        let room = target.as_secs_f64() / self.slow_factor() - fixed;
        if room <= 0.0 {
            return Some(0);
        }
        // The epsilon keeps an exact fit (250 ms at 5 ms a token) from rounding down.
        Some(((room / per + 1e-9).floor() as usize).max(1))
    }
}

/// The share of a pass its fixed cost may be once the pass is big enough that starting one more
/// prompt in it would delay the others more than it saves (see
/// [`Scheduler::efficient_prompt_tokens`]).
const EFFICIENT_FIXED_SHARE: f64 = 0.1;

/// The share of the interactive TTFT target a pass of background work alone may take.
const BACKGROUND_PASS_SHARE: f64 = 0.1;

impl Scheduler {
    /// Tokens the next pass may carry. Without decoding requests (or with
    /// pacing off) that is the configured token budget; while requests decode
    /// it is what fits, slow passes included, in `pace_margin` times the
    /// tightest inter-token target among them (so the gaps stay below the
    /// target, not at it), never more than the token budget. When the decoders
    /// alone fill that, a pass carries prompt tokens (`min_prefill_chunk`) only
    /// if some prompt cannot wait for the decoders to finish (see
    /// [`Scheduler::prompt_cannot_wait`]); otherwise it decodes alone and the
    /// prompts wait, within their TTFT targets, for passes that have room.
    pub(super) fn step_budget(&mut self, now: Instant) -> usize {
        let decoders = self.decoders();
        let fits = self.paced_fit(decoders);
        let floor = match fits {
            Some(fits) if fits <= decoders.count && !self.prompt_cannot_wait(decoders, now) => 0,
            _ => self.cfg.min_prefill_chunk,
        };
        let budget = self.budget_with(decoders.count, fits, floor);
        // Only background work (pre-warms), or prompts that miss their targets anyway: a pass
        // cannot be interrupted, so it is kept short enough that a user's request arriving during
        // it waits a small share of its TTFT target. (An agent's follow-up on a cached prefix
        // waited out a 2.1 s pass of a long prompt that was late already, then shared the next
        // one with it: 4.5 s for 70 tokens.)
        let all_prewarm = self.running.iter().chain(&self.waiting).all(|s| s.req.prewarm);
        if decoders.count == 0 && (all_prewarm || self.all_late(now)) {
            let short = self.pace.tokens_within(self.cfg.interactive.ttft.mul_f64(BACKGROUND_PASS_SHARE));
            if let Some(short) = short {
                // Users' prompts, late as they are, keep passes efficient.
                let floor = if all_prewarm { self.cfg.min_prefill_chunk } else { self.efficient_prompt_tokens() };
                return budget.min(short.max(floor));
            }
        }
        budget
    }

    /// Prompt tokens of background work that may join `plan` when a user's prompt gets its
    /// first token from it: as many as add at most [`BACKGROUND_PASS_SHARE`] to the pass's time
    /// (on a CPU, where a pass costs about its tokens, a few; on a GPU, where a pass's fixed
    /// cost is that of thousands of tokens, many); none while the pass time is not known.
    pub(super) fn background_room(&self, plan: &[super::plan::Planned]) -> usize {
        let tokens: usize = plan.iter().map(|p| p.len).sum();
        match (self.pace.seconds(tokens), self.pace.fit()) {
            (Some(pass), Some((_, per))) if per > 0.0 && pass > 0.0 => (BACKGROUND_PASS_SHARE * pass / per) as usize,
            _ => 0,
        }
    }

    /// The prompt tokens past which a pass starts no further prompt: where the pass's fixed cost
    /// (reading every weight) is a tenth of it, so a bigger pass saves little time per token.
    /// Packing more prompts into a pass delays the first of them by the others' compute and
    /// gains the later ones almost nothing: four 96-token questions that arrive together on a
    /// CPU get their first tokens after one, two, three and four prompts' time instead of all
    /// after four. On a GPU, where the fixed cost is a pass of thousands of tokens, prompts are
    /// packed as before. The token budget without a fit.
    pub(super) fn efficient_prompt_tokens(&self) -> usize {
        let max = self.cfg.token_budget;
        match self.pace.fit() {
            Some((fixed, per)) if fixed > 0.0 && per > 0.0 => {
                let n = (EFFICIENT_FIXED_SHARE.recip() - 1.0) * fixed / per;
                if n.is_finite() {
                    (n.ceil() as usize).clamp(self.cfg.min_prefill_chunk.min(max), max)
                } else {
                    max
                }
            }
            _ => max,
        }
    }

    /// Whether every request is a pre-warm or a prompt that cannot make its TTFT target even
    /// served alone from now (under `slo`).
    fn all_late(&mut self, now: Instant) -> bool {
        let rate = self.prefill_rate();
        let running =
            self.running.iter().all(|s| s.req.prewarm || (s.remaining() > 1 && self.late(s, s.remaining(), now, rate)));
        running
            && (0..self.waiting.len()).all(|i| {
                let work = self.uncached(i);
                let s = &self.waiting[i];
                s.req.prewarm || self.late(s, work, now, rate)
            })
    }

    /// The requests decoding now.
    pub(super) fn decoders(&self) -> Decoders {
        let decoding = self.running.iter().filter(|s| s.first_token.is_some() && s.remaining() == 1);
        decoding.fold(Decoders::default(), |d, s| d.and(1, self.cfg.targets(s.req.slo).itl))
    }

    /// [`Scheduler::step_budget`] with these decoders when prompts cannot wait: what admission
    /// control counts on (a prompt admitted now gets at least `min_prefill_chunk` a pass once it
    /// is short of time).
    pub(super) fn budget_for(&self, decoders: Decoders) -> usize {
        self.budget_with(decoders.count, self.paced_fit(decoders), self.cfg.min_prefill_chunk)
    }

    /// Tokens that fit in a pass beside these decoders (None: no pacing).
    fn paced_fit(&self, decoders: Decoders) -> Option<usize> {
        let itl = decoders.itl.filter(|_| self.cfg.pace_prefill)?;
        self.pace.tokens_within(itl.mul_f64(self.cfg.pace_margin))
    }

    /// The budget beside `count` decoders when `fits` tokens fit in a paced pass (None: no
    /// pacing), `floor` prompt tokens beside them when nothing more fits.
    fn budget_with(&self, count: usize, fits: Option<usize>, floor: usize) -> usize {
        let max = self.cfg.token_budget;
        let Some(fits) = fits else { return max };
        if fits > count { fits } else { count + floor }.min(max)
    }

    /// Whether a prompt would miss its TTFT target if it waited for every request decoding now
    /// to finish (their remaining tokens at the pace of decode-only passes, slow passes
    /// included) and were computed after that at the prompt rate without decoders. Prompts that
    /// cannot make their targets anyway count only once overdue (they are never starved).
    ///
    /// A lax target does not let a short prompt wait long either: it cannot wait past
    /// `prompt_slowdown` × what it takes alone (its uncached work at the prompt rate). With an
    /// operator's 20 s target sized for long prompts, a 96-token question beside four requests
    /// each decoding 255 more tokens otherwise waited 12 s for a first token it could have had in
    /// one second (the long-output scenario, docs/benchmarks.md), and an agent's follow-up on a
    /// cached prefix 10–20 s.
    fn prompt_cannot_wait(&mut self, decoders: Decoders, now: Instant) -> bool {
        let Some(pass) = self.pace.seconds(decoders.count) else { return true };
        let left = |s: &super::seq::Seq| s.req.params.max_tokens.saturating_sub(s.generated());
        let longest = self.running.iter().filter(|s| s.first_token.is_some()).map(left).max().unwrap_or(0);
        let wait = Duration::from_secs_f64(longest as f64 * pass * self.pace.slow_factor());
        let rate = self.prefill_rate_for(Decoders::default());
        let waiting: Vec<usize> = (0..self.waiting.len()).map(|i| self.uncached(i)).collect();
        let slowdown = self.cfg.prompt_slowdown;
        let alone = |work: usize| {
            Duration::from_secs_f64(
                self.pace.seconds(work).filter(|t| t.is_finite() && *t > 0.0).unwrap_or(work as f64 / rate),
            )
        };
        let late = |s: &super::seq::Seq, work: usize, after: Duration| now + after + alone(work) > s.deadline;
        // Waiting for the decoders would keep it past `prompt_slowdown` × its time alone.
        let kept = |s: &super::seq::Seq, work: usize, after: Duration| {
            slowdown > 0.0 && now + after + alone(work) > s.arrival + alone(work).mul_f64(slowdown)
        };
        let urgent = |s: &super::seq::Seq, work: usize| {
            if s.req.prewarm || s.first_token.is_some() {
                return false;
            }
            // Hopeless even served now: only once it has waited its patience.
            if late(s, work, Duration::ZERO) {
                return now.saturating_duration_since(s.arrival) >= self.patience(s);
            }
            late(s, work, wait) || kept(s, work, wait)
        };
        if self.running.iter().any(|s| s.remaining() > 1 && urgent(s, s.remaining())) {
            return true;
        }
        self.waiting.iter().zip(waiting).any(|(s, work)| urgent(s, work))
    }
}

/// Requests decoding: how many, and the tightest inter-token target among them (none without).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Decoders {
    pub count: usize,
    pub itl: Option<Duration>,
}

impl Decoders {
    /// These and `count` more with an inter-token target of `itl`.
    pub fn and(self, count: usize, itl: Duration) -> Decoders {
        if count == 0 {
            return self;
        }
        Decoders { count: self.count + count, itl: Some(self.itl.map_or(itl, |m| m.min(itl))) }
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
    fn aims_so_that_slow_passes_fit_too() {
        let mut m = PassModel::default();
        // Paced passes of about the target's size, and now and then a big prefill pass; one
        // paced pass in ten takes 30% longer than the others of its size.
        for i in 0..2000 {
            let seconds = |n: usize| 0.012 + 0.0025 * n as f64;
            if i % 25 == 0 {
                m.observe(512, seconds(512));
                continue;
            }
            let n = m.tokens_within(Duration::from_millis(250)).unwrap_or(50).min(512);
            let secs = if i % 10 == 3 { 1.3 } else { 1.0 } * seconds(n);
            m.check(n, secs);
            m.observe(n, secs);
        }
        let q = m.slow_factor();
        assert!(q > 1.1 && q < 1.35, "{q}");
        let fits = m.tokens_within(Duration::from_millis(250)).unwrap();
        // A slow pass of that size ends near the target (1.3 × (12 + 2.5 × 72) ms = 250 ms);
        // the mean line alone would allow about 92 tokens, whose slow passes take 315 ms.
        assert!((62..=80).contains(&fits), "{fits}");
    }

    #[test]
    fn an_exact_fit_aims_at_its_line() {
        let mut m = PassModel::default();
        for i in 0..200 {
            let n = [1, 300][i % 2];
            m.observe(n, 0.01 + 0.001 * n as f64);
        }
        assert_eq!(m.slow_factor(), 1.0);
        assert_eq!(m.tokens_within(Duration::from_millis(250)), Some(240));
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

    /// A size seen three times costs its own recent average, not the line through all sizes.
    #[test]
    fn small_passes_cost_what_they_were_measured_at() {
        let mut m = PassModel::default();
        for _ in 0..3 {
            m.observe(1, 0.020);
            m.observe(512, 1.000);
        }
        let line = m.seconds(9).unwrap();
        assert_eq!(m.cost(9), Some(line), "not seen: the fit");
        for _ in 0..3 {
            m.observe(9, 0.100);
        }
        assert!((m.cost(9).unwrap() - 0.100).abs() < 1e-9);
        assert!(m.cost(9).unwrap() > m.seconds(9).unwrap());
    }
}
