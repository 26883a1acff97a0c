//! Drafts for speculative decoding without a second model: the tokens that followed the latest
//! earlier occurrence of the sequence's last few tokens, in its own prompt and output.
//!
//! Agents mostly write text that already exists — an edited file repeats the file, a tool call
//! repeats a path from the context, a patch repeats its context lines — so the continuation of
//! the longest recent n-gram match (4, 3, then 2 tokens) is often what the model writes next. A
//! draft is only a guess: every drafted token is checked by the model in the same pass (see
//! `step.rs`), and the output is exactly what decoding one token at a time gives.
//!
//! The index holds only this sequence's tokens. Where it has nothing, the draft may come from
//! the same tenant's recent answers ([`Recent`]: what followed the sequence's last 4 tokens in
//! one of them, each kept with the last tokens of its prompt) — a new session writing what an
//! earlier one wrote, an agent's tool call repeating an earlier one. Never from another tenant's
//! (whose decode speed would otherwise tell what that tenant wrote), nor across a tenant's cache
//! salts (its end users, when it keeps them apart).
//!
//! How many tokens to draft is the scheduler's choice (`plan_drafts`): from the drafter's running
//! estimate of how often its guesses are right (checked at every token, drafted or not: each
//! step the drafter's next-token guess is compared with the token sampled) and the measured cost
//! of passes of each size.

use crate::radix::TenantKey;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// N-gram lengths looked up, longest first.
const NGRAMS: [usize; 3] = [4, 3, 2];

/// What the acceptance estimate starts at.
const PRIOR: f64 = 0.5;

/// Weight of a new observation in the acceptance estimate (about the last 10 tokens count).
const LEARN: f64 = 0.1;

/// A sequence's n-gram index and acceptance estimate.
#[derive(Debug)]
pub(super) struct Drafter {
    /// Every n-gram ending before this position is indexed.
    indexed: usize,
    /// Hash of an n-gram (its length mixed in) → the position right after its latest occurrence.
    /// A lookup compares the tokens themselves, so a hash collision costs a missed draft only.
    index: HashMap<u64, u32>,
    /// Running estimate of the chance that the drafter's next guess is the token sampled.
    /// (Estimated apart after a check that was all right and after one that was not — guesses
    /// come right in runs — it drafted shorter on the code edit of `cachet bench --spec`: 4.95
    /// tokens a pass against 7.05, 1.64× against 1.78×.)
    pub accept: f64,
    /// The guess for the token the current step samples (compared with it afterwards).
    pub guess: Option<u32>,
}

impl Default for Drafter {
    fn default() -> Self {
        Drafter { indexed: 0, index: HashMap::new(), accept: PRIOR, guess: None }
    }
}

/// The hash of an n-gram.
fn hash(gram: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ gram.len() as u64;
    for &t in gram {
        h = (h ^ t as u64).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

impl Drafter {
    /// Indexes the n-grams of `tokens` that have a continuation (those ending before its last
    /// position); tokens only ever grow at the end while a sequence runs.
    fn update(&mut self, tokens: &[u32]) {
        let last = tokens.len().saturating_sub(1);
        for end in self.indexed..=last {
            for n in NGRAMS {
                if end >= n {
                    self.index.insert(hash(&tokens[end - n..end]), end as u32);
                }
            }
        }
        self.indexed = self.indexed.max(last + 1);
    }

    /// Up to `k` tokens to follow `tokens`, into `out` (emptied first): what followed the latest
    /// earlier occurrence of its longest indexed suffix. Where that runs into the end of
    /// `tokens` (a repeating pattern: the suffix last occurred a period ago), the draft goes on
    /// repeating it. Empty when nothing matches.
    fn propose(&mut self, tokens: &[u32], k: usize, out: &mut Vec<u32>) {
        out.clear();
        if k == 0 || tokens.is_empty() {
            return;
        }
        self.update(tokens);
        let len = tokens.len();
        for n in NGRAMS {
            if len <= n {
                continue;
            }
            let suffix = &tokens[len - n..];
            if let Some(&at) = self.index.get(&hash(suffix)) {
                let at = at as usize;
                if at >= n && at < len && &tokens[at - n..at] == suffix {
                    for i in 0..k {
                        let from = at + i;
                        out.push(if from < len { tokens[from] } else { out[from - len] });
                    }
                    return;
                }
            }
        }
    }

    /// [`Drafter::propose`], then, when the sequence's own text has nothing, its owner's recent
    /// answers ([`Recent::propose`]).
    pub fn propose_with(&mut self, tokens: &[u32], k: usize, recent: &Recent, owner: &Owner, out: &mut Vec<u32>) {
        self.propose(tokens, k, out);
        if out.is_empty() {
            recent.propose(owner, tokens, k, out);
        }
    }

    /// Updates the acceptance estimate with `hits` guesses that were right, then `misses` (0 or
    /// 1) that was not.
    pub fn observe(&mut self, hits: usize, misses: usize) {
        for _ in 0..hits {
            self.accept += LEARN * (1.0 - self.accept);
        }
        for _ in 0..misses {
            self.accept -= LEARN * self.accept;
        }
    }
}

/// Whose answers a draft may come from: a tenant, within one cache salt.
pub(super) type Owner = (TenantKey, Option<Arc<str>>);

/// Tokens of its prompt kept before each answer (what a new request's last tokens match when it
/// asks what an earlier one asked).
const LEAD_IN: usize = 16;

/// Recent answers kept per owner, in tokens (lead-ins included).
const PER_OWNER: usize = 16_384;

/// Recent answers kept in all, in tokens: past it the least recently used owner's oldest
/// answer goes (about 8 MB with the index).
const TOTAL: usize = 262_144;

/// The n-gram a recent answer is found by: longer than within a sequence, since it crosses
/// requests.
const RECENT_NGRAM: usize = 4;

/// Recent answers of each tenant (within a cache salt), for drafts: bounded per owner and in
/// all, the least recently used owner's oldest answers evicted first, like the cache.
#[derive(Debug, Default)]
pub(super) struct Recent {
    owners: HashMap<Owner, Texts>,
    total: usize,
    /// Uses so far (an owner's `used` is the last).
    tick: u64,
    /// Answers added so far (the next one's id).
    next_id: u64,
}

/// One owner's answers, oldest first, and the index of their n-grams.
#[derive(Debug, Default)]
struct Texts {
    docs: VecDeque<(u64, Vec<u32>)>,
    /// Hash of an n-gram → (answer id, position right after it), the latest occurrence.
    index: HashMap<u64, (u64, u32)>,
    tokens: usize,
    used: u64,
}

impl Texts {
    fn doc(&self, id: u64) -> Option<&[u32]> {
        let first = self.docs.front()?.0;
        let (got, doc) = self.docs.get(id.checked_sub(first)? as usize)?;
        (*got == id).then_some(doc.as_slice())
    }

    /// Drops the oldest answer and its index entries; its tokens.
    fn evict(&mut self) -> usize {
        let Some((id, doc)) = self.docs.pop_front() else { return 0 };
        for end in RECENT_NGRAM..doc.len() {
            let h = hash(&doc[end - RECENT_NGRAM..end]);
            if self.index.get(&h).is_some_and(|&(d, _)| d == id) {
                self.index.remove(&h);
            }
        }
        self.tokens -= doc.len();
        doc.len()
    }
}

impl Recent {
    /// Keeps `answer` (with the last [`LEAD_IN`] tokens of `prompt` before it) for `owner`.
    pub fn add(&mut self, owner: &Owner, prompt: &[u32], answer: &[u32]) {
        if answer.len() < RECENT_NGRAM {
            return;
        }
        let mut doc = prompt[prompt.len().saturating_sub(LEAD_IN)..].to_vec();
        doc.extend_from_slice(answer);
        doc.truncate(PER_OWNER);
        let (id, len) = (self.next_id, doc.len());
        self.next_id += 1;
        self.tick += 1;
        let texts = self.owners.entry(owner.clone()).or_default();
        texts.used = self.tick;
        while texts.tokens + len > PER_OWNER {
            self.total -= texts.evict();
        }
        for end in RECENT_NGRAM..len {
            texts.index.insert(hash(&doc[end - RECENT_NGRAM..end]), (id, end as u32));
        }
        texts.tokens += len;
        texts.docs.push_back((id, doc));
        self.total += len;
        while self.total > TOTAL {
            let Some(lru) = self.owners.iter().min_by_key(|(_, t)| t.used).map(|(o, _)| o.clone()) else { break };
            let texts = self.owners.get_mut(&lru).expect("just found");
            self.total -= texts.evict();
            if texts.docs.is_empty() {
                self.owners.remove(&lru);
            }
        }
    }

    /// Up to `k` tokens to follow `tokens`, from `owner`'s answers: what followed the latest
    /// occurrence of its last [`RECENT_NGRAM`] tokens, up to that answer's end.
    pub fn propose(&self, owner: &Owner, tokens: &[u32], k: usize, out: &mut Vec<u32>) {
        let (Some(texts), true) = (self.owners.get(owner), tokens.len() >= RECENT_NGRAM) else { return };
        let suffix = &tokens[tokens.len() - RECENT_NGRAM..];
        let Some(&(id, at)) = texts.index.get(&hash(suffix)) else { return };
        let Some(doc) = texts.doc(id) else { return };
        let at = at as usize;
        if at >= RECENT_NGRAM && &doc[at - RECENT_NGRAM..at] == suffix {
            out.extend(doc[at..].iter().take(k));
        }
    }

    /// Tokens held.
    #[cfg(test)]
    pub fn tokens(&self) -> usize {
        self.total
    }
}

impl super::Scheduler {
    /// Adds drafts to the decode chunks of `plan` (all of them one-token decodes so far) while
    /// they pay: each sequence in turn drafts the `k` tokens (at most `draft_tokens`, its
    /// output's and the context's room, the pass's budget) that maximize the tokens the pass is
    /// expected to produce per second of the pass — with the pass's cost at its new size as
    /// measured ([`super::pace::PassModel::cost`]) and each drafted token right with the
    /// drafter's estimated chance, given the ones before it were. Under a grammar the draft is
    /// cut at its first token the grammar would not allow (checked without moving the
    /// grammar's state: only sampled tokens are fed to it, so a rejected draft leaves nothing
    /// to roll back). A pre-warm, or a sequence whose drafter has nothing, does not draft; one
    /// that could but does not pay keeps its drafter's next-token guess, checked against the
    /// token sampled so that its estimate follows the text.
    pub(super) fn plan_drafts(&mut self, plan: &mut [super::plan::Planned], budget: &mut usize) {
        let max = self.cfg.draft_tokens;
        let mut tokens = plan.len();
        let Some(base) = self.pace.cost(tokens).filter(|&c| max > 0 && c > 0.0) else { return };
        let mut expect = tokens as f64;
        let mut rate = expect / base;
        let max_context = self.model.max_context;
        for p in plan.iter_mut() {
            let Some(seq) = self.running.iter_mut().find(|s| s.id == p.seq) else { continue };
            seq.draft.clear();
            seq.drafter.guess = None;
            if seq.req.prewarm || p.len != 1 {
                continue;
            }
            let left = seq.req.params.max_tokens.saturating_sub(seq.generated());
            let room = max_context.saturating_sub(seq.tokens.len());
            let cap = max.min(left.saturating_sub(1)).min(room).min(*budget);
            let owner = (seq.req.tenant.clone(), seq.req.salt.clone());
            seq.drafter.propose_with(&seq.tokens, cap.max(1), &self.recent, &owner, &mut seq.draft);
            let guess = seq.draft.first().copied();
            // Under a grammar, the draft ends at its first token the grammar would not allow.
            if let Some(c) = &mut seq.constraint {
                let allowed = c.allowed_prefix(&seq.draft);
                seq.draft.truncate(allowed);
            }
            let mut best = (0, rate);
            for k in 1..=seq.draft.len().min(cap) {
                let Some(cost) = self.pace.cost(tokens + k).filter(|&c| c > 0.0) else { break };
                let r = (expect + expected(seq.drafter.accept, k)) / cost;
                if r > best.1 {
                    best = (k, r);
                }
            }
            let k = best.0;
            seq.draft.truncate(k);
            if k == 0 {
                seq.drafter.guess = guess;
                continue;
            }
            if !self.kv.reserve_free(seq, k) {
                seq.draft.clear();
                seq.drafter.guess = guess;
                continue;
            }
            p.len += k;
            p.draft = k;
            tokens += k;
            *budget -= k;
            expect += expected(seq.drafter.accept, k);
            rate = best.1;
        }
    }
}

/// Tokens expected from a draft of `k` when each guess is right with chance `p` (given the
/// ones before it were): p + p² + … + pᵏ.
pub(super) fn expected(p: f64, k: usize) -> f64 {
    let mut sum = 0.0;
    let mut term = 1.0;
    for _ in 0..k {
        term *= p;
        sum += term;
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draft_continues_the_latest_earlier_occurrence_of_the_longest_suffix() {
        let propose = |d: &mut Drafter, tokens: &[u32], k| {
            let mut out = Vec::new();
            d.propose(tokens, k, &mut out);
            out
        };
        let mut d = Drafter::default();
        // "1 2 3 4 5 6 … 1 2 3 4 9 … 7 2 3 4": the 4-gram "2 3 4 ?" is not there, the 3-gram
        // "2 3 4" last came before 9.
        let tokens = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 9, 8, 7, 2, 3, 4];
        assert_eq!(propose(&mut d, &tokens, 3), [9, 8, 7]);
        assert_eq!(propose(&mut d, &tokens, 1), [9]);
        // A repeating pattern goes on repeating.
        let mut d = Drafter::default();
        assert_eq!(propose(&mut d, &[5, 6, 7, 5, 6], 8), [7, 5, 6, 7, 5, 6, 7, 5]);
        assert_eq!(propose(&mut Drafter::default(), &[1, 2, 3], 4), [] as [u32; 0]);
    }

    #[test]
    fn the_index_grows_with_the_tokens() {
        let mut d = Drafter::default();
        let mut out = Vec::new();
        let mut tokens = vec![10, 11, 12, 13];
        d.propose(&tokens, 4, &mut out);
        assert!(out.is_empty());
        tokens.extend([10, 11]);
        d.propose(&tokens, 4, &mut out);
        assert_eq!(out, [12, 13, 10, 11]);
    }

    #[test]
    fn the_estimate_follows_hits_and_misses_and_the_expectation_is_a_geometric_sum() {
        let mut d = Drafter::default();
        d.observe(10, 0);
        assert!(d.accept > 0.8);
        d.observe(0, 1);
        d.observe(0, 1);
        assert!(d.accept < 0.7);
        assert!((expected(0.5, 3) - 0.875).abs() < 1e-12);
        assert_eq!(expected(0.9, 0), 0.0);
    }

    #[test]
    fn recent_answers_draft_for_their_owner_only_and_stay_bounded() {
        let owner = |t: &str, salt: Option<&str>| (TenantKey::new(t), salt.map(Arc::from));
        let (a, a_user, b) = (owner("a", None), owner("a", Some("u1")), owner("b", None));
        let mut r = Recent::default();
        // A asked [1 2 3 4 5] and was answered [6 7 8 9 10].
        r.add(&a, &[1, 2, 3, 4, 5], &[6, 7, 8, 9, 10]);
        let propose = |r: &Recent, o: &Owner, tokens: &[u32], k| {
            let mut out = Vec::new();
            r.propose(o, tokens, k, &mut out);
            out
        };
        // Asked again (the prompt ends the same): the answer, from its start, up to its end.
        assert_eq!(propose(&r, &a, &[9, 2, 3, 4, 5], 3), [6, 7, 8]);
        assert_eq!(propose(&r, &a, &[4, 5, 6, 7], 8), [8, 9, 10]);
        // Another tenant, or the tenant's salted users, get nothing from it.
        assert!(propose(&r, &b, &[9, 2, 3, 4, 5], 3).is_empty());
        assert!(propose(&r, &a_user, &[9, 2, 3, 4, 5], 3).is_empty());
        // A drafter falls back to them only when the sequence's own text has nothing.
        let mut d = Drafter::default();
        let mut out = Vec::new();
        d.propose_with(&[2, 3, 4, 5], 2, &r, &a, &mut out);
        assert_eq!(out, [6, 7]);
        d.propose_with(&[2, 3, 4, 5, 1, 2, 3, 4, 5], 2, &r, &a, &mut out);
        assert_eq!(out, [1, 2], "its own text first");
        // Bounded: an owner keeps at most PER_OWNER tokens, the oldest answers going first.
        let long: Vec<u32> = (100..100 + PER_OWNER as u32 / 2).collect();
        r.add(&a, &[0], &long);
        r.add(&a, &[0], &long);
        assert!(r.tokens() <= PER_OWNER, "{}", r.tokens());
        assert!(propose(&r, &a, &[9, 2, 3, 4, 5], 3).is_empty(), "the first answer was evicted");
        assert_eq!(propose(&r, &a, &[100, 101, 102, 103], 2), [104, 105]);
        // And in all: the least recently used owner's answers go first.
        for t in 0..(TOTAL / (long.len() + 1) + 2) {
            r.add(&owner(&format!("t{t}"), None), &[0], &long);
        }
        assert!(r.tokens() <= TOTAL);
        assert!(propose(&r, &a, &[100, 101, 102, 103], 2).is_empty(), "A was the least recently used");
    }
}
