//! `cachet`: reads the command line, sets up logging, runs the command.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cachet_api::cli::Cli::parse();
    let _telemetry = match cachet_api::telemetry::init(cli.log_format) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match cachet_api::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
