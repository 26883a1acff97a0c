//! `cachet`: reads the command line, sets up logging, runs the command.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cachet_api::cli::Cli::parse();
    cachet_api::telemetry::init(cli.log_format);
    match cachet_api::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
