//! What a request can make the server hold in memory. A binary of its own, so the process's
//! high-water mark of resident memory is this test's alone.

#[allow(dead_code)]
#[path = "../api/helpers.rs"]
mod helpers;

use helpers::*;
use serde_json::json;

/// Resident memory (`VmRSS`) and its high-water mark (`VmHWM`), in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets the high-water mark to the current resident memory (Linux ≥ 4.0).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

#[tokio::test]
async fn a_named_file_over_the_limit_is_never_read() {
    let _one = SERIAL.lock().await;
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    // 64 MiB of text (a few KiB in git, compressed): reading it would inflate all of it.
    let big = "0123456789abcdef".repeat(4 << 20);
    let repo = app
        .register(&token, app.source_repo("big", &[("big.txt", Some(&big)), ("src/lib.rs", Some("fn f() {}\n"))]))
        .await;
    drop(big);
    let session = app.session(&token, &repo).await;
    reset_peak();
    let (start, _) = rss();
    for _ in 0..3 {
        let r = app.message(&token, &session, json!({ "content": "q", "files": ["big.txt"], "dry_run": true })).await;
        let e = error(r, 400).await;
        assert!(e["message"].as_str().unwrap().contains("larger than"), "{e}");
    }
    let (_, peak) = rss();
    let grew = peak.saturating_sub(start);
    assert!(grew < 32 << 20, "naming a 64 MiB file raised the memory peak by {} MiB", grew >> 20);
}

#[tokio::test]
async fn distinct_end_users_leave_nothing_behind() {
    let _one = SERIAL.lock().await;
    // 1,000 requests, each from a different end user named by 2 MB of `user`: the engine's
    // scope table once kept every one of them for good.
    let app = spawn_with(|s| s.server.max_body_bytes = 4 << 20).await;
    let (_, token) = app.tenant("users").await;
    let big = "u".repeat(2 << 20);
    // Spliced in as text: serializing 2 MB through this (unoptimized) test crate takes longer
    // than the server's whole answer.
    let head = app.chat_body("hi", 1).to_string();
    let head = head.strip_suffix('}').unwrap().to_string();
    let send = |u: usize| {
        let body = format!(r#"{head},"user":"{u:08}{big}"}}"#);
        let request = app
            .client
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body);
        async move {
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            let _ = r.bytes().await;
            status
        }
    };
    // Warm up first (allocator arenas, the model's buffers, connection pools).
    for u in 0..16 {
        assert_eq!(send(u).await, 200);
    }
    let (start, _) = rss();
    use futures_util::StreamExt;
    let statuses: Vec<u16> = futures_util::stream::iter(16..1000).map(send).buffer_unordered(4).collect().await;
    assert!(
        statuses.iter().all(|&s| s == 200),
        "{:?}",
        statuses.iter().filter(|&&s| s != 200).take(5).collect::<Vec<_>>()
    );
    let (end, _) = rss();
    let grew = end.saturating_sub(start);
    eprintln!("resident memory: {} MiB before, {} MiB after", start >> 20, end >> 20);
    assert!(grew < 50 << 20, "resident memory grew by {} MiB after the requests finished", grew >> 20);
}

/// The tests of this binary one at a time: each measures the process's memory.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn failing_grammars_leave_nothing_behind() {
    let _one = SERIAL.lock().await;
    // Regular expressions whose lexer hits llguidance's limits only once it is built (at the
    // first mask) with a real vocabulary's long tokens: each one once stayed in the grammar
    // cache with its half-built lexer, ~200 MiB each with the default model. Its tokenizer
    // (the vocabulary is what matters, not the weights).
    let Some(path) = cachet_engine::testing::default_model() else { return };
    let file = cachet_engine::gguf::GgufFile::open(&path).unwrap();
    let spec = cachet_engine::tokenizer::GgufTokenizerSpec::from_gguf_file(&file).unwrap();
    let tokenizer = std::sync::Arc::new(cachet_engine::tokenizer::Tokenizer::from_gguf(spec).unwrap());
    let vocab = tokenizer.vocab_size();
    let grammars = std::sync::Arc::new(cachet_engine::constraint::Grammars::new(tokenizer, vocab));
    let compile = |i: usize| {
        let g = grammars.clone();
        tokio::task::spawn_blocking(move || {
            let source = cachet_engine::constraint::GrammarSource::Regex(format!("(a{{1000}}){{1000}}z{i}"));
            let r = g.compile(&source).map(drop);
            (r, g.is_cached(&source))
        })
    };
    // What any grammar needs first (the tokenizer's view for llguidance), and one failure.
    grammars.warm_up().unwrap();
    let (r, cached) = compile(0).await.unwrap();
    let message = r.expect_err("the lexer cannot be built within llguidance's limits").to_string();
    assert!(!message.contains('\n'), "a grammar error is one line: {message}");
    assert!(!cached, "a grammar that failed is not kept");
    let (start, _) = rss();
    for i in 1..=6 {
        let (r, cached) = compile(i).await.unwrap();
        assert!(r.is_err() && !cached, "grammar {i}: {r:?}");
    }
    let (end, _) = rss();
    let grew = end.saturating_sub(start);
    eprintln!("resident memory: {} MiB before six failing grammars, {} MiB after", start >> 20, end >> 20);
    assert!(grew < 50 << 20, "six failing grammars left {} MiB behind", grew >> 20);
}
