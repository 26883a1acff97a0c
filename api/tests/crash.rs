//! `kill -9` in the middle of a stream, then a restart on the same data: the request's ledger
//! row (opened at admission, kept current as tokens stream) holds what was streamed, once.

use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::quant::DType;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
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

fn serve(data: &Path, model: &Path, port: u16) -> Server {
    let log = std::fs::File::create(data.with_extension(format!("{port}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cachet"))
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(data)
        .arg("--model")
        .arg(model)
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
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
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    Tiny::random(TinyArch::Qwen2, 11, false).write_gguf(DType::Q8_0, &model).unwrap();
    let data = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
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
