//! One request inside the engine: its tokens (prompt, then output), where
//! their K/V lives, its sampler and text state, and its accounting.

use super::request::{Event, Request};
use crate::constraint::Constraint;
use crate::kv_pool::SlotId;
use crate::output::Output;
use crate::radix::{KeyElem, NodeId, RadixCache, Scope, Span};
use crate::sampler::Sampler;
use std::borrow::Cow;
use std::cell::Cell;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

pub(super) struct Seq {
    pub id: u64,
    pub req: Request,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// The cache key of the whole prompt, built once (its scope markers are held: see
    /// [`RadixCache::compact_tables`]).
    key: Vec<KeyElem>,
    /// The cached prefix of `tokens` last found: (cache generation, tokens, cached tokens).
    peeked: Cell<Option<(u64, usize, usize)>>,
    pub tx: UnboundedSender<Event>,
    pub sampler: Sampler,
    pub output: Output,
    /// The grammar's state: the generated tokens so far have been fed to it (it
    /// survives retraction with them).
    pub constraint: Option<Constraint>,
    /// The cache node this sequence's reused prefix ends at (locked).
    pub node: Option<NodeId>,
    /// K/V slots of positions `0..computed`: `slots[..owned_from]` belong to
    /// the cache (the locked prefix), the rest to this sequence.
    pub slots: Vec<SlotId>,
    pub owned_from: usize,
    pub computed: usize,
    pub arrival: Instant,
    pub deadline: Instant,
    pub admitted: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Prompt tokens served from the cache at first admission.
    pub cached_tokens: Option<usize>,
    pub computed_prefill: usize,
    pub compute_seconds: f64,
    pub retractions: u32,
    /// Leading prompt positions the disk tier held at submission (its admission loads them): counted
    /// as cached when the request's wait is judged.
    pub stored: usize,
    /// Its prompt's K/V is arriving from elsewhere ([`Request::remote_kv`]): nothing to compute
    /// until it has, its slots reserved.
    pub receiving: bool,
    /// Speculative decoding: the n-gram index of its tokens and its hit rate, and the tokens
    /// drafted for the pass being run (empty between passes).
    pub drafter: super::draft::Drafter,
    pub draft: Vec<u32>,
    /// Tokens drafted into its passes so far, and those confirmed.
    pub drafted: usize,
    pub accepted: usize,
    /// The span of the phase the request is in (a child of its span: a trace shows how long it
    /// queued, computed its prompt and decoded).
    phase: (Phase, tracing::Span),
}

/// Where a request is, as its trace shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for admission (again, after a retraction).
    Queue,
    /// Its prompt (or, after a retraction, what it lost) being computed.
    Prefill,
    /// Generating.
    Decode,
}

impl Seq {
    /// A sequence for `req`; its prompt's cache key is built here, once.
    pub fn new(
        id: u64,
        req: Request,
        tx: UnboundedSender<Event>,
        output: Output,
        now: Instant,
        ttft: Duration,
        mut scope: impl FnMut(&Scope) -> KeyElem,
    ) -> Seq {
        let sampler = Sampler::new(req.params.sampling.clone(), &req.tokens);
        let tokens = req.tokens.clone();
        let receiving = req.remote_kv.is_some();
        let constraint = req.grammar.as_ref().map(|g| g.start());
        let queue = tracing::info_span!(parent: &req.span, "queue", retractions = 0u32);
        let public = req.public.as_ref().filter(|p| p.tokens > 0);
        let mut key = Vec::with_capacity(tokens.len() + 2);
        let mut split = 0;
        if let Some(p) = public {
            key.push(scope(&Scope::Public { template: p.template.clone() }));
            split = p.tokens.min(tokens.len());
            key.extend(tokens[..split].iter().map(|&t| KeyElem::Token(t)));
        }
        key.push(scope(&Scope::Tenant { tenant: req.tenant.clone(), salt: req.salt.clone() }));
        key.extend(tokens[split..].iter().map(|&t| KeyElem::Token(t)));
        Seq {
            id,
            prompt_len: tokens.len(),
            key,
            peeked: Cell::new(None),
            tokens,
            req,
            tx,
            sampler,
            output,
            constraint,
            node: None,
            slots: Vec::new(),
            owned_from: 0,
            computed: 0,
            arrival: now,
            deadline: now + ttft,
            admitted: None,
            first_token: None,
            last_token: None,
            cached_tokens: None,
            computed_prefill: 0,
            compute_seconds: 0.0,
            retractions: 0,
            stored: 0,
            receiving,
            drafter: Default::default(),
            draft: Vec::new(),
            drafted: 0,
            accepted: 0,
            phase: (Phase::Queue, queue),
        }
    }

    /// Moves the request to `phase`: the previous phase's span ends here, the new one starts.
    pub fn enter(&mut self, phase: Phase) {
        if self.phase.0 == phase {
            return;
        }
        // The old span closes before the new one starts: the phases of a trace do not overlap.
        self.phase = (phase, tracing::Span::none());
        let parent = &self.req.span;
        self.phase.1 = match phase {
            Phase::Queue => tracing::info_span!(parent: parent, "queue", retractions = self.retractions),
            Phase::Prefill => tracing::info_span!(parent: parent, "prefill", from_token = self.computed),
            Phase::Decode => tracing::info_span!(parent: parent, "decode"),
        };
    }

    /// Output tokens so far.
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to run before the next sample (1 when decoding); none while the prompt's
    /// K/V is arriving from elsewhere.
    pub fn remaining(&self) -> usize {
        if self.receiving {
            0
        } else {
            self.tokens.len() - self.computed
        }
    }

    fn public_len(&self) -> Option<usize> {
        self.req.public.as_ref().map(|p| p.tokens).filter(|&n| n > 0)
    }

    /// Key element index of token position `pos`.
    fn elem(&self, pos: usize) -> usize {
        match self.public_len() {
            Some(p) if pos >= p => pos + 2,
            _ => pos + 1,
        }
    }

    /// The cache key of the first `n` tokens:
    /// `[Scope(Public) public-tokens] Scope(Tenant) rest`. Within the prompt (past its public
    /// part) a slice of the key built at submission; past it, that key and the output so far.
    pub fn key(&self, n: usize) -> Cow<'_, [KeyElem]> {
        match self.public_len() {
            // Inside the public part: the public tokens so far, then the tenant's marker.
            Some(p) if n < p => {
                let mut key = self.key[..n + 1].to_vec();
                key.push(self.key[p + 1]);
                Cow::Owned(key)
            }
            Some(_) if n <= self.prompt_len => Cow::Borrowed(&self.key[..n + 2]),
            None if n <= self.prompt_len => Cow::Borrowed(&self.key[..n + 1]),
            _ => {
                let mut key = self.key.clone();
                key.extend(self.tokens[self.prompt_len..n].iter().map(|&t| KeyElem::Token(t)));
                Cow::Owned(key)
            }
        }
    }

    /// The scope markers of this sequence's key (held while it lives).
    pub fn scopes(&self) -> impl Iterator<Item = KeyElem> + '_ {
        self.key.iter().copied().filter(|e| !e.is_token())
    }

    /// Tokens of `tokens` (prompt and output so far) the cache holds now; found again only when the cache changed ([`RadixCache::generation`]) or the
    /// sequence grew, so that judging a queue of waiting requests costs nothing per prompt token
    /// while the cache stays as it is.
    pub fn cached_prefix(&self, cache: &RadixCache) -> usize {
        let (generation, len) = (cache.generation(), self.tokens.len());
        if let Some((g, l, cached)) = self.peeked.get() {
            if (g, l) == (generation, len) {
                return cached;
            }
        }
        let cached = cache.peek_prefix(&self.key(len)).max(self.stored.min(len));
        self.peeked.set(Some((generation, len, cached)));
        cached
    }

    /// The provenance spans within the first `n` tokens, in key positions.
    pub fn spans(&self, n: usize) -> Vec<Span> {
        self.req
            .spans
            .iter()
            .filter(|s| s.range.start < n && s.range.start < s.range.end)
            .map(|s| {
                let end = s.range.end.min(n);
                Span { range: self.elem(s.range.start)..self.elem(end - 1) + 1, tag: s.tag.clone() }
            })
            .collect()
    }

    /// Token positions whose key elements come before element `elems`.
    pub fn positions_before(&self, elems: usize) -> usize {
        (0..self.computed).take_while(|&p| self.elem(p) < elems).count()
    }

    /// Sends an event; false when the caller has gone.
    pub fn send(&self, event: Event) -> bool {
        self.tx.send(event).is_ok()
    }

    /// Whether the caller dropped its stream.
    pub fn cancelled(&self) -> bool {
        self.tx.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::GenerateParams;
    use crate::radix::{InsertOpts, TenantKey};
    use crate::runtime::PublicPrefix;

    fn seq(cache: &mut RadixCache, tokens: Vec<u32>, public: usize) -> Seq {
        let mut req = Request::new(TenantKey::new("a"), tokens, GenerateParams::default());
        req.public = (public > 0).then(|| PublicPrefix { template: "chat".into(), tokens: public });
        let (tx, _) = tokio::sync::mpsc::unbounded_channel();
        let output = Output::new(&req.params, &[]);
        Seq::new(0, req, tx, output, Instant::now(), Duration::from_secs(1), |s| cache.scope(s))
    }

    fn slots(n: usize) -> Vec<SlotId> {
        (0..n as u32).map(SlotId).collect()
    }

    /// The key built at submission, sliced, is the key the cache was always given: the public
    /// tokens under the public marker, the rest under the tenant's.
    #[test]
    fn keys_are_slices_of_the_prompt_key() {
        let mut cache = RadixCache::new(10_000, 1.0);
        let mut s = seq(&mut cache, (100..110).collect(), 4);
        let public = cache.scope(&Scope::Public { template: "chat".into() });
        let tenant = cache.scope(&Scope::Tenant { tenant: TenantKey::new("a"), salt: None });
        let t = |r: std::ops::Range<u32>| r.map(KeyElem::Token).collect::<Vec<_>>();
        let expect = |a: Vec<KeyElem>, b: Vec<KeyElem>| [vec![public], a, vec![tenant], b].concat();
        assert_eq!(&*s.key(10), &expect(t(100..104), t(104..110))[..]);
        assert_eq!(&*s.key(6), &expect(t(100..104), t(104..106))[..]);
        assert_eq!(&*s.key(4), &expect(t(100..104), vec![])[..]);
        assert_eq!(&*s.key(2), &expect(t(100..102), vec![])[..]);
        s.tokens.extend([7, 8]);
        assert_eq!(&*s.key(12), &expect(t(100..104), [t(104..110), t(7..9)].concat())[..]);
        assert_eq!(s.scopes().collect::<Vec<_>>(), vec![public, tenant]);
        let plain = seq(&mut cache, (100..110).collect(), 0);
        assert_eq!(&*plain.key(3), &[vec![tenant], t(100..103)].concat()[..]);
    }

    /// Judging a waiting request walks the tree once per change of the cache, not once per
    /// look: a queue judged again and again while the cache stays costs nothing per token.
    #[test]
    fn the_cached_prefix_is_found_again_only_when_the_cache_changed() {
        let mut cache = RadixCache::new(100_000, 1.0);
        let long = seq(&mut cache, (0..20_000).collect(), 0);
        let other = seq(&mut cache, (50_000..50_100).collect(), 0);
        assert_eq!(long.cached_prefix(&cache), 0);
        for _ in 0..100 {
            assert_eq!(long.cached_prefix(&cache), 0);
        }
        assert_eq!(cache.peeks.get(), 1);
        // Another request's prompt enters the cache: found again, still nothing of this one.
        let key = other.key(100).into_owned();
        cache.insert(&key, &slots(100), &InsertOpts::default());
        assert_eq!(long.cached_prefix(&cache), 0);
        assert_eq!(cache.peeks.get(), 2);
        // Its own first 5,000 tokens do.
        let key = long.key(5_000).into_owned();
        let ins = cache.insert(&key, &slots(5_000), &InsertOpts::default());
        assert_eq!(long.cached_prefix(&cache), 5_000);
        // Matching, locking and tagging change no path: no new walk.
        let before = cache.peeks.get();
        let m = cache.match_prefix(&key, 2_500);
        cache.lock(m.node);
        cache.unlock(m.node);
        cache.lock(ins.node);
        assert_eq!(long.cached_prefix(&cache), 5_000);
        assert_eq!(cache.peeks.get(), before);
        // Eviction does.
        cache.unlock(ins.node);
        let freed = cache.evict(10_000, Instant::now(), None);
        assert_eq!(freed.len(), 5_100);
        assert_eq!(long.cached_prefix(&cache), 0);
        assert_eq!(cache.peeks.get(), before + 1);
    }

    /// A queued request's key keeps its scope ids through a compaction of the tables: given to
    /// another scope, the key would match that scope's cache (another tenant's).
    #[test]
    fn a_held_keys_scopes_survive_compaction() {
        let mut cache = RadixCache::new(1_000, 1.0);
        let waiting = seq(&mut cache, vec![1, 2, 3], 0);
        let mine = waiting.scopes().next().unwrap();
        cache.compact_tables(Instant::now(), waiting.scopes());
        let theirs = cache.scope(&Scope::Tenant { tenant: TenantKey::new("b"), salt: None });
        assert_ne!(theirs, mine);
        // Not held, the id is free for the next scope.
        cache.compact_tables(Instant::now(), []);
        let third = cache.scope(&Scope::Tenant { tenant: TenantKey::new("c"), salt: None });
        assert!(third == mine || third == theirs, "{third:?}");
    }
}
