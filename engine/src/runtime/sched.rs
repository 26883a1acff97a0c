//! Which waiting request goes next, and whether a new one can be served in
//! time at all.
//!
//! - `fcfs`: arrival order.
//! - `lpm`: the longest cached prefix first (most reuse per step).
//! - `slo` (default): requests that can still meet their TTFT target first
//!   (those that cannot, even served alone from now, wait behind them and are
//!   served after: under overload, earliest deadline first would otherwise
//!   make every request late); among those, fair share across tenants — the
//!   tenant whose virtual token counter (tokens processed for it) is lowest
//!   goes next, so one tenant's burst cannot starve another — then, within
//!   the tenant, the earliest deadline (arrival + TTFT target), higher
//!   priority, longest cached prefix. Running prompts get their chunks in
//!   the same order.
//!
//! Pre-warm requests always go last. Before any of this, a tenant's short request may take a
//! pass alone (the express lane, `express.rs`).
//!
//! Admission control refuses (429 with Retry-After) only what waiting would fix: a request
//! predicted to miss its TTFT target by more than `overload_factor` because of the queue
//! ahead of it. A request that would miss it even served alone on this machine (its
//! uncached prompt is too long for the hardware) is admitted and served as well as
//! possible: behind the requests that can still make their targets, but never starved —
//! once it has waited as long as a refusal would have allowed (it is *overdue*), every pass
//! gives the overdue prompts together a bounded share (`min_prefill_chunk` prompt tokens, the
//! earliest deadline first) before the hopeful requests get theirs, and whatever they leave
//! after that. It counts as an SLO miss.

use super::admission::Work;
use super::config::Policy;
use super::seq::Seq;
use super::Scheduler;
use crate::radix::TenantKey;
use std::cmp::Reverse;
use std::time::{Duration, Instant};

/// Uncached prompt tokens a waiting request must share with a running prompt still being
/// computed to wait for it rather than compute them again.
const SHARED_PREFILL: usize = 256;

/// A running prompt: its sequence id.
pub(super) type Prompt = u64;

/// Which waiting requests an admission phase of a step takes (see [`Scheduler::pick`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tier {
    /// Under `slo`, requests that cannot meet their TTFT target and have waited their
    /// [`Scheduler::patience`]: admitted first, within the overdue prompts' bounded share.
    Overdue,
    /// Requests that can still meet their TTFT target (every request under `fcfs` and `lpm`).
    Hopeful,
    /// Any user's request, those that can still make it first.
    Any,
    /// Pre-warms, once no user's request waits.
    Background,
}

/// Running prompts in the order their next chunks are planned (see [`Scheduler::prefill_order`]).
pub(super) struct PrefillOrder {
    /// Hopeless and overdue: a bounded share for all of them, before everything else.
    pub overdue: Vec<Prompt>,
    /// Can still meet the TTFT target (all of them under `fcfs` and `lpm`).
    pub hopeful: Vec<Prompt>,
    /// Cannot (the overdue ones included): what the hopeful ones leave.
    pub hopeless: Vec<Prompt>,
    /// Pre-warms: what every user's prompt leaves.
    pub background: Vec<Prompt>,
}

/// Whether a request that has `work` prompt tokens left can no longer produce its first token
/// by its deadline, even if it were served alone from `now` at `rate` tokens per second. Never
/// for pre-warm requests or requests past their first token (a retracted request resumes).
fn hopeless(seq: &Seq, work: usize, now: Instant, rate: f64) -> bool {
    if seq.req.prewarm || seq.first_token.is_some() {
        return false;
    }
    now + Duration::from_secs_f64(work as f64 / rate) > seq.deadline
}

impl Scheduler {
    /// How long a request may wait before the queue, not its own size, is what makes it late:
    /// its TTFT target times `overload_factor` (at least the target).
    pub(super) fn patience(&self, seq: &Seq) -> Duration {
        self.cfg.targets(seq.req.slo).ttft.mul_f64(self.cfg.overload_factor.max(1.0))
    }

    /// The predicted time to first token past which the engine refuses a request of `class`: its
    /// target × `overload_factor`, with [`super::admission::LATE_SLACK`] (the door, which let the
    /// request through, refuses at the limit itself).
    pub(super) fn refusal_limit(&self, class: super::config::SloClass) -> Duration {
        self.cfg.targets(class).ttft.mul_f64(self.cfg.overload_factor * super::admission::LATE_SLACK)
    }

    /// Whether a request is hopeless (see [`hopeless`]) under the `slo` policy: only that policy
    /// tells requests apart by whether they can still make their targets.
    pub(super) fn late(&self, seq: &Seq, work: usize, now: Instant, rate: f64) -> bool {
        self.cfg.policy == Policy::Slo && hopeless(seq, work, now, rate)
    }

    /// Whether a hopeless request has waited its [`Scheduler::patience`]: from then on every pass
    /// gives it a bounded share, so it is never starved.
    pub(super) fn overdue(&self, seq: &Seq, now: Instant) -> bool {
        now.saturating_duration_since(seq.arrival) >= self.patience(seq)
    }

    /// Whether a request would be refused even served alone from `now` (no queue ahead): its
    /// wait so far plus its own uncached prompt at the current rate already pass the refusal
    /// limit (TTFT target × `overload_factor`). Refusing it would not help it, so it is admitted.
    pub(super) fn beyond_reach(&self, seq: &Seq, now: Instant) -> bool {
        let own = seq.tokens.len() - self.kv.cached_prefix(seq).min(seq.tokens.len() - 1);
        let alone = Duration::from_secs_f64(own as f64 / self.prefill_rate());
        let limit = self.cfg.targets(seq.req.slo).ttft.mul_f64(self.cfg.overload_factor);
        now.saturating_duration_since(seq.arrival) + alone > limit
    }

    /// Whether waiting request `i` shares at least [`SHARED_PREFILL`] uncached prompt tokens with
    /// a running prompt of the same cache scope that is still being computed: admitted now, it
    /// would compute them a second time; a step after that prompt completes, it finds them in
    /// the cache (running prompts are published as they complete). Agents send such pairs: a
    /// side request on the same long history as the main one, at the same moment.
    fn shares_running_prefill(&mut self, i: usize) -> bool {
        if self.running.iter().all(|s| s.computed >= s.prompt_len) {
            return false;
        }
        let cached = self.cached_prefix(i);
        let w = &self.waiting[i];
        self.running.iter().any(|s| {
            s.computed < s.prompt_len
                && s.req.tenant == w.req.tenant
                && s.req.salt == w.req.salt
                && s.tokens[..s.prompt_len].iter().zip(&w.tokens).take_while(|(a, b)| a == b).count()
                    >= cached + SHARED_PREFILL
        })
    }

    /// Index in `waiting` of the request to admit next in admission phase `tier`, if any.
    /// Under `slo`, what can still meet its TTFT target goes first: under overload, earliest
    /// deadline first would spend the engine on requests that are late anyway, and so make
    /// every later one late too. Those that cannot wait (they are still served) behind the
    /// ones that can, except for the bounded share of the overdue ones ([`Tier::Overdue`]).
    pub(super) fn pick(&mut self, now: Instant, tier: Tier) -> Option<usize> {
        let prewarm_only = self.waiting.iter().all(|s| s.req.prewarm);
        // Pre-warms are admitted last, with what users' requests leave (see `schedule`): not in
        // the phases for users' prompts, even once those phases have taken every user.
        if prewarm_only != (tier == Tier::Background) {
            return None;
        }
        let mut candidates: Vec<usize> =
            (0..self.waiting.len()).filter(|&i| self.waiting[i].req.prewarm == prewarm_only).collect();
        candidates.retain(|&i| !self.shares_running_prefill(i));
        let rate = self.prefill_rate();
        let late: Vec<bool> = candidates
            .iter()
            .map(|&i| {
                let work = self.uncached(i);
                self.late(&self.waiting[i], work, now, rate)
            })
            .collect();
        let hopeful: Vec<usize> = candidates.iter().zip(&late).filter(|(_, &l)| !l).map(|(&i, _)| i).collect();
        candidates = match tier {
            Tier::Overdue => candidates
                .iter()
                .zip(&late)
                .filter(|(&i, &l)| l && self.overdue(&self.waiting[i], now))
                .map(|(&i, _)| i)
                .collect(),
            Tier::Hopeful => hopeful,
            Tier::Any | Tier::Background if hopeful.is_empty() => candidates,
            Tier::Any | Tier::Background => hopeful,
        };
        if candidates.is_empty() {
            return None;
        }
        Some(match self.cfg.policy {
            Policy::Fcfs => {
                *candidates.iter().min_by_key(|&&i| (self.waiting[i].arrival, self.waiting[i].id)).expect("non-empty")
            }
            Policy::Lpm => {
                let cached: Vec<usize> = candidates.iter().map(|&i| self.cached_prefix(i)).collect();
                let best = (0..candidates.len())
                    .max_by_key(|&k| (cached[k], Reverse(self.waiting[candidates[k]].arrival)))
                    .expect("non-empty");
                candidates[best]
            }
            Policy::Slo => {
                let vt = |s: &Seq| self.vtc.get(&s.req.tenant).copied().unwrap_or(0.0);
                let tenant = candidates
                    .iter()
                    .map(|&i| &self.waiting[i])
                    .min_by(|a, b| vt(a).total_cmp(&vt(b)).then(a.arrival.cmp(&b.arrival)))
                    .map(|s| s.req.tenant.clone())
                    .expect("non-empty");
                let mine: Vec<usize> =
                    candidates.into_iter().filter(|&i| self.waiting[i].req.tenant == tenant).collect();
                let cached: Vec<usize> = mine.iter().map(|&i| self.cached_prefix(i)).collect();
                let best = (0..mine.len())
                    .min_by_key(|&k| {
                        let s = &self.waiting[mine[k]];
                        (s.deadline, Reverse(s.req.priority), Reverse(cached[k]), s.id)
                    })
                    .expect("non-empty");
                mine[best]
            }
        })
    }

    fn cached_prefix(&self, i: usize) -> usize {
        self.kv.cached_prefix(&self.waiting[i])
    }

    /// Tokens waiting request `i` still has to compute before its first token.
    pub(super) fn uncached(&mut self, i: usize) -> usize {
        if self.waiting[i].receiving {
            return 1;
        }
        let len = self.waiting[i].tokens.len();
        len - self.cached_prefix(i).min(len - 1)
    }

    /// Prompt tokens per second the engine computes now: what a pass carries beyond the decode
    /// tokens, over what such a pass takes (pacing makes passes smaller while requests decode).
    pub(super) fn prefill_rate(&self) -> f64 {
        self.prefill_rate_for(self.decoders())
    }

    /// [`Scheduler::prefill_rate`] with these decoders.
    pub(super) fn prefill_rate_for(&self, decoders: super::pace::Decoders) -> f64 {
        let decoding = decoders.count;
        let budget = self.budget_for(decoders);
        match self.pace.seconds(budget) {
            Some(secs) if secs > 0.0 => budget.saturating_sub(decoding).max(budget / 10).max(1) as f64 / secs,
            _ => self.pace.throughput * (1.0 - decoding as f64 / budget as f64).max(0.1),
        }
        .max(1.0)
    }

    /// Running prompts in the order their next chunks are planned: oldest first, all hopeful,
    /// except under `slo`, where those that can no longer make their TTFT target come after
    /// the others (the overdue ones among them also get a bounded share first) and each list
    /// goes by deadline.
    pub(super) fn prefill_order(&self, now: Instant) -> PrefillOrder {
        let (background, mut prefilling): (Vec<&Seq>, Vec<&Seq>) =
            self.running.iter().filter(|s| s.remaining() > 1).partition(|s| s.req.prewarm);
        let rate = self.prefill_rate();
        if self.cfg.policy == Policy::Slo {
            prefilling.sort_by_key(|s| (s.deadline, s.id));
        }
        let (hopeless, hopeful): (Vec<&Seq>, Vec<&Seq>) =
            prefilling.into_iter().partition(|s| self.late(s, s.remaining(), now, rate));
        let ids = |v: &[&Seq]| v.iter().map(|s| s.id).collect::<Vec<_>>();
        let overdue: Vec<&Seq> = hopeless.iter().copied().filter(|s| self.overdue(s, now)).collect();
        let (overdue, hopeful, hopeless, background) = (ids(&overdue), ids(&hopeful), ids(&hopeless), ids(&background));
        PrefillOrder { overdue, hopeful, hopeless, background }
    }

    /// Publishes what admission at the door needs (see `admission`): the prompt throughput now
    /// and with more requests decoding, the uncached work of queued requests per tenant and
    /// class (those that can still make their targets apart from those that cannot), and what
    /// is left of the prompts being computed.
    pub(super) fn publish_admission(&mut self) {
        let now = self.clock.now();
        let decoders = self.decoders();
        // Requests let in start decoding once their prompts are done: a later request's prompt
        // shares its passes with them. They are counted with the tightest inter-token target.
        let itl = self.cfg.interactive.itl.min(self.cfg.batch.itl);
        let rates: Vec<f64> =
            (0..=self.cfg.max_running).map(|more| self.prefill_rate_for(decoders.and(more, itl))).collect();
        let rate = rates[0];
        let mut p = super::admission::Published { rates, taken: self.intake.taken, ..Default::default() };
        for i in 0..self.waiting.len() {
            if self.waiting[i].req.prewarm {
                continue;
            }
            let w = self.uncached(i);
            let s = &self.waiting[i];
            let side = if self.late(s, w, now, rate) { &mut p.hopeless } else { &mut p.hopeful };
            *side.entry((s.req.tenant.clone(), s.req.slo)).or_default() += Work::one(w);
        }
        // Pre-warms are invisible here: a user's request puts them back in the queue.
        for s in self.running.iter().filter(|s| s.remaining() > 1 && !s.req.prewarm) {
            p.running_all += Work::one(s.remaining());
            if !self.late(s, s.remaining(), now, rate) {
                p.running_hopeful += Work::one(s.remaining());
            }
        }
        p.busy = self.running.iter().chain(&self.waiting).any(|s| !s.req.prewarm);
        self.intake.door.publish(p);
    }

    /// A tenant coming back from idle starts level with the least served
    /// active tenant instead of spending credit saved while away.
    pub(super) fn lift_vtc(&mut self, tenant: &TenantKey) {
        let active = |s: &Seq| &s.req.tenant == tenant;
        if self.running.iter().chain(&self.waiting).any(active) {
            return;
        }
        let floor = self
            .running
            .iter()
            .chain(&self.waiting)
            .filter_map(|s| self.vtc.get(&s.req.tenant))
            .fold(f64::INFINITY, |m, &v| m.min(v));
        if floor.is_finite() {
            let v = self.vtc.entry(tenant.clone()).or_default();
            *v = v.max(floor);
        }
    }

    /// Predicted time to first token of a new request: the uncached prompt
    /// tokens that will run before its last one, at the measured throughput
    /// with the running decodes' share of each step taken out. What runs
    /// first depends on the policy: under `fcfs` and `lpm` everything queued
    /// (for `lpm`, conservatively); under `slo`, its own tenant's requests
    /// with earlier deadlines, and from every other tenant about as much work
    /// as its own tenant gets (fair share), plus unfinished prefills — but
    /// requests that can no longer make their target do not count ahead of
    /// one that can, and one that cannot waits for all that can.
    pub(super) fn predict_ttft(&mut self, seq: &Seq, now: Instant) -> Duration {
        let own = seq.tokens.len() - self.kv.cached_prefix(seq).min(seq.tokens.len() - 1);
        let rate = self.prefill_rate();
        // Under `slo`, a request that can still make its target goes before every one that
        // cannot; one that cannot waits for all that can.
        let slo = self.cfg.policy == Policy::Slo;
        let me_hopeless = slo && hopeless(seq, own, now, rate);
        let mut mine = 0;
        let mut before_me = 0;
        let mut others: std::collections::HashMap<TenantKey, usize> = std::collections::HashMap::new();
        for i in 0..self.waiting.len() {
            let (prewarm, deadline, len, tenant, id) = {
                let w = &self.waiting[i];
                (w.req.prewarm, w.deadline, w.tokens.len(), w.req.tenant.clone(), w.id)
            };
            if prewarm || id == seq.id {
                continue;
            }
            let work = len - self.cached_prefix(i).min(len - 1);
            let its_hopeless = slo && hopeless(&self.waiting[i], work, now, rate);
            if its_hopeless && !me_hopeless {
                continue;
            }
            if me_hopeless && !its_hopeless {
                before_me += work;
            } else if tenant == seq.req.tenant {
                if deadline <= seq.deadline {
                    mine += work;
                }
            } else {
                *others.entry(tenant).or_default() += work;
            }
        }
        let ahead = before_me
            + match self.cfg.policy {
                Policy::Slo => mine + others.values().map(|&w| w.min(mine + own)).sum::<usize>(),
                Policy::Fcfs | Policy::Lpm => mine + others.values().sum::<usize>(),
            };
        let running: usize = self
            .running
            .iter()
            .filter(|s| !s.req.prewarm)
            .filter(|s| s.remaining() > 1 && (me_hopeless || !(slo && hopeless(s, s.remaining(), now, rate))))
            .map(|s| s.remaining())
            .sum();
        Duration::from_secs_f64((ahead + running + own) as f64 / rate)
    }
}

impl Scheduler {
    /// Refuses queued requests that can no longer start in time: re-checked
    /// every step with the current throughput, so a slow-down turns into
    /// early refusals instead of late answers. Requests that already started
    /// (or were retracted after starting) are never refused.
    /// While nothing but pre-warms runs, nothing is refused: the next step admits what it can (a
    /// pre-warm is put back in the queue for it), and waiting
    /// would not make any of it faster.
    pub(super) fn refuse_late(&mut self, now: std::time::Instant) {
        if self.cfg.overload_factor <= 0.0 || self.running.iter().all(|s| s.req.prewarm) {
            return;
        }
        let mut i = 0;
        while i < self.waiting.len() {
            let seq = &self.waiting[i];
            if seq.req.prewarm || seq.admitted.is_some() {
                i += 1;
                continue;
            }
            let limit = self.refusal_limit(seq.req.slo);
            let waited = now.saturating_duration_since(seq.arrival);
            let seq = self.waiting.swap_remove(i);
            let predicted = waited + self.predict_ttft(&seq, now);
            if predicted > limit && !self.beyond_reach(&seq, now) {
                self.refuse(seq, predicted);
            } else {
                self.waiting.push(seq);
                let last = self.waiting.len() - 1;
                self.waiting.swap(i, last);
                i += 1;
            }
        }
    }

    /// Answers `Overloaded` with when to come back.
    pub(super) fn refuse(&mut self, seq: Seq, predicted: Duration) {
        let error = super::request::overloaded(predicted, self.cfg.targets(seq.req.slo).ttft);
        self.stats.refused += 1;
        metrics::counter!(
            "cachet:requests_refused_total",
            super::tenant_labels(self.cfg.tenant_labels, &seq.req.tenant)
        )
        .increment(1);
        seq.req.span.in_scope(|| tracing::debug!(predicted_ms = predicted.as_millis() as u64, "refused: overloaded"));
        self.report(&seq, super::request::Outcome::Failed, crate::generate::FinishReason::Stop);
        seq.send(super::request::Event::Error(error));
    }
}
