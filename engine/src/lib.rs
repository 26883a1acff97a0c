//! cachet-engine: cachet's inference engine.
//!
//! Loading a model:
//! - [`gguf`]: the GGUF container (reader and writer).
//! - [`config`], [`weights`]: hyper-parameters and tensors from GGUF files or
//!   Hugging Face safetensors directories; [`loader`] puts them together.
//! - [`tokenizer`]: byte-level BPE from the GGUF vocabulary or `tokenizer.json`, and the
//!   incremental decoder that never breaks UTF-8; [`chat_template`]: the model's Jinja template.
//!
//! Running it:
//! - [`model::Model`]: the generic Qwen2 / Llama / Qwen3 decoder and its
//!   batched forward pass over a slot-indexed KV pool ([`kv_pool::KvPool`]).
//! - [`sampler`]: penalties, greedy / top-k / top-p / min-p, seeded; [`output`]: text, stop
//!   strings and stop tokens of one request.
//! - [`constraint`]: grammars (JSON Schema, regex, Lark) that a request's output
//!   must match, enforced token by token with llguidance.
//! - [`generate`]: one request alone (the CLI's `generate`, tests).
//! - [`radix`]: the prefix cache (token prefixes → KV slots, namespaced by scope, with
//!   provenance tags and per-tenant shares).
//! - [`runtime`]: the engine thread serving many requests, and its [`runtime::EngineHandle`];
//!   inside it one owner of K/V memory (the pool's slots, the prefix cache, the disk tier).
//! - [`kv_transfer`]: the checksummed, versioned record a chunk of cached K/V leaves the pool
//!   as, and [`kv_transfer::disk::DiskTier`], a directory of them: the engine's disk tier, and
//!   what a prefill server sends a decode server and a replica hands the next.
//! - [`testing`]: tiny random-weight models written as GGUF or safetensors, for tests.
//!
//! Serving a request with a tiny model the example writes itself:
//!
//! ```
//! use cachet_engine::generate::GenerateParams;
//! use cachet_engine::radix::TenantKey;
//! use cachet_engine::runtime::{self, EngineConfig, Request};
//! use cachet_engine::testing::{Tiny, TinyArch};
//! use cachet_kernels::cpu::CpuBackend;
//! use cachet_kernels::quant::DType;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("tiny.gguf");
//! Tiny::random(TinyArch::Qwen2, 7, false).write_gguf(DType::Q8_0, &path).unwrap();
//! let backend = CpuBackend::new(1).unwrap();
//! let loaded = cachet_engine::loader::load(&path, &backend).unwrap();
//! let engine = runtime::start(backend, loaded, EngineConfig::default()).unwrap();
//! let params = GenerateParams { max_tokens: 4, ..Default::default() };
//! let request = Request::new(TenantKey::new("tenant-a"), vec![1, 2, 3], params);
//! let done = engine.submit(request).collect_blocking();
//! assert_eq!(done.tokens.len(), 4);
//! assert_eq!(done.result.unwrap().output_tokens, 4);
//! ```

pub mod config;
pub mod constraint;
mod error;
pub mod generate;
pub mod gguf;
pub mod host_weights;
pub mod kv_pool;
pub mod kv_transfer;
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
