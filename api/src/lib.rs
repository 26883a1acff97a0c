//! cachet-api: the `cachet` command line (and, later, the HTTP service).

pub mod cli;
pub mod models;
pub mod telemetry;
