//! The scheduler's half of a step: plan a batch within the token budget (decode tokens first,
//! then prefill chunks of running sequences, then newly admitted ones), find memory for it
//! (evict unlocked cache, else retract the running request with the least progress); once the
//! runner has run it, hand out the tokens and do the accounting.

use super::plan::Planned;
use super::request::{Completion, Event, RequestError};
use super::runner::Ran;
use super::sched::{Prompt, Tier};
use super::seq::{Phase, Seq};
use super::Scheduler;
use crate::generate::FinishReason;
use crate::radix::TenantKey;
use std::time::Instant;

impl Scheduler {
    /// Plans the step that starts `now`; `None` when nothing can run (a running prompt stuck on
    /// memory may have been retracted).
    pub(super) fn schedule(&mut self, now: Instant) -> Option<Vec<Planned>> {
        self.drop_cancelled();
        self.preempt_prewarms();
        self.refuse_late(now);
        self.receive_remote();
        if let Some(plan) = self.express(now) {
            return Some(plan);
        }
        let mut plan = Vec::new();
        let mut budget = self.step_budget(now);

        // 1. Decode: every running sequence that is ready for its next token.
        self.make_room_for_decode(now);
        for seq in &mut self.running {
            if seq.remaining() == 1 && budget > 0 {
                if !self.kv.reserve_free(seq, 1) {
                    continue;
                }
                plan.push(Planned { seq: seq.id, len: 1, logits: true, draft: 0 });
                budget -= 1;
            }
        }
        // Drafted tokens after the decoders' last ones, where they pay (speculative decoding).
        self.plan_drafts(&mut plan, &mut budget);
        // 2. Prefill chunks of sequences already running, then 3. admit waiting requests in
        // policy order while budget and memory last. Under `slo`, prompts that can no longer
        // meet their TTFT target (hopeless) yield to everything that still can: overdue ones (see
        // `sched`) get a bounded share first, then hopeful running prompts, then hopeful
        // admissions, then the hopeless running prompts, then the rest.
        let order = self.prefill_order(now);
        // A pass that already carries an efficient pass's prompt tokens takes no other prompt.
        let full = Fill { decodes: plan.len(), prompt_tokens: self.efficient_prompt_tokens() };
        // The overdue prompts' share, all of them together (the earliest deadline first): a share
        // each would let a burst of them take every pass again.
        // When pacing leaves a pass little room (a decoder beside a long context), they get at
        // most half of it: taking all of it, they kept an agent's 93-token follow-up, which could
        // make its target, waiting 5.5 s for the decoder to finish.
        let share = self.cfg.min_prefill_chunk.min(if self.waiting.is_empty() && order.hopeful.is_empty() {
            budget
        } else {
            budget / 2
        });
        let mut left = share;
        self.plan_prefills(order.overdue, &mut plan, &mut left, full, now);
        let mut out_of_memory = self.admit_waiting(&mut plan, &mut left, full, now, Tier::Overdue);
        budget -= share - left;
        let hopeful_from = plan.len();
        self.plan_prefills(order.hopeful, &mut plan, &mut budget, full, now);
        if !out_of_memory {
            out_of_memory = self.admit_waiting(&mut plan, &mut budget, full, now, Tier::Hopeful);
        }
        // A prompt that can make its target gets its first token from this pass: what cannot is
        // not added past an efficient pass (it made a 40-token remainder wait out a 1.9 s pass).
        let first_token = plan[hopeful_from..].iter().any(|p| p.logits);
        if first_token {
            budget = budget.min(full.prompt_tokens.saturating_sub(full.prompt_tokens_in(&plan)));
        }
        self.plan_prefills(order.hopeless, &mut plan, &mut budget, full, now);
        if !out_of_memory {
            out_of_memory = self.admit_waiting(&mut plan, &mut budget, full, now, Tier::Any);
        }
        // Background work (pre-warms) last. Beside a user's first token it adds at most a tenth
        // to the pass: on a CPU a pass costs about its tokens, and a pre-warm filling the pass
        // made a 20-token turn wait 2.9 s for 492 tokens of someone's future context.
        let mut room = if first_token { budget.min(self.background_room(&plan)) } else { budget };
        self.plan_prefills(order.background, &mut plan, &mut room, full, now);
        if !out_of_memory {
            self.admit_waiting(&mut plan, &mut room, full, now, Tier::Background);
        }
        if plan.is_empty() {
            // Nothing fits: running prefills are stuck on memory. Give one up
            // so the others can move.
            self.retract_one();
            return None;
        }
        Some(plan)
    }

    /// Plans the next chunk of each listed running prompt while the budget lasts; a prompt
    /// already in the plan gets its chunk extended; past `full`, only a prompt alone in the pass
    /// gets more.
    fn plan_prefills(
        &mut self,
        order: Vec<Prompt>,
        plan: &mut Vec<Planned>,
        budget: &mut usize,
        full: Fill,
        now: Instant,
    ) {
        for id in order {
            if *budget == 0 {
                break;
            }
            if full.closed_to(plan, id) {
                continue;
            }
            let planned = plan.iter().position(|p| p.seq == id);
            let left = self.running.iter().find(|s| s.id == id).map_or(0, |s| s.remaining());
            let remaining = left.saturating_sub(planned.map_or(0, |k| plan[k].len));
            let chunk = remaining.min(*budget);
            let seq = self.running.iter_mut().find(|s| s.id == id).expect("listed above");
            if chunk == 0 || !self.kv.reserve(seq, chunk, now) {
                continue;
            }
            let logits = chunk == remaining;
            match planned {
                Some(k) => {
                    plan[k].len += chunk;
                    plan[k].logits = logits;
                }
                None => plan.push(Planned { seq: id, len: chunk, logits, draft: 0 }),
            }
            *budget -= chunk;
        }
    }

    /// Admits waiting requests of admission phase `tier` in policy order while budget, memory
    /// and `max_running` allow. True when memory ran out (admitting more this step is pointless).
    fn admit_waiting(
        &mut self,
        plan: &mut Vec<Planned>,
        budget: &mut usize,
        full: Fill,
        now: Instant,
        tier: Tier,
    ) -> bool {
        while *budget > 0
            && self.running.len() < self.cfg.max_running
            && !self.waiting.is_empty()
            && !full.closed_to(plan, u64::MAX)
        {
            let Some(idx) = self.pick(now, tier) else { return false };
            let mut seq = self.waiting.swap_remove(idx);
            self.admit(&mut seq, now);
            if seq.receiving {
                // Its K/V arrives from elsewhere: slots for every prompt position before the last
                // token now, nothing to compute until it has arrived.
                let n = (seq.prompt_len - 1).saturating_sub(seq.computed);
                if n > 0 {
                    if !self.kv.reserve(&mut seq, n, now) {
                        self.kv.release(&mut seq, false);
                        self.waiting.push(seq);
                        return true;
                    }
                    self.running.push(seq);
                    self.receive(self.running.len() - 1);
                    continue;
                }
                seq.receiving = false;
            }
            let chunk = seq.remaining().min(*budget);
            if !self.kv.reserve(&mut seq, chunk, now) {
                // Not enough memory even after evicting: wait for running
                // requests to finish.
                self.kv.release(&mut seq, false);
                self.waiting.push(seq);
                return true;
            }
            plan.push(Planned { seq: seq.id, len: chunk, logits: chunk == seq.remaining(), draft: 0 });
            *budget -= chunk;
            self.running.push(seq);
        }
        false
    }

    /// Gives `seq` its cached prefix ([`super::kv::KvManager::admit`]) and starts its prefill;
    /// at its first admission, counts what the cache served.
    fn admit(&mut self, seq: &mut Seq, now: Instant) {
        self.kv.admit(seq, now);
        seq.enter(Phase::Prefill);
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(seq.computed.min(seq.prompt_len));
            seq.admitted = Some(now);
            let labels = super::tenant_labels(self.cfg.tenant_labels, &seq.req.tenant);
            metrics::counter!("cachet:prefix_cache_query_tokens_total", labels.clone())
                .increment(seq.prompt_len as u64);
            metrics::counter!("cachet:prefix_cache_hit_tokens_total", labels)
                .increment(seq.computed.min(seq.prompt_len) as u64);
            metrics::histogram!("cachet:queue_time_seconds").record((now - seq.arrival).as_secs_f64());
            let _in = seq.req.span.enter();
            tracing::debug!(
                queue_ms = (now - seq.arrival).as_millis() as u64,
                prompt_tokens = seq.prompt_len,
                cached_tokens = seq.computed.min(seq.prompt_len),
                "admitted"
            );
            if let Some(hook) = &seq.req.on_progress {
                hook(&self.completion(seq, FinishReason::Stop));
            }
            self.stats.query_tokens += seq.prompt_len as u64;
            self.stats.hit_tokens += seq.computed.min(seq.prompt_len) as u64;
        }
    }

    /// Fails the requests whose loaded chunks could not be copied into the pool, and drops their
    /// tenants' cache (those positions were cached as computed).
    pub(super) fn fail_loaded(&mut self, ids: &[u64]) {
        let mut tenants: Vec<TenantKey> = self
            .running
            .iter()
            .chain(&self.waiting)
            .filter(|s| ids.contains(&s.id))
            .map(|s| s.req.tenant.clone())
            .collect();
        let mut i = 0;
        while i < self.running.len() {
            if !ids.contains(&self.running[i].id) {
                i += 1;
                continue;
            }
            let mut seq = self.running.swap_remove(i);
            seq.send(Event::Error(RequestError::Engine(
                "K/V from the disk tier could not be copied into the pool".into(),
            )));
            self.kv.release(&mut seq, false);
            self.report(&seq, super::request::Outcome::Failed, FinishReason::Stop);
        }
        tenants.dedup();
        for t in tenants {
            self.kv.drop_cached(&t);
        }
    }

    /// Every decoding sequence needs one slot: evict, then retract the
    /// sequences with the least progress until they all fit.
    fn make_room_for_decode(&mut self, now: Instant) {
        loop {
            let need = self.running.iter().filter(|s| s.remaining() == 1).count();
            if self.kv.make_room(need, now) || !self.retract_one() {
                return;
            }
        }
    }

    /// Pushes the running request with the least progress back to the
    /// queue; its K/V goes into the cache, so resuming mostly hits. A request whose K/V is
    /// arriving from elsewhere keeps its slots (they are what the transfer writes into). False
    /// when there was none to retract.
    fn retract_one(&mut self) -> bool {
        let Some(idx) = (0..self.running.len()).filter(|&i| !self.running[i].receiving).min_by_key(|&i| {
            let s = &self.running[i];
            (s.generated(), std::cmp::Reverse(s.arrival))
        }) else {
            return false;
        };
        let mut seq = self.running.swap_remove(idx);
        self.kv.release(&mut seq, true);
        seq.retractions += 1;
        seq.enter(Phase::Queue);
        seq.req.span.in_scope(|| tracing::debug!(retractions = seq.retractions, "retracted: out of KV memory"));
        self.stats.retractions += 1;
        metrics::counter!("cachet:retractions_total").increment(1);
        self.waiting.push(seq);
        true
    }

    /// Background work never holds a user up: while a user's request waits, every pre-warm still
    /// computing its prompt goes back to the queue (behind every user's request). What it has
    /// computed stays in the cache, so a request on the same prefix starts from there, and the
    /// pre-warm resumes from there once no user's request waits.
    fn preempt_prewarms(&mut self) {
        if !self.waiting.iter().any(|s| !s.req.prewarm) {
            return;
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].req.prewarm {
                let mut seq = self.running.swap_remove(i);
                self.kv.release(&mut seq, true);
                seq.enter(Phase::Queue);
                self.stats.preempted_prewarms += 1;
                metrics::counter!("cachet:prewarm_preemptions_total").increment(1);
                self.waiting.push(seq);
            } else {
                i += 1;
            }
        }
    }

    /// Cancels requests whose caller dropped the stream.
    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancelled() {
                let mut seq = self.running.swap_remove(i);
                self.kv.release(&mut seq, true);
                self.stats.cancelled += 1;
                self.report(&seq, super::request::Outcome::Cancelled, FinishReason::Stop);
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].cancelled() {
                let mut seq = self.waiting.swap_remove(i);
                self.kv.release(&mut seq, true);
                self.stats.cancelled += 1;
                self.report(&seq, super::request::Outcome::Cancelled, FinishReason::Stop);
            } else {
                i += 1;
            }
        }
    }

    /// Hands out what the runner made of `plan` (planned at `now`): computed positions,
    /// sampled tokens and their text, first-token and inter-token timing, finished and failed
    /// requests, prompts published to the cache, the throughput estimate and pacing.
    pub(super) fn postprocess(&mut self, plan: &[Planned], ran: Ran, now: Instant) {
        let total: usize = plan.iter().map(|p| p.len).sum();
        // Requests past their first token that waited for this pass: its length is their gap.
        let decoding = ran.index.iter().filter(|&&i| self.running[i].first_token.is_some()).count();
        if let Some(t) = &ran.grammar {
            self.record_grammar(t);
        }
        if let Some(e) = ran.failed {
            self.fail_pass(&ran.index, e);
            return;
        }
        self.observe_pass(total, ran.secs);
        let mut ends = Ends::default();
        let mut sampled = ran.sampled.into_iter();
        for (p, &i) in plan.iter().zip(&ran.index) {
            let tokens = sampled.next().unwrap_or_default();
            // A drafted chunk holds K/V for its first position and for each draft token that
            // was confirmed: one position per token sampled.
            let valid = if p.draft > 0 { tokens.len().clamp(1, p.len) } else { p.len };
            self.advance(i, valid, ran.secs * p.len as f64 / total as f64, &mut ends);
            if p.draft > 0 {
                self.settle_draft(i, p.draft, tokens.len());
            }
            if !p.logits {
                continue;
            }
            if tokens.is_empty() {
                self.hand_out(i, None, true, &mut ends);
                continue;
            }
            if let (Some(guess), Some(Ok((token, _)))) = (self.running[i].drafter.guess.take(), tokens.first()) {
                let hit = usize::from(guess == *token);
                self.running[i].drafter.observe(hit, 1 - hit);
            }
            let count = tokens.len();
            for (k, token) in tokens.into_iter().enumerate() {
                let ended = ends.finished.len() + ends.failed.len();
                self.hand_out(i, Some(token), k + 1 == count, &mut ends);
                if ends.finished.len() + ends.failed.len() > ended {
                    break;
                }
            }
            // Confirmed draft positions past where the output ended hold K/V of tokens it does
            // not have.
            let seq = &mut self.running[i];
            if seq.computed >= seq.tokens.len() {
                seq.computed = seq.tokens.len() - 1;
                self.kv.unreserve(seq, seq.computed);
            }
        }
        self.settle(ends, now);
        self.pace_step(total, plan.len(), decoding, ran.secs, now);
    }

    /// A failed forward pass fails every request in it.
    fn fail_pass(&mut self, index: &[usize], e: String) {
        tracing::error!("forward pass failed: {e}");
        let mut failed = index.to_vec();
        failed.sort_unstable();
        for &i in failed.iter().rev() {
            let mut seq = self.running.swap_remove(i);
            seq.send(Event::Error(RequestError::Engine(e.clone())));
            self.kv.release(&mut seq, false);
            self.report(&seq, super::request::Outcome::Failed, FinishReason::Stop);
        }
    }

    /// The throughput estimate (passes of 16 tokens and more) and the pass metrics.
    fn observe_pass(&mut self, total: usize, secs: f64) {
        if total >= 16 {
            self.pace.note_throughput(total as f64 / secs.max(1e-6));
        }
        metrics::histogram!("cachet:forward_pass_tokens").record(total as f64);
        metrics::histogram!("cachet:forward_pass_seconds").record(secs);
    }

    /// Running sequence `i` has `len` more positions computed, in `secs` of the pass: its
    /// progress, its compute time and its tenant's fair-share counter.
    fn advance(&mut self, i: usize, len: usize, secs: f64, ends: &mut Ends) {
        let seq = &mut self.running[i];
        let (prefill, before) = (seq.computed < seq.prompt_len, seq.computed);
        seq.computed += len;
        if prefill && seq.computed >= seq.prompt_len && !seq.req.prewarm {
            ends.prompted.push(i);
        } else if prefill && seq.computed < seq.prompt_len {
            ends.partial.push(i);
        }
        seq.compute_seconds += secs;
        if prefill {
            // Only the prompt's positions: a pass that computes a prompt's last token can carry a
            // draft after it (a request whose prompt arrived from a prefill server).
            seq.computed_prefill += seq.computed.min(seq.prompt_len) - before;
        }
        *self.vtc.entry(seq.req.tenant.clone()).or_default() += len as f64;
    }

    /// Running sequence `i` ran a draft of `draft` tokens and sampled `sampled` tokens (all but
    /// the last confirm a drafted one): the slots of the positions that were not confirmed go
    /// back (their K/V never reaches the cache), the drafter learns how it did, and the counts.
    fn settle_draft(&mut self, i: usize, draft: usize, sampled: usize) {
        let seq = &mut self.running[i];
        self.kv.unreserve(seq, seq.computed);
        let accepted = sampled.saturating_sub(1);
        seq.drafter.observe(accepted, usize::from(accepted < draft));
        seq.draft.clear();
        seq.drafted += draft;
        seq.accepted += accepted;
        self.stats.drafted_tokens += draft as u64;
        self.stats.accepted_tokens += accepted as u64;
        metrics::counter!("cachet:spec_draft_tokens_total").increment(draft as u64);
        metrics::counter!("cachet:spec_accepted_tokens_total").increment(accepted as u64);
    }

    /// Running sequence `i` sampled `token`: its text goes out, and whether it ends here (a stop,
    /// the context's end, a complete grammar, the caller's own judgment) is noted in `ends`.
    ///
    /// `last`: the last token the pass sampled for it. The grammar's state is the one after that
    /// token (a drafted chunk samples several; the runner stops at one that completes the
    /// grammar), so whether the grammar is complete is asked of the last one only.
    fn hand_out(&mut self, i: usize, token: Option<super::runner::Sampled>, last: bool, ends: &mut Ends) {
        let (max_context, labels_on) = (self.model.max_context, self.cfg.tenant_labels);
        let seq = &mut self.running[i];
        if seq.req.prewarm {
            ends.finished.push((seq.id, FinishReason::Length));
            return;
        }
        let (token, logprobs) = match token.expect("the runner samples every chunk with logits") {
            Ok(sampled) => sampled,
            Err(e) => return ends.failed.push((seq.id, e)),
        };
        seq.tokens.push(token);
        seq.enter(Phase::Decode);
        let out = match seq.output.push(&self.model.tokenizer, token) {
            Ok(out) => out,
            Err(e) => return ends.failed.push((seq.id, RequestError::Engine(e.to_string()))),
        };
        token_timing(seq, self.clock.now(), labels_on);
        let mut text = out.text;
        let reason = match out.finish {
            Some(reason) => Some(reason),
            None if seq.tokens.len() >= max_context => {
                // One event per token: text held back for a possible stop string goes out with
                // the last one.
                text.push_str(&seq.output.flush(&self.model.tokenizer).unwrap_or_default());
                Some(FinishReason::Length)
            }
            // The grammar is complete and allows nothing more (not even text before an EOS).
            None if last && seq.constraint.as_ref().is_some_and(|c| c.finished()) => {
                text.push_str(&seq.output.flush(&self.model.tokenizer).unwrap_or_default());
                Some(FinishReason::Stop)
            }
            None => None,
        };
        // The caller's own judgment of the text so far (it sees every piece, the last too).
        let reason = match &seq.req.stop_when {
            Some(stop) if stop(&text) && reason.is_none() => {
                let rest = seq.output.flush(&self.model.tokenizer).unwrap_or_default();
                stop(&rest);
                text.push_str(&rest);
                Some(FinishReason::Stop)
            }
            _ => reason,
        };
        seq.send(Event::Token { id: token, text, logprobs });
        if let Some(reason) = reason {
            ends.finished.push((seq.id, reason));
        } else if seq.req.on_progress.is_some() && seq.generated().is_multiple_of(super::request::PROGRESS_TOKENS) {
            ends.progressed.push(i);
        }
    }

    /// What comes of the pass once every token is out: progress hooks, the disk tier's copies of
    /// long prompts so far, prompts published to the cache, finished and failed requests.
    fn settle(&mut self, ends: Ends, now: Instant) {
        for i in ends.progressed {
            let seq = &self.running[i];
            let _in = seq.req.span.enter();
            if let Some(hook) = &seq.req.on_progress {
                hook(&self.completion(seq, FinishReason::Stop));
            }
        }
        // The disk tier takes a long prompt's whole chunks as its prefill computes them (a prefill
        // server streams them to a decode server meanwhile; a retry after a cancel finds them).
        for i in ends.partial {
            self.kv.queue_partial_saves(&self.running[i]);
        }
        // Prompts computed in full go into the cache now, not when their answers end: a request
        // with the same prefix that waited for this one (see `pick`) reuses it at once.
        for i in ends.prompted {
            self.kv.publish_prompt(&mut self.running[i]);
        }
        for (id, reason) in ends.finished {
            let i = self.running.iter().position(|s| s.id == id).expect("finished sequences are running");
            let mut seq = self.running.swap_remove(i);
            self.finish(&mut seq, reason, now);
        }
        for (id, error) in ends.failed {
            let i = self.running.iter().position(|s| s.id == id).expect("failed sequences are running");
            let mut seq = self.running.swap_remove(i);
            tracing::debug!(seq = id, "request failed: {error}");
            seq.send(Event::Error(error));
            self.kv.release(&mut seq, true);
            self.report(&seq, super::request::Outcome::Failed, FinishReason::Stop);
        }
    }

    /// Pacing fits the whole step, not the forward pass alone: what a decoding request waits
    /// between two tokens includes planning, sampling, grammars and sending.
    fn pace_step(&mut self, total: usize, chunks: usize, decoding: usize, secs: f64, now: Instant) {
        let step = self.clock.now().saturating_duration_since(now).as_secs_f64();
        if tracing::enabled!(target: "cachet::pass", tracing::Level::TRACE) {
            tracing::trace!(
                target: "cachet::pass",
                tokens = total,
                chunks,
                decode = decoding,
                forward_ms = format_args!("{:.1}", secs * 1e3),
                step_ms = format_args!("{:.1}", step * 1e3),
                predicted_ms = format_args!("{:.1}", self.pace.seconds(total).unwrap_or(0.0) * 1e3),
                slow = format_args!("{:.2}", self.pace.slow_factor()),
                "pass"
            );
        }
        if decoding > 0 {
            self.pace.check(total, step);
        }
        self.pace.observe(total, step);
    }

    /// Caches what the request computed and reports its accounting.
    fn finish(&mut self, seq: &mut Seq, reason: FinishReason, _now: Instant) {
        self.kv.release(seq, true);
        if !seq.req.prewarm && self.cfg.draft_tokens > 0 {
            let owner = (seq.req.tenant.clone(), seq.req.salt.clone());
            let (prompt, answer) = seq.tokens.split_at(seq.prompt_len.min(seq.tokens.len()));
            self.recent.add(&owner, prompt, answer);
        }
        let completion = self.completion(seq, reason);
        metrics::histogram!("cachet:e2e_request_latency_seconds").record(completion.e2e.as_secs_f64());
        self.stats.finished += 1;
        let _in = seq.req.span.enter();
        tracing::debug!(
            reason = ?reason,
            output_tokens = completion.output_tokens,
            computed_prefill_tokens = completion.computed_prefill_tokens,
            e2e_ms = completion.e2e.as_millis() as u64,
            "finished"
        );
        if let Some(hook) = &seq.req.on_complete {
            hook(super::request::Outcome::Finished, &completion);
        }
        seq.send(Event::Done(completion));
    }

    /// Runs the request's accounting hook (cancelled or failed requests).
    pub(super) fn report(&self, seq: &Seq, outcome: super::request::Outcome, reason: FinishReason) {
        let _in = seq.req.span.enter();
        tracing::debug!(outcome = ?outcome, output_tokens = seq.generated(), "ended");
        if let Some(hook) = &seq.req.on_complete {
            hook(outcome, &self.completion(seq, reason));
        }
    }

    fn completion(&self, seq: &Seq, reason: FinishReason) -> Completion {
        let end = self.clock.now();
        Completion {
            finish_reason: reason,
            prompt_tokens: seq.prompt_len,
            cached_tokens: seq.cached_tokens.unwrap_or(0),
            computed_prefill_tokens: seq.computed_prefill,
            output_tokens: seq.generated(),
            queue_time: seq.admitted.unwrap_or(end) - seq.arrival,
            ttft: seq.first_token.map(|t| t - seq.arrival),
            e2e: end - seq.arrival,
            compute_seconds: seq.compute_seconds,
            retractions: seq.retractions,
            drafted_tokens: seq.drafted,
            accepted_tokens: seq.accepted,
        }
    }
}

/// When a pass is full of prompts: its first `decodes` entries are decode tokens; once the
/// prompts in it carry `prompt_tokens` ([`Scheduler::efficient_prompt_tokens`]), it takes no chunk
/// of another prompt (an overdue prompt's share planned first is not extended past a follow-up
/// that can still make its target, and no further prompt starts).
#[derive(Clone, Copy, Debug)]
struct Fill {
    decodes: usize,
    prompt_tokens: usize,
}

impl Fill {
    /// The plan's prompt chunks (its entries past the decode tokens).
    fn prompts<'a>(&self, plan: &'a [Planned]) -> &'a [Planned] {
        plan.get(self.decodes..).unwrap_or(&[])
    }

    /// Prompt tokens the plan carries.
    fn prompt_tokens_in(&self, plan: &[Planned]) -> usize {
        self.prompts(plan).iter().map(|p| p.len).sum()
    }

    /// Whether the plan takes no (more) tokens of prompt `id` (for a prompt not in it yet, any
    /// id not planned): it is full and carries another prompt.
    fn closed_to(&self, plan: &[Planned], id: u64) -> bool {
        self.prompt_tokens_in(plan) >= self.prompt_tokens && self.prompts(plan).iter().any(|p| p.seq != id)
    }
}

/// What a pass's tokens led to, settled once they are all out ([`Scheduler::settle`]).
#[derive(Default)]
struct Ends {
    /// Requests that ended (by id), and why.
    finished: Vec<(u64, FinishReason)>,
    /// Requests that failed (by id).
    failed: Vec<(u64, RequestError)>,
    /// Running sequences (by index) whose prompt was computed in full by this pass.
    prompted: Vec<usize>,
    /// Running sequences whose prompt is still being computed.
    partial: Vec<usize>,
    /// Running sequences due a progress report.
    progressed: Vec<usize>,
}

/// The first-token and inter-token timing of a token `seq` sampled at `t`.
fn token_timing(seq: &mut Seq, t: Instant, tenant_labels: bool) {
    match seq.last_token {
        None => {
            seq.first_token = Some(t);
            seq.req.span.in_scope(|| tracing::debug!(ttft_ms = (t - seq.arrival).as_millis() as u64, "first token"));
            let labels = super::tenant_labels(tenant_labels, &seq.req.tenant);
            metrics::histogram!("cachet:time_to_first_token_seconds", labels).record((t - seq.arrival).as_secs_f64());
            // TTFT = queue time (recorded at admission) + this part.
            metrics::histogram!("cachet:prefill_time_seconds")
                .record((t - seq.admitted.unwrap_or(seq.arrival)).as_secs_f64());
        }
        Some(prev) => metrics::histogram!("cachet:inter_token_latency_seconds").record((t - prev).as_secs_f64()),
    }
    seq.last_token = Some(t);
}
