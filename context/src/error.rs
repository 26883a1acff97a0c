//! The one error type of the crate.

/// Why a context operation failed.
///
/// [`ContextError::is_client_error`] separates what the caller sent wrong (a 4xx at the API) from
/// failures on our side or of a remote (a 5xx / 502).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// A repository source that registration refuses (bad URL scheme, path outside the allowed root, …).
    #[error("refused repository source: {0}")]
    BadSource(String),
    /// A repository-relative path that is not acceptable (absolute, `..`, empty, …).
    #[error("bad path: {0}")]
    BadPath(String),
    /// No such mirror, file or commit.
    #[error("not found: {0}")]
    NotFound(String),
    /// A branch or revision that does not exist (or is not a valid name).
    #[error("unknown ref: {0}")]
    UnknownRef(String),
    /// Context options that cannot be used (an invalid glob, …).
    #[error("bad options: {0}")]
    BadOptions(String),
    /// A file larger than the caller's limit (found from its header, without reading it).
    #[error("too large: {0}")]
    TooLarge(String),
    /// A libgit2 failure: corrupt repository, … (libgit2's error kept as the source).
    #[error("git: {}", .0.message())]
    Git(#[from] git2::Error),
    /// Fetching from the remote failed (unreachable, refused, not a repository, timed out). The
    /// message is libgit2's: it names what answered and how, so it is for the operator's log;
    /// a tenant learns only that the fetch failed (a tenant's URL must not make a port scanner).
    #[error("fetch: {0}")]
    Fetch(String),
    /// A file-system failure on our side (the I/O error kept as the source).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl ContextError {
    /// True when the caller's input is at fault (bad source, bad path, unknown ref, not found, bad
    /// options).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            Self::BadSource(_)
                | Self::BadPath(_)
                | Self::NotFound(_)
                | Self::UnknownRef(_)
                | Self::BadOptions(_)
                | Self::TooLarge(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::ContextError;
    use std::error::Error;

    /// libgit2's and the file system's errors stay reachable as sources (an operator's log of
    /// `{:#}` shows the chain), and the message keeps libgit2's text alone.
    #[test]
    fn sources_are_kept() {
        let e = ContextError::from(git2::Error::from_str("object not found"));
        assert_eq!(e.to_string(), "git: object not found");
        assert!(e.source().and_then(|s| s.downcast_ref::<git2::Error>()).is_some());
        let e = ContextError::from(std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied"));
        assert_eq!(e.to_string(), "io: denied");
        assert!(e.source().and_then(|s| s.downcast_ref::<std::io::Error>()).is_some());
    }
}
