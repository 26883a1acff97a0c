//! The integration tests of `cachet-engine`, in one binary (one link instead of one per file).

mod common;
mod constrained;
mod cuda_parity;
mod fidelity_qwen;
mod kv_tier;
mod logprobs;
mod moe_reference;
mod overload;
mod runtime;
mod speculative;
mod tiny_models;
mod tokenizer_reference;
mod yarn_reference;
