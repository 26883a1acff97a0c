//! The command line: `cachet-bench run` and `cachet-bench report`.

use crate::arrival::Arrival;
use crate::calibrate::calibrate;
use crate::client::Target;
use crate::error::BenchError;
use crate::record::Slo;
use crate::report::ResultsFile;
use crate::run::{http_client, run_workload, warmup, RunOptions};
use crate::workload::source::SourceCorpus;
use crate::workload::trace::Trace;
use crate::workload::{Scenario, ScenarioSpec, Workload};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// Load generator for OpenAI-compatible servers: nine coding-agent workloads,
/// TTFT / ITL / e2e percentiles, throughput, SLO attainment and goodput.
#[derive(Debug, Parser)]
#[command(name = "cachet-bench", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process
pub enum Command {
    /// Runs scenarios against one or more targets; writes results.json, results.md, ttft.svg, configs.svg.
    Run(RunArgs),
    /// Merges results files and renders the markdown and charts again.
    Report(ReportArgs),
    /// A push during a session, on cachet: `after_push = "overlay"` and `"rebuild"` side by side
    /// (writes push.json and push.md).
    Push(PushArgs),
}

/// `cachet-bench push`.
#[derive(Debug, Args)]
pub struct PushArgs {
    /// cachet's base URL (without /v1).
    #[arg(long)]
    pub url: String,
    /// The model to request.
    #[arg(long)]
    pub model: String,
    /// A tenant's bearer token.
    #[arg(long, env = "CACHET_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: String,
    /// The git repository to copy and push to (its HEAD branch; default: the current one).
    #[arg(long, default_value = ".")]
    pub source_repo: PathBuf,
    /// Where the two copies go: a folder under the server's `[context] allowed_root`.
    #[arg(long)]
    pub work: PathBuf,
    /// Rounds (each: a warm turn, a push and the turn right after it, then a turn once the
    /// context is at the new head), alternating which mode goes first.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Tokens each turn generates.
    #[arg(long, default_value_t = 8)]
    pub max_tokens: u32,
    /// Seconds to wait, once the session's context is at the new head, before the round's last turn.
    #[arg(long, default_value_t = 5)]
    pub settle_s: u64,
    /// Per-request timeout (seconds).
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
}

/// `cachet-bench run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// A system under test: NAME=URL or NAME=URL@MODEL (URL without /v1). Repeat for several.
    #[arg(long = "target", required = true, value_name = "NAME=URL[@MODEL]")]
    pub targets: Vec<String>,
    /// The model to request (unless a target names its own).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token sent to every target without its own.
    #[arg(long, env = "CACHET_BENCH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Bearer token of one target. Repeatable; several for one target spread its conversations
    /// over several tenants (conversation i sends key i mod n).
    #[arg(long = "target-api-key", value_name = "NAME=KEY")]
    pub target_api_keys: Vec<String>,
    /// Comma-separated scenarios, or `all`: repeated-context, unrelated, long-input, long-output, peak, agent,
    /// agent-trace, code-edit, code-edit-tools.
    #[arg(long, default_value = "all")]
    pub scenario: String,
    /// Seed of prompts and arrival schedules.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Multiplies request counts (conversations, bursts).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Multiplies prompt sizes.
    #[arg(long, default_value_t = 1.0)]
    pub size_scale: f64,
    /// Overrides max_tokens of every scenario.
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Overrides the turns per conversation (requests replayed per session in agent-trace).
    #[arg(long)]
    pub turns: Option<usize>,
    /// Overrides the users of closed-loop scenarios.
    #[arg(long)]
    pub users: Option<usize>,
    /// Overrides the Poisson rate (requests/s) of open-loop scenarios.
    #[arg(long)]
    pub rate: Option<f64>,
    /// TTFT objective (ms).
    #[arg(long, default_value_t = 3000.0)]
    pub slo_ttft_ms: f64,
    /// Mean inter-token latency objective (ms).
    #[arg(long, default_value_t = 250.0)]
    pub slo_itl_ms: f64,
    /// Per-request timeout (seconds).
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
    /// Send a request refused with 429 or 503 again, up to this many times, after its
    /// Retry-After (TTFT still counts from the first scheduled send).
    #[arg(long, default_value_t = 0)]
    pub retries: u32,
    /// The git repository prompts are cut from (default: the one containing the current directory).
    #[arg(long, default_value = ".")]
    pub source_repo: PathBuf,
    /// The agent trace `agent-trace` replays (JSON Lines, as scripts/agents-check.sh records with
    /// AGENTS_RECORD); default: the trace committed with the benchmark.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// A label stored with the results (e.g. the configuration).
    #[arg(long)]
    pub label: Option<String>,
    /// Leave per-request records out of results.json.
    #[arg(long)]
    pub no_records: bool,
    /// Skip the warm-up request before each (system, scenario).
    #[arg(long)]
    pub no_warmup: bool,
    /// Skip the calibration before each scenario (lone requests on every target, from which
    /// the calibrated SLO and the open-loop arrival rates follow; see `calibrate`). The fixed
    /// SLO (--slo-ttft-ms, --slo-itl-ms) is reported either way.
    #[arg(long, conflicts_with = "calibrate_only")]
    pub no_calibrate: bool,
    /// Only calibrate: print `SCENARIO TTFT_MS ITL_MS CAPACITY_PER_S` (the calibrated SLO and
    /// the one-at-a-time capacity) per scenario, write calibration.json, run nothing.
    #[arg(long)]
    pub calibrate_only: bool,
}

/// `cachet-bench report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A results.json. Repeat to merge.
    #[arg(long = "in", required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
}

/// Parses `NAME=URL[@MODEL]`; the model defaults to `model`.
///
/// # Errors
/// [`BenchError::InvalidArgument`] for a malformed target or no model.
pub fn parse_target(spec: &str, model: Option<&str>) -> Result<Target, BenchError> {
    let bad = |m: &str| BenchError::InvalidArgument(format!("--target {spec:?}: {m}"));
    let (name, rest) = spec.split_once('=').ok_or_else(|| bad("expected NAME=URL[@MODEL]"))?;
    // The model starts at the first '@' after the scheme (URLs with user info are not supported).
    let after_scheme = rest.find("://").map_or(0, |i| i + 3);
    let (url, own_model) = match rest[after_scheme..].find('@') {
        Some(at) => (&rest[..after_scheme + at], Some(&rest[after_scheme + at + 1..])),
        None => (rest, None),
    };
    if name.is_empty() {
        return Err(bad("empty name"));
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(bad("the URL must start with http:// or https://"));
    }
    let model = own_model.filter(|m| !m.is_empty()).or(model).ok_or_else(|| bad("no model: give --model or @MODEL"))?;
    Ok(Target {
        name: name.to_string(),
        base_url: url.trim_end_matches('/').trim_end_matches("/v1").to_string(),
        model: model.to_string(),
        api_key: None,
        tenant_keys: Vec::new(),
    })
}

impl RunArgs {
    /// The targets, with their keys.
    fn targets(&self) -> Result<Vec<Target>, BenchError> {
        let mut targets = Vec::new();
        for t in &self.targets {
            let mut target = parse_target(t, self.model.as_deref())?;
            if targets.iter().any(|o: &Target| o.name == target.name) {
                return Err(BenchError::InvalidArgument(format!("two targets are named {:?}", target.name)));
            }
            target.api_key = self.api_key.clone();
            targets.push(target);
        }
        let mut keys: Vec<(usize, String)> = Vec::new();
        for k in &self.target_api_keys {
            let (name, key) = k
                .split_once('=')
                .ok_or_else(|| BenchError::InvalidArgument("--target-api-key expects NAME=KEY".into()))?;
            let t = targets
                .iter()
                .position(|t| t.name == name)
                .ok_or_else(|| BenchError::InvalidArgument(format!("--target-api-key: no target named {name:?}")))?;
            keys.push((t, key.to_string()));
        }
        for (i, t) in targets.iter_mut().enumerate() {
            let mine: Vec<String> = keys.iter().filter(|(k, _)| *k == i).map(|(_, key)| key.clone()).collect();
            if let Some(first) = mine.first() {
                t.api_key = Some(first.clone());
            }
            // Several keys for one target: its conversations go to several tenants in turn.
            if mine.len() > 1 {
                t.tenant_keys = mine;
            }
        }
        Ok(targets)
    }

    /// The spec of `scenario` after scaling and overrides.
    fn spec(&self, scenario: Scenario) -> Result<ScenarioSpec, BenchError> {
        let positive = |v: f64, flag: &str| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(BenchError::InvalidArgument(format!("{flag} must be a positive number")))
            }
        };
        let mut spec = ScenarioSpec::defaults(scenario)
            .scaled(positive(self.scale, "--scale")?, positive(self.size_scale, "--size-scale")?);
        if let Some(m) = self.max_tokens {
            spec.max_tokens = m;
        }
        if let Some(t) = self.turns {
            spec.turns = t;
        }
        match &mut spec.arrival {
            Arrival::Closed { users } => *users = self.users.unwrap_or(*users),
            Arrival::Open { rate_per_s, .. } => *rate_per_s = self.rate.unwrap_or(*rate_per_s),
        }
        spec.validate()?;
        Ok(spec)
    }
}

/// Runs the command line.
///
/// # Errors
/// Invalid arguments, an unreadable repository, a failed warm-up, or files
/// that cannot be read or written.
pub async fn main(cli: Cli) -> Result<(), BenchError> {
    match cli.command {
        Command::Run(args) => run(args).await,
        Command::Report(args) => report(args),
        Command::Push(args) => push(args).await,
    }
}

async fn push(args: PushArgs) -> Result<(), BenchError> {
    let mut target = parse_target(&format!("cachet={}", args.url), Some(&args.model))?;
    target.api_key = Some(args.api_key.clone());
    std::fs::create_dir_all(&args.work).map_err(|e| BenchError::io("creating", &args.work, e))?;
    let opts = crate::push::PushOptions {
        target,
        source: args.source_repo.clone(),
        work: args.work.canonicalize().map_err(|e| BenchError::io("reading", &args.work, e))?,
        rounds: args.rounds.max(1),
        max_tokens: args.max_tokens.max(1),
        settle: Duration::from_secs(args.settle_s),
        timeout: Duration::from_secs(args.timeout_s.max(1)),
    };
    let rounds = crate::push::run_push(&http_client()?, &opts).await?;
    std::fs::create_dir_all(&args.out).map_err(|e| BenchError::io("creating", &args.out, e))?;
    let json_path = args.out.join("push.json");
    let json =
        serde_json::to_string_pretty(&rounds).map_err(|e| BenchError::Json { path: json_path.clone(), source: e })?;
    std::fs::write(&json_path, json).map_err(|e| BenchError::io("writing", &json_path, e))?;
    let table = crate::push::markdown(&rounds);
    let md_path = args.out.join("push.md");
    std::fs::write(&md_path, &table).map_err(|e| BenchError::io("writing", &md_path, e))?;
    print!("{table}");
    Ok(())
}

async fn run(args: RunArgs) -> Result<(), BenchError> {
    let targets = args.targets()?;
    let scenarios = Scenario::parse_list(&args.scenario)?;
    let opts = RunOptions {
        seed: args.seed,
        slo: Slo { ttft_ms: args.slo_ttft_ms, itl_ms: args.slo_itl_ms },
        timeout: Duration::from_secs(args.timeout_s.max(1)),
        source_repo: args.source_repo.clone(),
        warmup: !args.no_warmup,
        label: args.label.clone(),
        retries: args.retries,
    };
    let corpus = SourceCorpus::open(&args.source_repo)?;
    eprintln!("prompts from {} ({} files at HEAD)", corpus.root().display(), corpus.files().len());
    let trace = match &args.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| BenchError::io("reading", path, e))?;
            Some(Trace::parse(&text)?)
        }
        None => None,
    };
    let build = |spec: &ScenarioSpec| match (&trace, spec.scenario) {
        (Some(t), Scenario::AgentTrace) => Workload::from_trace(spec, t, args.seed),
        _ => Workload::build(spec, &corpus, args.seed),
    };
    let mut workloads = Vec::new();
    for &s in &scenarios {
        workloads.push(build(&args.spec(s)?)?);
    }
    let client = http_client()?;
    let mut file = ResultsFile::new(args.label.clone(), targets.clone(), Vec::new());
    let mut calibrations = Vec::new();
    for (i, workload) in workloads.iter_mut().enumerate() {
        // Alternate who goes first: A, B then B, A ...
        let mut order = targets.clone();
        order.rotate_left(i % targets.len());
        let calibration = if args.no_calibrate {
            None
        } else {
            let scenario = workload.spec.scenario;
            let tokens = workload.first_request_tokens();
            if opts.warmup {
                for target in &order {
                    warmup(&client, target, opts.timeout).await?;
                }
            }
            let c = calibrate(&client, &order, &corpus, args.seed, workload, opts.timeout).await?;
            if let Some(c) = &c {
                eprintln!(
                    "{scenario}: lone ~{tokens} tok prompts: {}; calibrated SLO TTFT ≤ {} ms, ITL ≤ {} ms; capacity {:.3} req/s",
                    c.lone.iter().map(|l| format!("{} TTFT {:.0} ms ITL {:.1} ms", l.system, l.ttft_ms, l.itl_ms)).collect::<Vec<_>>().join(", "),
                    c.slo.ttft_ms,
                    c.slo.itl_ms,
                    c.capacity_per_s
                );
                if args.calibrate_only {
                    println!("{scenario} {} {} {:.6}", c.slo.ttft_ms, c.slo.itl_ms, c.capacity_per_s);
                }
                // Open-loop arrivals follow the machine's capacity unless a rate was given.
                if args.rate.is_none() && !args.calibrate_only {
                    *workload = build(&workload.spec.clone().at_capacity(c.capacity_per_s))?;
                }
                calibrations.push((scenario, c.clone()));
            }
            c
        };
        if args.calibrate_only {
            continue;
        }
        for target in &order {
            eprintln!(
                "{} on {}: {} requests; {}",
                workload.spec.scenario,
                target.name,
                workload.requests(),
                workload.spec.describe()
            );
            if opts.warmup {
                warmup(&client, target, opts.timeout).await?;
            }
            let mut result = run_workload(&client, target, workload, &opts).await;
            if let Some(c) = &calibration {
                result = result.calibrated(c.clone());
            }
            let s = &result.summary;
            eprintln!(
                "  done {} / failed {}; TTFT p50 {} ms; goodput {:.3} req/s{}; {:.1} s",
                s.completed,
                s.failed,
                s.ttft_ms.map_or("n/a".into(), |p| format!("{:.0}", p.p50)),
                s.goodput_per_s,
                s.calibrated.map_or(String::new(), |c| format!(" ({:.3} calibrated)", c.goodput_per_s)),
                s.wall_s
            );
            file.results.push(result);
            // Written after every run, so an interrupted benchmark keeps what it measured.
            file.write_all(&args.out, !args.no_records)?;
        }
    }
    if args.calibrate_only {
        std::fs::create_dir_all(&args.out).map_err(|e| BenchError::io("creating", &args.out, e))?;
        let path = args.out.join("calibration.json");
        let json: Vec<_> =
            calibrations.iter().map(|(s, c)| serde_json::json!({"scenario": s, "calibration": c})).collect();
        let text = serde_json::to_string_pretty(&json).unwrap_or_default();
        std::fs::write(&path, text).map_err(|e| BenchError::io("writing", &path, e))?;
        return Ok(());
    }
    let md = file.write_all(&args.out, !args.no_records)?;
    println!("{md}");
    Ok(())
}

fn report(args: ReportArgs) -> Result<(), BenchError> {
    let files = args.inputs.iter().map(|p| ResultsFile::read(p)).collect::<Result<Vec<_>, _>>()?;
    let merged = ResultsFile::merge(files);
    let md = merged.write_all(&args.out, true)?;
    println!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_and_without_a_model() {
        let t = parse_target("cachet=http://127.0.0.1:8080/", Some("qwen")).unwrap();
        assert_eq!(
            (t.name.as_str(), t.base_url.as_str(), t.model.as_str()),
            ("cachet", "http://127.0.0.1:8080", "qwen")
        );
        let t = parse_target("llama=http://h:9000/v1@Qwen/Qwen2.5-0.5B@q8", None).unwrap();
        assert_eq!((t.base_url.as_str(), t.model.as_str()), ("http://h:9000", "Qwen/Qwen2.5-0.5B@q8"));
        assert!(parse_target("x=http://h", None).is_err());
        assert!(parse_target("http://h", Some("m")).is_err());
        assert!(parse_target("x=ftp://h", Some("m")).is_err());
    }

    #[test]
    fn the_command_line_parses() {
        let cli = Cli::try_parse_from([
            "cachet-bench",
            "run",
            "--target",
            "a=http://x",
            "--target",
            "b=http://y@m2",
            "--model",
            "m",
            "--scenario",
            "peak,agent",
            "--scale",
            "0.5",
            "--out",
            "/tmp/x",
            "--rate",
            "1.5",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else { panic!("run") };
        assert_eq!(args.targets().unwrap().len(), 2);
        let spec = args.spec(Scenario::Peak).unwrap();
        assert!(matches!(spec.arrival, Arrival::Open { rate_per_s, .. } if rate_per_s == 1.5));
        assert_eq!(spec.conversations, 4);
        assert!(Cli::try_parse_from(["cachet-bench", "report", "--out", "d"]).is_err());
    }

    #[test]
    fn several_keys_for_one_target_spread_its_conversations_over_tenants() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["cachet-bench", "run", "--target", "a=http://x@m", "--target", "b=http://y@m"];
            argv.extend(["--api-key", "global", "--out", "/tmp/x"]);
            argv.extend(extra);
            let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else { panic!("run") };
            args.targets()
        };
        let t = parse(&["--target-api-key", "a=k1", "--target-api-key", "a=k2", "--target-api-key", "a=k3"]).unwrap();
        let keys: Vec<Option<String>> = (0..4).map(|i| t[0].for_conversation(i).api_key).collect();
        assert_eq!(keys, [Some("k1"), Some("k2"), Some("k3"), Some("k1")].map(|k| k.map(String::from)));
        assert_eq!(t[1].for_conversation(1).api_key.as_deref(), Some("global"));
        let one = parse(&["--target-api-key", "a=k1"]).unwrap();
        assert!(one[0].tenant_keys.is_empty());
        assert_eq!(one[0].for_conversation(5).api_key.as_deref(), Some("k1"));
        assert!(parse(&["--target-api-key", "c=k"]).is_err());
        assert!(parse(&["--target-api-key", "a"]).is_err());
    }
}
