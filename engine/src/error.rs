//! Errors of loading a model and of running it.

use crate::gguf::GgufError;
use cachet_kernels::backend::BackendError;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// The GGUF container is malformed.
    #[error("GGUF: {0}")]
    Gguf(#[from] GgufError),
    /// Another model file is malformed.
    #[error("{path}: {reason}")]
    BadFile { path: String, reason: String },
    /// Hyper-parameters are missing or inconsistent.
    #[error("model config: {0}")]
    BadConfig(String),
    /// A feature of the model this engine does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tensor the architecture needs is absent.
    #[error("tensor {0:?} not found")]
    MissingTensor(String),
    /// A tensor's shape does not match the config.
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    Shape { name: String, expected: Vec<usize>, found: Vec<usize> },
    /// The backend rejected a tensor or allocation.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// The tokenizer could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// Why a forward pass or generation step failed. None of these leave the
/// model or the KV pool in a broken state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A token id the model does not have.
    #[error("token id {token} is outside the vocabulary ({vocab} tokens)")]
    TokenOutOfRange { token: u32, vocab: usize },
    /// Request parameters out of range (the message names which).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A batch that does not describe its sequences consistently.
    #[error("invalid batch: {0}")]
    BadBatch(String),
    /// A sequence longer than the model's context window.
    #[error("{tokens} tokens exceed the context window of {limit}")]
    ContextTooLong { tokens: usize, limit: usize },
    /// The KV pool has no room for the tokens.
    #[error("the KV pool has {free} free slots, {needed} needed")]
    OutOfSlots { needed: usize, free: usize },
    /// The backend failed.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// Tokenizing or detokenizing failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}
