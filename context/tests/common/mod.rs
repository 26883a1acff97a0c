//! Shared test helpers: a deterministic word tokenizer.
#![allow(dead_code)]

pub mod synth;

use cachet_context::TokenCounter;

/// One token per whitespace-separated word (its FNV-1a hash) and one per newline. Splits only at
/// whitespace, so blocks that end in '\n' tokenize independently.
pub struct Words;

pub const NEWLINE: u32 = 1;

impl TokenCounter for Words {
    fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut word = String::new();
        for c in text.chars() {
            if c.is_whitespace() {
                if !word.is_empty() {
                    out.push(fnv(&word));
                    word.clear();
                }
                if c == '\n' {
                    out.push(NEWLINE);
                }
            } else {
                word.push(c);
            }
        }
        if !word.is_empty() {
            out.push(fnv(&word));
        }
        out
    }
}

/// [`Words`] with a cache id, so a builder shares tokenizations across builds.
pub struct NamedWords;

impl TokenCounter for NamedWords {
    fn encode(&self, text: &str) -> Vec<u32> {
        Words.encode(text)
    }
    fn cache_id(&self) -> Option<String> {
        Some("words-v1".into())
    }
}

fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    h.max(2)
}
