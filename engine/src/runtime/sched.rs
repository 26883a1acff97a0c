//! Which waiting request goes next, and whether a new one can be served in
//! time at all.
//!
//! - `fcfs`: arrival order.
//! - `lpm`: the longest cached prefix first (most reuse per step).
//! - `slo` (default): fair share across tenants first — the tenant whose
//!   virtual token counter (tokens processed for it) is lowest goes next, so
//!   one tenant's burst cannot starve another — then, within the tenant, the
//!   earliest deadline (arrival + TTFT target), higher priority, longest
//!   cached prefix.
//!
//! Pre-warm requests always go last.

use super::config::Policy;
use super::seq::Seq;
use super::Engine;
use crate::radix::TenantKey;
use cachet_kernels::backend::Backend;
use std::cmp::Reverse;
use std::time::Duration;

impl<B: Backend> Engine<B> {
    /// Index in `waiting` of the request to admit next.
    pub(super) fn pick(&mut self) -> usize {
        let prewarm_only = self.waiting.iter().all(|s| s.req.prewarm);
        let candidates: Vec<usize> =
            (0..self.waiting.len()).filter(|&i| self.waiting[i].req.prewarm == prewarm_only).collect();
        match self.cfg.policy {
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
        }
    }

    fn cached_prefix(&mut self, i: usize) -> usize {
        let seq = &self.waiting[i];
        let key = seq.key(&mut self.cache, seq.tokens.len());
        self.cache.peek_prefix(&key)
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
    /// as its own tenant gets (fair share), plus unfinished prefills.
    pub(super) fn predict_ttft(&mut self, seq: &Seq) -> Duration {
        let key = seq.key(&mut self.cache, seq.tokens.len());
        let own = seq.tokens.len() - self.cache.peek_prefix(&key).min(seq.tokens.len() - 1);
        let mut mine = 0;
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
            if tenant == seq.req.tenant {
                if deadline <= seq.deadline {
                    mine += work;
                }
            } else {
                *others.entry(tenant).or_default() += work;
            }
        }
        let ahead = match self.cfg.policy {
            Policy::Slo => mine + others.values().map(|&w| w.min(mine + own)).sum::<usize>(),
            Policy::Fcfs | Policy::Lpm => mine + others.values().sum::<usize>(),
        };
        let running: usize = self.running.iter().filter(|s| s.remaining() > 1).map(|s| s.remaining()).sum();
        let decoding = self.running.iter().filter(|s| s.remaining() == 1).count();
        // Prompt tokens per second: what a pass carries beyond the decode tokens, over what
        // such a pass takes (pacing makes passes smaller while requests decode).
        let budget = self.step_budget();
        let rate = match self.pace.seconds(budget) {
            Some(secs) if secs > 0.0 => budget.saturating_sub(decoding).max(budget / 10).max(1) as f64 / secs,
            _ => self.rate * (1.0 - decoding as f64 / budget as f64).max(0.1),
        }
        .max(1.0);
        Duration::from_secs_f64((ahead + running + own) as f64 / rate)
    }
}

impl<B: Backend> Engine<B> {
    /// Refuses queued requests that can no longer start in time: re-checked
    /// every step with the current throughput, so a slow-down turns into
    /// early refusals instead of late answers. Requests that already started
    /// (or were retracted after starting) are never refused.
    /// While nothing runs, nothing is refused: the next step admits what it can, and waiting
    /// would not make any of it faster.
    pub(super) fn refuse_late(&mut self, now: std::time::Instant) {
        if self.cfg.overload_factor <= 0.0 || self.running.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.waiting.len() {
            let seq = &self.waiting[i];
            if seq.req.prewarm || seq.admitted.is_some() {
                i += 1;
                continue;
            }
            let limit = self.cfg.targets(seq.req.slo).ttft.mul_f64(self.cfg.overload_factor);
            let waited = now.saturating_duration_since(seq.arrival);
            let seq = self.waiting.swap_remove(i);
            let predicted = waited + self.predict_ttft(&seq);
            if predicted > limit {
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
        let target = self.cfg.targets(seq.req.slo).ttft;
        let retry_after = predicted.saturating_sub(target).max(Duration::from_secs(1));
        self.stats.refused += 1;
        metrics::counter!("cachet:requests_refused_total", "tenant" => seq.req.tenant.to_string()).increment(1);
        self.report(&seq, super::request::Outcome::Failed, crate::generate::FinishReason::Stop);
        seq.send(super::request::Event::Error(super::request::RequestError::Overloaded { retry_after }));
    }
}
