//! The one owner of K/V memory: the pool's slots, the radix prefix cache over them, the disk tier
//! and the copies between the tier and the pool still to be made. The scheduler decides *who*
//! runs; this decides *where their K/V lives* — reserving slots for a prompt chunk or a decode
//! token, evicting to make room, matching and locking a cached prefix, publishing a computed one,
//! releasing a sequence's K/V — through the narrow interface below (the role of nano-vllm's
//! `BlockManager`, with mini-sglang's split of the pool from the prefix cache).
//!
//! A sequence's own K/V state (its slots, its locked cache node, how far it is computed) lives in
//! its [`Seq`]; only this module changes the pool and the cache under it.

use super::runner::Runner;
use super::seq::Seq;
use super::tier::{Load, Save, Tier, TierCounts};
use crate::kv_pool::{SlotId, Slots};
use crate::kv_transfer::KvRecord;
use crate::radix::{InsertOpts, KeyElem, RadixCache, RetentionKey, Scope, TenantKey};
use cachet_kernels::backend::Backend;
use std::collections::HashSet;
use std::time::Instant;

/// What goes wrong with K/V memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// The pool's, the cache's or the sequences' bookkeeping disagree (a bug).
    #[error("{0}")]
    Integrity(String),
    /// The pool has too few free slots.
    #[error(transparent)]
    Pool(#[from] crate::error::EngineError),
    /// A hand-off without a disk tier to take it.
    #[error("the disk tier is off")]
    NoTier,
    /// The disk tier could not index or read a chunk.
    #[error("{0}")]
    Tier(#[from] std::io::Error),
    /// Rows that do not fit the pool (another model's layout), or the backend failed copying them.
    #[error("{0}")]
    Rows(String),
    /// The engine thread ended before it answered.
    #[error("the engine stopped")]
    Stopped,
}

impl From<crate::kv_pool::IntegrityError> for KvError {
    fn from(e: crate::kv_pool::IntegrityError) -> KvError {
        KvError::Integrity(e.to_string())
    }
}

impl From<crate::radix::IntegrityError> for KvError {
    fn from(e: crate::radix::IntegrityError) -> KvError {
        KvError::Integrity(e.to_string())
    }
}

/// What the pool, the cache and the tier hold (for the engine's snapshot and metrics).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct KvUsage {
    pub used: usize,
    pub capacity: usize,
    pub cached: usize,
    pub interned: usize,
    pub evicted: u64,
    pub invalidated: u64,
    /// Bytes, chunks and write errors of the disk tier.
    pub tier: (u64, usize, u64),
    pub tier_counts: TierCounts,
}

pub(super) struct KvManager {
    slots: Slots,
    cache: RadixCache,
    /// The disk tier, when configured.
    tier: Option<Tier>,
    /// Chunks to copy out of the pool for the disk tier (the engine does it after planning and
    /// after the pass, before anything can write those slots).
    saves: Vec<Save>,
    /// Chunks (from the disk tier or another server) to copy into the pool before the next pass.
    loads: Vec<Load>,
    evicted: u64,
    invalidated: u64,
}

impl KvManager {
    pub fn new(slots: Slots, default_share: f64) -> KvManager {
        KvManager {
            cache: RadixCache::new(slots.capacity(), default_share),
            slots,
            tier: None,
            saves: Vec::new(),
            loads: Vec::new(),
            evicted: 0,
            invalidated: 0,
        }
    }

    pub fn set_tier(&mut self, tier: Tier) {
        self.tier = Some(tier);
    }

    pub fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    pub fn free(&self) -> usize {
        self.slots.free_slots()
    }

    pub fn usage(&self) -> KvUsage {
        KvUsage {
            used: self.slots.capacity() - self.slots.free_slots(),
            capacity: self.slots.capacity(),
            cached: self.cache.cached_slots(),
            interned: self.cache.interned(),
            evicted: self.evicted,
            invalidated: self.invalidated,
            tier: self.tier.as_ref().map_or((0, 0, 0), |t| t.usage()),
            tier_counts: self.tier.as_ref().map(|t| t.counts).unwrap_or_default(),
        }
    }

    // ---- Keys and what is cached ------------------------------------------------------------

    /// The interned marker of a key scope (a sequence's key is built from these once).
    pub fn scope(&mut self, scope: &Scope) -> KeyElem {
        self.cache.scope(scope)
    }

    /// Tokens of `seq` the cache (or the disk tier) holds now.
    pub fn cached_prefix(&self, seq: &Seq) -> usize {
        seq.cached_prefix(&self.cache)
    }

    /// Prompt tokens of a request the disk tier holds.
    pub fn stored_prefix(&self, req: &super::Request) -> usize {
        self.tier.as_ref().map_or(0, |t| t.stored_prefix(req))
    }

    /// Whether the prefix `seq` locked was invalidated under it.
    pub fn doomed(&self, seq: &Seq) -> bool {
        seq.node.is_some_and(|n| self.cache.is_doomed(n))
    }

    /// Drops interning tables grown past their use; `held` are the scope markers of queued and
    /// running sequences.
    pub fn compact<I: IntoIterator<Item = KeyElem>>(&mut self, now: Instant, held: impl FnOnce() -> I) {
        self.cache.compact_tables_if_grown(now, held);
    }

    // ---- Tenants, retention, invalidation ---------------------------------------------------

    pub fn retain(&mut self, key: &RetentionKey, until: Instant) {
        self.cache.retain(key, until);
    }

    pub fn release_retention(&mut self, key: &RetentionKey) {
        self.cache.release(key);
    }

    pub fn set_share(&mut self, tenant: &TenantKey, share: f64) {
        if let Some(t) = &mut self.tier {
            t.set_share(&tenant.0, share);
        }
        self.cache.set_share(tenant, share);
    }

    /// Drops what a change to `source` made stale (cache and tier); returns the slots freed.
    pub fn invalidate(&mut self, source: &str, keep_version: Option<&str>) -> usize {
        let freed = self.cache.invalidate(source, keep_version);
        self.free_slots(&freed);
        if let Some(t) = &mut self.tier {
            t.invalidate(source, keep_version);
        }
        self.invalidated += freed.len() as u64;
        freed.len()
    }

    /// Drops everything of `tenant`: its cache and what the disk tier holds of it.
    pub fn purge_tenant(&mut self, tenant: &TenantKey) {
        let freed = self.cache.purge_tenant(tenant);
        self.free_slots(&freed);
        self.invalidated += freed.len() as u64;
        if let Some(t) = &mut self.tier {
            t.purge_tenant(&tenant.0);
        }
    }

    /// Drops `tenant`'s cache (positions cached as loaded whose copy into the pool failed).
    pub fn drop_cached(&mut self, tenant: &TenantKey) {
        let freed = self.cache.purge_tenant(tenant);
        self.free_slots(&freed);
    }

    /// Indexes a chunk the service wrote into the tier's directory (a hand-off).
    pub fn adopt(&mut self, record: &KvRecord, bytes: u64) -> Result<(), KvError> {
        match &mut self.tier {
            Some(t) => Ok(t.adopt(record, bytes)?),
            None => Err(KvError::NoTier),
        }
    }

    /// Waits until the tier has written every chunk it was given.
    pub fn flush_tier(&mut self) {
        if let Some(t) = &mut self.tier {
            t.flush();
        }
    }

    // ---- Room -------------------------------------------------------------------------------

    /// Slots for a pass that runs outside any sequence (the warm-up).
    pub fn allocate_loose(&mut self, n: usize) -> Result<Vec<SlotId>, KvError> {
        Ok(self.slots.allocate(n)?)
    }

    /// Gives back what [`KvManager::allocate_loose`] gave.
    pub fn free_loose(&mut self, slots: &[SlotId]) -> Result<(), KvError> {
        Ok(self.slots.free(slots)?)
    }

    /// Frees pool slots for `n` tokens of `tenant`'s request by evicting unlocked cache. False if
    /// that is not enough.
    fn ensure_free(&mut self, n: usize, tenant: &TenantKey, now: Instant) -> bool {
        if self.slots.free_slots() >= n {
            return true;
        }
        self.evict(n - self.slots.free_slots(), now, Some(tenant));
        self.slots.free_slots() >= n
    }

    /// Evicts unlocked cache until `need` slots are free (for decode tokens, anyone's cache).
    /// False if that is not enough.
    pub fn make_room(&mut self, need: usize, now: Instant) -> bool {
        if self.slots.free_slots() < need {
            self.evict(need - self.slots.free_slots(), now, None);
        }
        self.slots.free_slots() >= need
    }

    fn evict(&mut self, n: usize, now: Instant, requester: Option<&TenantKey>) {
        let freed = self.cache.evict(n, now, requester);
        self.evicted += freed.len() as u64;
        metrics::counter!("cachet:evicted_tokens_total").increment(freed.len() as u64);
        self.free_slots(&freed);
    }

    /// Reserves `n` more slots for `seq` (a prompt chunk or a decode token), evicting `tenant`'s
    /// fair share of unlocked cache if it must. False (nothing reserved) if memory is short.
    pub fn reserve(&mut self, seq: &mut Seq, n: usize, now: Instant) -> bool {
        let tenant = seq.req.tenant.clone();
        if !self.ensure_free(n, &tenant, now) {
            return false;
        }
        self.slots.allocate_into(n, &mut seq.slots).expect("ensure_free made room");
        true
    }

    /// Reserves `n` more slots for `seq` from what is free, evicting nothing.
    pub fn reserve_free(&mut self, seq: &mut Seq, n: usize) -> bool {
        self.slots.allocate_into(n, &mut seq.slots).is_ok()
    }

    /// Gives back the slots of `seq` from position `from` on (reserved, never filled).
    pub fn unreserve(&mut self, seq: &mut Seq, from: usize) {
        let unused = seq.slots.split_off(from);
        self.free_slots(&unused);
    }

    fn free_slots(&mut self, slots: &[SlotId]) {
        if let Err(e) = self.slots.free(slots) {
            tracing::error!("{e}");
        }
    }

    // ---- A sequence's K/V -------------------------------------------------------------------

    /// Matches the longest cached prefix of `seq` (leaving at least one token to compute, for
    /// the logits), locks it, tags it with `seq`'s provenance (an invalidation while it runs
    /// reaches it) and continues it with what the disk tier holds.
    pub fn admit(&mut self, seq: &mut Seq, now: Instant) {
        let key = seq.key(seq.tokens.len());
        let m = self.cache.match_prefix(&key, seq.tokens.len() - 1);
        self.cache.lock(m.node);
        self.cache.tag_spans(&key, &seq.spans(seq.tokens.len()));
        seq.node = Some(m.node);
        seq.computed = m.slots.len();
        seq.owned_from = seq.computed;
        seq.slots = m.slots;
        self.load_from_tier(seq, now);
    }

    /// Continues `seq`'s cached prefix (just matched and locked) with the chunks the disk tier
    /// holds: fresh slots for them (their rows are copied in before the next pass), the positions
    /// cached as if computed, with `seq`'s provenance, and the lock moved to their end.
    fn load_from_tier(&mut self, seq: &mut Seq, now: Instant) {
        let Some(tier) = self.tier.as_mut() else { return };
        let limit = seq.prompt_len.min(seq.tokens.len() - 1);
        if seq.computed >= limit {
            return;
        }
        let (records, skip) = tier.find(seq, seq.computed, limit);
        if records.is_empty() {
            return;
        }
        let start = seq.computed;
        let end = start - skip + records.iter().map(|r| r.tokens.len()).sum::<usize>();
        let n = end - start;
        if !self.ensure_free(n, &seq.req.tenant.clone(), now) {
            return;
        }
        let new = self.slots.allocate(n).expect("ensure_free made room");
        let raw = SlotId::raw(&new);
        let mut at = 0;
        for (i, record) in records.into_iter().enumerate() {
            let skip = if i == 0 { skip } else { 0 };
            let rows = record.tokens.len() - skip;
            self.loads.push(Load { seq: seq.id, slots: raw[at..at + rows].to_vec(), record, skip });
            at += rows;
        }
        seq.slots.extend(new);
        seq.computed = end;
        self.cache_prefix(seq, end);
        if let Some(t) = self.tier.as_mut() {
            t.counts.loaded_tokens += n as u64;
        }
        metrics::counter!("cachet:kv_tier_loaded_tokens_total").increment(n as u64);
        seq.req.span.in_scope(|| tracing::debug!(tokens = n, from = start, "prefix loaded from the disk tier"));
    }

    /// K/V of `seq`'s positions `seq.computed..seq.computed + record's rows - skip` that arrived
    /// from another server: copied into its reserved slots before the next pass.
    pub fn receive(&mut self, seq: &mut Seq, record: KvRecord, skip: usize, end: usize) {
        let slots = SlotId::raw(&seq.slots[seq.computed..end]).to_vec();
        self.loads.push(Load { seq: seq.id, slots, record, skip });
        seq.computed = end;
    }

    /// Puts `seq`'s first `n` positions (computed or loaded) in the cache and moves its lock to
    /// their end; it keeps running on the same K/V (where the cache already held a position
    /// under other slots, on the cache's).
    pub fn cache_prefix(&mut self, seq: &mut Seq, n: usize) {
        let key = seq.key(n).into_owned();
        let spans = seq.spans(n);
        let retention = seq.req.retention.as_ref().map(|(k, _)| k.clone());
        let opts = InsertOpts { spans: &spans, retention: retention.as_ref() };
        let inserted = self.cache.insert(&key, &seq.slots[..n], &opts);
        self.cache.lock(inserted.node);
        if !inserted.duplicates.is_empty() {
            // Another request cached some of these positions first: the same K/V under its
            // slots, which this sequence now reads instead of its own.
            let m = self.cache.match_prefix(&key, n);
            seq.slots[..m.slots.len()].copy_from_slice(&m.slots);
            self.free_slots(&inserted.duplicates);
        }
        if let Some(old) = seq.node.replace(inserted.node) {
            let freed = self.cache.unlock(old);
            self.free_slots(&freed);
        }
        seq.owned_from = n;
    }

    /// Publishes `seq`'s computed prompt (as [`KvManager::release`] puts a finished one) and moves
    /// its lock there; the sequence keeps running on the same K/V. Nothing under a prefix a push
    /// invalidated.
    pub fn publish_prompt(&mut self, seq: &mut Seq) {
        let Some(old) = seq.node else { return };
        let n = seq.prompt_len.min(seq.computed);
        if n <= seq.owned_from || self.cache.is_doomed(old) {
            return;
        }
        self.cache_prefix(seq, n);
        self.queue_saves(seq, n);
    }

    /// Queues the disk tier's copies of `seq`'s whole prompt chunks within its first `n` tokens,
    /// just cached, that the tier does not hold yet.
    fn queue_saves(&mut self, seq: &Seq, n: usize) {
        let Some(tier) = self.tier.as_mut() else { return };
        let n = n.min(seq.prompt_len);
        let m = self.cache.match_prefix(&seq.key(n), n);
        let saves = tier.saves(seq, n, SlotId::raw(&m.slots));
        self.saves.extend(saves);
    }

    /// Queues the disk tier's copies of `seq`'s whole prompt chunks computed so far (its prompt
    /// is not complete: the rows are in its own slots, final, and not in the cache yet). Nothing
    /// for a sequence whose prefix a push invalidated.
    pub fn queue_partial_saves(&mut self, seq: &Seq) {
        let Some(tier) = self.tier.as_mut() else { return };
        if seq.node.is_none_or(|n| self.cache.is_doomed(n)) {
            return;
        }
        let n = seq.computed.min(seq.prompt_len).min(seq.slots.len());
        let saves = tier.saves(seq, n, SlotId::raw(&seq.slots[..n]));
        self.saves.extend(saves);
    }

    /// Returns a sequence's K/V: computed positions go into the cache (if `keep`), its lock is
    /// released, what nobody holds goes back to the pool.
    pub fn release(&mut self, seq: &mut Seq, keep: bool) {
        let Some(node) = seq.node.take() else {
            let own = std::mem::take(&mut seq.slots);
            self.free_slots(&own);
            return;
        };
        // A prefix invalidated under this request may only be kept up to where the
        // invalidation cut it.
        let live = if self.cache.is_doomed(node) {
            seq.positions_before(self.cache.live_prefix_len(node))
        } else {
            seq.computed
        };
        let n = if keep { live } else { 0 };
        if n > 0 {
            let key = seq.key(n);
            let spans = seq.spans(n);
            let retention = seq.req.retention.as_ref().map(|(k, _)| k.clone());
            let opts = InsertOpts { spans: &spans, retention: retention.as_ref() };
            let inserted = self.cache.insert(&key, &seq.slots[..n], &opts);
            self.free_slots(&inserted.duplicates);
            self.queue_saves(seq, n);
        }
        // Own slots the cache did not take.
        let own_from = seq.owned_from.max(n);
        let rest: Vec<SlotId> = seq.slots[own_from..].to_vec();
        self.free_slots(&rest);
        let freed = self.cache.unlock(node);
        self.free_slots(&freed);
        seq.slots.clear();
        seq.owned_from = 0;
        seq.computed = 0;
    }

    // ---- Copies between the pool and the tier -----------------------------------------------

    /// The copies the engine makes before anything can write the slots they name: first the
    /// chunks to save (out of the pool; their slots may be a load's next), then the chunks loaded
    /// (into it), through the runner that holds the K/V storage; returns the sequences whose
    /// load failed.
    pub fn copy<B: Backend>(&mut self, runner: &mut Runner<B>) -> Vec<u64> {
        for mut save in std::mem::take(&mut self.saves) {
            let Some(tier) = self.tier.as_mut() else { break };
            match runner.export(&save.slots) {
                Ok((cols, layers)) => {
                    save.record.kv_cols = cols;
                    save.record.layers = layers;
                    tier.send(save.record);
                }
                Err(e) => {
                    tracing::warn!("kv tier: copying a chunk out of the pool failed: {e}");
                    tier.abandon(&save.record);
                }
            }
        }
        let mut failed = Vec::new();
        for load in std::mem::take(&mut self.loads) {
            if let Err(e) = runner.import(&load.slots, &load.record, load.skip) {
                tracing::error!("kv tier: copying a chunk into the pool failed: {e}");
                failed.push(load.seq);
            }
        }
        failed
    }

    // ---- Integrity --------------------------------------------------------------------------

    /// Checks the pool, the cache, and that every slot in use belongs to exactly one of: the
    /// cache, or one of `seqs`.
    pub fn check_integrity<'a>(&self, seqs: impl Iterator<Item = &'a Seq>) -> Result<(), KvError> {
        self.slots.check_integrity()?;
        self.cache.check_integrity()?;
        let mut owned = HashSet::new();
        for s in seqs {
            for slot in &s.slots[s.owned_from..] {
                if !owned.insert(*slot) {
                    return Err(KvError::Integrity(format!("slot {slot:?} is owned twice")));
                }
            }
            if s.node.is_none() && !s.slots.is_empty() {
                return Err(KvError::Integrity(format!("sequence {} holds slots without a cache lock", s.id)));
            }
        }
        let cached = self.cache.cached_slots();
        let in_use = self.slots.capacity() - self.slots.free_slots();
        if cached + owned.len() != in_use {
            return Err(KvError::Integrity(format!(
                "{in_use} slots in use, but the cache holds {cached} and sequences {}",
                owned.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::GenerateParams;
    use crate::output::Output;
    use crate::runtime::Request;
    use std::time::Duration;

    fn seq(kv: &mut KvManager, id: u64, tenant: &str, tokens: Vec<u32>) -> Seq {
        let req = Request::new(TenantKey::new(tenant), tokens, GenerateParams::default());
        let (tx, _) = tokio::sync::mpsc::unbounded_channel();
        let output = Output::new(&req.params, &[]);
        Seq::new(id, req, tx, output, Instant::now(), Duration::from_secs(1), |s| kv.scope(s))
    }

    /// A prompt computed in full: its slots reserved, its positions computed.
    fn compute(kv: &mut KvManager, s: &mut Seq, now: Instant) {
        kv.admit(s, now);
        let n = s.prompt_len - s.computed;
        assert!(kv.reserve(s, n, now));
        s.computed = s.prompt_len;
    }

    /// A prompt's K/V is reserved, published while the sequence runs, shared by the next request
    /// with the same prompt (all but its last token), and kept in the cache after both release;
    /// every slot in use is held by exactly one of the cache or a sequence throughout.
    #[test]
    fn a_published_prompt_is_shared_and_outlives_its_sequence() {
        let now = Instant::now();
        let mut kv = KvManager::new(Slots::new(100), 1.0);
        let prompt: Vec<u32> = (0..40).collect();
        let mut a = seq(&mut kv, 0, "t", prompt.clone());
        compute(&mut kv, &mut a, now);
        assert_eq!((kv.free(), kv.usage().cached), (60, 0));
        kv.check_integrity([&a].into_iter()).unwrap();
        kv.publish_prompt(&mut a);
        assert_eq!((kv.free(), kv.usage().cached, a.owned_from), (60, 40, 40));
        kv.check_integrity([&a].into_iter()).unwrap();

        let mut b = seq(&mut kv, 1, "t", prompt.clone());
        assert_eq!(kv.cached_prefix(&b), 40);
        kv.admit(&mut b, now);
        assert_eq!(b.computed, 39, "the last token is computed again, for its logits");
        assert_eq!(b.slots[..], a.slots[..39]);
        assert!(kv.reserve(&mut b, 1, now));
        kv.check_integrity([&a, &b].into_iter()).unwrap();

        kv.release(&mut a, true);
        b.computed = 40;
        kv.release(&mut b, true);
        assert!(a.slots.is_empty() && b.slots.is_empty());
        assert_eq!((kv.free(), kv.usage().cached), (60, 40));
        kv.check_integrity(std::iter::empty()).unwrap();
        // Another tenant's same prompt finds nothing.
        let c = seq(&mut kv, 2, "u", prompt);
        assert_eq!(kv.cached_prefix(&c), 0);
    }

    /// Memory is made by evicting unlocked cache, never what a running sequence holds; a release
    /// without `keep` returns everything to the pool.
    #[test]
    fn reserving_evicts_unlocked_cache_but_never_a_running_sequence() {
        let now = Instant::now();
        let mut kv = KvManager::new(Slots::new(64), 1.0);
        let mut old = seq(&mut kv, 0, "t", (0..40).collect());
        compute(&mut kv, &mut old, now);
        kv.release(&mut old, true);
        assert_eq!((kv.free(), kv.usage().cached), (24, 40));

        let mut running = seq(&mut kv, 1, "t", (100..120).collect());
        compute(&mut kv, &mut running, now);
        assert_eq!(kv.usage().evicted, 0, "20 slots were free");
        let mut next = seq(&mut kv, 2, "t", (200..230).collect());
        kv.admit(&mut next, now);
        assert!(kv.reserve(&mut next, 30, now), "the cached prompt is evicted for it");
        assert!(kv.usage().evicted >= 26);
        kv.check_integrity([&running, &next].into_iter()).unwrap();
        // Nothing left to evict: the running sequences' slots are not taken.
        let mut more = seq(&mut kv, 3, "t", (300..340).collect());
        kv.admit(&mut more, now);
        assert!(!kv.reserve(&mut more, 40, now));
        assert!(!kv.make_room(kv.free() + 1, now));
        assert_eq!(running.slots.len(), 20);
        kv.check_integrity([&running, &next, &more].into_iter()).unwrap();

        for s in [&mut running, &mut next, &mut more] {
            kv.release(s, false);
        }
        assert_eq!(kv.free(), 64 - kv.usage().cached);
        kv.check_integrity(std::iter::empty()).unwrap();
    }

    /// Reserved slots nothing arrived for go back to the pool.
    #[test]
    fn unreserved_slots_go_back() {
        let now = Instant::now();
        let mut kv = KvManager::new(Slots::new(32), 1.0);
        let mut s = seq(&mut kv, 0, "t", (0..20).collect());
        kv.admit(&mut s, now);
        assert!(kv.reserve(&mut s, 19, now));
        s.computed = 5;
        kv.unreserve(&mut s, 5);
        assert_eq!((s.slots.len(), kv.free()), (5, 27));
        kv.check_integrity([&s].into_iter()).unwrap();
    }
}
