//! `cachet serve` as an operator runs it: the binary, its private Postgres, a tiny model.
//!
//! - `kill -9` in the middle of a stream, then a restart on the same data: the request's ledger
//!   row (opened at admission, kept current as tokens stream) holds what was streamed, once.
//! - JSON logs: one request's lines, from the HTTP line through the engine's events to the
//!   ledger row, are selected by its request id.
//! - OpenTelemetry: with an OTLP endpoint set, each request is one trace (HTTP span, engine span,
//!   its queue, prefill and decode phases) at a stand-in collector.

use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::quant::DType;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn cachet(data: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A running `cachet serve`; dropped, it stops as an operator would stop it (SIGTERM: in-flight
/// requests end, the ledger flushes, the private Postgres cluster stops).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
            let _ = self.0.wait();
        }
    }
}

/// A temporary folder with a tiny random model (`seed`) in it, the data folder's path beside it,
/// and a free port.
fn setup(seed: u64) -> (tempfile::TempDir, PathBuf, PathBuf, u16) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    Tiny::random(TinyArch::Qwen2, seed, false).write_gguf(DType::Q8_0, &model).unwrap();
    let data = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    (dir, model, data, port)
}

fn serve(data: &Path, model: &Path, port: u16) -> Server {
    serve_logging(data, model, port, "warn", &data.with_extension(format!("{port}.log")), &[])
}

/// [`serve`] with JSON logs at `filter` into `log`, and `env` set.
fn serve_logging(data: &Path, model: &Path, port: u16, filter: &str, log: &Path, env: &[(&str, &str)]) -> Server {
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(["--log-format", "json", "serve", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(data)
        .arg("--model")
        .arg(model)
        .env("RUST_LOG", filter)
        .env_remove("DATABASE_URL")
        .env_remove("OTEL_SERVICE_NAME")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Server(child)
}

/// One HTTP/1.1 request; returns the connection positioned at the body, and the status.
fn request(port: u16, method: &str, path: &str, token: &str, body: &str) -> (u16, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let code = status.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    (code, r)
}

fn wait_ready(port: u16, server: &mut Server) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
        if TcpStream::connect(("127.0.0.1", port)).is_ok() && request(port, "GET", "/readyz", "", "").0 == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "the server did not become ready");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_server_killed_mid_stream_leaves_the_streamed_tokens_billed_once() {
    let (_dir, model, data, port) = setup(11);
    let mut server = serve(&data, &model, port);
    wait_ready(port, &mut server);
    let tenant = cachet(&data, &["tenants", "create", "crash"]);
    let token = cachet(&data, &["token", "issue", "--tenant", &tenant, "--ttl", "1h"]);

    let body = r#"{"model": "default", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 2000,
                   "ignore_eos": true, "stream": true}"#;
    let (status, mut stream) = request(port, "POST", "/v1/chat/completions", &token, body);
    assert_eq!(status, 200);
    // Read until well past the first progress report (every 32 tokens), then kill the server.
    let mut chunks = 0;
    let mut line = String::new();
    while chunks < 80 {
        line.clear();
        assert!(stream.read_line(&mut line).unwrap() > 0, "the stream ended early");
        if line.starts_with("data: {") {
            chunks += 1;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    server.0.kill().unwrap(); // SIGKILL: no shutdown, no flush
    server.0.wait().unwrap();
    drop(stream);

    let mut server = serve(&data, &model, port);
    wait_ready(port, &mut server);
    let (status, mut r) = request(port, "GET", "/v1/usage", &token, "");
    assert_eq!(status, 200);
    let mut text = String::new();
    r.read_to_string(&mut text).unwrap();
    // The body may be chunked: take the JSON object out of it.
    let json = &text[text.find('{').unwrap()..=text.rfind('}').unwrap()];
    let usage: serde_json::Value = serde_json::from_str(json).unwrap();
    let rows = usage["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "one row for the one request: {rows:?}");
    let row = &rows[0];
    assert_eq!(row["status"], "running", "{row}");
    let streamed = row["output_tokens"].as_i64().unwrap();
    assert!((32..=2000).contains(&streamed), "{row}");
    assert!(row["cost"].as_f64().unwrap() > 0.0, "what was streamed is billed: {row}");
}

/// The body of a response read to its end (a chunked body's JSON object taken out of it).
fn json_body(mut r: BufReader<TcpStream>) -> serde_json::Value {
    let mut text = String::new();
    r.read_to_string(&mut text).unwrap();
    serde_json::from_str(&text[text.find('{').unwrap()..=text.rfind('}').unwrap()]).unwrap()
}

#[test]
fn one_requests_log_lines_from_the_http_line_to_the_ledger_row_share_its_id() {
    let (dir, model, data, port) = setup(12);
    let log = dir.path().join("serve.log");
    let mut server = serve_logging(&data, &model, port, "info,cachet_engine=debug,cachet_api=debug", &log, &[]);
    wait_ready(port, &mut server);
    let tenant = cachet(&data, &["tenants", "create", "traced"]);
    let token = cachet(&data, &["token", "issue", "--tenant", &tenant, "--ttl", "1h"]);

    // Two requests, one streamed, each labelled with a task of its own.
    let mut ids = Vec::new();
    for (n, stream) in [(0, false), (1, true)] {
        let (status, r) = request(port, "POST", "/v1/tasks", &token, &format!(r#"{{"title": "task {n}"}}"#));
        assert_eq!(status, 201);
        let task = json_body(r)["id"].as_str().unwrap().to_string();
        let body = format!(
            r#"{{"model": "default", "messages": [{{"role": "user", "content": "request {n}"}}], "max_tokens": 8,
                "ignore_eos": true, "stream": {stream}, "task_id": "{task}"}}"#
        );
        let (status, mut r) = request(port, "POST", "/v1/chat/completions", &token, &body);
        assert_eq!(status, 200);
        let mut text = String::new();
        r.read_to_string(&mut text).unwrap();
        let at = text.find("chatcmpl-").expect("a completion id") + "chatcmpl-".len();
        let simple = &text[at..at + 32];
        ids.push((uuid::Uuid::parse_str(simple).unwrap().to_string(), task));
    }
    // The ledger writes its rows once the request has ended: wait for both rows' lines.
    let deadline = Instant::now() + Duration::from_secs(60);
    let lines = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        let ok_rows = text.lines().filter(|l| l.contains("ledger row") && l.contains(r#""status":"ok""#)).count();
        if ok_rows >= 2 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(server);
    // Log lines are JSON; the server's own messages to the operator ("listening on …") are not.
    let parsed: Vec<serde_json::Value> = lines
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for (id, task) in &ids {
        let mine: Vec<&serde_json::Value> = parsed.iter().filter(|v| v.to_string().contains(id.as_str())).collect();
        let messages: Vec<&str> = mine.iter().filter_map(|v| v["fields"]["message"].as_str()).collect();
        // The engine's events, the HTTP access line (a streamed request's comes before its
        // tokens: its response began with the stream) and the ledger rows.
        for m in ["queued", "admitted", "first token", "finished", "request", "ledger row"] {
            assert!(messages.contains(&m), "{id}: no {m:?} line among {messages:?}");
        }
        for v in &mine {
            // Every selected line carries the request's HTTP span with its tenant and task.
            let http = v["spans"].as_array().and_then(|s| s.first()).unwrap_or_else(|| panic!("no span: {v}"));
            assert_eq!(http["name"], "http", "{v}");
            assert_eq!(http["request_id"], id.as_str(), "{v}");
            assert_eq!(http["tenant"], tenant.as_str(), "{v}");
            assert_eq!(http["task"], task.as_str(), "{v}");
            assert_eq!(http["endpoint"], "chat.completions", "{v}");
        }
        let finished = mine.iter().find(|v| v["fields"]["message"] == "finished").unwrap();
        assert_eq!(finished["fields"]["output_tokens"], 8, "{finished}");
        let row = mine.iter().rev().find(|v| v["fields"]["message"] == "ledger row").unwrap();
        assert_eq!(row["fields"]["status"], "ok", "{row}");
    }
    // The selection is exact: the two requests share no line.
    let (a, b) = (&ids[0].0, &ids[1].0);
    assert!(!parsed.iter().any(|v| v.to_string().contains(a.as_str()) && v.to_string().contains(b.as_str())));
}

/// A stand-in OpenTelemetry collector: accepts OTLP/HTTP posts on a port of its own and keeps
/// their bodies.
fn collector() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let kept = kept.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn);
                loop {
                    // One request: headers, then a Content-Length body.
                    let mut length = 0;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    r.read_exact(&mut body).unwrap();
                    kept.lock().unwrap().push(body);
                    let reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
                    if r.get_mut().write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, bodies)
}

/// An OTLP/JSON attribute's string value.
fn attribute<'a>(span: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    span["attributes"].as_array()?.iter().find(|a| a["key"] == key)?["value"]["stringValue"].as_str()
}

#[test]
fn with_an_otlp_endpoint_each_request_is_one_trace_with_its_engine_phases() {
    let (dir, model, data, port) = setup(13);
    let (collector_port, bodies) = collector();
    let endpoint = format!("http://127.0.0.1:{collector_port}");
    let otlp = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
    let filter = "warn,cachet_api=info,cachet_engine=info";
    let mut server = serve_logging(&data, &model, port, filter, &dir.path().join("serve.log"), &otlp);
    wait_ready(port, &mut server);
    let tenant = cachet(&data, &["tenants", "create", "traced"]);
    let token = cachet(&data, &["token", "issue", "--tenant", &tenant, "--ttl", "1h"]);
    let mut ids = Vec::new();
    for n in 0..2 {
        let body = format!(
            r#"{{"model": "default", "messages": [{{"role": "user", "content": "hi {n}"}}], "max_tokens": 4, "ignore_eos": true}}"#
        );
        let (status, r) = request(port, "POST", "/v1/chat/completions", &token, &body);
        assert_eq!(status, 200);
        let id = json_body(r)["id"].as_str().unwrap().trim_start_matches("chatcmpl-").to_string();
        ids.push(uuid::Uuid::parse_str(&id).unwrap().to_string());
    }
    // Stopped as an operator stops it: the spans not yet sent are exported on the way out.
    drop(server);
    let spans: Vec<serde_json::Value> = bodies
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| {
            let v: serde_json::Value = serde_json::from_slice(b).expect("OTLP/JSON");
            let mut out = Vec::new();
            for rs in v["resourceSpans"].as_array().into_iter().flatten() {
                let resource = &rs["resource"];
                assert_eq!(attribute(resource, "service.name"), Some("cachet"), "{resource}");
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
                }
            }
            out
        })
        .collect();
    let mut traces = Vec::new();
    for id in &ids {
        let http = spans
            .iter()
            .find(|s| s["name"] == "http" && attribute(s, "request_id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no http span of {id} among {} spans", spans.len()));
        assert_eq!(attribute(http, "tenant"), Some(tenant.as_str()), "{http}");
        assert_eq!(attribute(http, "endpoint"), Some("chat.completions"), "{http}");
        let trace = http["traceId"].as_str().unwrap();
        let mine: Vec<&serde_json::Value> = spans.iter().filter(|s| s["traceId"] == trace).collect();
        let named = |name: &str| {
            let found: Vec<&&serde_json::Value> = mine.iter().filter(|s| s["name"] == name).collect();
            assert_eq!(found.len(), 1, "{id}: one {name:?} span in its trace: {mine:?}");
            *found[0]
        };
        let engine = named("engine");
        assert_eq!(engine["parentSpanId"], http["spanId"], "the engine's span is under the request's");
        let mut ends = Vec::new();
        for phase in ["queue", "prefill", "decode"] {
            let s = named(phase);
            assert_eq!(s["parentSpanId"], engine["spanId"], "{phase} is a phase of the engine's span");
            let time = |k: &str| s[k].as_str().map_or_else(|| s[k].as_u64().unwrap(), |t| t.parse().unwrap());
            ends.push((time("startTimeUnixNano"), time("endTimeUnixNano")));
        }
        assert!(ends.windows(2).all(|w| w[0].1 <= w[1].0), "queue, then prefill, then decode: {ends:?}");
        traces.push(trace.to_string());
    }
    assert_ne!(traces[0], traces[1], "one trace per request");
}
