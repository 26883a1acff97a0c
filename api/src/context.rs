//! Repositories as the service uses them: the mirrors, each repository's
//! context options, and the contexts built at a commit — cached, since a
//! commit never changes. Everything here blocks (git, parsing, tokenizing):
//! call it from `spawn_blocking`.

use crate::config::{AfterPush, ContextSettings};
use crate::error::ApiError;
use cachet_context::{
    CommitId, ContextBuilder, ContextError, ContextOptions, FileRules, Mirror, RepoContext, RepoStore, SourcePolicy,
    TokenCounter,
};
use cachet_engine::tokenizer::Tokenizer;
use cachet_tenants::store::Repository;
use cachet_tenants::RepoId;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// What a tenant may set for a repository at registration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RepoOptions {
    /// Tokens of repository context per prompt (default: the server's).
    pub budget_tokens: Option<usize>,
    /// Which files are skipped (`max_file_bytes`, `exclude` and `include`
    /// globs, `skip_vendored`, `skip_generated`).
    #[schema(value_type = Object)]
    pub rules: FileRules,
    /// What a session's next turn sees after a push changed files in its context (default: the
    /// server's `[context] after_push`).
    pub after_push: Option<AfterPush>,
    /// Follow the working tree of a repository registered from a local path: uncommitted edits
    /// are in the context of its checked-out branch within a second or so (`crate::watch`).
    pub watch: bool,
}

/// The engine's tokenizer as the context crate's token counter (special
/// tokens in file contents stay plain text).
pub struct PlainTokens<'a>(pub &'a Tokenizer);

impl std::fmt::Debug for PlainTokens<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlainTokens")
    }
}

impl TokenCounter for PlainTokens<'_> {
    /// One served model per process: its tokenizer's vocabulary size and
    /// special tokens identify it well enough to share block tokenizations.
    fn cache_id(&self) -> Option<String> {
        Some(format!("{}:{:?}:{:?}", self.0.vocab_size(), self.0.bos_token(), self.0.eos_token()))
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        match self.0.encode(text, false) {
            Ok(ids) => ids,
            Err(e) => {
                // Plain text always encodes with a byte-level vocabulary.
                tracing::error!("tokenizing repository text failed: {e}");
                Vec::new()
            }
        }
    }
}

/// Mirrors, the context builder and built contexts.
pub struct Repos {
    pub store: RepoStore,
    builder: ContextBuilder,
    contexts: moka::sync::Cache<(RepoId, CommitId), Arc<RepoContext>>,
    settings: ContextSettings,
}

impl std::fmt::Debug for Repos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repos").field("contexts", &self.contexts.entry_count()).finish_non_exhaustive()
    }
}

impl Repos {
    /// Opens (creating if needed) the mirrors folder.
    pub fn new(settings: &ContextSettings, data_dir: &Path) -> Result<Repos, ContextError> {
        let mirrors = if settings.mirrors_dir.as_os_str().is_empty() {
            data_dir.join("mirrors")
        } else {
            settings.mirrors_dir.clone()
        };
        let allowed_root = Some(settings.allowed_root.clone()).filter(|p| !p.as_os_str().is_empty());
        let policy = SourcePolicy {
            allowed_root,
            // The ledger spool, secrets, the private cluster, the KV tier: never a source.
            private_dirs: vec![data_dir.to_path_buf()],
            allow_remote: settings.allow_remote,
            allowed_hosts: settings.allowed_hosts.clone(),
            allow_private_hosts: settings.allow_private_hosts,
            fetch_timeout: Some(std::time::Duration::from_secs(settings.fetch_timeout_secs.max(1))),
            max_fetch_bytes: Some(settings.max_fetch_bytes),
        };
        let store = RepoStore::new(mirrors, policy)?;
        if let Err(e) = cachet_context::set_network_timeouts() {
            tracing::warn!("libgit2 network timeouts not set: {e}");
        }
        Ok(Repos {
            store,
            builder: ContextBuilder::new(settings.outline_cache_entries),
            // Contexts are a few hundred KB each.
            contexts: moka::sync::Cache::new(256),
            settings: settings.clone(),
        })
    }

    /// Checks options sent at registration against the server's limits.
    pub fn check_options(&self, options: &RepoOptions) -> Result<(), ApiError> {
        match options.budget_tokens {
            Some(b) if b == 0 || b > self.settings.max_budget_tokens => Err(ApiError::bad_param(
                "options.budget_tokens",
                format!("budget_tokens must be between 1 and {}", self.settings.max_budget_tokens),
            )),
            _ => Ok(()),
        }
    }

    /// What a repository's options say, read from the stored JSON.
    fn stored(repo: &Repository) -> RepoOptions {
        serde_json::from_value(repo.options.clone()).unwrap_or_else(|e| {
            tracing::warn!(repo = %repo.id, "stored context options unreadable ({e}); using defaults");
            RepoOptions::default()
        })
    }

    /// Whether the repository's working tree is watched (`crate::watch`).
    pub fn watched(&self, repo: &Repository) -> bool {
        Self::stored(repo).watch
    }

    /// The commit `branch`'s context is built at: for a watched repository whose working tree
    /// has that branch checked out, the latest snapshot of the working tree; else the branch's
    /// head.
    pub fn head(&self, repo: &Repository, mirror: &Mirror, branch: &str) -> Result<CommitId, ContextError> {
        if self.watched(repo) {
            if let Some(snapshot) = mirror.worktree_head(branch)? {
                return Ok(snapshot);
            }
        }
        mirror.branch_head(branch)
    }

    /// What a session's next turn sees after a push to the repository.
    pub fn after_push(&self, repo: &Repository) -> AfterPush {
        Self::stored(repo).after_push.unwrap_or(self.settings.after_push)
    }

    /// The context options of a repository.
    pub fn options(&self, repo: &Repository) -> ContextOptions {
        let stored = Self::stored(repo);
        ContextOptions {
            budget_tokens: stored.budget_tokens.unwrap_or(self.settings.budget_tokens),
            rules: stored.rules,
            ..ContextOptions::default()
        }
    }

    /// The mirror of a registered repository.
    ///
    /// A replica that has no mirror of a registered repository yet (another replica took the
    /// registration, or its volume is new) creates it from the registered source, checked
    /// against this replica's source policy.
    pub fn mirror(&self, repo: &Repository) -> Result<Mirror, ContextError> {
        let id = mirror_id(repo.id);
        match self.store.mirror(&id) {
            Err(ContextError::NotFound(_)) => {
                let source = self.store.validate(&repo.source)?;
                tracing::info!(repo = %repo.id, "mirroring the repository on this replica (first use here)");
                self.store.create_mirror(&id, &source)
            }
            other => other,
        }
    }

    /// The repository's context at `commit` (built once per commit).
    pub fn context(
        &self,
        repo: &Repository,
        mirror: &Mirror,
        commit: &CommitId,
        tokenizer: &Tokenizer,
    ) -> Result<Arc<RepoContext>, ContextError> {
        let key = (repo.id, commit.clone());
        if let Some(hit) = self.contexts.get(&key) {
            return Ok(hit);
        }
        let started = std::time::Instant::now();
        let built = Arc::new(self.builder.build(mirror, commit, &self.options(repo), &PlainTokens(tokenizer))?);
        metrics::histogram!("cachet:context_build_seconds").record(started.elapsed().as_secs_f64());
        tracing::debug!(repo = %repo.id, %commit, tokens = built.tokens.len(), "built the repository context");
        self.contexts.insert(key, built.clone());
        Ok(built)
    }
}

/// A repository's mirror name.
pub fn mirror_id(repo: RepoId) -> String {
    repo.simple().to_string()
}

/// The cache tag source of a repository file as a branch's prompts hold
/// it: a push to one branch does not evict what other branches use alone.
pub fn tag_source(repo: RepoId, branch: &str, path: &str) -> String {
    format!("repo:{}:{branch}:{path}", repo.simple())
}
