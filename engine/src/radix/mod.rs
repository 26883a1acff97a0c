//! The radix prefix cache: which token prefixes have their K/V in which pool
//! slots. The tree holds slot indices, never tensors, so splitting a node
//! copies nothing.
//!
//! Keys are sequences of [`KeyElem`]: scope markers and token ids. A prompt's
//! key is `Scope(Public(template))`, the operator's public system prompt,
//! `Scope(Tenant(tenant, salt))`, then everything else; so the public prompt
//! is shared by every tenant and nothing under one tenant's scope can ever
//! match another tenant's key. Scope markers only ever start an edge, so every
//! node belongs to one owner: the public scope or one tenant.
//!
//! Contracts:
//! - Slots returned by [`RadixCache::match_prefix`] stay valid while the
//!   returned node is locked ([`RadixCache::lock`]); unlocked nodes may be
//!   evicted by [`RadixCache::evict`] at any later call.
//! - Every slot the cache holds was handed to it by [`RadixCache::insert`] and
//!   is handed back exactly once, by `evict`, `invalidate` or `unlock`; the
//!   caller returns those to the pool.

mod evict;
mod intern;
mod key;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use key::{KeyElem, RetentionKey, Scope, ScopeId, Span, Tag, TenantKey};

use crate::kv_pool::SlotId;
use intern::Interner;
use key::ScopeTable;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A node of the tree (stable while the node lives).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(u32);

/// Who a node's slots count against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Public,
    Tenant(u32),
}

#[derive(Debug)]
struct Node {
    alive: bool,
    parent: Option<NodeId>,
    /// The edge from the parent: scope markers only at index 0.
    key: Vec<KeyElem>,
    /// One slot per token element of `key`, in order.
    slots: Vec<SlotId>,
    children: HashMap<KeyElem, NodeId>,
    /// Invalidated children still locked by running requests: unreachable by
    /// matching, freed when their last lock goes.
    detached: Vec<NodeId>,
    owner: Owner,
    /// Locks taken on this node itself.
    locks: u32,
    /// Locks on this node or anything below it.
    lock_ref: u32,
    last_access: u64,
    /// (source, version, offset in `key`) of spans that start here.
    tags: Vec<(u32, u32, u32)>,
    /// Retention keys covering this node.
    retention: Vec<u32>,
    /// Part of an invalidated subtree.
    doomed: bool,
}

impl Node {
    fn new(parent: Option<NodeId>, key: Vec<KeyElem>, slots: Vec<SlotId>, owner: Owner, now: u64) -> Node {
        Node {
            alive: true,
            parent,
            key,
            slots,
            children: HashMap::new(),
            detached: Vec::new(),
            owner,
            locks: 0,
            lock_ref: 0,
            last_access: now,
            tags: Vec::new(),
            retention: Vec::new(),
            doomed: false,
        }
    }
}

#[derive(Debug)]
struct TenantState {
    key: TenantKey,
    /// Slots held by this tenant's nodes.
    usage: usize,
    /// Slots this tenant may hold before its nodes are evicted first.
    share: usize,
}

/// Result of [`RadixCache::match_prefix`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match {
    /// The deepest node of the match (its edge ends exactly at `len`).
    pub node: NodeId,
    /// Key elements matched.
    pub len: usize,
    /// The slots of the matched token elements, in order.
    pub slots: Vec<SlotId>,
}

/// What to attach to an inserted key.
#[derive(Clone, Debug, Default)]
pub struct InsertOpts<'a> {
    /// Provenance spans (in key-element positions).
    pub spans: &'a [Span],
    /// A retention key covering the whole key.
    pub retention: Option<&'a RetentionKey>,
}

/// Result of [`RadixCache::insert`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inserted {
    /// The node whose edge ends at the end of the key.
    pub node: NodeId,
    /// The caller's slots for positions that were already cached under other
    /// slots: the cache did not take them; the caller frees them.
    pub duplicates: Vec<SlotId>,
}

/// A broken invariant found by [`RadixCache::check_integrity`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("radix cache integrity: {0}")]
pub struct IntegrityError(pub String);

/// The radix prefix cache.
#[derive(Debug)]
pub struct RadixCache {
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    root: NodeId,
    scopes: ScopeTable,
    tenants: Vec<TenantState>,
    tenant_ids: HashMap<TenantKey, u32>,
    /// Interned provenance sources and versions.
    sources: Interner<Arc<str>>,
    versions: Interner<Arc<str>>,
    /// Nodes carrying a tag of each source.
    tagged: HashMap<u32, HashSet<NodeId>>,
    retention_ids: Interner<RetentionKey>,
    /// Expiry of each live retention key (by id).
    retention_until: HashMap<u32, std::time::Instant>,
    /// Entries the interning tables kept at their last compaction.
    interned_kept: usize,
    /// See [`RadixCache::generation`].
    generation: u64,
    /// Walks of [`RadixCache::peek_prefix`] (tests count them).
    #[cfg(test)]
    pub(crate) peeks: std::cell::Cell<usize>,
    /// Logical clock for LRU.
    clock: u64,
    /// Pool size, for shares.
    capacity: usize,
    default_share: f64,
}

impl RadixCache {
    /// An empty cache over a pool of `capacity` slots; each tenant may hold
    /// `default_share` of it before its nodes are evicted first.
    pub fn new(capacity: usize, default_share: f64) -> RadixCache {
        let root = Node::new(None, Vec::new(), Vec::new(), Owner::Public, 0);
        RadixCache {
            nodes: vec![root],
            free_nodes: Vec::new(),
            root: NodeId(0),
            scopes: ScopeTable::default(),
            tenants: Vec::new(),
            tenant_ids: HashMap::new(),
            sources: Interner::default(),
            versions: Interner::default(),
            tagged: HashMap::new(),
            retention_ids: Interner::default(),
            retention_until: HashMap::new(),
            interned_kept: 0,
            generation: 0,
            #[cfg(test)]
            peeks: std::cell::Cell::new(0),
            clock: 0,
            capacity,
            default_share: default_share.clamp(0.0, 1.0),
        }
    }

    /// The key element of a scope.
    pub fn scope(&mut self, scope: &Scope) -> KeyElem {
        if let Scope::Tenant { tenant, .. } = scope {
            self.tenant_index(tenant);
        }
        KeyElem::Scope(self.scopes.intern(scope))
    }

    /// Sets the share of the pool `tenant` may hold before its nodes are the
    /// first to go (a fraction in [0, 1]).
    pub fn set_share(&mut self, tenant: &TenantKey, share: f64) {
        let t = self.tenant_index(tenant) as usize;
        self.tenants[t].share = (share.clamp(0.0, 1.0) * self.capacity as f64) as usize;
    }

    /// Slots held by `tenant`'s nodes.
    pub fn tenant_usage(&self, tenant: &TenantKey) -> usize {
        self.tenant_ids.get(tenant).map_or(0, |&t| self.tenants[t as usize].usage)
    }

    fn tenant_index(&mut self, tenant: &TenantKey) -> u32 {
        if let Some(&t) = self.tenant_ids.get(tenant) {
            return t;
        }
        let t = self.tenants.len() as u32;
        let share = (self.default_share * self.capacity as f64) as usize;
        self.tenants.push(TenantState { key: tenant.clone(), usage: 0, share });
        self.tenant_ids.insert(tenant.clone(), t);
        t
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.0 as usize]
    }

    /// Changes whenever a token path is added to or taken from the tree (never when only
    /// recency, locks, tags or retention change): a prefix length computed at one generation
    /// ([`RadixCache::peek_prefix`]) holds as long as the generation stays.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn alloc_node(&mut self, node: Node) -> NodeId {
        match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                NodeId(i)
            }
            None => {
                self.nodes.push(node);
                NodeId(self.nodes.len() as u32 - 1)
            }
        }
    }

    fn owner_of(&self, first: KeyElem, parent: NodeId) -> Owner {
        match first {
            KeyElem::Scope(id) => match self.scopes.get(id) {
                Some(Scope::Tenant { tenant, .. }) => Owner::Tenant(self.tenant_ids[tenant]),
                _ => Owner::Public,
            },
            KeyElem::Token(_) => self.node(parent).owner,
        }
    }

    /// Length of the common prefix of a node's edge and `key`, stopping
    /// after `max_tokens` token elements.
    fn common(&self, id: NodeId, key: &[KeyElem], max_tokens: usize) -> (usize, usize) {
        let edge = &self.node(id).key;
        let (mut l, mut tokens) = (0, 0);
        while l < edge.len() && l < key.len() && edge[l] == key[l] {
            if key[l].is_token() {
                if tokens == max_tokens {
                    break;
                }
                tokens += 1;
            }
            l += 1;
        }
        (l, tokens)
    }

    /// Splits `id` after `l` key elements: a new node takes the first part
    /// and becomes `id`'s parent. `id` keeps its identity (and its locks).
    fn split(&mut self, id: NodeId, l: usize) -> NodeId {
        let now = self.node(id).last_access;
        let node = self.node_mut(id);
        let n_tokens = node.key[..l].iter().filter(|e| e.is_token()).count();
        let upper_key: Vec<KeyElem> = node.key.drain(..l).collect();
        let upper_slots: Vec<SlotId> = node.slots.drain(..n_tokens).collect();
        let (upper_tags, lower_tags): (Vec<_>, Vec<_>) =
            node.tags.drain(..).partition(|&(_, _, off)| (off as usize) < l);
        node.tags = lower_tags.into_iter().map(|(s, v, off)| (s, v, off - l as u32)).collect();
        let (parent, owner, lock_ref, retention) = (node.parent, node.owner, node.lock_ref, node.retention.clone());
        let first_lower = node.key[0];
        let lower_sources: HashSet<u32> = node.tags.iter().map(|t| t.0).collect();
        let mut upper = Node::new(parent, upper_key, upper_slots, owner, now);
        upper.lock_ref = lock_ref;
        upper.retention = retention;
        upper.tags = upper_tags;
        upper.children.insert(first_lower, id);
        let first_upper = upper.key[0];
        let upper_sources: HashSet<u32> = upper.tags.iter().map(|t| t.0).collect();
        let uid = self.alloc_node(upper);
        self.node_mut(id).parent = Some(uid);
        if let Some(p) = parent {
            self.node_mut(p).children.insert(first_upper, uid);
        }
        for s in upper_sources {
            let set = self.tagged.entry(s).or_default();
            set.insert(uid);
            if !lower_sources.contains(&s) {
                set.remove(&id);
            }
        }
        uid
    }

    /// The longest cached prefix of `key` with at most `max_tokens` token
    /// elements, splitting a node where the match ends inside its edge.
    /// Touches the matched nodes (LRU). The result is valid until the next
    /// eviction unless `lock`ed.
    pub fn match_prefix(&mut self, key: &[KeyElem], max_tokens: usize) -> Match {
        let now = self.tick();
        let mut node = self.root;
        let (mut i, mut tokens) = (0, 0);
        let mut slots = Vec::new();
        while i < key.len() {
            let Some(&child) = self.node(node).children.get(&key[i]) else { break };
            let (l, t) = self.common(child, &key[i..], max_tokens - tokens);
            if l == 0 {
                break;
            }
            let full = l == self.node(child).key.len();
            let child = if full { child } else { self.split(child, l) };
            self.node_mut(child).last_access = now;
            slots.extend_from_slice(&self.node(child).slots);
            node = child;
            i += l;
            tokens += t;
            if !full {
                break;
            }
        }
        Match { node, len: i, slots }
    }

    /// Token elements of the longest cached prefix of `key`, without
    /// changing anything (an estimate for admission control).
    pub fn peek_prefix(&self, key: &[KeyElem]) -> usize {
        #[cfg(test)]
        self.peeks.set(self.peeks.get() + 1);
        let mut node = self.root;
        let (mut i, mut tokens) = (0, 0);
        while i < key.len() {
            let Some(&child) = self.node(node).children.get(&key[i]) else { break };
            let (l, t) = self.common(child, &key[i..], usize::MAX);
            i += l;
            tokens += t;
            if l < self.node(child).key.len() {
                break;
            }
            node = child;
        }
        tokens
    }

    /// Caches `key` with `slots` (one per token element). Positions already
    /// cached keep their slots; the caller's other slots for them come back
    /// in `duplicates`. Spans are tagged where they start; the retention key
    /// covers every node of the key.
    pub fn insert(&mut self, key: &[KeyElem], slots: &[SlotId], opts: &InsertOpts<'_>) -> Inserted {
        debug_assert_eq!(slots.len(), key.iter().filter(|e| e.is_token()).count());
        let now = self.tick();
        let retention = opts.retention.map(|k| self.retention_id(k));
        let mut node = self.root;
        let (mut i, mut s) = (0, 0);
        let mut duplicates = Vec::new();
        while i < key.len() {
            match self.node(node).children.get(&key[i]).copied() {
                Some(child) => {
                    let (l, t) = self.common(child, &key[i..], usize::MAX);
                    let child = if l < self.node(child).key.len() { self.split(child, l) } else { child };
                    let existing = &self.node(child).slots;
                    duplicates.extend(existing.iter().zip(&slots[s..s + t]).filter(|(a, b)| a != b).map(|(_, b)| *b));
                    self.touch(child, now, retention);
                    node = child;
                    i += l;
                    s += t;
                }
                None => {
                    // New edges, cut so that scope markers only start one.
                    self.generation += 1;
                    let mut start = i;
                    while start < key.len() {
                        let end =
                            key[start + 1..].iter().position(|e| !e.is_token()).map_or(key.len(), |p| start + 1 + p);
                        let t = key[start..end].iter().filter(|e| e.is_token()).count();
                        let owner = self.owner_of(key[start], node);
                        let mut new =
                            Node::new(Some(node), key[start..end].to_vec(), slots[s..s + t].to_vec(), owner, now);
                        new.retention.extend(retention);
                        let id = self.alloc_node(new);
                        self.node_mut(node).children.insert(key[start], id);
                        if let Owner::Tenant(o) = owner {
                            self.tenants[o as usize].usage += t;
                        }
                        node = id;
                        start = end;
                        s += t;
                    }
                    i = key.len();
                }
            }
        }
        self.tag_spans(key, opts.spans);
        Inserted { node, duplicates }
    }

    /// Tags the spans of `key` that start on its cached path (a running
    /// request declaring where its reused prefix came from).
    pub fn tag_spans(&mut self, key: &[KeyElem], spans: &[Span]) {
        for span in spans {
            if span.range.start < span.range.end && span.range.end <= key.len() {
                self.tag(key, span);
            }
        }
    }

    fn touch(&mut self, id: NodeId, now: u64, retention: Option<u32>) {
        let node = self.node_mut(id);
        node.last_access = now;
        if let Some(r) = retention {
            if !node.retention.contains(&r) {
                node.retention.push(r);
            }
        }
    }

    /// Records `span`'s tag on the node holding its first element.
    fn tag(&mut self, key: &[KeyElem], span: &Span) {
        let source = self.sources.intern(&span.tag.source);
        let version = self.versions.intern(&span.tag.version);
        let mut node = self.root;
        let mut i = 0;
        while let Some(&child) = self.node(node).children.get(&key[i]) {
            let len = self.node(child).key.len();
            if span.range.start < i + len {
                let tag = (source, version, (span.range.start - i) as u32);
                let n = self.node_mut(child);
                if !n.tags.contains(&tag) {
                    n.tags.push(tag);
                }
                self.tagged.entry(source).or_default().insert(child);
                return;
            }
            i += len;
            node = child;
            if i >= key.len() {
                return;
            }
        }
    }

    /// Pins the path from the root to `node`: none of it can be evicted
    /// until as many `unlock`s.
    pub fn lock(&mut self, node: NodeId) {
        self.node_mut(node).locks += 1;
        let mut cur = Some(node);
        while let Some(id) = cur {
            let n = self.node_mut(id);
            n.lock_ref += 1;
            cur = n.parent;
        }
    }

    /// Releases a `lock`. Returns the slots of invalidated nodes that were
    /// only waiting for this lock to go.
    pub fn unlock(&mut self, node: NodeId) -> Vec<SlotId> {
        let n = self.node_mut(node);
        debug_assert!(n.locks > 0, "unlock without lock");
        n.locks = n.locks.saturating_sub(1);
        let mut cur = Some(node);
        // The topmost invalidated node left without locks: it and everything
        // below it (all unlocked too) can go now.
        let mut free_from = None;
        while let Some(id) = cur {
            let n = self.node_mut(id);
            n.lock_ref = n.lock_ref.saturating_sub(1);
            if n.doomed && n.lock_ref == 0 {
                free_from = Some(id);
            }
            cur = n.parent;
        }
        let mut freed = Vec::new();
        if let Some(id) = free_from {
            self.unhook(id);
            self.free_subtree(id, &mut freed);
        }
        freed
    }

    /// Removes `id` from its parent's children (or detached list).
    fn unhook(&mut self, id: NodeId) {
        self.generation += 1;
        let Some(parent) = self.node(id).parent else { return };
        let first = self.node(id).key[0];
        let p = self.node_mut(parent);
        if p.children.get(&first) == Some(&id) {
            p.children.remove(&first);
        }
        p.detached.retain(|&d| d != id);
    }

    /// Whether a node is part of an invalidated subtree.
    pub fn is_doomed(&self, node: NodeId) -> bool {
        self.node(node).doomed
    }

    /// Key elements from the root to `node` that are not invalidated: a
    /// request holding `node` may re-insert only this much of its key.
    pub fn live_prefix_len(&self, node: NodeId) -> usize {
        let mut path = Vec::new();
        let mut cur = Some(node);
        while let Some(id) = cur {
            path.push(id);
            cur = self.node(id).parent;
        }
        path.iter().rev().take_while(|&&id| !self.node(id).doomed).map(|&id| self.node(id).key.len()).sum()
    }

    /// Slots held by the cache.
    pub fn cached_slots(&self) -> usize {
        self.nodes.iter().filter(|n| n.alive).map(|n| n.slots.len()).sum()
    }

    /// Frees `id` and everything below it (attached or detached).
    fn free_subtree(&mut self, id: NodeId, freed: &mut Vec<SlotId>) {
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            let node = self.node_mut(n);
            stack.extend(node.children.values().copied());
            stack.extend(node.detached.iter().copied());
            freed.extend(node.slots.iter().copied());
            self.release_node(n);
        }
    }

    /// Removes a node's bookkeeping (owner usage, tags) and recycles it.
    fn release_node(&mut self, id: NodeId) {
        self.generation += 1;
        let node = &mut self.nodes[id.0 as usize];
        node.alive = false;
        let (owner, n_slots) = (node.owner, node.slots.len());
        let sources: Vec<u32> = node.tags.iter().map(|t| t.0).collect();
        *node = Node::new(None, Vec::new(), Vec::new(), Owner::Public, 0);
        node.alive = false;
        if let Owner::Tenant(t) = owner {
            self.tenants[t as usize].usage -= n_slots;
        }
        for s in sources {
            if let Some(set) = self.tagged.get_mut(&s) {
                set.remove(&id);
            }
        }
        self.free_nodes.push(id.0);
    }

    fn retention_id(&mut self, key: &RetentionKey) -> u32 {
        self.retention_ids.intern(key)
    }
}
