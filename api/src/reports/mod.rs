//! The report page (`GET /reports`): server-rendered HTML with inline SVG charts — cost per
//! successful task, cache hit ratio, TTFT percentiles and task outcomes by day — the headline
//! figures of the window, and the daily table. No script and no external asset, so it renders
//! under a `default-src 'none'` content security policy and in any browser or mail client.

pub mod format;
pub mod svg;

use cachet_tenants::report::{Report, ReportRow};
use chrono::{DateTime, Duration, NaiveDate, Utc};
use format::{escape, int, ms, number, opt, pct, rps, usd, NONE};
use std::fmt::Write;
use svg::{Frame, Layer, Series};

const STYLE: &str = r#"
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1100px;padding:24px;color:#1f2328;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 8px}
.window{color:#59636e;margin:0 0 20px}
.figures{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:12px;margin:0 0 24px}
.figure{border:1px solid #d1d9e0;border-radius:6px;padding:10px 12px}
.figure .value{font-size:20px;font-weight:600}.figure .name{color:#59636e;font-size:12px}
.figure.lead{border-color:#0969da;background:#f0f6ff}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:20px;margin:0 0 24px}
section.chart-box{border:1px solid #d1d9e0;border-radius:6px;padding:12px}
svg.chart{width:100%;height:auto;display:block}
svg .grid{stroke:#e6e9ec;stroke-width:1}svg .axis{stroke:#8c959f;stroke-width:1}
svg .tick{font-size:11px;fill:#59636e}svg .empty{font-size:14px;fill:#8c959f}
svg .legend text{font-size:11px;fill:#1f2328}
svg path.series{fill:none;stroke-width:2}svg path.bar{stroke:none}
svg .c0{stroke:#0969da}svg .c1{stroke:#cf222e}svg .c2{stroke:#9a6700}
svg circle.c0,svg rect.c0,svg path.bar.c0{fill:#0969da}svg circle.c1,svg rect.c1,svg path.bar.c1{fill:#cf222e}
svg circle.c2,svg rect.c2,svg path.bar.c2{fill:#9a6700}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #d1d9e0;padding:4px 8px;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}tr.total td{font-weight:600}
.scroll{overflow-x:auto}
.note{color:#59636e;font-size:12px;margin-top:16px}
"#;

/// The whole page for a report grouped by day.
pub fn render_page(title: &str, daily: &Report) -> String {
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1><p class="window">{from} — {to} (UTC) · {days} day(s) with activity</p>"#,
        t = escape(title),
        from = daily.from.format("%Y-%m-%d %H:%M"),
        to = daily.to.format("%Y-%m-%d %H:%M"),
        days = daily.rows.len(),
    );
    figures(&mut out, &daily.total);
    out.push_str(r#"<div class="charts">"#);
    for (title, chart) in charts(daily) {
        let _ = write!(out, r#"<section class="chart-box"><h2>{}</h2>{chart}</section>"#, escape(title));
    }
    out.push_str("</div>");
    table(&mut out, daily);
    out.push_str(
        r#"<p class="note">Cost per successful task = the cost of every request of the window's tasks (failed and abandoned attempts included) ÷ the tasks that succeeded. Cache hit ratio = cached ÷ prompt tokens. Goodput = requests that met their latency SLO per second. The same numbers: <code>GET /v1/reports/usage</code> (JSON or CSV) and <code>cachet report</code>.</p></body></html>"#,
    );
    out
}

fn figures(out: &mut String, t: &ReportRow) {
    let items: [(&str, String, bool); 9] = [
        ("cost per successful task", opt(t.cost_per_successful_task, usd), true),
        ("task success rate", opt(t.success_rate, pct), false),
        ("cache hit ratio", opt(t.cache_hit_ratio, pct), false),
        ("cost", usd(t.cost), false),
        ("requests", int(t.requests), false),
        (
            "tasks (succeeded / failed / abandoned / open)",
            format!("{} / {} / {} / {}", t.tasks_succeeded, t.tasks_failed, t.tasks_abandoned, t.tasks_open),
            false,
        ),
        ("TTFT p50 / p95", format!("{} / {}", opt(t.ttft_p50_ms, ms), opt(t.ttft_p95_ms, ms)), false),
        ("SLO attainment", opt(t.slo_attainment, pct), false),
        ("goodput", rps(t.goodput_rps), false),
    ];
    out.push_str(r#"<div class="figures">"#);
    for (name, value, lead) in items {
        let _ = write!(
            out,
            r#"<div class="figure{}"><div class="value">{}</div><div class="name">{}</div></div>"#,
            if lead { " lead" } else { "" },
            escape(&value),
            escape(name),
        );
    }
    out.push_str("</div>");
}

/// Where a day's point sits on the time axis (its midday), or `None` for a key that is not a day.
fn day_x(report: &Report, key: &str) -> Option<f64> {
    let day = NaiveDate::parse_from_str(key, "%Y-%m-%d").ok()?;
    let midday = day.and_hms_opt(12, 0, 0)?.and_utc();
    Some(fraction(report.from, report.to, midday))
}

fn fraction(from: DateTime<Utc>, to: DateTime<Utc>, t: DateTime<Utc>) -> f64 {
    let span = (to - from).num_seconds().max(1) as f64;
    ((t - from).num_seconds() as f64 / span).clamp(0.0, 1.0)
}

/// Time-axis labels: about six midnights across the window (the window's ends when it is shorter
/// than two days).
fn x_ticks(from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<(f64, String)> {
    let days = (to - from).num_seconds() as f64 / 86_400.0;
    if days < 2.0 {
        return vec![(0.0, from.format("%m-%d %H:%M").to_string()), (1.0, to.format("%m-%d %H:%M").to_string())];
    }
    let step = (days / 6.0).ceil().max(1.0) as i64;
    let mut t = from.date_naive().and_hms_opt(0, 0, 0).map(|d| d.and_utc()).unwrap_or(from);
    if t < from {
        t += Duration::days(1);
    }
    let mut ticks = Vec::new();
    while t <= to && ticks.len() < 16 {
        ticks.push((fraction(from, to, t), t.format("%b %d").to_string()));
        t += Duration::days(step);
    }
    ticks
}

/// The four charts with their titles, in page order.
pub fn charts(report: &Report) -> Vec<(&'static str, String)> {
    let ticks = x_ticks(report.from, report.to);
    let rows: Vec<(f64, &ReportRow)> =
        report.rows.iter().filter_map(|r| day_x(report, &r.key).map(|x| (x, r))).collect();
    let line = |f: fn(&ReportRow) -> Option<f64>| rows.iter().map(|(x, r)| (*x, f(r))).collect::<Vec<_>>();
    let frame = |id, title, y_label| Frame { id, title, x_ticks: &ticks, y_label };
    let day_share = 86_400.0 / (report.to - report.from).num_seconds().max(1) as f64;
    let bar = (day_share * 0.7).min(0.06);
    let titles = [
        "Cost per successful task (USD)",
        "Cache hit ratio (cached ÷ prompt tokens)",
        "Time to first token",
        "Task outcomes",
    ];
    let charts = [
        svg::lines(
            &frame("chart-cost-per-task", titles[0], usd),
            &[Series { name: "cost per successful task", colour: "c0", points: line(|r| r.cost_per_successful_task) }],
        ),
        svg::lines(
            &frame("chart-cache-hit", titles[1], pct),
            &[Series { name: "cache hit ratio", colour: "c0", points: line(|r| r.cache_hit_ratio) }],
        ),
        svg::lines(
            &frame("chart-ttft", titles[2], ms),
            &[
                Series { name: "p50", colour: "c0", points: line(|r| r.ttft_p50_ms) },
                Series { name: "p95", colour: "c1", points: line(|r| r.ttft_p95_ms) },
            ],
        ),
        svg::stacked_bars(
            &frame("chart-outcomes", titles[3], number),
            &[
                Layer {
                    name: "succeeded",
                    colour: "c0",
                    values: rows.iter().map(|(x, r)| (*x, r.tasks_succeeded as f64)).collect(),
                },
                Layer {
                    name: "failed",
                    colour: "c1",
                    values: rows.iter().map(|(x, r)| (*x, r.tasks_failed as f64)).collect(),
                },
                Layer {
                    name: "abandoned",
                    colour: "c2",
                    values: rows.iter().map(|(x, r)| (*x, r.tasks_abandoned as f64)).collect(),
                },
            ],
            bar,
        ),
    ];
    titles.into_iter().zip(charts).collect()
}

fn table(out: &mut String, report: &Report) {
    out.push_str(
        "<h2>By day</h2><div class=\"scroll\"><table><thead><tr><th>day</th><th>requests</th><th>prompt tokens</th><th>cached</th>\
<th>hit ratio</th><th>output tokens</th><th>cost</th><th>tasks ✓ / ✗ / abandoned / open</th>\
<th>cost per successful task</th><th>TTFT p50</th><th>TTFT p95</th><th>SLO</th></tr></thead><tbody>",
    );
    for (row, class) in report.rows.iter().map(|r| (r, "")).chain(std::iter::once((&report.total, "total"))) {
        let _ = write!(
            out,
            r#"<tr class="{class}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {} / {} / {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            escape(&row.key),
            int(row.requests),
            int(row.prompt_tokens),
            int(row.cached_tokens),
            opt(row.cache_hit_ratio, pct),
            int(row.output_tokens),
            usd(row.cost),
            row.tasks_succeeded,
            row.tasks_failed,
            row.tasks_abandoned,
            row.tasks_open,
            opt(row.cost_per_successful_task, usd),
            opt(row.ttft_p50_ms, ms),
            opt(row.ttft_p95_ms, ms),
            opt(row.slo_attainment, pct),
        );
    }
    if report.rows.is_empty() {
        let _ = write!(out, r#"<tr><td colspan="12">{NONE} no requests or tasks in this window</td></tr>"#);
    }
    out.push_str("</tbody></table></div>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachet_tenants::report::GroupBy;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn row(key: &str, cps: Option<f64>, hit: Option<f64>, p50: Option<f64>, ok: i64, failed: i64) -> ReportRow {
        ReportRow {
            key: key.into(),
            requests: 3,
            prompt_tokens: 1000,
            cached_tokens: 600,
            cost_per_successful_task: cps,
            cache_hit_ratio: hit,
            ttft_p50_ms: p50,
            ttft_p95_ms: p50.map(|v| v * 2.0),
            tasks_succeeded: ok,
            tasks_failed: failed,
            ..ReportRow::default()
        }
    }

    fn report(rows: Vec<ReportRow>) -> Report {
        Report {
            from: at("2026-11-01T00:00:00Z"),
            to: at("2026-12-01T00:00:00Z"),
            group_by: GroupBy::Day,
            rows,
            total: ReportRow { key: "total".into(), ..row("total", Some(0.25), Some(0.6), Some(120.0), 2, 1) },
        }
    }

    #[test]
    fn the_page_holds_four_charts_figures_and_the_table() {
        let r = report(vec![
            row("2026-11-03", Some(0.5), Some(0.2), Some(300.0), 1, 1),
            row("2026-11-10", None, Some(0.7), Some(90.0), 0, 1),
            row("2026-11-20", Some(0.1), Some(0.9), None, 1, 0),
        ]);
        let page = render_page("acme <&> — usage", &r);
        assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>"));
        assert!(page.contains("<h1>acme &lt;&amp;&gt; — usage</h1>"));
        for id in ["chart-cost-per-task", "chart-cache-hit", "chart-ttft", "chart-outcomes"] {
            assert_eq!(page.matches(&format!("<svg id=\"{id}\"")).count(), 1, "{id}");
        }
        assert!(
            !page.contains("<script") && !page.contains("src=") && !page.contains("href="),
            "no script or external asset"
        );
        assert!(!page.contains("NaN") && !page.contains("inf<"));
        assert!(!page.contains("no data"), "every chart has data");
        // Cost per successful task: two points and a gap where no task succeeded.
        let cps = &page[page.find("chart-cost-per-task").unwrap()..page.find("chart-cache-hit").unwrap()];
        assert_eq!(cps.matches("<circle class=\"point").count(), 2);
        // TTFT: p50 and p95 with a legend.
        let ttft =
            &page[page.find("<svg id=\"chart-ttft\"").unwrap()..page.find("<svg id=\"chart-outcomes\"").unwrap()];
        assert_eq!(ttft.matches("<path class=\"series").count(), 2);
        assert!(ttft.contains(">p50<") && ttft.contains(">p95<"));
        // The lead figure and the table's total row.
        assert!(page.contains("$0.25"));
        assert_eq!(page.matches("<tr class=\"\">").count(), 3);
        assert!(page.contains("<tr class=\"total\"><td>total</td>"));
    }

    #[test]
    fn points_sit_at_their_day_on_the_time_axis() {
        let r = report(vec![row("2026-11-01", Some(1.0), Some(0.5), Some(10.0), 1, 0)]);
        assert!((day_x(&r, "2026-11-01").unwrap() - 0.5 / 30.0).abs() < 1e-9);
        assert!((day_x(&r, "2026-11-30").unwrap() - 29.5 / 30.0).abs() < 1e-9);
        assert_eq!(day_x(&r, "none"), None);
        let ticks = x_ticks(r.from, r.to);
        assert_eq!(ticks.first().map(|t| t.0), Some(0.0));
        assert!(ticks.len() >= 5 && ticks.len() <= 8, "{ticks:?}");
        assert!(ticks.windows(2).all(|w| w[0].0 < w[1].0));
        let short = x_ticks(r.from, r.from + Duration::hours(5));
        assert_eq!(short.len(), 2);
    }

    #[test]
    fn an_empty_window_renders_without_numbers_it_does_not_have() {
        let mut r = report(vec![]);
        r.total = ReportRow { key: "total".into(), ..ReportRow::default() };
        let page = render_page("empty", &r);
        assert_eq!(page.matches("no data in this window").count(), 4);
        assert!(page.contains("no requests or tasks in this window"));
        assert!(!page.contains("NaN") && !page.contains("<path"));
        assert!(
            page.contains(&format!("<div class=\"value\">{NONE}</div><div class=\"name\">cost per successful task"))
        );
    }
}
