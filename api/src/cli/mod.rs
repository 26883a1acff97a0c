//! The command line: `cachet serve`, `models pull`, `generate`, `bench`,
//! `tenants`, `token`, `public-prefixes`, `context`.

mod bench;
mod bench_grammar;
mod bench_kl;
mod bench_spec;
mod context;
mod generate;
mod prefixes;
pub mod report;
pub mod serve;

use crate::models::{self, ModelSpec, Progress, PullOptions};
use crate::telemetry::LogFormat;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

pub use bench::BenchArgs;
pub use generate::GenerateArgs;

/// cachet: an LLM backend for coding agents.
#[derive(Debug, Parser)]
#[command(name = "cachet", version, about)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t, env = "CACHET_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage model files.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Generate a completion on this machine and report its speed.
    Generate(GenerateArgs),
    /// Measure prompt and decode speed the way llama-bench does.
    Bench(BenchArgs),
    /// Run the service (OpenAI-compatible API, tenants, ledger).
    Serve(serve::ServeArgs),
    /// Manage tenants (the server's data folder or DATABASE_URL).
    Tenants {
        #[command(flatten)]
        data: serve::DataArgs,
        #[command(subcommand)]
        command: serve::TenantsCommand,
    },
    /// Public prefixes: prompt openings every tenant shares in the cache (agent preambles).
    PublicPrefixes {
        #[command(flatten)]
        data: serve::DataArgs,
        #[command(subcommand)]
        command: prefixes::PublicPrefixesCommand,
    },
    /// Usage and cost per successful task, by day, session, repository or task.
    Report(report::ReportArgs),
    /// Repository context: show it, or replay a history to measure reuse.
    #[command(subcommand)]
    Context(context::ContextCommand),
    /// Issue bearer tokens.
    Token {
        #[command(flatten)]
        data: serve::DataArgs,
        #[command(subcommand)]
        command: serve::TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Download a model (idempotent; verifies every hash): a catalogue name (default: the
    /// default model) or hf:OWNER/REPO/FILE.gguf[@REVISION]. Prints the file's path.
    Pull {
        /// A name from `cachet models list`, or hf:OWNER/REPO/FILE.gguf.
        name: Option<String>,
        /// Models folder (default: $CACHET_MODELS_DIR or ~/.cache/cachet/models).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The catalogue: each model's name, size, whether it is here, and what it is for.
    List {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print where a model lives (default: the default model), pulled or not.
    Path {
        name: Option<String>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Models(ModelsCommand::Pull { name, dir }) => {
            let dir = dir.unwrap_or_else(models::models_dir);
            let path = models::resolve(name.as_deref().unwrap_or("default"), &dir, Progress::Auto)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Models(ModelsCommand::List { dir }) => {
            let dir = dir.unwrap_or_else(models::models_dir);
            for (i, entry) in models::CATALOGUE.iter().enumerate() {
                let spec = (entry.spec)();
                let here = std::fs::metadata(dir.join(&spec.file_name)).is_ok_and(|m| m.len() == spec.size);
                println!(
                    "{:<20} {:>5} MiB  {:<10} {}{}",
                    entry.name,
                    spec.size >> 20,
                    if here { "pulled" } else { "-" },
                    if i == 0 { "[default] " } else { "" },
                    entry.summary.split_whitespace().collect::<Vec<_>>().join(" ")
                );
            }
            println!("\nAlso: hf:OWNER/REPO/FILE.gguf[@REVISION] (a Hugging Face file, SHA-256 checked), or a path.");
            Ok(())
        }
        Command::Models(ModelsCommand::Path { name, dir }) => {
            let dir = dir.unwrap_or_else(models::models_dir);
            println!("{}", models::Resolved::parse(name.as_deref().unwrap_or("default"))?.local_path(&dir).display());
            Ok(())
        }
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Tenants { data, command } => serve::tenants(data, command),
        Command::Token { data, command } => serve::token(data, command),
        Command::PublicPrefixes { data, command } => prefixes::run(data, command),
        Command::Context(cmd) => context::run(cmd),
        Command::Report(args) => report::run(args),
    }
}

/// The model file for a command's `--model`: a path, a catalogue name or a hub file,
/// pulled if needed; the default model when left out.
pub fn model_path(model: Option<&std::path::Path>) -> anyhow::Result<PathBuf> {
    match model.map(|m| (m, m.to_str())) {
        None => pull_default(None),
        Some((_, Some(name))) => Ok(models::resolve(name, &models::models_dir(), Progress::Auto)?),
        Some((path, None)) => Ok(path.to_path_buf()),
    }
}

/// Pulls the default model into `dir` (or the default models folder).
pub fn pull_default(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let dir = dir.unwrap_or_else(models::models_dir);
    let opts = PullOptions { progress: Progress::Auto, ..Default::default() };
    Ok(models::pull(&ModelSpec::default_model(), &dir, &opts)?)
}
