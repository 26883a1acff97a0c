//! cachet-engine: cachet's inference engine.
//!
//! - [`gguf`]: the GGUF container (reader and writer).
//! - [`config`], [`weights`]: hyper-parameters and tensors from GGUF files or
//!   Hugging Face safetensors directories.
//! - [`model::Model`]: the generic Qwen2 / Llama / Qwen3 decoder and its
//!   batched forward pass over a slot-indexed KV pool ([`kv_pool::KvPool`]).
//! - [`constraint`]: grammars (JSON Schema, regex, Lark) that a request's output
//!   must match, enforced token by token with llguidance.

pub mod config;
pub mod constraint;
mod error;
pub mod generate;
pub mod gguf;
pub mod kv_pool;
pub mod loader;
pub mod model;
pub mod output;
pub mod sampler;
pub mod weights;

pub use error::{EngineError, LoadError};
pub mod chat_template;
pub mod radix;
pub mod runtime;
pub mod testing;
pub mod tokenizer;
