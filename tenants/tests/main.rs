//! The integration tests of `cachet-tenants`, in one binary (one link instead of one per file).

mod cluster;
mod common;
mod fanout;
mod jwt;
mod reports;
mod store;
