//! One request inside the engine: its tokens (prompt, then output), where
//! their K/V lives, its sampler and text state, and its accounting.

use super::request::{Event, Request};
use crate::constraint::Constraint;
use crate::kv_pool::SlotId;
use crate::output::Output;
use crate::radix::{KeyElem, NodeId, RadixCache, Scope, Span};
use crate::sampler::Sampler;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

pub(super) struct Seq {
    pub id: u64,
    pub req: Request,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
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
}

impl Seq {
    pub fn new(id: u64, req: Request, tx: UnboundedSender<Event>, output: Output, now: Instant, ttft: Duration) -> Seq {
        let sampler = Sampler::new(req.params.sampling.clone(), &req.tokens);
        let tokens = req.tokens.clone();
        let constraint = req.grammar.as_ref().map(|g| g.start());
        Seq {
            id,
            prompt_len: tokens.len(),
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
        }
    }

    /// Output tokens so far.
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to run before the next sample (1 when decoding).
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.computed
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
    /// `[Scope(Public) public-tokens] Scope(Tenant) rest`.
    pub fn key(&self, cache: &mut RadixCache, n: usize) -> Vec<KeyElem> {
        let mut key = Vec::with_capacity(n + 2);
        let mut split = 0;
        if let (Some(p), Some(public)) = (self.public_len(), &self.req.public) {
            key.push(cache.scope(&Scope::Public { template: public.template.clone() }));
            split = p.min(n);
            key.extend(self.tokens[..split].iter().map(|&t| KeyElem::Token(t)));
        }
        key.push(cache.scope(&Scope::Tenant { tenant: self.req.tenant.clone(), salt: self.req.salt.clone() }));
        key.extend(self.tokens[split..n].iter().map(|&t| KeyElem::Token(t)));
        key
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
