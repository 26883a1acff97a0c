//! Results: the JSON file (machines), the markdown table (people) and SVG
//! charts (TTFT distributions, configuration comparisons).

pub mod markdown;
pub mod svg;

use crate::client::Target;
use crate::error::BenchError;
use crate::record::Slo;
use crate::run::ScenarioResult;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The machine the benchmark ran on (the client's: run it on the server's host).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// `model name` from `/proc/cpuinfo`.
    pub cpu: String,
    /// Logical CPUs.
    pub cores: usize,
    /// `MemTotal` from `/proc/meminfo`, GiB.
    pub memory_gib: f64,
}

impl Machine {
    /// Reads `/proc/cpuinfo` and `/proc/meminfo`; unknown fields stay empty or zero.
    pub fn detect() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine::parse(&cpuinfo, &meminfo)
    }

    /// Parses the two files' text.
    pub fn parse(cpuinfo: &str, meminfo: &str) -> Machine {
        let field = |line: &str, name: &str| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        };
        let cpu = cpuinfo.lines().find_map(|l| field(l, "model name")).unwrap_or_else(|| "unknown CPU".into());
        let mut cores = cpuinfo.lines().filter(|l| field(l, "processor").is_some()).count();
        if cores == 0 {
            cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        }
        let kib: f64 = meminfo
            .lines()
            .find_map(|l| field(l, "MemTotal"))
            .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        Machine { cpu, cores, memory_gib: kib / (1024.0 * 1024.0) }
    }

    /// "CPU, N cores, M GiB".
    pub fn describe(&self) -> String {
        format!("{}, {} logical cores, {:.1} GiB memory", self.cpu, self.cores, self.memory_gib)
    }
}

/// Everything one run (or a merge of runs) produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultsFile {
    /// The format's version (1).
    pub format: u32,
    /// When the file was written.
    pub created_at: DateTime<Utc>,
    /// The run's label.
    #[serde(default)]
    pub label: Option<String>,
    /// Where it ran.
    pub machine: Machine,
    /// The targets (without their keys).
    pub targets: Vec<Target>,
    /// Every (system, scenario) result.
    pub results: Vec<ScenarioResult>,
}

impl ResultsFile {
    /// A file for `results`, on this machine, now.
    pub fn new(label: Option<String>, targets: Vec<Target>, results: Vec<ScenarioResult>) -> ResultsFile {
        ResultsFile { format: 1, created_at: Utc::now(), label, machine: Machine::detect(), targets, results }
    }

    /// Reads a results file.
    ///
    /// # Errors
    /// [`BenchError::Io`] or [`BenchError::Json`].
    pub fn read(path: &Path) -> Result<ResultsFile, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::io("reading", path, e))?;
        serde_json::from_str(&text).map_err(|source| BenchError::Json { path: path.to_path_buf(), source })
    }

    /// Merges files: results and targets in order (targets deduplicated by
    /// name and URL), the first file's machine.
    pub fn merge(files: Vec<ResultsFile>) -> ResultsFile {
        let mut out = ResultsFile {
            format: 1,
            created_at: Utc::now(),
            label: None,
            machine: files.first().map_or_else(Machine::detect, |f| f.machine.clone()),
            targets: Vec::new(),
            results: Vec::new(),
        };
        for f in files {
            for t in f.targets {
                if !out.targets.iter().any(|o| o.name == t.name && o.base_url == t.base_url) {
                    out.targets.push(t);
                }
            }
            out.results.extend(f.results);
        }
        out
    }

    /// The SLOs used, deduplicated.
    pub fn slos(&self) -> Vec<Slo> {
        let mut out: Vec<Slo> = Vec::new();
        for r in &self.results {
            if !out.contains(&r.summary.slo) {
                out.push(r.summary.slo);
            }
        }
        out
    }

    /// Writes `results.json`, `results.md`, `ttft.svg` and `configs.svg`
    /// into `dir` (created if needed); returns the markdown.
    ///
    /// # Errors
    /// [`BenchError::Io`] when a file cannot be written.
    pub fn write_all(&self, dir: &Path, with_records: bool) -> Result<String, BenchError> {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io("creating", dir, e))?;
        let mut file = self.clone();
        if !with_records {
            file.results.iter_mut().for_each(|r| r.records.clear());
        }
        let json = serde_json::to_string_pretty(&file).unwrap_or_default();
        let md = markdown::render(self);
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| BenchError::io("writing", path, e))
        };
        write("results.json", &json)?;
        write("results.md", &md)?;
        write("ttft.svg", &svg::ttft_cdf(&self.results))?;
        write("configs.svg", &svg::configs(&self.results))?;
        Ok(md)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::record::RequestRecord;
    use crate::stats::summarize;
    use crate::workload::{Scenario, ScenarioSpec};

    /// A result of `system` on `scenario` with two completed requests and one failure.
    pub(crate) fn sample(system: &str, scenario: Scenario, ttft: f64) -> ScenarioResult {
        let rec = |turn: usize, ttft: Option<f64>, error: Option<&str>| RequestRecord {
            conversation: 0,
            turn,
            scheduled_ms: 0.0,
            sent_ms: Some(0.0),
            end_ms: 1000.0,
            ttft_ms: ttft,
            itl_ms: vec![10.0, 20.0],
            e2e_ms: 1000.0,
            output_tokens: 3,
            prompt_tokens: Some(100),
            cached_tokens: Some(50),
            drafted_tokens: Some(8),
            accepted_tokens: Some(6),
            approx_prompt_tokens: 90,
            status: Some(200),
            retries: 0,
            error: error.map(str::to_string),
        };
        let records = vec![rec(0, Some(ttft), None), rec(1, Some(ttft * 2.0), None), rec(2, None, Some("HTTP 503"))];
        ScenarioResult {
            system: system.into(),
            label: None,
            model: "m".into(),
            scenario,
            spec: ScenarioSpec::defaults(scenario),
            seed: 9,
            started_at: Utc::now(),
            summary: summarize(&records, &Slo::default()),
            records,
            calibration: None,
        }
    }

    #[test]
    fn results_round_trip_through_json_and_merge() {
        let dir = std::env::temp_dir().join(format!("cachet-bench-test-{}", std::process::id()));
        let target = Target {
            name: "a".into(),
            base_url: "http://a".into(),
            model: "m".into(),
            api_key: Some("k".into()),
            tenant_keys: vec!["k2".into()],
        };
        let file = ResultsFile::new(None, vec![target], vec![sample("a", Scenario::Peak, 100.0)]);
        let md = file.write_all(&dir, true).unwrap();
        assert!(md.contains("| peak | a |"));
        let back = ResultsFile::read(&dir.join("results.json")).unwrap();
        assert_eq!(back.results, file.results);
        assert_eq!(back.targets[0].api_key, None, "keys are not written");
        assert!(back.targets[0].tenant_keys.is_empty(), "keys are not written");
        assert!(!std::fs::read_to_string(dir.join("results.json")).unwrap().contains("\"k\""));
        for f in ["results.md", "ttft.svg", "configs.svg"] {
            assert!(dir.join(f).exists(), "{f}");
        }
        let other = ResultsFile::new(Some("x".into()), back.targets.clone(), vec![sample("b", Scenario::Agent, 50.0)]);
        let merged = ResultsFile::merge(vec![back, other]);
        assert_eq!(merged.results.len(), 2);
        assert_eq!(merged.targets.len(), 1, "deduplicated");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn machine_from_proc_files() {
        let cpu = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9R14\n";
        let mem = "MemTotal:        8049248 kB\nMemFree: 1 kB\n";
        let m = Machine::parse(cpu, mem);
        assert_eq!((m.cpu.as_str(), m.cores), ("AMD EPYC 9R14", 2));
        assert!((m.memory_gib - 7.676).abs() < 0.01);
        assert!(m.describe().contains("2 logical cores"));
    }
}
