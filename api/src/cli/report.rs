//! `cachet report`: the usage report in the terminal (the numbers of `GET /v1/reports/usage`).

use super::serve::DataArgs;
use crate::routes::reports::{parse, ReportQuery};
use crate::startup::database;
use cachet_tenants::report::{Report, ReportRow};
use cachet_tenants::TenantId;

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// One tenant (default: all tenants).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start (RFC 3339 or YYYY-MM-DD); default 30 days before --to.
    #[arg(long)]
    pub from: Option<String>,
    /// End (RFC 3339, or YYYY-MM-DD: the end of that day); default now.
    #[arg(long)]
    pub to: Option<String>,
    /// day, session, repo or task.
    #[arg(long, default_value = "day")]
    pub group_by: String,
    /// table, csv or json.
    #[arg(long, default_value = "table")]
    pub format: String,
}

fn money(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("${v:.6}"))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{:.1}%", 100.0 * v))
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn line(r: &ReportRow) -> String {
    let key = match &r.label {
        Some(l) => format!("{} ({l})", r.key),
        None => r.key.clone(),
    };
    format!(
        "{key:<38} {:>8} {:>10} {:>10} {:>7} {:>12} {:>3}/{:<3}/{:<3}/{:<3} {:>7} {:>12} {:>7} {:>7} {:>7} {:>8.4}",
        r.requests,
        r.prompt_tokens,
        r.cached_tokens,
        pct(r.cache_hit_ratio),
        money(Some(r.cost)),
        r.tasks_succeeded,
        r.tasks_failed,
        r.tasks_abandoned,
        r.tasks_open,
        pct(r.success_rate),
        money(r.cost_per_successful_task),
        ms(r.ttft_p50_ms),
        ms(r.ttft_p95_ms),
        pct(r.slo_attainment),
        r.goodput_rps,
    )
}

/// The report as a table.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "{:<38} {:>8} {:>10} {:>10} {:>7} {:>12} {:>15} {:>7} {:>12} {:>7} {:>7} {:>7} {:>8}\n",
        format!("{:?}", report.group_by).to_lowercase(),
        "requests",
        "prompt",
        "cached",
        "hit",
        "cost",
        "tasks s/f/a/o",
        "success",
        "$/success",
        "ttft50",
        "ttft95",
        "slo",
        "goodput",
    );
    for r in report.rows.iter().chain(std::iter::once(&report.total)) {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

/// The report as `--format` asks, read from the configured database.
pub fn render(args: ReportArgs) -> anyhow::Result<String> {
    if !["table", "csv", "json"].contains(&args.format.as_str()) {
        anyhow::bail!("unknown --format {:?} (table, csv, json)", args.format);
    }
    let settings = args.data.settings()?;
    let q = ReportQuery { from: args.from, to: args.to, group_by: Some(args.group_by), format: None, tenant: None };
    let (from, to, group) = parse(&q).map_err(|e| anyhow::anyhow!("{e}"))?;
    let tenant: Option<TenantId> = args
        .tenant
        .map(|t| t.parse())
        .transpose()
        .map_err(|e: cachet_tenants::ParseTenantIdError| anyhow::anyhow!("{e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let report = rt.block_on(async {
        let db = database(&settings).await?;
        anyhow::Ok(db.store.usage_report(tenant, from, to, group).await?)
    })?;
    Ok(match args.format.as_str() {
        "csv" => report.csv(),
        "json" => format!("{}\n", serde_json::to_string_pretty(&report)?),
        _ => format!(
            "usage {} .. {} (UTC)\n{}",
            report.from.format("%Y-%m-%d %H:%M"),
            report.to.format("%Y-%m-%d %H:%M"),
            table(&report)
        ),
    })
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    print!("{}", render(args)?);
    Ok(())
}
