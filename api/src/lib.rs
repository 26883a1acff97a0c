//! cachet-api: the `cachet` service and command line.
//!
//! [`startup::Application`] builds the service from [`config::Settings`]
//! (database, secrets, ledger, HTTP server, model loading) so that tests can
//! run it on a random port; `main.rs` only parses the command line.

pub mod auth;
pub mod cli;
pub mod config;
pub mod context;
pub mod device;
pub mod error;
pub mod fanout;
#[doc(hidden)]
pub mod fuzz;
pub mod ledger;
pub mod models;
pub mod openai;
pub mod prefixes;
pub mod ratelimit;
pub mod registration;
pub mod reports;
pub mod routes;
pub mod sessions;
pub mod startup;
pub mod state;
pub mod sweeper;
pub mod telemetry;
