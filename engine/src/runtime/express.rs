//! The express lane: a tenant's short request runs its passes alone while other tenants' longer
//! requests can wait for it within their targets.
//!
//! Where a pass costs about its tokens (a CPU: on two cores a step of two decoding sequences
//! took 1.7–2× a step of one), every request that decodes beside another slows it down in
//! proportion. A tenant's eight-token question asked while another tenant decodes a long answer
//! then takes twice its time alone or more, although the long answer, which has an inter-token
//! target of 250 ms and gets a token every 25–50 ms, could pause for a few passes without anyone
//! noticing. So under the `slo` policy, when the running request with the fewest output tokens
//! left has at most `express_tokens` of them and every other running request is another
//! tenant's with more left, a step runs that request alone — as long as everyone else can wait
//! through this pass and the next: every decoder's next token still within `pace_margin` × its
//! inter-token target, every running or waiting prompt still able to make its TTFT target (and
//! none overdue). When one of them cannot wait, the step is planned as usual, all of them
//! together, and the lane opens again at the next step. Within one tenant requests keep sharing
//! passes (a tenant's own work is its own affair), and the lane stays closed where a token adds
//! little to a pass (a GPU, whose pass costs about the same for one sequence or dozens).
//!
//! The outputs do not change: kernels are batch-invariant, so which requests share a pass never
//! changes what any of them computes.

use super::plan::Planned;
use super::seq::Seq;
use super::{Policy, Scheduler};
use std::time::{Duration, Instant};

/// The lane opens only where one more token adds at least this share of a one-token pass to a
/// pass (the pass-time fit's per-token cost over fixed + per-token): a CPU's is 0.2 and more, a
/// GPU's about a thousandth.
const MIN_TOKEN_SHARE: f64 = 0.1;

/// Output tokens `seq` may still produce (its `max_tokens` less what it has produced).
fn left(seq: &Seq) -> usize {
    seq.req.params.max_tokens.saturating_sub(seq.generated())
}

impl Scheduler {
    /// The express lane's pass (see the module): the short request's next decode token or
    /// prompt chunk, alone; `None` when the lane is closed and the step is planned as usual.
    pub(super) fn express(&mut self, now: Instant) -> Option<Vec<Planned>> {
        let limit = self.cfg.express_tokens;
        if limit == 0 || self.cfg.policy != Policy::Slo || self.running.len() < 2 {
            return None;
        }
        let (fixed, per) = self.pace.fit()?;
        if !(per > 0.0 && per >= MIN_TOKEN_SHARE * (fixed + per)) {
            return None;
        }
        let budget = self.cfg.token_budget;
        let short =
            |s: &Seq| !s.req.prewarm && !s.receiving && (1..=budget).contains(&s.remaining()) && left(s) <= limit;
        let i = (0..self.running.len())
            .filter(|&i| short(&self.running[i]))
            .min_by_key(|&i| (left(&self.running[i]) + self.running[i].remaining(), self.running[i].arrival))?;
        let me = &self.running[i];
        let others = || self.running.iter().enumerate().filter(move |&(j, s)| j != i && !s.req.prewarm).map(|(_, s)| s);
        if others().next().is_none() || others().any(|s| s.req.tenant == me.req.tenant || left(s) <= left(me)) {
            return None;
        }
        // This pass, then the next one with everybody in it (slow passes included).
        let chunk = me.remaining();
        let slow = self.pace.slow_factor();
        let wait = slow * (self.pace.seconds(chunk)? + self.pace.seconds(self.running.len())?);
        let wait = Duration::from_secs_f64(wait);
        let rate = self.prefill_rate();
        // A prompt with `work` tokens to go can wait if it is not overdue and either cannot make
        // its target anyway or still can after the wait.
        let prompt_can_wait = |s: &Seq, work: usize| {
            !self.overdue(s, now) && (self.late(s, work, now, rate) || !self.late(s, work, now + wait, rate))
        };
        let running_can_wait = |s: &Seq| match s.first_token {
            Some(_) => {
                let since = now.saturating_duration_since(s.last_token.unwrap_or(now));
                since + wait <= self.cfg.targets(s.req.slo).itl.mul_f64(self.cfg.pace_margin)
            }
            None => prompt_can_wait(s, s.remaining()),
        };
        let waiting_can_wait = |s: &Seq| {
            s.req.prewarm || prompt_can_wait(s, s.tokens.len() - self.kv.cached_prefix(s).min(s.tokens.len() - 1))
        };
        if !others().all(running_can_wait) || !self.waiting.iter().all(waiting_can_wait) {
            return None;
        }
        let seq = &mut self.running[i];
        if !self.kv.reserve(seq, chunk, now) {
            return None;
        }
        metrics::counter!("cachet:express_passes_total").increment(1);
        Some(vec![Planned { seq: seq.id, len: chunk, logits: true, draft: 0 }])
    }
}
