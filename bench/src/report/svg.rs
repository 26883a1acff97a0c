//! Self-contained SVG charts (no scripts, no external resources): empirical
//! CDFs of TTFT per system per scenario, and bar charts comparing
//! configurations.

use crate::run::ScenarioResult;
use crate::workload::Scenario;
use std::fmt::Write;

/// Colours of successive systems / configurations (colour-blind safe, Okabe-Ito).
const PALETTE: [&str; 8] = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];
const PANEL_W: f64 = 440.0;
const PANEL_H: f64 = 250.0;
const MARGIN: (f64, f64, f64, f64) = (50.0, 15.0, 30.0, 40.0); // left, right, top, bottom

/// Escapes text for XML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The configurations of `results` in first-seen order.
fn configurations(results: &[ScenarioResult]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in results {
        let c = r.configuration();
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// The scenarios of `results` in report order.
fn scenarios(results: &[ScenarioResult]) -> Vec<Scenario> {
    let mut out: Vec<Scenario> = results.iter().map(|r| r.scenario).collect();
    out.sort();
    out.dedup();
    out
}

fn open(svg: &mut String, width: f64, height: f64, title: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11"><title>{}</title><rect width="100%" height="100%" fill="white"/>"#,
        escape(title)
    );
}

fn legend(svg: &mut String, names: &[String], y: f64) {
    let mut x = 10.0;
    for (i, n) in names.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            y - 10.0,
            PALETTE[i % PALETTE.len()],
            x + 16.0,
            y,
            escape(n)
        );
        x += 30.0 + 7.0 * n.chars().count() as f64;
    }
}

/// Empirical CDFs of TTFT (log-scale x axis, ms), one panel per scenario,
/// one step line per system; completed requests only.
pub fn ttft_cdf(results: &[ScenarioResult]) -> String {
    let configs = configurations(results);
    let scens = scenarios(results);
    let cols = if scens.len() > 1 { 2 } else { 1 };
    let rows = scens.len().div_ceil(cols).max(1);
    let (w, h) = (PANEL_W * cols as f64, PANEL_H * rows as f64 + 30.0);
    let mut svg = String::new();
    open(&mut svg, w, h, "TTFT distribution per system (empirical CDF)");
    legend(&mut svg, &configs, 20.0);
    for (p, scen) in scens.iter().enumerate() {
        let (ox, oy) = ((p % cols) as f64 * PANEL_W, 30.0 + (p / cols) as f64 * PANEL_H);
        let series: Vec<(usize, Vec<f64>)> = results
            .iter()
            .filter(|r| r.scenario == *scen)
            .map(|r| {
                let mut v: Vec<f64> = r.records.iter().filter(|x| x.completed()).filter_map(|x| x.ttft_ms).collect();
                v.sort_by(f64::total_cmp);
                let c = configs.iter().position(|c| *c == r.configuration()).unwrap_or(0);
                (c, v)
            })
            .collect();
        let all = series.iter().flat_map(|(_, v)| v.iter().copied()).filter(|x| *x > 0.0);
        let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
        let (lo_dec, hi_dec) = if lo.is_finite() {
            (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0))
        } else {
            (1.0, 4.0)
        };
        let (left, right, top, bottom) = MARGIN;
        let (pw, ph) = (PANEL_W - left - right, PANEL_H - top - bottom);
        let x_of = |ms: f64| ox + left + (ms.max(1e-3).log10() - lo_dec) / (hi_dec - lo_dec) * pw;
        let y_of = |f: f64| oy + top + (1.0 - f) * ph;
        let _ = write!(
            svg,
            r##"<text x="{}" y="{}" font-weight="bold">{}</text><rect x="{}" y="{}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##,
            ox + left,
            oy + top - 8.0,
            escape(&format!("{scen}: TTFT (ms, log scale)")),
            ox + left,
            oy + top
        );
        for d in lo_dec as i32..=hi_dec as i32 {
            let x = x_of(10f64.powi(d));
            let _ = write!(
                svg,
                r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                oy + top,
                oy + top + ph,
                oy + top + ph + 14.0,
                decade_label(d)
            );
        }
        for f in [0.0, 0.5, 0.9, 1.0] {
            let y = y_of(f);
            let _ = write!(
                svg,
                r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" text-anchor="end">{f}</text>"##,
                ox + left,
                ox + left + pw,
                ox + left - 4.0,
                y + 4.0
            );
        }
        for (c, v) in &series {
            if v.is_empty() {
                continue;
            }
            let n = v.len() as f64;
            let mut pts = format!("{:.1},{:.1}", x_of(v[0]), y_of(0.0));
            for (i, &x) in v.iter().enumerate() {
                let _ = write!(
                    pts,
                    " {:.1},{:.1} {:.1},{:.1}",
                    x_of(x),
                    y_of(i as f64 / n),
                    x_of(x),
                    y_of((i + 1) as f64 / n)
                );
            }
            let _ = write!(
                svg,
                r#"<polyline points="{pts}" fill="none" stroke="{}" stroke-width="2"/>"#,
                PALETTE[c % PALETTE.len()]
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn decade_label(d: i32) -> String {
    match d {
        d if d < 0 => format!("{}", 10f64.powi(d)),
        0..=3 => format!("{}", 10i64.pow(d as u32)),
        d => format!("{}k", 10i64.pow(d as u32 - 3)),
    }
}

/// One panel of a bar chart: a title and one bar per configuration (`None`: no value).
#[derive(Clone, Debug, PartialEq)]
pub struct BarPanel {
    /// The panel's title.
    pub title: String,
    /// The bars' values, indexed like the chart's configurations.
    pub values: Vec<Option<f64>>,
    /// Show values as percentages of 1.
    pub percent: bool,
}

/// A grid of bar panels (`cols` per row) with one colour per configuration.
pub fn bar_chart(title: &str, configs: &[String], panels: &[BarPanel], cols: usize) -> String {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols).max(1);
    let panel_w = (60.0 + 48.0 * configs.len() as f64).max(240.0);
    let (w, h) = (panel_w * cols as f64, PANEL_H * rows as f64 + 30.0);
    let mut svg = String::new();
    open(&mut svg, w, h, title);
    legend(&mut svg, configs, 20.0);
    let (left, right, top, bottom) = MARGIN;
    for (p, panel) in panels.iter().enumerate() {
        let (ox, oy) = ((p % cols) as f64 * panel_w, 30.0 + (p / cols) as f64 * PANEL_H);
        let (pw, ph) = (panel_w - left - right, PANEL_H - top - bottom);
        let max = panel.values.iter().flatten().copied().fold(0.0f64, f64::max);
        // Headroom above the tallest bar for its label; percentages on a 0-100% scale.
        let top_value = if panel.percent || max <= 0.0 { max.max(1.0) * 1.15 } else { max * 1.15 };
        let _ = write!(
            svg,
            r##"<text x="{}" y="{}" font-weight="bold">{}</text><line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"/>"##,
            ox + left,
            oy + top - 8.0,
            escape(&panel.title),
            ox + left,
            oy + top + ph,
            ox + left + pw,
            oy + top + ph
        );
        let slot = pw / panel.values.len().max(1) as f64;
        for (i, v) in panel.values.iter().enumerate() {
            let x = ox + left + i as f64 * slot + slot * 0.15;
            let Some(v) = v else {
                let _ = write!(svg, r#"<text x="{:.1}" y="{:.1}">n/a</text>"#, x, oy + top + ph - 4.0);
                continue;
            };
            let bh = (v / top_value).clamp(0.0, 1.0) * ph;
            let label = if panel.percent { format!("{:.0}%", v * 100.0) } else { format!("{v:.3}") };
            let _ = write!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#,
                oy + top + ph - bh,
                slot * 0.7,
                PALETTE[i % PALETTE.len()],
                x + slot * 0.35,
                oy + top + ph - bh - 3.0
            );
        }
    }
    svg.push_str("</svg>\n");
    svg
}

/// Completed requests/s, SLO attainment and goodput per configuration, one
/// row of three panels per scenario.
pub fn configs(results: &[ScenarioResult]) -> String {
    let configs = configurations(results);
    let mut panels = Vec::new();
    for scen in scenarios(results) {
        let value = |f: &dyn Fn(&ScenarioResult) -> f64| -> Vec<Option<f64>> {
            configs
                .iter()
                .map(|c| results.iter().find(|r| r.scenario == scen && r.configuration() == *c).map(f))
                .collect()
        };
        panels.push(BarPanel {
            title: format!("{scen}: completed req/s"),
            values: value(&|r| r.summary.requests_per_s),
            percent: false,
        });
        panels.push(BarPanel {
            title: format!("{scen}: SLO attainment"),
            values: value(&|r| r.summary.slo_attainment),
            percent: true,
        });
        panels.push(BarPanel {
            title: format!("{scen}: goodput req/s"),
            values: value(&|r| r.summary.goodput_per_s),
            percent: false,
        });
    }
    bar_chart("Configurations compared", &configs, &panels, 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_charts_are_self_contained_svg() {
        let svg = bar_chart(
            "t <&>",
            &["a".into(), "b".into()],
            &[BarPanel { title: "x".into(), values: vec![Some(0.5), None], percent: true }],
            3,
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("t &lt;&amp;&gt;"));
        assert!(svg.contains("50%") && svg.contains("n/a"));
        assert!(!svg.contains("<script"));
    }

    #[test]
    fn decade_labels() {
        assert_eq!(decade_label(0), "1");
        assert_eq!(decade_label(3), "1000");
        assert_eq!(decade_label(4), "10k");
        assert_eq!(decade_label(-1), "0.1");
    }
}
