//! `cachet context`: the repository context of a local repository, and the
//! replay measurement of how much of it stays reusable across its history.

use crate::context::PlainTokens;
use anyhow::Context as _;
use cachet_context::{ContextBuilder, ContextOptions, FileRules, Mirror, Order};
use cachet_engine::gguf::GgufFile;
use cachet_engine::tokenizer::Tokenizer;
use std::path::PathBuf;

#[derive(Debug, clap::Subcommand)]
pub enum ContextCommand {
    /// Print the repository context of a commit (as a session would see it).
    Show {
        #[command(flatten)]
        common: Common,
        /// A commit or branch (default: HEAD).
        #[arg(long, default_value = "HEAD")]
        rev: String,
        /// Print the segments (kind, path, tokens) instead of the text.
        #[arg(long)]
        segments: bool,
        /// Print the definitions other files reference, each `visible` or `hidden` in the
        /// context, and their visible share, instead of the text.
        #[arg(long)]
        definitions: bool,
    },
    /// Replay the last N first-parent commits: for each commit that changes a
    /// file inside the context, the share of the context before the first
    /// changed block (what stays reusable), for each block order.
    Replay {
        #[command(flatten)]
        common: Common,
        /// The commit to replay back from (default: HEAD).
        #[arg(long, default_value = "HEAD")]
        rev: String,
        /// How many first-parent commits.
        #[arg(long, default_value_t = 300)]
        commits: usize,
        /// Write the report as JSON here too.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Also compare variants of the stability model.
        #[arg(long)]
        variants: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct Common {
    /// A local git repository (bare or not).
    #[arg(long)]
    pub repo: PathBuf,
    /// Context budget in tokens (the default is the server's, `ContextOptions::default()`).
    #[arg(long, default_value_t = cachet_context::ContextOptions::default().budget_tokens)]
    pub budget: usize,
    /// The model whose tokenizer counts tokens (default: the default model).
    #[arg(long, env = "CACHET_MODEL")]
    pub model: Option<PathBuf>,
}

fn tokenizer(model: Option<PathBuf>) -> anyhow::Result<Tokenizer> {
    let path = super::model_path(model.as_deref())?;
    let file = GgufFile::open(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Tokenizer::from_gguf_file(&file)?)
}

pub fn run(cmd: ContextCommand) -> anyhow::Result<()> {
    match cmd {
        ContextCommand::Show { common, rev, segments, definitions } => {
            let tok = tokenizer(common.model)?;
            let mirror = Mirror::open_path(&common.repo)?;
            let commit = mirror.resolve(&rev)?;
            let opts = ContextOptions { budget_tokens: common.budget, ..ContextOptions::default() };
            let builder = ContextBuilder::new(10_000);
            if definitions {
                let all = builder.definitions(&mirror, &commit, &opts, &PlainTokens(&tok))?;
                for d in &all {
                    println!("{}\t{}\t{}", if d.visible { "visible" } else { "hidden" }, d.path, d.name);
                }
                let d = cachet_context::DefinitionsVisible::of(&all);
                let share = 100.0 * d.share();
                println!(
                    "commit {commit}: {} of {} referenced definitions visible ({share:.1}%)",
                    d.visible, d.referenced
                );
                return Ok(());
            }
            let ctx = builder.build(&mirror, &commit, &opts, &PlainTokens(&tok))?;
            if segments {
                for s in &ctx.segments {
                    let kind = format!("{:?}", s.kind).to_lowercase();
                    println!(
                        "{:>6}..{:<6} {kind:<7} {}",
                        s.tokens.start,
                        s.tokens.end,
                        s.path.as_deref().unwrap_or("-")
                    );
                }
                println!("commit {commit}: {} tokens", ctx.tokens.len());
            } else {
                print!("{}", ctx.text);
            }
            Ok(())
        }
        ContextCommand::Replay { common, rev, commits, json, variants } => {
            let tok = tokenizer(common.model)?;
            let mirror = Mirror::open_path(&common.repo)?;
            let head = mirror.resolve(&rev)?;
            let opts = ContextOptions {
                budget_tokens: common.budget,
                order: Order::Stability,
                rules: FileRules::default(),
                ..ContextOptions::default()
            };
            let started = std::time::Instant::now();
            let named =
                if variants { cachet_context::replay::variants() } else { vec![("default", Default::default())] };
            let models: Vec<_> = named.iter().map(|(_, m)| *m).collect();
            let reports =
                cachet_context::replay::replay_with(&mirror, &head, commits, &opts, &PlainTokens(&tok), &models)?;
            eprintln!("replayed in {:.1} s", started.elapsed().as_secs_f64());
            if variants {
                println!("{}", cachet_context::replay::variants_markdown(&named, &reports));
            }
            let report = reports.into_iter().next().ok_or_else(|| anyhow::anyhow!("no report"))?;
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_vec_pretty(&report)?)?;
            }
            println!("{}", report.markdown());
            Ok(())
        }
    }
}
