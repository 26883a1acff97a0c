//! `cachet-bench`: see the library for what it measures.

use clap::Parser;
use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = cachet_bench::cli::Cli::parse();
    match cachet_bench::cli::main(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Each error's message already includes its cause.
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
