//! Engine counters: exported as metrics (through the `metrics` facade, which
//! the service installs an exporter for) and readable as a [`Snapshot`].

use super::Scheduler;

#[derive(Debug, Default)]
pub(super) struct Stats {
    pub query_tokens: u64,
    pub hit_tokens: u64,
    pub retractions: u64,
    pub preempted_prewarms: u64,
    pub refused: u64,
    pub cancelled: u64,
    pub finished: u64,
    pub grammar_steps: u64,
    pub grammar_masks: u64,
    pub grammar_mask_seconds: f64,
    pub grammar_wait_seconds: f64,
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
}

/// A point-in-time view of the engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub running: usize,
    pub waiting: usize,
    /// KV slots in use (cache and running requests) / pool size.
    pub kv_used: usize,
    pub kv_capacity: usize,
    /// Slots held by the prefix cache.
    pub cached_slots: usize,
    /// Entries of the cache's interning tables (scopes, sources, versions, retention keys).
    pub interned: usize,
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub evicted_slots: u64,
    pub invalidated_slots: u64,
    pub retractions: u64,
    /// Pre-warm requests put back in the queue (their computed K/V kept in the cache) so that a
    /// user's request could go first.
    pub preempted_prewarms: u64,
    pub refused: u64,
    /// Of those, refused at submission by the door (see `EngineHandle::submit`).
    pub refused_at_door: u64,
    pub cancelled: u64,
    pub finished: u64,
    /// Forward-pass throughput estimate (tokens/s) used for admission.
    pub throughput: f64,
    /// Steps with grammars, masks computed, the time computing them (beside the forward
    /// passes), and the time steps waited for them after their forward pass had finished.
    pub grammar_steps: u64,
    pub grammar_masks: u64,
    pub grammar_mask_seconds: f64,
    pub grammar_wait_seconds: f64,
    /// Speculative decoding: tokens drafted into passes, and those the model confirmed (each
    /// saved a pass).
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    /// The disk tier (zeros without one): bytes and chunks stored, prompt tokens loaded from it
    /// instead of computed, prompt tokens handed to it, chunks dropped because its writer was
    /// behind, and writes that failed.
    pub kv_tier_bytes: u64,
    pub kv_tier_chunks: usize,
    pub kv_tier_loaded_tokens: u64,
    pub kv_tier_saved_tokens: u64,
    pub kv_tier_dropped_chunks: u64,
    pub kv_tier_write_errors: u64,
}

impl Scheduler {
    pub(super) fn snapshot(&self) -> Snapshot {
        let kv = self.kv.usage();
        let ((kv_tier_bytes, kv_tier_chunks, kv_tier_write_errors), counts) = (kv.tier, kv.tier_counts);
        Snapshot {
            kv_tier_bytes,
            kv_tier_chunks,
            kv_tier_loaded_tokens: counts.loaded_tokens,
            kv_tier_saved_tokens: counts.saved_tokens,
            kv_tier_dropped_chunks: counts.dropped_chunks,
            kv_tier_write_errors,
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_used: kv.used,
            kv_capacity: kv.capacity,
            cached_slots: kv.cached,
            interned: kv.interned,
            prefix_query_tokens: self.stats.query_tokens,
            prefix_hit_tokens: self.stats.hit_tokens,
            evicted_slots: kv.evicted,
            invalidated_slots: kv.invalidated,
            retractions: self.stats.retractions,
            preempted_prewarms: self.stats.preempted_prewarms,
            refused: self.stats.refused + self.intake.door.refused(),
            refused_at_door: self.intake.door.refused(),
            cancelled: self.stats.cancelled,
            finished: self.stats.finished,
            throughput: self.pace.throughput,
            grammar_steps: self.stats.grammar_steps,
            grammar_masks: self.stats.grammar_masks,
            grammar_mask_seconds: self.stats.grammar_mask_seconds,
            grammar_wait_seconds: self.stats.grammar_wait_seconds,
            drafted_tokens: self.stats.drafted_tokens,
            accepted_tokens: self.stats.accepted_tokens,
        }
    }

    pub(super) fn publish_stats(&self) {
        let (used, capacity) = (self.kv.capacity() - self.kv.free(), self.kv.capacity());
        metrics::gauge!("cachet:kv_cache_usage_ratio").set(used as f64 / capacity.max(1) as f64);
        metrics::gauge!("cachet:num_requests_running").set(self.running.len() as f64);
        metrics::gauge!("cachet:num_requests_waiting").set(self.waiting.len() as f64);
    }
}
