//! Inline SVG charts for the report page: lines over a time axis, and stacked bars. No script, no
//! external assets; every number written is finite.

use super::format::escape;
use std::fmt::Write;

/// Size of every chart, in SVG user units (the page scales it to its width).
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 220.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 30.0;
/// Horizontal grid lines (and y labels) above zero.
const Y_TICKS: usize = 4;

/// One line of a line chart: points at `x` in `[0, 1]` of the time axis. `None` leaves a gap.
#[derive(Debug)]
pub struct Series<'a> {
    pub name: &'a str,
    /// CSS class giving its colour (`c0`, `c1`, ...).
    pub colour: &'a str,
    pub points: Vec<(f64, Option<f64>)>,
}

/// One stacked bar layer: `(x, value)` per bar.
#[derive(Debug)]
pub struct Layer<'a> {
    pub name: &'a str,
    pub colour: &'a str,
    pub values: Vec<(f64, f64)>,
}

/// The chart frame shared by both kinds.
#[derive(Debug)]
pub struct Frame<'a> {
    pub id: &'a str,
    pub title: &'a str,
    /// Labels of the time axis: `(x in [0, 1], text)`.
    pub x_ticks: &'a [(f64, String)],
    /// How y values are labelled.
    pub y_label: fn(f64) -> String,
}

fn px(x: f64) -> f64 {
    LEFT + x.clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
}

fn py(y: f64, top: f64) -> f64 {
    let h = HEIGHT - TOP - BOTTOM;
    TOP + h - (y / top).clamp(0.0, 1.0) * h
}

/// A "nice" top for a y axis showing values up to `max` in [`Y_TICKS`] steps of 1, 2, 2.5 or 5
/// times a power of ten.
pub fn nice_top(max: f64) -> f64 {
    if !max.is_finite() || max <= 0.0 {
        return 1.0;
    }
    let raw = max / Y_TICKS as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(10.0 * magnitude);
    step * Y_TICKS as f64
}

fn open(out: &mut String, frame: &Frame<'_>) {
    let _ = write!(
        out,
        r#"<svg id="{id}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-labelledby="{id}-title" xmlns="http://www.w3.org/2000/svg"><title id="{id}-title">{title}</title>"#,
        id = escape(frame.id),
        title = escape(frame.title),
    );
}

fn axes(out: &mut String, frame: &Frame<'_>, top: f64) {
    for i in 0..=Y_TICKS {
        let v = top * i as f64 / Y_TICKS as f64;
        let y = py(v, top);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{LEFT}" x2="{x2}" y1="{y:.1}" y2="{y:.1}"/><text class="tick" x="{lx}" y="{ty:.1}" text-anchor="end">{label}</text>"#,
            x2 = WIDTH - RIGHT,
            lx = LEFT - 6.0,
            ty = y + 4.0,
            label = escape(&(frame.y_label)(v)),
        );
    }
    let base = HEIGHT - BOTTOM;
    for (x, label) in frame.x_ticks {
        // Labels at the ends stay inside the chart.
        let anchor = match *x {
            x if x < 0.05 => "start",
            x if x > 0.95 => "end",
            _ => "middle",
        };
        let _ = write!(
            out,
            r#"<line class="axis" x1="{x:.1}" x2="{x:.1}" y1="{base}" y2="{b2}"/><text class="tick" x="{x:.1}" y="{ty}" text-anchor="{anchor}">{label}</text>"#,
            x = px(*x),
            b2 = base + 4.0,
            ty = base + 18.0,
            label = escape(label),
        );
    }
}

fn no_data(out: &mut String) {
    let _ = write!(
        out,
        r#"<text class="empty" x="{x}" y="{y}" text-anchor="middle">no data in this window</text></svg>"#,
        x = WIDTH / 2.0,
        y = HEIGHT / 2.0,
    );
}

fn legend(out: &mut String, entries: &[(&str, &str)]) {
    if entries.len() < 2 {
        return;
    }
    let mut x = LEFT + 8.0;
    for (name, colour) in entries {
        let _ = write!(
            out,
            r#"<g class="legend"><rect class="{colour}" x="{x:.1}" y="{y}" width="10" height="10"/><text x="{tx:.1}" y="{ty}">{name}</text></g>"#,
            y = TOP,
            tx = x + 14.0,
            ty = TOP + 9.0,
            colour = escape(colour),
            name = escape(name),
        );
        x += 24.0 + 7.0 * name.chars().count() as f64;
    }
}

/// A line chart; `y` starts at zero. Shows "no data" when no series has a finite point.
pub fn lines(frame: &Frame<'_>, series: &[Series<'_>]) -> String {
    let mut out = String::new();
    open(&mut out, frame);
    let finite = |v: &Option<f64>| v.filter(|v| v.is_finite());
    let max = series.iter().flat_map(|s| s.points.iter().filter_map(|(_, v)| finite(v))).fold(f64::NAN, f64::max);
    if max.is_nan() {
        no_data(&mut out);
        return out;
    }
    let top = nice_top(max);
    axes(&mut out, frame, top);
    for s in series {
        let mut d = String::new();
        let mut pen_down = false;
        for (x, v) in &s.points {
            match finite(v) {
                Some(v) => {
                    let _ = write!(d, "{}{:.1} {:.1} ", if pen_down { "L" } else { "M" }, px(*x), py(v, top));
                    pen_down = true;
                }
                None => pen_down = false,
            }
        }
        if d.is_empty() {
            continue;
        }
        let _ = write!(out, r#"<path class="series {}" d="{}"/>"#, escape(s.colour), d.trim_end());
        for (x, v) in &s.points {
            if let Some(v) = finite(v) {
                let _ = write!(
                    out,
                    r#"<circle class="point {c}" cx="{cx:.1}" cy="{cy:.1}" r="3"><title>{name}: {label}</title></circle>"#,
                    c = escape(s.colour),
                    cx = px(*x),
                    cy = py(v, top),
                    name = escape(s.name),
                    label = escape(&(frame.y_label)(v)),
                );
            }
        }
    }
    let entries: Vec<(&str, &str)> = series.iter().map(|s| (s.name, s.colour)).collect();
    legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}

/// Stacked bars, one per x, of width `bar` (a fraction of the axis). "No data" when every value
/// is zero.
pub fn stacked_bars(frame: &Frame<'_>, layers: &[Layer<'_>], bar: f64) -> String {
    let mut out = String::new();
    open(&mut out, frame);
    let mut totals: Vec<(f64, f64)> = Vec::new();
    for layer in layers {
        for (x, v) in &layer.values {
            let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
            match totals.iter_mut().find(|(tx, _)| tx == x) {
                Some((_, t)) => *t += v,
                None => totals.push((*x, v)),
            }
        }
    }
    let max = totals.iter().map(|(_, t)| *t).fold(0.0, f64::max);
    if max <= 0.0 {
        no_data(&mut out);
        return out;
    }
    let top = nice_top(max);
    axes(&mut out, frame, top);
    let half = (bar * (WIDTH - LEFT - RIGHT) / 2.0).max(1.5);
    let mut base: Vec<(f64, f64)> = totals.iter().map(|(x, _)| (*x, 0.0)).collect();
    for layer in layers {
        let mut d = String::new();
        for (x, v) in &layer.values {
            let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
            if v == 0.0 {
                continue;
            }
            let Some((_, b)) = base.iter_mut().find(|(bx, _)| bx == x) else { continue };
            let (y0, y1) = (py(*b, top), py(*b + v, top));
            *b += v;
            let cx = px(*x);
            let _ = write!(
                d,
                "M{:.1} {y0:.1} L{:.1} {y0:.1} L{:.1} {y1:.1} L{:.1} {y1:.1} Z ",
                cx - half,
                cx + half,
                cx + half,
                cx - half,
            );
        }
        if !d.is_empty() {
            let _ = write!(
                out,
                r#"<path class="series bar {c}" d="{d}"><title>{name}</title></path>"#,
                c = escape(layer.colour),
                d = d.trim_end(),
                name = escape(layer.name),
            );
        }
    }
    let entries: Vec<(&str, &str)> = layers.iter().map(|l| (l.name, l.colour)).collect();
    legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame<'a>(ticks: &'a [(f64, String)]) -> Frame<'a> {
        Frame { id: "c", title: "T <&>", x_ticks: ticks, y_label: |v| format!("{v}") }
    }

    #[test]
    fn nice_tops_cover_the_maximum_in_round_steps() {
        assert_eq!(nice_top(0.0), 1.0);
        assert_eq!(nice_top(f64::NAN), 1.0);
        assert_eq!(nice_top(1.0), 1.0);
        assert_eq!(nice_top(0.87), 1.0);
        assert_eq!(nice_top(3.7), 4.0);
        assert_eq!(nice_top(9.0), 10.0);
        assert_eq!(nice_top(130.0), 200.0);
        assert_eq!(nice_top(0.0042), 0.008);
        for m in [0.3, 7.0, 55.0, 1234.0, 0.00017] {
            assert!(nice_top(m) >= m, "{m}");
        }
    }

    #[test]
    fn lines_break_at_gaps_and_draw_points() {
        let ticks = [(0.0, "a".to_string()), (1.0, "b".to_string())];
        let svg = lines(
            &frame(&ticks),
            &[Series {
                name: "s",
                colour: "c0",
                points: vec![(0.0, Some(1.0)), (0.5, None), (0.75, Some(2.0)), (1.0, Some(4.0))],
            }],
        );
        assert!(svg.starts_with("<svg id=\"c\"") && svg.ends_with("</svg>"));
        assert!(svg.contains("T &lt;&amp;&gt;"), "title escaped");
        let d = svg.split("class=\"series c0\" d=\"").nth(1).unwrap().split('"').next().unwrap();
        assert_eq!(d.matches('M').count(), 2, "a gap starts a new stroke: {d}");
        assert_eq!(d.matches('L').count(), 1, "{d}");
        assert_eq!(svg.matches("<circle class=\"point").count(), 3);
        // The highest point sits at the top of the plot (4 is the nice top).
        assert!(d.ends_with(&format!("{:.1} {:.1}", px(1.0), TOP)), "{d}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
        assert!(!svg.contains("no data"));
    }

    #[test]
    fn empty_and_non_finite_series_say_no_data() {
        let svg =
            lines(&frame(&[]), &[Series { name: "s", colour: "c0", points: vec![(0.5, None), (0.6, Some(f64::NAN))] }]);
        assert!(svg.contains("no data"));
        assert!(!svg.contains("<path"));
        let svg = stacked_bars(&frame(&[]), &[Layer { name: "a", colour: "c0", values: vec![(0.5, 0.0)] }], 0.1);
        assert!(svg.contains("no data"));
    }

    #[test]
    fn bars_stack_layers() {
        let svg = stacked_bars(
            &frame(&[]),
            &[
                Layer { name: "ok", colour: "c0", values: vec![(0.25, 1.0), (0.75, 3.0)] },
                Layer { name: "failed", colour: "c1", values: vec![(0.25, 1.0), (0.75, 0.0)] },
            ],
            0.1,
        );
        assert_eq!(svg.matches("<path class=\"series bar").count(), 2);
        // Top is 4 (max total 3 → nice 4); the failed bar at 0.25 spans 1..2.
        let failed = svg.split("bar c1\" d=\"").nth(1).unwrap().split('"').next().unwrap();
        assert!(
            failed.contains(&format!("{:.1}", py(1.0, 4.0))) && failed.contains(&format!("{:.1}", py(2.0, 4.0))),
            "{failed}"
        );
        assert_eq!(failed.matches('Z').count(), 1, "zero values draw nothing");
        assert!(svg.contains("class=\"legend\""));
    }
}
