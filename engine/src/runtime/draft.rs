//! Drafts for speculative decoding without a second model: the tokens that followed the latest
//! earlier occurrence of the sequence's last few tokens, in its own prompt and output.
//!
//! Agents mostly write text that already exists — an edited file repeats the file, a tool call
//! repeats a path from the context, a patch repeats its context lines — so the continuation of
//! the longest recent n-gram match (4, 3, then 2 tokens) is often what the model writes next. A
//! draft is only a guess: every drafted token is checked by the model in the same pass (see
//! `step.rs`), and the output is exactly what decoding one token at a time gives.
//!
//! The index holds only this sequence's tokens: a draft never carries another request's text,
//! let alone another tenant's (whose decode speed would otherwise tell what that tenant wrote).
//!
//! How many tokens to draft is the scheduler's choice (`plan_drafts`): from the drafter's running
//! estimate of how often its guesses are right (checked at every token, drafted or not: each
//! step the drafter's next-token guess is compared with the token sampled) and the measured cost
//! of passes of each size.

use std::collections::HashMap;

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
    pub fn propose(&mut self, tokens: &[u32], k: usize, out: &mut Vec<u32>) {
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
            seq.drafter.propose(&seq.tokens, cap.max(1), &mut seq.draft);
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
}
