//! cachet-api: the `cachet` service and command line.
//!
//! [`startup::Application`] builds the service from [`config::Settings`]
//! (database, secrets, ledger, HTTP server, model loading) so that tests can
//! run it on a random port; `main.rs` only parses the command line. The modules and one
//! request's way through them: `docs/structures.md`.
//!
//! - The OpenAI-compatible endpoints: [`openai`] (chat, completions, the Responses API, tools
//!   and structured output); sessions over a repository: [`sessions`]; the other routes:
//!   [`routes`] (repositories, webhooks, tasks, usage, reports, admin, operations).
//! - Who is calling: [`auth`]; errors in OpenAI's shape: [`error`]; per-tenant limits:
//!   [`ratelimit`]; the usage ledger: [`ledger`]; logs and request ids: [`telemetry`].
//! - Settings: [`config`], checked when they load:
//!
//! ```
//! use cachet_api::config::{Overrides, Settings};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let file = dir.path().join("cachet.toml");
//! std::fs::write(&file, "[engine]\npolicy = \"fcfs\"\n").unwrap();
//! let at = |file| Overrides { config: Some(file), data_dir: Some(dir.path().into()), ..Overrides::default() };
//! let s = Settings::load(&at(file.clone())).unwrap();
//! assert_eq!(s.engine.policy, cachet_engine::runtime::Policy::Fcfs);
//! // A typo fails the load, with the key named.
//! std::fs::write(&file, "[engine]\npolicy = \"fsfc\"\n").unwrap();
//! assert!(Settings::load(&at(file)).unwrap_err().0.contains("engine.policy"));
//! ```

pub mod auth;
mod body_deadline;
pub mod cli;
pub mod config;
pub mod context;
pub mod device;
pub mod disagg;
pub mod error;
pub mod fanout;
#[doc(hidden)]
pub mod fuzz;
pub mod handoff;
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
pub mod watch;
