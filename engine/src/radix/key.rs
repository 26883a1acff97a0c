//! The keys of the radix cache: token ids and the scope markers that
//! namespace them. A scope marker takes no KV slot; it only makes keys that
//! start the same under different scopes diverge.

use std::collections::HashMap;
use std::sync::Arc;

/// An opaque tenant identity, as the engine knows it (the service derives
/// it from the authenticated tenant, never from a request body).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantKey(pub Arc<str>);

impl TenantKey {
    pub fn new(s: impl Into<Arc<str>>) -> TenantKey {
        TenantKey(s.into())
    }
}

impl std::fmt::Display for TenantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A namespace of the cache.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The operator's public system prompt of one chat template: shared by
    /// every tenant.
    Public { template: Arc<str> },
    /// Everything a tenant sent, optionally narrowed by a client-chosen salt
    /// (e.g. per end user). A salt can only split a tenant's namespace.
    Tenant { tenant: TenantKey, salt: Option<Arc<str>> },
}

/// Interned [`Scope`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScopeId(pub u32);

/// One element of a cache key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyElem {
    Scope(ScopeId),
    Token(u32),
}

impl KeyElem {
    pub fn is_token(self) -> bool {
        matches!(self, KeyElem::Token(_))
    }
}

/// Interning table of scopes. Ids of scopes no node refers to any more are reused (see
/// [`crate::radix::RadixCache::compact_tables`]).
#[derive(Debug, Default)]
pub(crate) struct ScopeTable {
    ids: HashMap<Scope, ScopeId>,
    scopes: Vec<Option<Scope>>,
    free: Vec<u32>,
}

impl ScopeTable {
    pub(crate) fn intern(&mut self, scope: &Scope) -> ScopeId {
        if let Some(&id) = self.ids.get(scope) {
            return id;
        }
        let id = match self.free.pop() {
            Some(i) => {
                self.scopes[i as usize] = Some(scope.clone());
                ScopeId(i)
            }
            None => {
                self.scopes.push(Some(scope.clone()));
                ScopeId(self.scopes.len() as u32 - 1)
            }
        };
        self.ids.insert(scope.clone(), id);
        id
    }

    pub(crate) fn get(&self, id: ScopeId) -> Option<&Scope> {
        self.scopes.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Scopes interned now.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Forgets every scope not in `live`; their ids become free.
    pub(crate) fn retain(&mut self, live: &std::collections::HashSet<ScopeId>) {
        let free = &mut self.free;
        let scopes = &mut self.scopes;
        self.ids.retain(|_, id| {
            let keep = live.contains(id);
            if !keep {
                scopes[id.0 as usize] = None;
                free.push(id.0);
            }
            keep
        });
    }
}

/// A provenance tag: which version of which source a token span came from
/// (for repository context: the file path and its blob id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    pub source: Arc<str>,
    pub version: Arc<str>,
}

/// A tagged span of a key, in key-element positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub range: std::ops::Range<usize>,
    pub tag: Tag,
}

/// A retention key (e.g. a session id): nodes a live key covers are evicted
/// after their tenant's unretained nodes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RetentionKey(pub Arc<str>);
