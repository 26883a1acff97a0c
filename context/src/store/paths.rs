//! Checks on names that come from callers: repository-relative paths and revisions.

use crate::ContextError;

/// Accepts `a/b/c.rs`; refuses empty paths, absolute paths, `.`/`..`/empty components, NUL and
/// backslashes with [`ContextError::BadPath`].
pub(crate) fn check_repo_path(path: &str) -> Result<(), ContextError> {
    let bad = |m: &str| Err(ContextError::BadPath(format!("{m}: {path:?}")));
    if path.is_empty() {
        return bad("empty path");
    }
    if path.len() > 4096 {
        return bad("path too long");
    }
    if path.contains('\0') {
        return bad("path contains NUL");
    }
    if path.contains('\\') {
        return bad("path contains a backslash (use '/')");
    }
    if path.starts_with('/') {
        return bad("absolute path");
    }
    for component in path.split('/') {
        match component {
            "" => return bad("empty path component"),
            "." | ".." => return bad("'.' and '..' are not allowed"),
            _ => {}
        }
    }
    Ok(())
}

/// The full reference name of a branch given as `main` or `refs/heads/main`; `UnknownRef` when it is
/// not a valid branch name.
pub(crate) fn branch_ref(branch: &str) -> Result<String, ContextError> {
    let full = if branch.starts_with("refs/heads/") { branch.to_string() } else { format!("refs/heads/{branch}") };
    let valid = !branch.is_empty()
        && !branch.starts_with('-')
        && !branch.chars().any(char::is_control)
        && full.len() <= 1024
        && git2::Reference::is_valid_name(&full);
    if valid {
        Ok(full)
    } else {
        Err(ContextError::UnknownRef(format!("invalid branch name {branch:?}")))
    }
}

/// True for 4 to 64 hex digits: something that may be an (abbreviated) object id.
pub(crate) fn looks_like_sha(rev: &str) -> bool {
    (4..=64).contains(&rev.len()) && rev.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_paths() {
        assert!(check_repo_path("src/lib.rs").is_ok());
        assert!(check_repo_path(".github/workflows/ci.yml").is_ok());
        for bad in ["", "/etc/passwd", "a/../b", "./a", "a//b", "a/", "a\\b", "a\0b", ".."] {
            assert!(matches!(check_repo_path(bad), Err(ContextError::BadPath(_))), "{bad:?}");
        }
    }

    #[test]
    fn branch_names() {
        assert_eq!(branch_ref("main").unwrap(), "refs/heads/main");
        assert_eq!(branch_ref("refs/heads/feat/x").unwrap(), "refs/heads/feat/x");
        for bad in ["", "-x", "a..b", "a b", "a\nb", "x.lock", "@{1}"] {
            assert!(matches!(branch_ref(bad), Err(ContextError::UnknownRef(_))), "{bad:?}");
        }
    }
}
