//! The markdown report: context (date, machine, seed, SLOs, scenario
//! parameters) and one table row per (scenario, system).

use super::ResultsFile;
use crate::run::ScenarioResult;
use crate::stats::Percentiles;
use crate::workload::{Scenario, CHARS_PER_TOKEN};
use std::fmt::Write;

/// The whole report.
pub fn render(file: &ResultsFile) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# cachet-bench results\n");
    if let Some(label) = &file.label {
        let _ = writeln!(md, "Label: {label}\n");
    }
    let dates = date_range(file);
    let _ = writeln!(md, "- Date: {dates}");
    let _ = writeln!(md, "- Machine (client): {}", file.machine.describe());
    let mut seeds: Vec<u64> = file.results.iter().map(|r| r.seed).collect();
    seeds.sort_unstable();
    seeds.dedup();
    let seeds: Vec<String> = seeds.iter().map(u64::to_string).collect();
    let _ = writeln!(md, "- Seed: {}", seeds.join(", "));
    for slo in file.slos() {
        let _ = writeln!(
            md,
            "- SLO: TTFT ≤ {} ms and mean inter-token latency ≤ {} ms per request; \
             goodput = requests meeting it per second of wall time",
            slo.ttft_ms, slo.itl_ms
        );
    }
    for t in &file.targets {
        let _ = writeln!(md, "- Target `{}`: {} (model `{}`)", t.name, t.base_url, t.model);
    }
    let _ = writeln!(
        md,
        "- TTFT and e2e count from when the arrival process scheduled the request (client-side queueing included). \
         Percentiles interpolate linearly between closest ranks (numpy's default); ITL percentiles pool every \
         gap between token events. Failed requests count in totals and never meet the SLO. Sizes are approximate \
         tokens ({CHARS_PER_TOKEN} characters each); *prompt tok* is the server-reported mean. Throughput is over \
         the wall time from the first send to the last completion.\n"
    );

    let _ = writeln!(md, "## Scenarios\n\n| scenario | parameters |\n|---|---|");
    let mut seen: Vec<(Scenario, String)> = Vec::new();
    for r in &file.results {
        let d = r.spec.describe();
        if !seen.iter().any(|(s, x)| *s == r.scenario && *x == d) {
            let _ = writeln!(md, "| {} | {} |", r.scenario, d);
            seen.push((r.scenario, d));
        }
    }

    calibration_table(&mut md, file);
    let calibrated = file.results.iter().any(|r| r.summary.calibrated.is_some());
    let _ = writeln!(
        md,
        "\n## Results\n\n| scenario | system | done / failed | TTFT p50 / p95 / p99 ms | ITL p50 / p95 / p99 ms \
         | e2e p50 / p95 / p99 ms | req/s | out tok/s | SLO met | goodput req/s |{} cached | prompt tok | drafts confirmed |\n\
         |---|---|---|---|---|---|---|---|---|---|{}---|---|---|",
        if calibrated { " SLO met (calibrated) | goodput (calibrated) |" } else { "" },
        if calibrated { "---|---|" } else { "" },
    );
    let several_slos = file.slos().len() > 1;
    let mut rows: Vec<_> = file.results.iter().enumerate().collect();
    rows.sort_by_key(|(i, r)| (r.scenario, *i));
    for (_, r) in rows {
        let s = &r.summary;
        let cached = s.cached_ratio.map_or("n/a".to_string(), |c| format!("{:.0}%", c * 100.0));
        let prompt = if s.completed > 0 && s.prompt_tokens > 0 {
            format!("{:.0}", s.prompt_tokens as f64 / s.completed as f64)
        } else {
            "n/a".into()
        };
        let drafts = match s.drafts {
            None => "n/a".to_string(),
            Some(d) if d.drafted == 0 => "0".to_string(),
            Some(d) => format!("{} / {} ({:.0}%)", d.accepted, d.drafted, d.accepted as f64 * 100.0 / d.drafted as f64),
        };
        let cal = match (calibrated, s.calibrated) {
            (false, _) => String::new(),
            (true, None) => " n/a | n/a |".into(),
            (true, Some(c)) => format!(" {:.0}% | {:.3} |", c.slo_attainment * 100.0, c.goodput_per_s),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} / {}{} | {} | {} | {} | {:.3} | {:.1} | {:.0}% | {:.3} |{cal} {} | {} | {drafts} |",
            r.scenario,
            system_cell(r, several_slos),
            s.completed,
            s.failed,
            if s.retries > 0 { format!(" ({} retries)", s.retries) } else { String::new() },
            triple(&s.ttft_ms, 0),
            triple(&s.itl_ms, 1),
            triple(&s.e2e_ms, 0),
            s.requests_per_s,
            s.output_tokens_per_s,
            s.slo_attainment * 100.0,
            s.goodput_per_s,
            cached,
            prompt,
        );
    }
    turn_table(&mut md, file);
    let failures: Vec<String> = file
        .results
        .iter()
        .flat_map(|r| {
            r.records.iter().filter_map(move |x| {
                x.error
                    .as_ref()
                    .map(|e| format!("- {} / {} #{}.{}: {e}", r.scenario, r.configuration(), x.conversation, x.turn))
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(md, "\n## Failures\n");
        for f in failures.iter().take(50) {
            let _ = writeln!(md, "{f}");
        }
        if failures.len() > 50 {
            let _ = writeln!(md, "- ... and {} more", failures.len() - 50);
        }
    }
    md
}

/// `agent-trace` per request of a session: TTFT p50 and the cached share of prompt tokens, per
/// configuration (the first request of a session pays for the client's preamble; the later ones
/// show how much of it and of the growing conversation the server kept).
fn turn_table(md: &mut String, file: &ResultsFile) {
    let runs: Vec<&ScenarioResult> = file.results.iter().filter(|r| r.scenario == Scenario::AgentTrace).collect();
    let turns = runs.iter().flat_map(|r| r.records.iter().map(|x| x.turn + 1)).max().unwrap_or(0);
    if turns == 0 {
        return;
    }
    let _ = write!(md, "\n## agent-trace by request of a session\n\nTTFT p50 ms / cached share of prompt tokens, over the agents' completed requests.\n\n| request |");
    for r in &runs {
        let _ = write!(md, " {} |", r.configuration());
    }
    let _ = writeln!(md, "\n|---|{}", "---|".repeat(runs.len()));
    for turn in 0..turns {
        let _ = write!(md, "| {} |", turn + 1);
        for r in &runs {
            let done: Vec<_> = r.records.iter().filter(|x| x.turn == turn && x.completed()).collect();
            let ttft: Vec<f64> = done.iter().filter_map(|x| x.ttft_ms).collect();
            let prompt: u64 = done.iter().filter_map(|x| x.prompt_tokens).sum();
            let cached: Option<u64> = done.iter().map(|x| x.cached_tokens).sum();
            let cell = match (crate::stats::percentile(&ttft, 50.0), cached) {
                (None, _) => "n/a".to_string(),
                (Some(t), Some(c)) if prompt > 0 => format!("{t:.0} / {:.0}%", c as f64 * 100.0 / prompt as f64),
                (Some(t), _) => format!("{t:.0} / n/a"),
            };
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
    }
}

/// Each calibrated scenario's lone figures and the SLO they give (the first result's: every
/// target of a run shares its scenario's calibration).
fn calibration_table(md: &mut String, file: &ResultsFile) {
    let mut seen: Vec<Scenario> = Vec::new();
    let mut rows = String::new();
    for r in &file.results {
        let Some(c) = &r.calibration else { continue };
        if seen.contains(&r.scenario) {
            continue;
        }
        seen.push(r.scenario);
        let lone: Vec<String> =
            c.lone.iter().map(|l| format!("{} {:.0} / {:.1}", l.system, l.ttft_ms, l.itl_ms)).collect();
        let _ = writeln!(
            rows,
            "| {} | {} | {} | {:.0} / {:.0} | {:.3} |",
            r.scenario,
            c.prompt_tokens,
            lone.join("; "),
            c.slo.ttft_ms,
            c.slo.itl_ms,
            c.capacity_per_s
        );
    }
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "\n## Calibrated SLO\n\nBefore each scenario every target served {} lone requests of the scenario's \
         median first-request size (fresh prompts, targets alternating; the fastest counts). Calibrated SLO: TTFT ≤ \
         {}× and mean ITL ≤ {}× the fastest target's lone figures (`cachet_bench::calibrate`); capacity: requests \
         per second the fastest target serves one at a time (open-loop arrivals run at {}× it).\n\n\
         | scenario | lone prompt ~tok | lone TTFT ms / ITL ms | calibrated SLO TTFT / ITL ms | capacity req/s |\n\
         |---|---|---|---|---|\n{rows}",
        crate::calibrate::ROUNDS,
        crate::calibrate::TTFT_FACTOR,
        crate::calibrate::ITL_FACTOR,
        crate::workload::PEAK_LOAD,
    );
}

/// The configuration, with its SLO when results with different SLOs are merged.
fn system_cell(r: &ScenarioResult, with_slo: bool) -> String {
    if with_slo {
        format!("{} (SLO {} / {} ms)", r.configuration(), r.summary.slo.ttft_ms, r.summary.slo.itl_ms)
    } else {
        r.configuration()
    }
}

/// "p50 / p95 / p99" with `digits` decimals, or "n/a".
fn triple(p: &Option<Percentiles>, digits: usize) -> String {
    match p {
        Some(p) => format!("{:.d$} / {:.d$} / {:.d$}", p.p50, p.p95, p.p99, d = digits),
        None => "n/a".into(),
    }
}

/// The first and last scenario start, as UTC dates and times.
fn date_range(file: &ResultsFile) -> String {
    let first = file.results.iter().map(|r| r.started_at).min();
    let last = file.results.iter().map(|r| r.started_at).max();
    let fmt = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M UTC").to_string();
    match (first, last) {
        (Some(a), Some(b)) if fmt(a) != fmt(b) => format!("{} to {}", fmt(a), fmt(b)),
        (Some(a), _) => fmt(a),
        _ => fmt(file.created_at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::sample;
    use crate::report::Machine;

    #[test]
    fn the_report_states_its_context_and_one_row_per_result() {
        let mut file = ResultsFile::new(
            Some("run 1".into()),
            Vec::new(),
            vec![sample("cachet", Scenario::Agent, 100.0), sample("llama", Scenario::Peak, 200.0)],
        );
        file.machine = Machine { cpu: "Test CPU".into(), cores: 2, memory_gib: 8.0 };
        let md = render(&file);
        for needle in
            ["Test CPU, 2 logical cores, 8.0 GiB", "Seed: 9", "TTFT ≤ 3000 ms", "≤ 250 ms", "Date: 20", "numpy"]
        {
            assert!(md.contains(needle), "{needle} missing:\n{md}");
        }
        // Scenario order (peak before agent), parameters, the failure listed.
        let peak = md.find("| peak | llama | 2 / 1 | 300 / 390 / 398 |").expect("peak row");
        let agent = md.find("| agent | cachet | 2 / 1 |").expect("agent row");
        assert!(peak < agent);
        assert!(md.contains("| peak | 8 prompts of ~600 tok"));
        assert!(md.contains("HTTP 503"));
        assert!(md.contains("| 50% |"), "cached ratio");
        assert!(!md.contains("by request of a session"), "no agent-trace results, no table");
    }

    #[test]
    fn calibrated_results_get_their_slo_table_and_columns() {
        use crate::calibrate::{Calibration, Lone};
        let lone = |system: &str, ttft_ms, itl_ms| Lone { system: system.into(), ttft_ms, itl_ms };
        let c = Calibration::from_lone(600, 32, vec![lone("cachet", 100.0, 20.0), lone("llama", 120.0, 10.0)]).unwrap();
        // The sample's requests: TTFT 100 and 200 ms, gaps 10 and 20 ms, one failed.
        let file = ResultsFile::new(None, Vec::new(), vec![sample("cachet", Scenario::Peak, 100.0).calibrated(c)]);
        let md = render(&file);
        assert!(md.contains("| peak | 600 | cachet 100 / 20.0; llama 120 / 10.0 | 300 / 50 |"), "{md}");
        assert!(md.contains("SLO met (calibrated) | goodput (calibrated) |"), "{md}");
        // Both completed requests meet TTFT ≤ 300 ms and mean ITL ≤ 50 ms: 2 of 3 in 1 s.
        assert!(md.contains("| 67% | 2.000 |"), "{md}");
        let plain = render(&ResultsFile::new(None, Vec::new(), vec![sample("cachet", Scenario::Peak, 100.0)]));
        assert!(!plain.contains("calibrated"), "{plain}");
    }

    #[test]
    fn agent_trace_results_get_a_row_per_request_of_a_session() {
        let file = ResultsFile::new(
            None,
            Vec::new(),
            vec![sample("cachet", Scenario::AgentTrace, 100.0), sample("llama", Scenario::AgentTrace, 300.0)],
        );
        let md = render(&file);
        assert!(md.contains("| request | cachet | llama |"), "{md}");
        assert!(md.contains("| 1 | 100 / 50% | 300 / 50% |"), "{md}");
        assert!(md.contains("| 2 | 200 / 50% | 600 / 50% |"), "{md}");
        assert!(md.contains("| 3 | n/a | n/a |"), "the failed request: {md}");
    }
}
