//! The cache's interning tables (scopes, provenance sources and versions, retention keys) and
//! their compaction. Every request can bring a new scope (a tenant's end user), a new retention
//! key (a session) or new sources; the tables would only grow. Compaction keeps what some node
//! of the tree still refers to (and retention keys still in force) and frees the rest, so the
//! tables stay proportional to what the cache holds.

use super::{KeyElem, RadixCache};
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Instant;

/// Values to small ids; freed ids are reused.
#[derive(Debug)]
pub(crate) struct Interner<K> {
    ids: HashMap<K, u32>,
    free: Vec<u32>,
    next: u32,
}

impl<K> Default for Interner<K> {
    fn default() -> Self {
        Interner { ids: HashMap::new(), free: Vec::new(), next: 0 }
    }
}

impl<K: Hash + Eq + Clone> Interner<K> {
    pub(crate) fn intern(&mut self, k: &K) -> u32 {
        if let Some(&id) = self.ids.get(k) {
            return id;
        }
        let id = self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        self.ids.insert(k.clone(), id);
        id
    }

    pub(crate) fn get<Q: Hash + Eq + ?Sized>(&self, k: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
    {
        self.ids.get(k).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Forgets every value whose id is not in `live`; those ids become free.
    pub(crate) fn retain(&mut self, live: &HashSet<u32>) {
        let free = &mut self.free;
        self.ids.retain(|_, id| {
            let keep = live.contains(id);
            if !keep {
                free.push(*id);
            }
            keep
        });
    }
}

impl RadixCache {
    /// Entries in the interning tables (scopes, sources, versions, retention keys).
    pub fn interned(&self) -> usize {
        self.scopes.len() + self.sources.len() + self.versions.len() + self.retention_ids.len()
    }

    /// Compacts the interning tables once they have grown to twice what the last compaction
    /// kept (plus some slack): amortized constant time per entry interned. `held`: the scope
    /// markers of keys held outside the tree (see [`RadixCache::compact_tables`]), read only if
    /// the tables are compacted.
    pub fn compact_tables_if_grown<I: IntoIterator<Item = KeyElem>>(&mut self, now: Instant, held: impl FnOnce() -> I) {
        if self.interned() > 2 * self.interned_kept + 256 {
            self.compact_tables(now, held());
        }
    }

    /// Frees every interned scope, source, version and retention key that no node refers to;
    /// retention keys that expired are dropped from the nodes first (they protect nothing any
    /// more). Scopes in `held` stay: the markers of keys built once and kept outside the tree (a
    /// queued request's), whose ids must not be given to another scope while they are held.
    pub fn compact_tables(&mut self, now: Instant, held: impl IntoIterator<Item = KeyElem>) {
        self.retention_until.retain(|_, until| *until > now);
        let in_force: HashSet<u32> = self.retention_until.keys().copied().collect();
        let (mut scopes, mut sources, mut versions) = (HashSet::new(), HashSet::new(), HashSet::new());
        scopes.extend(held.into_iter().filter_map(|e| match e {
            KeyElem::Scope(id) => Some(id),
            KeyElem::Token(_) => None,
        }));
        for node in self.nodes.iter_mut().filter(|n| n.alive) {
            if let Some(&KeyElem::Scope(id)) = node.key.first() {
                scopes.insert(id);
            }
            for &(source, version, _) in &node.tags {
                sources.insert(source);
                versions.insert(version);
            }
            node.retention.retain(|r| in_force.contains(r));
        }
        self.scopes.retain(&scopes);
        self.sources.retain(&sources);
        self.versions.retain(&versions);
        self.tagged.retain(|source, _| sources.contains(source));
        self.retention_ids.retain(&in_force);
        self.interned_kept = self.interned();
    }
}
