//! The integration tests of `cachet-context`, in one binary (one link instead of one per file).

mod common;
mod context;
mod outline;
mod replay;
mod rules;
mod selection;
mod stability;
mod store;
