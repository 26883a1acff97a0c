//! cachet-context: the repository context of a session — a repository read at an exact commit,
//! outlined with tree-sitter, ranked, fitted to a token budget and rendered stable-first, with the
//! provenance (path, blob id, token range) of every block.
//!
//! - [`RepoStore`] keeps one bare mirror per registered repository and validates registration
//!   sources; [`Mirror`] reads files, diffs and history at exact commits.
//! - [`ContextBuilder::build`] turns a mirror at a commit into a [`RepoContext`]: outlines and full
//!   files chosen by rank within the budget (the choice does not depend on the order), then ordered
//!   (by default the files least likely to change first, from the repository's own history).
//! - [`replay`] measures, over a real history, how much of the context a push leaves reusable.
//! - [`testing::TestRepo`] writes real git repositories for tests.
//!
//! ```
//! use cachet_context::{testing::TestRepo, ContextBuilder, ContextOptions, Mirror, TokenCounter};
//!
//! struct Words;
//! impl TokenCounter for Words {
//!     fn encode(&self, text: &str) -> Vec<u32> {
//!         text.split_inclusive(char::is_whitespace).map(|w| w.len() as u32).collect()
//!     }
//! }
//!
//! let dir = tempfile::tempdir().unwrap();
//! let repo = TestRepo::init(dir.path()).unwrap();
//! let head = repo.commit(&[("src/lib.rs", Some("pub fn answer() -> u32 { 42 }\n"))], "first").unwrap();
//! let mirror = Mirror::open_path(repo.path()).unwrap();
//! let ctx = ContextBuilder::new(1000).build(&mirror, &head, &ContextOptions::default(), &Words).unwrap();
//! assert!(ctx.text.contains("### src/lib.rs (full)"));
//! assert_eq!(ctx.segments.last().unwrap().tokens.end, ctx.tokens.len());
//! ```

pub mod builder;
mod cap;
pub mod context;
pub mod error;
mod history;
pub mod ids;
mod manifest;
pub mod options;
mod order;
pub mod outline;
mod rank;
mod refs;
mod render;
pub mod replay;
mod rules;
mod select;
mod snapshot;
mod stability;
pub mod store;
mod terse;
pub mod testing;
mod token_cache;
pub mod tokens;
mod usefulness;

pub use builder::ContextBuilder;
pub use context::{RepoContext, Segment, SegmentKind};
pub use error::ContextError;
pub use ids::{BlobId, CommitId};
pub use options::{ContextOptions, FileRules, Order};
pub use refs::{DefinitionShown, DefinitionsVisible};
pub use stability::StabilityModel;
pub use store::{
    set_network_timeouts, Change, ChangeKind, FileAt, Mirror, RepoStore, Source, SourcePolicy, WorktreeSnapshot,
    MAX_WORKTREE_CHANGES, MAX_WORKTREE_FILE_BYTES, WORKTREE_REFS,
};
pub use tokens::TokenCounter;
