//! Usage reports (definitions in [`crate::report`]): one query over the ledger, one over the tasks,
//! merged by group key. The group expressions are constants chosen by [`GroupBy`], never text from
//! a request; the tenant scope is a bind parameter (`NULL`: all tenants, for the operator).

use std::collections::BTreeMap;

use super::{Store, StoreError};
use crate::ids::TenantId;
use crate::report::{GroupBy, Report, ReportRow};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use uuid::Uuid;

/// The group key of a request (`r`, with its session `s`) and of a task (`t`, with `s`).
fn keys(group: Option<GroupBy>) -> (&'static str, &'static str) {
    match group {
        Some(GroupBy::Day) => (
            "to_char(r.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
            "to_char(COALESCE(t.closed_at, t.created_at) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
        ),
        Some(GroupBy::Session) => ("COALESCE(r.session_id::text, 'none')", "COALESCE(t.session_id::text, 'none')"),
        Some(GroupBy::Repo) => ("COALESCE(s.repo_id::text, 'none')", "COALESCE(s.repo_id::text, 'none')"),
        Some(GroupBy::Task) => ("COALESCE(rt.id::text, 'none')", "t.id::text"),
        None => ("'total'", "'total'"),
    }
}

#[derive(sqlx::FromRow)]
struct RequestAgg {
    key: String,
    requests: i64,
    prompt_tokens: i64,
    cached_tokens: i64,
    computed_tokens: i64,
    output_tokens: i64,
    cost: f64,
    ttft_p50_ms: Option<f64>,
    ttft_p95_ms: Option<f64>,
    slo_met: i64,
    slo_judged: i64,
}

#[derive(sqlx::FromRow)]
struct TaskAgg {
    key: String,
    succeeded: i64,
    failed: i64,
    abandoned: i64,
    open: i64,
    task_cost: f64,
}

impl Store {
    /// The usage report of one tenant, or of all tenants with `None` (the operator's view).
    pub async fn usage_report(
        &self,
        tenant: Option<TenantId>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        group_by: GroupBy,
    ) -> Result<Report, StoreError> {
        if to <= from {
            return Err(StoreError::Invalid("the report window is empty: `to` must be after `from`".into()));
        }
        let rows = self.report_rows(tenant, from, to, Some(group_by)).await?;
        let total = self.report_rows(tenant, from, to, None).await?.pop().unwrap_or_else(|| {
            let mut empty = ReportRow { key: "total".into(), ..ReportRow::default() };
            empty.finish(seconds(from, to), 0, 0);
            empty
        });
        Ok(Report { from, to, group_by, rows, total })
    }

    async fn report_rows(
        &self,
        tenant: Option<TenantId>,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        group: Option<GroupBy>,
    ) -> Result<Vec<ReportRow>, StoreError> {
        let (request_key, task_key) = keys(group);
        let tenant = tenant.map(|t| t.0);
        let requests: Vec<RequestAgg> = sqlx::query_as(&format!(
            "SELECT {request_key} AS key, count(*) AS requests, \
               COALESCE(sum(r.prompt_tokens), 0)::bigint AS prompt_tokens, \
               COALESCE(sum(r.cached_tokens), 0)::bigint AS cached_tokens, \
               COALESCE(sum(r.computed_tokens), 0)::bigint AS computed_tokens, \
               COALESCE(sum(r.output_tokens), 0)::bigint AS output_tokens, \
               COALESCE(sum(r.cost), 0)::float8 AS cost, \
               percentile_cont(0.5) WITHIN GROUP (ORDER BY r.ttft_ms) AS ttft_p50_ms, \
               percentile_cont(0.95) WITHIN GROUP (ORDER BY r.ttft_ms) AS ttft_p95_ms, \
               count(*) FILTER (WHERE r.slo_met) AS slo_met, count(r.slo_met) AS slo_judged \
             FROM requests r LEFT JOIN sessions s ON s.id = r.session_id AND s.tenant_id = r.tenant_id \
             LEFT JOIN tasks rt ON rt.id = r.task_id AND rt.tenant_id = r.tenant_id \
             WHERE r.created_at >= $1 AND r.created_at < $2 AND ($3::uuid IS NULL OR r.tenant_id = $3) \
             GROUP BY 1"
        ))
        .bind(from)
        .bind(to)
        .bind(tenant)
        .fetch_all(self.pool())
        .await?;
        let tasks: Vec<TaskAgg> = sqlx::query_as(&format!(
            "SELECT {task_key} AS key, \
               count(*) FILTER (WHERE t.status = 'succeeded') AS succeeded, \
               count(*) FILTER (WHERE t.status = 'failed') AS failed, \
               count(*) FILTER (WHERE t.status = 'abandoned') AS abandoned, \
               count(*) FILTER (WHERE t.status = 'open') AS open, \
               COALESCE(sum(c.cost), 0)::float8 AS task_cost \
             FROM tasks t LEFT JOIN sessions s ON s.id = t.session_id AND s.tenant_id = t.tenant_id \
             LEFT JOIN (SELECT task_id, tenant_id, sum(cost) AS cost FROM requests \
                        WHERE task_id IS NOT NULL AND ($3::uuid IS NULL OR tenant_id = $3) \
                        GROUP BY task_id, tenant_id) c \
               ON c.task_id = t.id AND c.tenant_id = t.tenant_id \
             WHERE COALESCE(t.closed_at, t.created_at) >= $1 AND COALESCE(t.closed_at, t.created_at) < $2 \
               AND ($3::uuid IS NULL OR t.tenant_id = $3) \
             GROUP BY 1"
        ))
        .bind(from)
        .bind(to)
        .bind(tenant)
        .fetch_all(self.pool())
        .await?;

        let mut rows: BTreeMap<String, (ReportRow, i64, i64)> = BTreeMap::new();
        fn entry<'a>(
            rows: &'a mut BTreeMap<String, (ReportRow, i64, i64)>,
            key: &str,
        ) -> &'a mut (ReportRow, i64, i64) {
            rows.entry(key.to_string())
                .or_insert_with(|| (ReportRow { key: key.to_string(), ..ReportRow::default() }, 0, 0))
        }
        for a in requests {
            let (row, met, judged) = entry(&mut rows, &a.key);
            row.requests = a.requests;
            row.prompt_tokens = a.prompt_tokens;
            row.cached_tokens = a.cached_tokens;
            row.computed_tokens = a.computed_tokens;
            row.output_tokens = a.output_tokens;
            row.cost = a.cost;
            row.ttft_p50_ms = a.ttft_p50_ms;
            row.ttft_p95_ms = a.ttft_p95_ms;
            *met = a.slo_met;
            *judged = a.slo_judged;
        }
        for t in tasks {
            let (row, _, _) = entry(&mut rows, &t.key);
            row.tasks_succeeded = t.succeeded;
            row.tasks_failed = t.failed;
            row.tasks_abandoned = t.abandoned;
            row.tasks_open = t.open;
            row.task_cost = t.task_cost;
        }
        let labels = self.labels(tenant, group, rows.keys().cloned().collect()).await?;
        Ok(rows
            .into_values()
            .map(|(mut row, met, judged)| {
                let span = match group {
                    Some(GroupBy::Day) => day_seconds(&row.key, from, to),
                    _ => seconds(from, to),
                };
                row.finish(span, met, judged);
                row.label = labels.get(&row.key).cloned();
                row
            })
            .collect())
    }

    /// Repository names and task titles for the keys of a report (of `tenant`'s own repositories
    /// and tasks; across tenants for the operator).
    async fn labels(
        &self,
        tenant: Option<Uuid>,
        group: Option<GroupBy>,
        keys: Vec<String>,
    ) -> Result<BTreeMap<String, String>, StoreError> {
        let query = match group {
            Some(GroupBy::Repo) => {
                "SELECT id::text, name FROM repositories WHERE id::text = ANY($1) AND ($2::uuid IS NULL OR tenant_id = $2)"
            }
            Some(GroupBy::Task) => {
                "SELECT id::text, title FROM tasks WHERE id::text = ANY($1) AND ($2::uuid IS NULL OR tenant_id = $2)"
            }
            _ => return Ok(BTreeMap::new()),
        };
        let rows: Vec<(String, String)> = sqlx::query_as(query).bind(keys).bind(tenant).fetch_all(self.pool()).await?;
        Ok(rows.into_iter().collect())
    }
}

fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds().max(0) as f64 / 1000.0
}

/// The part of `[from, to)` that falls on the UTC day `key`.
fn day_seconds(key: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let Ok(day) = NaiveDate::parse_from_str(key, "%Y-%m-%d") else { return seconds(from, to) };
    let start = day.and_hms_opt(0, 0, 0).map(|d| d.and_utc()).unwrap_or(from);
    seconds(start.max(from), (start + Duration::days(1)).min(to))
}
