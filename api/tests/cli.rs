//! The `cachet` binary end to end: generation on a tiny model the test
//! writes, clear errors for bad input, and the resident-memory bound on the
//! real default model.

use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::quant::DType;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn cachet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachet")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    Tiny::random(TinyArch::Qwen2, 9, false).write_gguf(DType::Q8_0, &path).unwrap();
    path
}

#[test]
fn generate_streams_and_reports_speed() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let out = cachet(&["generate", "--model", m, "--prompt", "hello", "--max-tokens", "12", "--ignore-eos", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["generated_tokens"], 12);
    assert_eq!(v["finish_reason"], "length");
    assert!(v["decode_tokens_per_second"].as_f64().unwrap() > 0.0);

    // Same seed, same text; the human-readable form prints the speeds.
    let args = ["generate", "--model", m, "--chat", "--prompt", "hi", "--max-tokens", "16", "--temperature", "1.0"];
    let a = cachet(&[&args[..], &["--seed", "5", "--ignore-eos"]].concat());
    let b = cachet(&[&args[..], &["--seed", "5", "--ignore-eos"]].concat());
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
    assert!(stderr(&a).contains("tok/s"), "{}", stderr(&a));
}

#[test]
fn special_tokens_in_the_prompt_are_parsed_unless_plain() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let prompt = "<|im_start|>user\nhi<|im_end|>";
    let tokens = |extra: &[&str]| {
        let out =
            cachet(&[&["generate", "--model", m, "--prompt", prompt, "--max-tokens", "1", "--json"], extra].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["prompt_tokens"].as_u64().unwrap()
    };
    // Each special token is one token parsed (as /v1/completions encodes it), and one token per
    // character as plain text in the tiny byte-level vocabulary: 12 + 10 characters.
    let (parsed, plain) = (tokens(&[]), tokens(&["--plain"]));
    assert_eq!(plain - parsed, 11 + 9, "parsed {parsed}, plain {plain}");
}

#[test]
fn bad_input_gives_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let m = model.to_str().unwrap();
    let check = |args: &[&str], needle: &str| {
        let out = cachet(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    };
    check(&["generate", "--model", "/nonexistent/model.gguf", "--prompt", "x"], "/nonexistent/model.gguf");

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a model").unwrap();
    check(&["generate", "--model", garbage.to_str().unwrap(), "--prompt", "x"], "not a GGUF file");

    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    check(&["generate", "--model", truncated.to_str().unwrap(), "--prompt", "x"], "beyond the end of the file");

    check(&["generate", "--model", m, "--prompt", "x", "--top-p", "0"], "top_p");
    check(&["generate", "--model", m, "--prompt", "a b c d e f g h", "--ctx", "4"], "context window");
    check(&["generate", "--model", m, "--prompt", ""], "empty");
}

/// Weights are memory-mapped and used quantized: peak RSS while generating
/// stays within the file size + the KV pool + 300 MiB.
#[test]
fn resident_memory_stays_within_budget() {
    let Some(path) = cachet_engine::testing::default_model() else { return };
    let prompt = "Explain, with a short Rust example, how ownership and borrowing work. ".repeat(20);
    let out = cachet(&[
        "generate",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        &prompt,
        "--max-tokens",
        "48",
        "--ignore-eos",
        "--ctx",
        "4096",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (rss, file, kv) = (
        v["peak_rss_bytes"].as_u64().unwrap(),
        v["model_file_bytes"].as_u64().unwrap(),
        v["kv_pool_bytes"].as_u64().unwrap(),
    );
    let budget = file + kv + (300 << 20);
    eprintln!("peak RSS {} MiB, budget {} MiB", rss >> 20, budget >> 20);
    assert!(rss <= budget, "peak RSS {rss} > file {file} + KV {kv} + 300 MiB");
}

/// A mistake in the configuration fails `cachet serve` before anything starts (no Postgres
/// cluster is created, no model is loaded), with the key named.
#[test]
fn serve_refuses_a_mistyped_setting_before_starting_anything() {
    for (toml, needle) in [
        ("[engine]\npolicy = \"fsfc\"\n", "engine.policy"),
        ("[model]\ndevice = \"gpu0\"\n", "model.device"),
        ("[context]\nafter_push = \"overlya\"\n", "context.after_push"),
        ("[engine]\npolcy = \"fcfs\"\n", "polcy"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cachet.toml");
        std::fs::write(&file, toml).unwrap();
        let data = dir.path().join("data");
        let out = Command::new(env!("CARGO_BIN_EXE_cachet"))
            .args(["serve", "--config", file.to_str().unwrap(), "--data-dir", data.to_str().unwrap()])
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(!out.status.success(), "{toml}: started");
        assert!(err.contains(needle), "{toml}: {err}");
        assert!(!err.contains("panicked"), "{toml}: {err}");
        assert!(!data.join("postgres").exists(), "{toml}: a cluster was created before the check");
    }
}

/// An OpenTelemetry setting cachet cannot honour stops `cachet serve` at once (a silent typo
/// would lose every trace).
#[test]
fn serve_refuses_an_otlp_setting_it_cannot_honour() {
    for (var, value, needle) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTLP protocol \"grpc\" is not supported"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318", "only http:// is supported"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cachet"));
        cmd.args(["serve", "--data-dir", data.to_str().unwrap()])
            .env_remove("DATABASE_URL")
            .env("RUST_LOG", "warn")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
            .env(var, value);
        let out = cmd.output().unwrap();
        let err = stderr(&out);
        assert!(!out.status.success(), "{var}={value}: started");
        assert!(err.contains(needle), "{var}={value}: {err}");
        assert!(!data.join("postgres").exists(), "{var}={value}: a cluster was created before the check");
    }
}
