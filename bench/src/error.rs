//! The crate's error type.

use std::path::PathBuf;

/// What can go wrong while preparing, running or reporting a benchmark.
///
/// A failed *request* is not an error: it is recorded in its
/// [`RequestRecord`](crate::RequestRecord) and counted in the summary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The source repository could not be opened or read.
    #[error("reading the source repository {path}: {source}")]
    Git {
        /// The repository path given.
        path: PathBuf,
        /// What libgit2 said.
        #[source]
        source: git2::Error,
    },
    /// The source repository holds too little text to build prompts from.
    #[error("the source repository {0} has no usable text files at HEAD")]
    NoSourceText(PathBuf),
    /// A command-line or API argument is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Reading or writing a file failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("writing", "reading").
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A results file is not valid JSON of the expected shape.
    #[error("parsing results file {path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The warm-up request before a scenario failed, so the target is not usable.
    #[error("the warm-up request to {target} failed: {message}")]
    Warmup {
        /// The target's name.
        target: String,
        /// Why it failed.
        message: String,
    },
}

impl BenchError {
    /// An [`BenchError::Io`] for `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> BenchError {
        BenchError::Io { action, path: path.into(), source }
    }
}
