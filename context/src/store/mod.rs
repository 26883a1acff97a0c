//! The repository store: one bare mirror per registered repository, read at exact commits.

mod local;
mod mirror;
mod net;
mod paths;
mod repo_store;
mod source;
pub(crate) mod tree;

pub use mirror::{Change, ChangeKind, FileAt, Mirror};
pub use net::set_network_timeouts;
pub use repo_store::RepoStore;
pub use source::{Source, SourcePolicy};
