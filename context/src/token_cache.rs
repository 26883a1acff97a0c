//! Block tokenizations, cached by what the block's text is a function of.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use moka::sync::Cache;

use crate::context::SegmentKind;
use crate::{ContextError, TokenCounter};

/// A block's identity for tokenization: the tokenizer and (kind, path, version), which determine the
/// block's text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct TokenKey {
    pub tokenizer: Arc<str>,
    pub kind: SegmentKind,
    pub path: String,
    pub version: String,
}

/// Tokenizations shared across builds (only for tokenizers with a [`TokenCounter::cache_id`]).
pub(crate) type TokenCache = Cache<TokenKey, Arc<[u32]>>;

/// The tokenizer of one build, with the shared cache when the tokenizer names itself and a cache
/// local to the build otherwise.
pub(crate) struct Tokens<'a> {
    counter: &'a dyn TokenCounter,
    tokenizer: Arc<str>,
    shared: Option<&'a TokenCache>,
    local: RefCell<HashMap<TokenKey, Arc<[u32]>>>,
}

impl<'a> Tokens<'a> {
    pub(crate) fn new(counter: &'a dyn TokenCounter, shared: &'a TokenCache) -> Self {
        let id = counter.cache_id();
        Tokens {
            counter,
            tokenizer: Arc::from(id.as_deref().unwrap_or("")),
            shared: id.is_some().then_some(shared),
            local: RefCell::new(HashMap::new()),
        }
    }

    /// The tokens of the block (kind, path, version), rendering it with `render` on a miss.
    pub(crate) fn get(
        &self,
        kind: SegmentKind,
        path: &str,
        version: &str,
        render: impl FnOnce() -> Result<String, ContextError>,
    ) -> Result<Arc<[u32]>, ContextError> {
        let key =
            TokenKey { tokenizer: self.tokenizer.clone(), kind, path: path.to_string(), version: version.to_string() };
        if let Some(t) = self.local.borrow().get(&key) {
            return Ok(t.clone());
        }
        if let Some(t) = self.shared.and_then(|c| c.get(&key)) {
            self.local.borrow_mut().insert(key, t.clone());
            return Ok(t);
        }
        let tokens: Arc<[u32]> = self.counter.encode(&render()?).into();
        if let Some(c) = self.shared {
            c.insert(key.clone(), tokens.clone());
        }
        self.local.borrow_mut().insert(key, tokens.clone());
        Ok(tokens)
    }
}
