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
