//! Freeing cache memory: eviction (LRU over unlocked leaves, tenants above
//! their share and unretained nodes first), invalidation by provenance, and
//! retention keys; plus the integrity check.

use super::*;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Eviction order: lower classes go first; within a class, least recently
/// used. A tenant within its share loses cache to another tenant's request
/// only when nothing else is left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    /// A tenant above its share, not retained.
    OverShare,
    /// A tenant above its share, retained by a live session.
    OverShareRetained,
    /// The requesting tenant's own nodes, within its share, not retained.
    Own,
    /// The requesting tenant's own nodes, retained.
    OwnRetained,
    /// Another tenant within its share, not retained.
    Other,
    /// Another tenant within its share, retained.
    OtherRetained,
    /// The public scope (shared by every tenant): last.
    Public,
}

impl RadixCache {
    fn retained(&self, node: &Node, now: Instant) -> bool {
        node.retention.iter().any(|r| self.retention_until.get(r).is_some_and(|&until| until > now))
    }

    fn class(&self, id: NodeId, now: Instant, requester: Option<u32>) -> Class {
        let node = self.node(id);
        match node.owner {
            Owner::Public => Class::Public,
            Owner::Tenant(t) => {
                let state = &self.tenants[t as usize];
                match (state.usage > state.share, requester == Some(t), self.retained(node, now)) {
                    (true, _, false) => Class::OverShare,
                    (true, _, true) => Class::OverShareRetained,
                    (false, true, false) => Class::Own,
                    (false, true, true) => Class::OwnRetained,
                    (false, false, false) => Class::Other,
                    (false, false, true) => Class::OtherRetained,
                }
            }
        }
    }

    fn evictable_leaf(&self, id: NodeId) -> bool {
        let n = self.node(id);
        n.alive && id != self.root && !n.doomed && n.lock_ref == 0 && n.children.is_empty() && n.detached.is_empty()
    }

    /// Slots that eviction could free now (unlocked, attached nodes).
    pub fn evictable_slots(&self) -> usize {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| n.alive && !n.doomed && n.lock_ref == 0 && *i != self.root.0 as usize)
            .map(|(_, n)| n.slots.len())
            .sum()
    }

    /// Evicts whole unlocked leaves until at least `slots` slots are freed (or
    /// nothing evictable is left), for a request of `requester` (if any):
    /// tenants above their share first, then the requester's own nodes,
    /// then other tenants', the public scope last; unretained before retained;
    /// least recently used first. A leaf's class is re-checked when it comes
    /// up (its tenant may have dropped below its share meanwhile). Returns the
    /// freed slots.
    pub fn evict(&mut self, slots: usize, now: Instant, requester: Option<&TenantKey>) -> Vec<SlotId> {
        let mut freed = Vec::new();
        if slots == 0 {
            return freed;
        }
        let requester = requester.and_then(|t| self.tenant_ids.get(t).copied());
        let mut heap: BinaryHeap<Reverse<(Class, u64, NodeId)>> = (0..self.nodes.len() as u32)
            .map(NodeId)
            .filter(|&id| self.evictable_leaf(id))
            .map(|id| Reverse((self.class(id, now, requester), self.node(id).last_access, id)))
            .collect();
        while freed.len() < slots {
            let Some(Reverse((class, access, id))) = heap.pop() else { break };
            if !self.evictable_leaf(id) {
                continue;
            }
            let now_class = self.class(id, now, requester);
            if now_class != class {
                heap.push(Reverse((now_class, access, id)));
                continue;
            }
            let parent = self.node(id).parent.expect("only the root has no parent");
            let first = self.node(id).key[0];
            self.node_mut(parent).children.remove(&first);
            freed.extend(self.node(id).slots.iter().copied());
            self.release_node(id);
            if self.evictable_leaf(parent) {
                heap.push(Reverse((self.class(parent, now, requester), self.node(parent).last_access, parent)));
            }
        }
        freed
    }

    /// Invalidates every span of `source` (except those of `keep_version`):
    /// the node where a span starts is cut there, and it and its subtree
    /// become unreachable at once. Unlocked parts are freed now (returned);
    /// locked parts when their last lock goes ([`RadixCache::unlock`]).
    ///
    /// A span that another source declared too, with the same version at the
    /// same place (the same file in a fork or another branch of the
    /// repository, read by that source's requests), is still current for
    /// that source: only `source`'s tag leaves it, and the tokens stay cached
    /// for the other's requests (evicted by recency like any others).
    pub fn invalidate(&mut self, source: &str, keep_version: Option<&str>) -> Vec<SlotId> {
        let mut freed = Vec::new();
        let Some(sid) = self.sources.get(source) else { return freed };
        let keep = keep_version.and_then(|v| self.versions.get(v));
        let mut nodes: Vec<NodeId> = self.tagged.get(&sid).map(|s| s.iter().copied().collect()).unwrap_or_default();
        nodes.sort();
        for id in nodes {
            // Earlier cuts may have freed or doomed this node.
            while let Some((_, version, offset)) = self.first_span_of(id, sid, keep) {
                let n = self.node_mut(id);
                if !n.tags.iter().any(|t| t.0 != sid && t.1 == version && t.2 == offset) {
                    if offset > 0 {
                        self.split(id, offset as usize);
                    }
                    self.detach(id, &mut freed);
                    break;
                }
                // Shared: only this source's tag goes.
                n.tags.retain(|t| !(t.0 == sid && t.1 == version && t.2 == offset));
                if !n.tags.iter().any(|t| t.0 == sid) {
                    if let Some(set) = self.tagged.get_mut(&sid) {
                        set.remove(&id);
                    }
                }
            }
        }
        freed
    }

    /// The first span of source `sid` (other than version `keep`) that starts on node `id`, if
    /// the node is live.
    fn first_span_of(&self, id: NodeId, sid: u32, keep: Option<u32>) -> Option<(u32, u32, u32)> {
        let n = self.node(id);
        if !n.alive || n.doomed {
            return None;
        }
        n.tags.iter().filter(|t| t.0 == sid && Some(t.1) != keep).min_by_key(|t| t.2).copied()
    }

    /// Unhooks `id` from its parent. Everything below it that is not on a
    /// locked path is freed now; the locked paths stay (doomed, unreachable)
    /// until their locks go.
    fn detach(&mut self, id: NodeId, freed: &mut Vec<SlotId>) {
        self.unhook(id);
        if self.node(id).lock_ref == 0 {
            self.free_subtree(id, freed);
            return;
        }
        let parent = self.node(id).parent.expect("only the root has no parent");
        self.node_mut(parent).detached.push(id);
        let mut stack = vec![id];
        while let Some(n) = stack.pop() {
            self.node_mut(n).doomed = true;
            let children: Vec<NodeId> = self.node(n).children.values().copied().collect();
            for c in children {
                if self.node(c).lock_ref == 0 {
                    self.unhook(c);
                    self.free_subtree(c, freed);
                } else {
                    stack.push(c);
                }
            }
        }
    }

    /// Drops everything cached under `tenant`'s scopes (every salt): unlocked
    /// parts are freed now (returned), locked ones when their requests end.
    /// For a deleted tenant.
    pub fn purge_tenant(&mut self, tenant: &TenantKey) -> Vec<SlotId> {
        let mut freed = Vec::new();
        let Some(&t) = self.tenant_ids.get(tenant) else { return freed };
        let roots: Vec<NodeId> = (0..self.nodes.len() as u32)
            .map(NodeId)
            .filter(|&id| {
                let n = self.node(id);
                n.alive
                    && !n.doomed
                    && n.owner == Owner::Tenant(t)
                    && n.parent.is_some_and(|p| self.node(p).owner != n.owner)
            })
            .collect();
        for id in roots {
            if self.node(id).alive && !self.node(id).doomed {
                self.detach(id, &mut freed);
            }
        }
        freed
    }

    /// Keeps the nodes `key` covers (at inserts with it) behind their
    /// tenant's unretained nodes until `until`, or `release`.
    pub fn retain(&mut self, key: &RetentionKey, until: Instant) {
        let id = self.retention_id(key);
        self.retention_until.insert(id, until);
    }

    /// Ends a retention: its nodes are evictable like any other.
    pub fn release(&mut self, key: &RetentionKey) {
        if let Some(id) = self.retention_ids.get(key) {
            self.retention_until.remove(&id);
        }
    }

    /// Checks every structural invariant; tests call it after each operation.
    pub fn check_integrity(&self) -> Result<(), IntegrityError> {
        let err = |m: String| Err(IntegrityError(m));
        let root = self.node(self.root);
        if !root.alive || !root.key.is_empty() || root.parent.is_some() || !root.slots.is_empty() {
            return err("bad root".into());
        }
        let mut seen_slots = HashSet::new();
        let mut usage = vec![0usize; self.tenants.len()];
        let mut reachable = 0;
        let mut stack = vec![(self.root, false)];
        while let Some((id, doomed)) = stack.pop() {
            reachable += 1;
            let n = self.node(id);
            if !n.alive {
                return err(format!("{id:?} is reachable but dead"));
            }
            if n.doomed != doomed {
                return err(format!("{id:?} doomed={} under a doomed={doomed} parent", n.doomed));
            }
            if id != self.root && n.key.is_empty() {
                return err(format!("{id:?} has an empty edge"));
            }
            if n.key.iter().skip(1).any(|e| !e.is_token()) {
                return err(format!("{id:?} has a scope marker inside its edge"));
            }
            if n.slots.len() != n.key.iter().filter(|e| e.is_token()).count() {
                return err(format!("{id:?} has {} slots for its tokens", n.slots.len()));
            }
            for s in &n.slots {
                if !seen_slots.insert(*s) {
                    return err(format!("slot {s:?} is held twice"));
                }
            }
            if let Owner::Tenant(t) = n.owner {
                usage[t as usize] += n.slots.len();
            }
            let expected_owner = match n.parent {
                Some(p) => self.owner_of(n.key[0], p),
                None => Owner::Public,
            };
            if n.owner != expected_owner {
                return err(format!("{id:?} has owner {:?}, expected {expected_owner:?}", n.owner));
            }
            let mut below = 0;
            if n.doomed && n.lock_ref == 0 {
                return err(format!("doomed {id:?} has no locks left but was not freed"));
            }
            for (first, &c) in &n.children {
                let child = self.node(c);
                if child.parent != Some(id) || child.key.first() != Some(first) {
                    return err(format!("{c:?} is listed under {first:?} of {id:?} but does not match"));
                }
                below += child.lock_ref;
                stack.push((c, doomed));
            }
            for &c in &n.detached {
                let child = self.node(c);
                if child.parent != Some(id) || !child.doomed || child.lock_ref == 0 {
                    return err(format!("detached {c:?} of {id:?} is not a locked doomed child"));
                }
                below += child.lock_ref;
                stack.push((c, true));
            }
            if n.lock_ref != n.locks + below {
                return err(format!("{id:?} lock_ref {} != own {} + below {below}", n.lock_ref, n.locks));
            }
            for &(s, _, off) in &n.tags {
                if off as usize >= n.key.len() {
                    return err(format!("{id:?} has a tag past its edge"));
                }
                if !self.tagged.get(&s).is_some_and(|set| set.contains(&id)) {
                    return err(format!("{id:?} is tagged but not indexed"));
                }
            }
        }
        if reachable != self.nodes.len() - self.free_nodes.len() {
            return err(format!("{reachable} reachable nodes, {} live", self.nodes.len() - self.free_nodes.len()));
        }
        for (t, state) in self.tenants.iter().enumerate() {
            if state.usage != usage[t] {
                return err(format!("tenant {} usage {} != {}", state.key, state.usage, usage[t]));
            }
        }
        for (s, set) in &self.tagged {
            for id in set {
                let n = self.node(*id);
                if !n.alive || !n.tags.iter().any(|t| t.0 == *s) {
                    return err(format!("index lists {id:?} for a source it does not carry"));
                }
            }
        }
        Ok(())
    }
}
