//! The tokenizer seam: the context crate counts and records tokens without knowing the model.

/// Turns text into token ids.
///
/// Contract: deterministic (the same text always gives the same ids), and `encode(a + b)` equals
/// `encode(a) + encode(b)` whenever `a` ends with `'\n'` and `b` starts with a non-whitespace
/// character (true of byte-level BPE with the Qwen2/Llama-3 pre-tokenizer, and of any tokenizer that
/// does not merge across a newline). Context blocks are cut at exactly such points and tokenized
/// one by one.
pub trait TokenCounter: Send + Sync {
    /// The token ids of `text` (no special tokens added).
    fn encode(&self, text: &str) -> Vec<u32>;

    /// A name that identifies this tokenizer's vocabulary (e.g. the model's tokenizer hash). When
    /// `Some`, a [`crate::ContextBuilder`] caches block tokenizations under it across builds; when
    /// `None` (the default) nothing is cached across builds.
    fn cache_id(&self) -> Option<String> {
        None
    }
}
