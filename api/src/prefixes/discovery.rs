//! Discovery of public-prefix candidates: openings that many distinct tenants send.
//!
//! Every chat, Responses or completions prompt is cut at block boundaries ([`BLOCK`] tokens);
//! each cut is identified by a chained hash of the tokens before it, and each hash counts the
//! distinct tenants (by a keyed hash of their id) that sent it. Only hashes are kept for an
//! opening one tenant sent; the tokens of an opening are kept (in memory only, never written
//! anywhere) once a second tenant has sent it, so that the operator can read it and register it.
//! Nothing becomes public here: a candidate is shown to the operator, who decides (an automatic
//! promotion would let an attacker holding k − 1 tenants learn whether a victim sent a guessed
//! prefix, by watching it become public).

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

/// Openings are cut every this many tokens.
pub const BLOCK: usize = 256;
/// Blocks of a prompt that count (openings longer than this are counted at this length).
const MAX_BLOCKS: usize = 256;
/// Openings remembered; past this the least recently sent ones with a single tenant go first.
const MAX_ENTRIES: usize = 16_384;
/// Distinct tenants counted per opening (the count shows as at least this many past it).
const MAX_TENANTS: usize = 1_000;
/// Tokens kept for the openings of several tenants, all together.
const MAX_KEPT_TOKENS: usize = 4 << 20;

/// One opening.
#[derive(Debug)]
struct Seen {
    blocks: usize,
    tenants: HashSet<u64>,
    /// When it was last sent (a counter of observations).
    last: u64,
    /// The tokens of a request that sent it (they begin with this opening), once several tenants have.
    tokens: Option<Arc<[u32]>>,
}

/// A candidate as the operator sees it.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The opening's hash (hex): its id.
    pub id: String,
    pub tokens: Arc<[u32]>,
    pub len: usize,
    pub tenants: usize,
}

/// The counts (one per server; behind a mutex in [`super::PublicPrefixes`]).
#[derive(Debug)]
pub struct Discovery {
    seen: HashMap<u64, Seen>,
    keys: RandomState,
    clock: u64,
    kept_tokens: usize,
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery { seen: HashMap::new(), keys: RandomState::new(), clock: 0, kept_tokens: 0 }
    }
}

impl Discovery {
    /// Counts a prompt `tenant` sent.
    pub fn observe(&mut self, tenant: &str, tokens: &[u32]) {
        let blocks = (tokens.len() / BLOCK).min(MAX_BLOCKS);
        if blocks == 0 {
            return;
        }
        self.clock += 1;
        let who = self.keys.hash_one(tenant);
        let mut chain = 0u64;
        let mut shared: Option<Arc<[u32]>> = None;
        for b in 1..=blocks {
            let mut h = self.keys.build_hasher();
            chain.hash(&mut h);
            tokens[(b - 1) * BLOCK..b * BLOCK].hash(&mut h);
            chain = h.finish();
            let entry =
                self.seen.entry(chain).or_insert(Seen { blocks: b, tenants: HashSet::new(), last: 0, tokens: None });
            entry.last = self.clock;
            if entry.tenants.len() < MAX_TENANTS {
                entry.tenants.insert(who);
            }
            if entry.tenants.len() >= 2 && entry.tokens.is_none() && self.kept_tokens + b * BLOCK <= MAX_KEPT_TOKENS {
                let kept = shared.get_or_insert_with(|| tokens[..blocks * BLOCK].into()).clone();
                self.kept_tokens += b * BLOCK;
                entry.tokens = Some(kept);
            }
        }
        if self.seen.len() > MAX_ENTRIES {
            self.shrink();
        }
    }

    /// Forgets the least recently sent quarter of the openings, those of one tenant first.
    fn shrink(&mut self) {
        let mut order: Vec<(bool, u64, u64)> =
            self.seen.iter().map(|(&h, s)| (s.tenants.len() > 1, s.last, h)).collect();
        order.sort_unstable();
        for &(_, _, h) in order.iter().take(self.seen.len() / 4) {
            if let Some(s) = self.seen.remove(&h) {
                if s.tokens.is_some() {
                    self.kept_tokens -= s.blocks * BLOCK;
                }
            }
        }
    }

    /// Openings sent by at least `min_tenants` tenants, longest first; an opening is left out
    /// when a longer one that begins with it was sent by as many tenants (it says nothing more).
    pub fn candidates(&self, min_tenants: usize) -> Vec<Candidate> {
        let mut all: Vec<Candidate> = self
            .seen
            .iter()
            .filter(|(_, s)| s.tenants.len() >= min_tenants.max(2))
            .filter_map(|(h, s)| {
                s.tokens.as_ref().map(|t| Candidate {
                    id: format!("{h:016x}"),
                    tokens: t.clone(),
                    len: s.blocks * BLOCK,
                    tenants: s.tenants.len(),
                })
            })
            .collect();
        all.sort_by(|a, b| b.len.cmp(&a.len).then(b.tenants.cmp(&a.tenants)).then(a.id.cmp(&b.id)));
        let mut kept: Vec<Candidate> = Vec::new();
        for c in all {
            let covered =
                kept.iter().any(|k| k.tenants >= c.tenants && k.tokens[..k.len].starts_with(&c.tokens[..c.len]));
            if !covered {
                kept.push(c);
            }
        }
        kept
    }

    /// A candidate by id.
    pub fn candidate(&self, id: &str) -> Option<Candidate> {
        let h = u64::from_str_radix(id, 16).ok()?;
        let s = self.seen.get(&h)?;
        let tokens = s.tokens.clone()?;
        Some(Candidate { id: id.to_string(), tokens, len: s.blocks * BLOCK, tenants: s.tenants.len() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(preamble: u32, tail: u32, blocks: usize) -> Vec<u32> {
        (0..blocks * BLOCK)
            .map(|i| if i < 2 * BLOCK { preamble * 10_000 + i as u32 } else { tail + i as u32 })
            .collect()
    }

    #[test]
    fn an_opening_three_tenants_sent_is_a_candidate_with_count_three_one_tenants_is_not() {
        let mut d = Discovery::default();
        // Three tenants open with the same two blocks, then go their own ways.
        for (tenant, tail) in [("a", 1_000_000), ("b", 2_000_000), ("c", 3_000_000)] {
            d.observe(tenant, &prompt(7, tail, 4));
        }
        // Tenant a also sends its own long opening twice: still one tenant.
        d.observe("a", &prompt(9, 5_000_000, 3));
        d.observe("a", &prompt(9, 5_000_000, 3));
        let c = d.candidates(2);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].len, c[0].tenants), (2 * BLOCK, 3));
        assert_eq!(&c[0].tokens[..2 * BLOCK], &prompt(7, 0, 2)[..]);
        assert!(d.candidates(4).is_empty());
        let again = d.candidate(&c[0].id).expect("found by id");
        assert_eq!(again.len, 2 * BLOCK);
        assert!(d.candidate("zz").is_none());
    }

    #[test]
    fn a_shorter_opening_with_more_tenants_is_listed_beside_the_longer_one() {
        let mut d = Discovery::default();
        // a and b share three blocks; c shares only the first two with them.
        let ab: Vec<u32> = (0..3 * BLOCK as u32).collect();
        d.observe("a", &ab);
        d.observe("b", &ab);
        let mut c = ab.clone();
        c[2 * BLOCK] = 999_999;
        d.observe("c", &c);
        let got: Vec<(usize, usize)> = d.candidates(2).iter().map(|c| (c.len, c.tenants)).collect();
        assert_eq!(got, [(3 * BLOCK, 2), (2 * BLOCK, 3)]);
    }

    #[test]
    fn memory_stays_bounded_whatever_the_tenants_send() {
        let mut d = Discovery::default();
        for i in 0..(MAX_ENTRIES as u32 / 2) {
            let p: Vec<u32> = (0..3 * BLOCK as u32).map(|t| t + i * 7919).collect();
            d.observe(&format!("t{i}"), &p);
        }
        assert!(d.seen.len() <= MAX_ENTRIES + MAX_BLOCKS, "{}", d.seen.len());
        // Short prompts count nothing.
        let before = d.seen.len();
        d.observe("x", &[1, 2, 3]);
        assert_eq!(d.seen.len(), before);
    }
}
