//! Registration sources: which repository locations a tenant may register, checked before any git
//! operation touches them.

use std::path::{Path, PathBuf};

use super::local::Confinement;
use crate::ContextError;

/// What a deployment allows as repository sources.
#[derive(Clone, Debug, Default)]
pub struct SourcePolicy {
    /// Local repositories must lie inside this directory (after resolving `..` and symlinks), and
    /// so must their git data (see `local`). `None` refuses every local source.
    pub allowed_root: Option<PathBuf>,
    /// The server's own directories (its data directory): no local source, nor its git data, may
    /// lie in one, unless the allowed root itself is inside it (then only the root's part is
    /// reachable). The mirrors directory always counts.
    pub private_dirs: Vec<PathBuf>,
    /// Accept remote URLs (`https://`, `http://`, `ssh://`, `git://`, scp-like `user@host:path`).
    pub allow_remote: bool,
    /// Hosts remote URLs may name: exact names, or `*.example.com` for any name below it. Empty:
    /// any host (subject to `allow_private_hosts`).
    pub allowed_hosts: Vec<String>,
    /// Let remote URLs reach hosts that resolve to loopback, private, link-local or reserved
    /// addresses (this machine, its database, the cloud's metadata service, the internal
    /// network). Off by default: a tenant's URL must not turn the server into a proxy.
    pub allow_private_hosts: bool,
    /// The longest a fetch of a remote mirror may take; None: no limit.
    pub fetch_timeout: Option<std::time::Duration>,
    /// The most bytes a fetch may download; None: no limit.
    pub max_fetch_bytes: Option<u64>,
}

/// A validated repository source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A local repository, as a canonical path inside the allowed root.
    Local(PathBuf),
    /// A remote clone URL.
    Remote(String),
}

impl Source {
    /// The location handed to git as the remote's URL.
    pub fn git_url(&self) -> String {
        match self {
            Source::Local(p) => p.to_string_lossy().into_owned(),
            Source::Remote(u) => u.clone(),
        }
    }
}

const REMOTE_SCHEMES: [&str; 4] = ["https", "http", "ssh", "git"];

/// The checks of [`crate::RepoStore::validate`]; the policy's root and private directories are
/// canonical, and no private directory contains the root.
pub(crate) fn validate_source(url: &str, policy: &SourcePolicy) -> Result<Source, ContextError> {
    let allow_remote = policy.allow_remote;
    let bad = |m: &str| Err(ContextError::BadSource(m.to_string()));
    if url.trim().is_empty() {
        return bad("empty repository source");
    }
    if url.len() > 4096 {
        return bad("repository source is too long");
    }
    if url.chars().any(char::is_control) {
        return bad("repository source contains control characters");
    }
    if url.starts_with('-') {
        return bad("repository source must not start with '-'");
    }
    if url != url.trim() {
        return bad("repository source has leading or trailing whitespace");
    }
    if let Some(scheme) = transport_helper(url) {
        return Err(ContextError::BadSource(format!("transport '{scheme}::' is not allowed")));
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        let scheme = scheme.to_ascii_lowercase();
        if scheme == "file" {
            return local_source(&file_url_path(rest)?, policy);
        }
        if !REMOTE_SCHEMES.contains(&scheme.as_str()) {
            return Err(ContextError::BadSource(format!(
                "scheme '{scheme}://' is not allowed (use https://, http://, ssh://, git:// or a local path)"
            )));
        }
        return remote_source(url, allow_remote, has_host(rest));
    }
    if is_scp_like(url) {
        return remote_source(url, allow_remote, true);
    }
    local_source(Path::new(url), policy)
}

/// `ext::cmd`, `fd::…` and other `<transport>::<address>` forms.
fn transport_helper(url: &str) -> Option<&str> {
    let (head, _) = url.split_once("::")?;
    let ok = !head.is_empty() && head.chars().all(|c| c.is_ascii_alphanumeric() || "+.-_".contains(c));
    ok.then_some(head)
}

fn has_host(rest: &str) -> bool {
    let authority = rest.split('/').next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    !host.is_empty() && !host.starts_with('-') && !host.contains(char::is_whitespace)
}

/// `user@host:path` (git's scp-like syntax), with a user part so a local path never matches.
fn is_scp_like(url: &str) -> bool {
    let Some((left, path)) = url.split_once(':') else { return false };
    let Some((user, host)) = left.split_once('@') else { return false };
    let word = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    word(user) && word(host) && !host.starts_with('-') && !path.is_empty() && !path.starts_with('-')
}

fn remote_source(url: &str, allow_remote: bool, has_host: bool) -> Result<Source, ContextError> {
    if !allow_remote {
        return Err(ContextError::BadSource("remote repositories are not allowed on this server".into()));
    }
    if !has_host {
        return Err(ContextError::BadSource("remote URL has no host".into()));
    }
    if url.contains(char::is_whitespace) {
        return Err(ContextError::BadSource("remote URL contains whitespace".into()));
    }
    Ok(Source::Remote(url.to_string()))
}

/// The path of `file://<rest>`: only an empty host or `localhost`, percent escapes decoded.
fn file_url_path(rest: &str) -> Result<PathBuf, ContextError> {
    let path = if let Some(p) = rest.strip_prefix("localhost/") {
        format!("/{p}")
    } else if rest.starts_with('/') {
        rest.to_string()
    } else {
        return Err(ContextError::BadSource("file:// URL must name an absolute local path (file:///…)".into()));
    };
    let decoded = percent_decode(&path)
        .ok_or_else(|| ContextError::BadSource("file:// URL has a malformed percent escape".into()))?;
    Ok(PathBuf::from(decoded))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            let b = u8::from_str_radix(hex, 16).ok()?;
            if b == 0 {
                return None;
            }
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A local repository: absolute, and a git repository all of whose data lies under the root and
/// outside the server's own directories (`local`). Every refusal past the syntactic checks says
/// the same words: which paths exist on the host is none of a tenant's business.
pub(crate) fn local_source(path: &Path, policy: &SourcePolicy) -> Result<Source, ContextError> {
    let Some(root) = policy.allowed_root.as_deref() else {
        return Err(ContextError::BadSource("local repositories are not allowed on this server".into()));
    };
    if !path.is_absolute() {
        return Err(ContextError::BadSource("a local repository must be given as an absolute path".into()));
    }
    let confinement = Confinement { root, private: &policy.private_dirs };
    confinement.check(path).map(Source::Local).ok_or_else(|| {
        ContextError::BadSource(format!(
            "local path {} is not a git repository under the allowed root whose git data stays there",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_helpers_are_recognized() {
        assert_eq!(transport_helper("ext::sh -c touch% /tmp/x"), Some("ext"));
        assert_eq!(transport_helper("fd::3"), Some("fd"));
        assert_eq!(transport_helper("https://host/a::b"), None);
    }

    #[test]
    fn scp_like_needs_user_and_host() {
        assert!(is_scp_like("git@github.com:org/repo.git"));
        assert!(!is_scp_like("/tmp/a:b"));
        assert!(!is_scp_like("git@-oProxyCommand=x:y"));
        assert!(!is_scp_like("git@host:-x"));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("/a%20b").as_deref(), Some("/a b"));
        assert_eq!(percent_decode("/a%2"), None);
        assert_eq!(percent_decode("/a%00"), None);
    }
}
