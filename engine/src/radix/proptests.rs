//! Property test: random sequences of insert / match / lock / unlock / evict /
//! invalidate against a naive model that stores every cached prefix with the
//! slot of its last token. `check_integrity()` after every step.

use super::*;
use proptest::prelude::*;
use std::time::Instant;

#[derive(Clone, Debug)]
enum Op {
    /// Insert reusing the slots of cached positions (as after a match).
    Insert {
        key: usize,
        span: Option<(usize, usize, u8)>,
    },
    /// Insert with fresh slots everywhere: cached positions come back as duplicates.
    InsertFresh {
        key: usize,
    },
    Match {
        key: usize,
        max_tokens: usize,
    },
    Lock {
        key: usize,
    },
    Unlock {
        which: usize,
    },
    Evict {
        slots: usize,
    },
    Invalidate {
        source: u8,
    },
}

/// Keys: public scope, 0-2 system tokens, a tenant scope (a, b or a salted
/// a), 0-6 tokens, from small alphabets so that keys share prefixes.
fn key_strategy() -> impl Strategy<Value = (Vec<u32>, u8, Vec<u32>)> {
    (prop::collection::vec(0u32..2, 0..3), 0u8..3, prop::collection::vec(0u32..4, 0..7))
}

fn op_strategy(n_keys: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..n_keys, prop::option::of((0usize..8, 1usize..4, 0u8..2)))
            .prop_map(|(key, span)| Op::Insert { key, span }),
        1 => (0..n_keys).prop_map(|key| Op::InsertFresh { key }),
        3 => (0..n_keys, 0usize..12).prop_map(|(key, max_tokens)| Op::Match { key, max_tokens }),
        2 => (0..n_keys).prop_map(|key| Op::Lock { key }),
        2 => (0usize..8).prop_map(|which| Op::Unlock { which }),
        2 => (1usize..8).prop_map(|slots| Op::Evict { slots }),
        1 => (0u8..2).prop_map(|source| Op::Invalidate { source }),
    ]
}

#[derive(Default)]
struct Model {
    /// Every matchable prefix → the slot of its last element (None: a scope).
    present: HashMap<Vec<KeyElem>, Option<SlotId>>,
    /// Slots the cache holds (matchable or waiting for a lock to go).
    held: HashSet<SlotId>,
    /// Span starts: (the prefix ending at the span's first element, source).
    spans: Vec<(Vec<KeyElem>, u8)>,
    /// Locks: (id, node, locked prefix, how much of it is still live: an
    /// invalidation cuts a lock's path, and the nodes past the cut are the
    /// old ones, not whatever is inserted under the same key later).
    locks: Vec<(u32, NodeId, Vec<KeyElem>, usize)>,
    next_lock: u32,
    /// Invalidated entries on locked paths: (slot, the locks holding it),
    /// freed when the last of those locks goes.
    doomed: Vec<(Option<SlotId>, HashSet<u32>)>,
    next_slot: u32,
}

impl Model {
    fn matched(&self, key: &[KeyElem], max_tokens: usize) -> Vec<SlotId> {
        let mut slots = Vec::new();
        for i in 0..key.len() {
            match self.present.get(&key[..=i]) {
                None => break,
                Some(Some(s)) => {
                    if slots.len() == max_tokens {
                        break;
                    }
                    slots.push(*s);
                }
                Some(None) => {}
            }
        }
        slots
    }

    fn fresh(&mut self) -> SlotId {
        self.next_slot += 1;
        SlotId(self.next_slot)
    }

    /// Removes every prefix that has `root` as a prefix; returns them.
    fn remove_under(&mut self, root: &[KeyElem]) -> Vec<(Vec<KeyElem>, Option<SlotId>)> {
        let gone: Vec<Vec<KeyElem>> = self.present.keys().filter(|p| p.starts_with(root)).cloned().collect();
        let removed = gone.into_iter().map(|p| (p.clone(), self.present.remove(&p).flatten())).collect();
        self.spans.retain(|(start, _)| self.present.contains_key(start));
        removed
    }

    fn locked_slots(&self) -> HashSet<SlotId> {
        let mut out = HashSet::new();
        for (_, _, prefix, live) in &self.locks {
            for i in 0..*live {
                if let Some(Some(s)) = self.present.get(&prefix[..=i]) {
                    out.insert(*s);
                }
            }
        }
        out
    }
}

fn run(keys: Vec<(Vec<u32>, u8, Vec<u32>)>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let mut cache = RadixCache::new(64, 1.0);
    let now = Instant::now();
    let public = cache.scope(&Scope::Public { template: "t".into() });
    let tenants = [
        cache.scope(&Scope::Tenant { tenant: TenantKey::new("a"), salt: None }),
        cache.scope(&Scope::Tenant { tenant: TenantKey::new("b"), salt: None }),
        cache.scope(&Scope::Tenant { tenant: TenantKey::new("a"), salt: Some("s".into()) }),
    ];
    let keys: Vec<Vec<KeyElem>> = keys
        .into_iter()
        .map(|(sys, t, rest)| {
            let mut k = vec![public];
            k.extend(sys.into_iter().map(KeyElem::Token));
            k.push(tenants[t as usize]);
            k.extend(rest.into_iter().map(KeyElem::Token));
            k
        })
        .collect();
    let sources: [Arc<str>; 2] = ["s0".into(), "s1".into()];
    let mut m = Model::default();

    for op in ops {
        match op {
            Op::Insert { key, span } => {
                let k = &keys[key];
                let mut slots = Vec::new();
                for i in 0..k.len() {
                    if k[i].is_token() {
                        match m.present.get(&k[..=i]) {
                            Some(Some(s)) => slots.push(*s),
                            _ => slots.push(m.fresh()),
                        }
                    }
                }
                // Spans start at tokens (file contents), as the context builder's do.
                let spans: Vec<Span> = span
                    .filter(|(start, _, _)| *start < k.len() && k[*start].is_token())
                    .map(|(start, len, src)| Span {
                        range: start..(start + len).min(k.len()),
                        tag: Tag { source: sources[src as usize].clone(), version: "v".into() },
                    })
                    .into_iter()
                    .collect();
                let ins = cache.insert(k, &slots, &InsertOpts { spans: &spans, retention: None });
                prop_assert!(ins.duplicates.is_empty(), "reused slots came back as duplicates");
                let mut t = 0;
                for i in 0..k.len() {
                    let slot = if k[i].is_token() {
                        t += 1;
                        Some(slots[t - 1])
                    } else {
                        None
                    };
                    if !m.present.contains_key(&k[..=i]) {
                        m.present.insert(k[..=i].to_vec(), slot);
                        m.held.extend(slot);
                    }
                }
                for s in &spans {
                    m.spans.push((k[..=s.range.start].to_vec(), if s.tag.source == sources[0] { 0 } else { 1 }));
                }
            }
            Op::InsertFresh { key } => {
                let k = &keys[key];
                let slots: Vec<SlotId> = k.iter().filter(|e| e.is_token()).map(|_| m.fresh()).collect();
                let ins = cache.insert(k, &slots, &InsertOpts::default());
                let mut expected = Vec::new();
                let mut t = 0;
                for i in 0..k.len() {
                    let slot = if k[i].is_token() {
                        t += 1;
                        Some(slots[t - 1])
                    } else {
                        None
                    };
                    if m.present.contains_key(&k[..=i]) {
                        expected.extend(slot);
                    } else {
                        m.present.insert(k[..=i].to_vec(), slot);
                        m.held.extend(slot);
                    }
                }
                prop_assert_eq!(ins.duplicates, expected);
            }
            Op::Match { key, max_tokens } => {
                let got = cache.match_prefix(&keys[key], max_tokens);
                prop_assert_eq!(got.slots, m.matched(&keys[key], max_tokens));
            }
            Op::Lock { key } => {
                let got = cache.match_prefix(&keys[key], usize::MAX);
                prop_assert_eq!(&got.slots, &m.matched(&keys[key], usize::MAX));
                cache.lock(got.node);
                m.next_lock += 1;
                m.locks.push((m.next_lock, got.node, keys[key][..got.len].to_vec(), got.len));
            }
            Op::Unlock { which } => {
                if m.locks.is_empty() {
                    continue;
                }
                let (id, node, _, _) = m.locks.remove(which % m.locks.len());
                let freed: HashSet<SlotId> = cache.unlock(node).into_iter().collect();
                let mut expected = HashSet::new();
                m.doomed.retain_mut(|(slot, holders)| {
                    holders.remove(&id);
                    if holders.is_empty() {
                        expected.extend(*slot);
                        false
                    } else {
                        true
                    }
                });
                prop_assert_eq!(&freed, &expected);
                for s in &freed {
                    m.held.remove(s);
                }
            }
            Op::Evict { slots } => {
                let freed = cache.evict(slots, now, None);
                let locked = m.locked_slots();
                for s in &freed {
                    prop_assert!(m.held.remove(s), "evicted a slot it did not hold");
                    prop_assert!(!locked.contains(s), "evicted a locked slot");
                }
                if freed.len() < slots {
                    prop_assert_eq!(cache.evictable_slots(), 0);
                }
                let gone: Vec<Vec<KeyElem>> = m
                    .present
                    .iter()
                    .filter(|(_, s)| s.is_some_and(|s| freed.contains(&s)))
                    .map(|(p, _)| p.clone())
                    .collect();
                for p in gone {
                    m.remove_under(&p);
                }
            }
            Op::Invalidate { source } => {
                let freed: HashSet<SlotId> = cache.invalidate(&sources[source as usize], None).into_iter().collect();
                // A span the other source declared at the same place stays (both use one
                // version here): only this source's tag goes. The others are cut.
                let shared =
                    |p: &Vec<KeyElem>, spans: &[(Vec<KeyElem>, u8)]| spans.iter().any(|(q, s)| *s != source && q == p);
                let spans = m.spans.clone();
                m.spans.retain(|(p, s)| !(*s == source && shared(p, &spans)));
                // Outermost cuts of this source.
                let mut cuts: Vec<Vec<KeyElem>> = m
                    .spans
                    .iter()
                    .filter(|(p, s)| *s == source && m.present.contains_key(p))
                    .map(|(p, _)| p.clone())
                    .collect();
                cuts.sort_by_key(|c| c.len());
                cuts.dedup();
                let mut roots: Vec<Vec<KeyElem>> = Vec::new();
                for c in cuts {
                    if !roots.iter().any(|r| c.starts_with(r)) {
                        roots.push(c);
                    }
                }
                // Prefixes on a locked path stay (doomed); the rest are freed.
                let mut expected = HashSet::new();
                for r in roots {
                    for (prefix, slot) in m.remove_under(&r) {
                        let holders: HashSet<u32> = m
                            .locks
                            .iter()
                            .filter(|(_, _, l, live)| l[..*live].starts_with(&prefix))
                            .map(|(id, ..)| *id)
                            .collect();
                        if holders.is_empty() {
                            expected.extend(slot);
                        } else {
                            m.doomed.push((slot, holders));
                        }
                    }
                    for (_, _, l, live) in m.locks.iter_mut() {
                        if l[..*live].starts_with(&r) {
                            *live = r.len() - 1;
                        }
                    }
                }
                prop_assert_eq!(&freed, &expected);
                for s in &freed {
                    m.held.remove(s);
                }
            }
        }
        if let Err(e) = cache.check_integrity() {
            return Err(TestCaseError::fail(e.to_string()));
        }
        prop_assert_eq!(cache.cached_slots(), m.held.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn radix_cache_matches_the_naive_model(
        keys in prop::collection::vec(key_strategy(), 6),
        ops in prop::collection::vec(op_strategy(6), 1..60),
    ) {
        run(keys, ops)?;
    }
}
