//! Usage reports: what a tenant's requests and tasks cost, and above all what one *successful*
//! task costs.
//!
//! Definitions (every aggregate in [`ReportRow`] follows them exactly):
//! - The window is `[from, to)`. A request belongs to it by its `created_at`; a task by its outcome
//!   time (`closed_at`), or, while open, by its creation time.
//! - Groups: `day` (UTC) of that time; the request's or task's `session`; the session's `repo`; the
//!   `task`. Requests and tasks without one fall in the group `"none"`.
//! - `cost` is the cost of the group's requests in the window. `task_cost` is the cost of *every*
//!   request of the group's tasks, whenever it ran, and `cost_per_successful_task` is `task_cost`
//!   over the succeeded tasks: failed and abandoned attempts are part of what success costs.
//! - `success_rate` is succeeded over closed tasks (succeeded + failed + abandoned).
//! - `slo_attainment` is the share of requests with an SLO verdict that met it; `goodput_rps` the
//!   requests that met it per second of the window (of the day's part of it, by day).
//! - Ratios whose denominator is zero are `None`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How report rows are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    Day,
    Session,
    Repo,
    Task,
}

impl std::str::FromStr for GroupBy {
    type Err = String;

    fn from_str(s: &str) -> Result<GroupBy, String> {
        match s {
            "day" => Ok(GroupBy::Day),
            "session" => Ok(GroupBy::Session),
            "repo" => Ok(GroupBy::Repo),
            "task" => Ok(GroupBy::Task),
            other => Err(format!("unknown group_by {other:?} (day, session, repo, task)")),
        }
    }
}

/// One group's numbers (see the module docs for the definitions).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportRow {
    /// The group: a UTC day (`2026-11-30`), a session, repository or task id, `"none"`, or
    /// `"total"`.
    pub key: String,
    /// A repository's name or a task's title.
    pub label: Option<String>,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub cached_tokens: i64,
    pub computed_tokens: i64,
    pub output_tokens: i64,
    pub cache_hit_ratio: Option<f64>,
    pub cost: f64,
    pub tasks_succeeded: i64,
    pub tasks_failed: i64,
    pub tasks_abandoned: i64,
    pub tasks_open: i64,
    pub success_rate: Option<f64>,
    pub task_cost: f64,
    pub cost_per_successful_task: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub slo_attainment: Option<f64>,
    pub goodput_rps: f64,
}

/// A report: its window and grouping, the rows (sorted by key) and the total.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub group_by: GroupBy,
    pub rows: Vec<ReportRow>,
    pub total: ReportRow,
}

impl ReportRow {
    /// Derives the ratios from the counts; `seconds` is the row's share of the window.
    pub(crate) fn finish(&mut self, seconds: f64, slo_met: i64, slo_judged: i64) {
        let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
        self.cache_hit_ratio = ratio(self.cached_tokens as f64, self.prompt_tokens as f64);
        let closed = self.tasks_succeeded + self.tasks_failed + self.tasks_abandoned;
        self.success_rate = ratio(self.tasks_succeeded as f64, closed as f64);
        self.cost_per_successful_task = ratio(self.task_cost, self.tasks_succeeded as f64);
        self.slo_attainment = ratio(slo_met as f64, slo_judged as f64);
        self.goodput_rps = ratio(slo_met as f64, seconds).unwrap_or(0.0);
    }

    /// The CSV header matching [`ReportRow::csv`].
    pub const CSV_HEADER: &'static str = "key,label,requests,prompt_tokens,cached_tokens,computed_tokens,\
output_tokens,cache_hit_ratio,cost,tasks_succeeded,tasks_failed,tasks_abandoned,tasks_open,success_rate,task_cost,\
cost_per_successful_task,ttft_p50_ms,ttft_p95_ms,slo_attainment,goodput_rps";

    /// The row as a CSV line (RFC 4180 quoting; empty cells for `None`).
    pub fn csv(&self) -> String {
        let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
        let quote = |s: &str| {
            if s.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        };
        [
            quote(&self.key),
            quote(self.label.as_deref().unwrap_or("")),
            self.requests.to_string(),
            self.prompt_tokens.to_string(),
            self.cached_tokens.to_string(),
            self.computed_tokens.to_string(),
            self.output_tokens.to_string(),
            opt(self.cache_hit_ratio),
            self.cost.to_string(),
            self.tasks_succeeded.to_string(),
            self.tasks_failed.to_string(),
            self.tasks_abandoned.to_string(),
            self.tasks_open.to_string(),
            opt(self.success_rate),
            self.task_cost.to_string(),
            opt(self.cost_per_successful_task),
            opt(self.ttft_p50_ms),
            opt(self.ttft_p95_ms),
            opt(self.slo_attainment),
            self.goodput_rps.to_string(),
        ]
        .join(",")
    }
}

impl Report {
    /// The report as CSV: a header, the rows, then the total.
    pub fn csv(&self) -> String {
        let mut out = String::from(ReportRow::CSV_HEADER);
        out.push('\n');
        for row in self.rows.iter().chain(std::iter::once(&self.total)) {
            out.push_str(&row.csv());
            out.push('\n');
        }
        out
    }
}
