//! The repository store: one bare mirror per registered repository, read at exact commits.

mod local;
mod mirror;
mod net;
mod paths;
mod repo_store;
mod source;
pub(crate) mod tree;
mod worktree;

pub use mirror::{Change, ChangeKind, FileAt, Mirror};
pub use net::set_network_timeouts;
pub use repo_store::RepoStore;
pub use source::{Source, SourcePolicy};
pub use worktree::{WorktreeSnapshot, MAX_WORKTREE_CHANGES, MAX_WORKTREE_FILE_BYTES, WORKTREE_REFS};
