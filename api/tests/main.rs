//! The integration tests of `cachet-api` (the `cachet` binary, its CLI and `cachet serve`), in one binary (one link instead of one per file).

mod cli;
mod models_hf;
mod models_pull;
mod serve;
mod session_prompt;
