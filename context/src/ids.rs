//! Git object ids as lowercase hex strings.

use std::fmt;

/// A commit id (40 lowercase hex digits for SHA-1 repositories).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct CommitId(pub String);

/// A blob id: the identity of a file's bytes. A blob never changes, so anything derived from it can
/// be cached forever under this key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct BlobId(pub String);

impl CommitId {
    /// The hex string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub(crate) fn from_oid(oid: git2::Oid) -> Self {
        Self(oid.to_string())
    }
    /// Parses the hex back into an oid; `None` if it is not a full hex id.
    pub(crate) fn oid(&self) -> Option<git2::Oid> {
        full_hex_oid(&self.0)
    }
}

impl BlobId {
    /// The hex string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub(crate) fn from_oid(oid: git2::Oid) -> Self {
        Self(oid.to_string())
    }
}

fn full_hex_oid(s: &str) -> Option<git2::Oid> {
    let ok = (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
    if ok {
        git2::Oid::from_str(s).ok()
    } else {
        None
    }
}

impl fmt::Display for CommitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for BlobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
