//! `cachet-bench push`: a push during a session, on cachet (it needs cachet's sessions and
//! webhooks), side by side for `after_push = "overlay"` and `"rebuild"`.
//!
//! Two copies of a git repository are registered, one per mode (a repository option), and a
//! session is opened on each. Each round, alternating which mode goes first, on each copy: a
//! warm turn; then a commit that adds a definition to a file the context shows, its signed push
//! webhook, and at once the next turn (the turn a user sends right after pushing); then, once
//! the session's context is at the new head (the overlay's background rebase is warm; at once
//! with rebuild) and a settling pause, a last turn. Reported per mode: the TTFT of each kind of
//! turn (medians over the rounds), the push turn's TTFT as a multiple of the warm turn's, the
//! share of its prompt served from the cache, and whether its prompt carried the new definition.

use crate::client::{send, HttpRequest, Target};
use crate::error::BenchError;
use crate::stats::percentile;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The two modes.
pub const MODES: [&str; 2] = ["overlay", "rebuild"];

/// What `cachet-bench push` needs.
#[derive(Clone, Debug)]
pub struct PushOptions {
    /// cachet, its model and a tenant's key.
    pub target: Target,
    /// The repository to copy (its HEAD branch).
    pub source: PathBuf,
    /// Where the copies go: under the server's `[context] allowed_root`.
    pub work: PathBuf,
    pub rounds: usize,
    /// Tokens each turn generates.
    pub max_tokens: u32,
    /// The pause before the last turn of a round, once the context is at the head.
    pub settle: Duration,
    pub timeout: Duration,
}

/// One round on one mode.
#[derive(Clone, Debug, Serialize)]
pub struct Round {
    pub mode: String,
    pub round: usize,
    pub file: String,
    pub warm_ttft_ms: f64,
    pub warm_prompt_tokens: u64,
    pub warm_cached_tokens: u64,
    pub push_ttft_ms: f64,
    pub push_prompt_tokens: u64,
    pub push_cached_tokens: u64,
    /// The push turn's context commit was the old one (an overlay carried the change).
    pub push_overlaid: bool,
    /// The push turn's prompt (as the next dry run shows the history) has the new definition.
    pub push_has_change: bool,
    /// Seconds from the push until the session's context was at the new head.
    pub rebased_after_s: f64,
    pub after_ttft_ms: f64,
    pub after_prompt_tokens: u64,
    pub after_cached_tokens: u64,
}

/// A mode's copy of the repository and its session.
struct Side {
    mode: &'static str,
    repo: git2::Repository,
    id: String,
    secret: String,
    session: String,
    branch: String,
}

fn git(path: &Path) -> impl Fn(git2::Error) -> BenchError + '_ {
    move |source| BenchError::Git { path: path.to_path_buf(), source }
}

fn bad(m: impl Into<String>) -> BenchError {
    BenchError::InvalidArgument(m.into())
}

/// Runs the scenario; returns every round's figures.
pub async fn run_push(client: &reqwest::Client, opts: &PushOptions) -> Result<Vec<Round>, BenchError> {
    let mut copies = Vec::new();
    for mode in MODES {
        copies.push(prepare(client, opts, mode).await?);
    }
    let mut rounds = Vec::new();
    for round in 0..opts.rounds {
        // Alternate which mode goes first.
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for i in order {
            let r = one_round(client, opts, &copies[i], round).await?;
            eprintln!(
                "round {round} {}: warm {:.0} ms ({} of {} cached), after the push {:.0} ms ({} of {} cached{}), rebased after {:.1} s, then {:.0} ms",
                r.mode,
                r.warm_ttft_ms,
                r.warm_cached_tokens,
                r.warm_prompt_tokens,
                r.push_ttft_ms,
                r.push_cached_tokens,
                r.push_prompt_tokens,
                if r.push_overlaid { ", overlay" } else { "" },
                r.rebased_after_s,
                r.after_ttft_ms
            );
            rounds.push(r);
        }
    }
    Ok(rounds)
}

async fn call(
    client: &reqwest::Client,
    target: &Target,
    method: &str,
    path: &str,
    body: Value,
) -> Result<Value, BenchError> {
    let url = target.url(path);
    let mut req = match method {
        "GET" => client.get(&url),
        _ => client.post(&url).json(&body),
    };
    if let Some(key) = &target.api_key {
        req = req.bearer_auth(key);
    }
    let response = req.send().await.map_err(|e| bad(format!("{method} {path}: {e}")))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(bad(format!("{method} {path}: HTTP {status}: {}", text.chars().take(400).collect::<String>())));
    }
    serde_json::from_str(&text).map_err(|e| bad(format!("{method} {path}: {e}")))
}

/// Copies the repository for `mode`, registers it with that mode and opens a session.
async fn prepare(client: &reqwest::Client, opts: &PushOptions, mode: &'static str) -> Result<Side, BenchError> {
    let path = opts.work.join(format!("push-{mode}"));
    if path.exists() {
        std::fs::remove_dir_all(&path).map_err(|e| BenchError::io("removing", &path, e))?;
    }
    let source = opts.source.canonicalize().map_err(|e| BenchError::io("reading", &opts.source, e))?;
    let repo = git2::Repository::clone(&source.display().to_string(), &path).map_err(git(&source))?;
    let branch = repo.head().map_err(git(&path))?.shorthand().unwrap_or("main").to_string();
    let reg = call(
        client,
        &opts.target,
        "POST",
        "/v1/repos",
        json!({"url": path.display().to_string(), "name": format!("push-{mode}"), "after_push": mode}),
    )
    .await?;
    let id = reg["id"].as_str().ok_or_else(|| bad(format!("registration without an id: {reg}")))?.to_string();
    let secret =
        reg["webhook"]["secret"].as_str().ok_or_else(|| bad("registration without a webhook secret"))?.to_string();
    // A registration slower than the server's wait answers 202: wait until it is ready.
    let deadline = Instant::now() + opts.timeout;
    loop {
        let repo = call(client, &opts.target, "GET", &format!("/v1/repos/{id}"), Value::Null).await?;
        match repo["status"].as_str() {
            Some("ready") => break,
            Some("failed") => return Err(bad(format!("registering {}: {}", path.display(), repo["error"]))),
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(bad(format!("repository {id} never became ready")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let session = call(client, &opts.target, "POST", "/v1/sessions", json!({"repo": id, "branch": branch})).await?;
    let session = session["id"].as_str().ok_or_else(|| bad("a session without an id"))?.to_string();
    let copy = Side { mode, repo, id, secret, session, branch };
    // The first turn computes the context; the scenario starts warm.
    turn(client, opts, &copy, "Give a one-line summary of this repository.").await?;
    Ok(copy)
}

/// One streamed turn: its TTFT, prompt and cached tokens.
async fn turn(
    client: &reqwest::Client,
    opts: &PushOptions,
    copy: &Side,
    question: &str,
) -> Result<(f64, u64, u64), BenchError> {
    let req = HttpRequest {
        path: format!("/v1/sessions/{}/messages", copy.session),
        body: json!({"content": question, "max_tokens": opts.max_tokens, "temperature": 0, "stream": true,
                     "stream_options": {"include_usage": true}}),
        approx_prompt_tokens: 0,
    };
    let now = Instant::now();
    let out = send(client, &opts.target, &req, now, now, opts.timeout, 0).await;
    if let Some(e) = &out.record.error {
        return Err(bad(format!("{} turn: {e}", copy.mode)));
    }
    let ttft = out.record.ttft_ms.ok_or_else(|| bad(format!("{} turn without a token", copy.mode)))?;
    Ok((ttft, out.record.prompt_tokens.unwrap_or(0), out.record.cached_tokens.unwrap_or(0)))
}

async fn dry_run(client: &reqwest::Client, opts: &PushOptions, copy: &Side) -> Result<Value, BenchError> {
    let path = format!("/v1/sessions/{}/messages", copy.session);
    call(client, &opts.target, "POST", &path, json!({"content": "?", "dry_run": true})).await
}

/// The definition a round adds to `path`, in its language, and the name it defines.
fn definition(path: &str, n: usize) -> Option<(String, String)> {
    let ext = path.rsplit_once('.').map(|(_, e)| e)?;
    let name = format!("cachet_bench_round_{n}");
    let text = match ext {
        "rs" => format!("\npub fn {name}() -> u32 {{\n    {n}\n}}\n"),
        "py" => format!("\n\ndef {name}():\n    return {n}\n"),
        "go" => format!("\nfunc Cachet_bench_round_{n}() int {{\n\treturn {n}\n}}\n"),
        "js" | "mjs" | "ts" | "tsx" | "jsx" => format!("\nexport function {name}() {{\n  return {n};\n}}\n"),
        _ => return None,
    };
    let name = if ext == "go" { format!("Cachet_bench_round_{n}") } else { name };
    Some((text, name))
}

/// A file of the context in a language the round can add a definition to: the one in the
/// middle of those the context shows (a push rarely touches the first block).
fn pick_file(dry: &Value) -> Option<String> {
    let paths: Vec<String> = dry["segments"]
        .as_array()?
        .iter()
        .filter(|s| ["outline", "file"].contains(&s["kind"].as_str().unwrap_or("")))
        .filter_map(|s| s["path"].as_str().map(str::to_string))
        .filter(|p| definition(p, 0).is_some())
        .collect();
    paths.get(paths.len() / 2).cloned()
}

/// Commits `text` appended to `file` on the copy's branch; returns (before, after).
fn commit(copy: &Side, file: &str, text: &str, round: usize) -> Result<(String, String), BenchError> {
    let root = copy.repo.workdir().ok_or_else(|| bad("the copy has no work tree"))?.to_path_buf();
    let err = git(&root);
    let full = root.join(file);
    let mut content = std::fs::read_to_string(&full).map_err(|e| BenchError::io("reading", &full, e))?;
    content.push_str(text);
    std::fs::write(&full, content).map_err(|e| BenchError::io("writing", &full, e))?;
    let head = copy.repo.head().map_err(&err)?.peel_to_commit().map_err(&err)?;
    let mut index = copy.repo.index().map_err(&err)?;
    index.add_path(Path::new(file)).map_err(&err)?;
    index.write().map_err(&err)?;
    let tree = copy.repo.find_tree(index.write_tree().map_err(&err)?).map_err(&err)?;
    let sig = git2::Signature::now("cachet-bench", "bench@cachet.invalid").map_err(&err)?;
    let message = format!("cachet-bench push round {round}");
    let new = copy.repo.commit(Some("HEAD"), &sig, &sig, &message, &tree, &[&head]).map_err(&err)?;
    Ok((head.id().to_string(), new.to_string()))
}

fn sign(secret: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    format!("sha256={}", digest.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

async fn push(
    client: &reqwest::Client,
    opts: &PushOptions,
    copy: &Side,
    before: &str,
    after: &str,
) -> Result<(), BenchError> {
    let body =
        serde_json::to_vec(&json!({"ref": format!("refs/heads/{}", copy.branch), "before": before, "after": after}))
            .map_err(|e| bad(e.to_string()))?;
    let response = client
        .post(opts.target.url(&format!("/v1/webhooks/git/{}", copy.id)))
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-hub-signature-256", sign(&copy.secret, &body))
        .body(body)
        .send()
        .await
        .map_err(|e| bad(format!("the webhook: {e}")))?;
    if !response.status().is_success() {
        let status = response.status();
        return Err(bad(format!("the webhook: HTTP {status}: {}", response.text().await.unwrap_or_default())));
    }
    Ok(())
}

async fn one_round(
    client: &reqwest::Client,
    opts: &PushOptions,
    copy: &Side,
    round: usize,
) -> Result<Round, BenchError> {
    let (warm_ttft_ms, warm_prompt_tokens, warm_cached_tokens) =
        turn(client, opts, copy, &format!("Round {round}: what changed recently?")).await?;
    let dry = dry_run(client, opts, copy).await?;
    let file = pick_file(&dry).ok_or_else(|| bad("the context shows no Rust, Python, Go or JavaScript file"))?;
    let (text, name) = definition(&file, round).ok_or_else(|| bad("no definition for the file"))?;
    let (before, after) = commit(copy, &file, &text, round)?;
    let pushed = Instant::now();
    push(client, opts, copy, &before, &after).await?;
    let (push_ttft_ms, push_prompt_tokens, push_cached_tokens) =
        turn(client, opts, copy, &format!("Round {round}: what does {name} return?")).await?;
    let seen = dry_run(client, opts, copy).await?;
    let push_overlaid = seen["context_commit"].as_str() != Some(after.as_str());
    let push_has_change = seen["prompt"].as_str().is_some_and(|p| p.contains(&name));
    // Until the session's context is at the new head.
    let deadline = Instant::now() + opts.timeout;
    let mut at = seen;
    while at["context_commit"].as_str() != Some(after.as_str()) {
        if Instant::now() > deadline {
            return Err(bad(format!("{}: the session's context never reached {after}", copy.mode)));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        at = dry_run(client, opts, copy).await?;
    }
    let rebased_after_s = pushed.elapsed().as_secs_f64();
    tokio::time::sleep(opts.settle).await;
    let (after_ttft_ms, after_prompt_tokens, after_cached_tokens) =
        turn(client, opts, copy, &format!("Round {round}: and after that?")).await?;
    Ok(Round {
        mode: copy.mode.to_string(),
        round,
        file,
        warm_ttft_ms,
        warm_prompt_tokens,
        warm_cached_tokens,
        push_ttft_ms,
        push_prompt_tokens,
        push_cached_tokens,
        push_overlaid,
        push_has_change,
        rebased_after_s,
        after_ttft_ms,
        after_prompt_tokens,
        after_cached_tokens,
    })
}

/// The markdown table: per mode, medians over the rounds.
pub fn markdown(rounds: &[Round]) -> String {
    let mut out = String::from(
        "| after_push | rounds | warm turn TTFT p50 ms | turn right after the push TTFT p50 ms | ÷ warm | cached share of that turn | new definition in its prompt | context at the head after s (p50) | next turn TTFT p50 ms |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for mode in MODES {
        let mine: Vec<&Round> = rounds.iter().filter(|r| r.mode == mode).collect();
        if mine.is_empty() {
            continue;
        }
        let p50 = |f: &dyn Fn(&Round) -> f64| {
            percentile(&mine.iter().map(|r| f(r)).collect::<Vec<_>>(), 50.0).unwrap_or(f64::NAN)
        };
        let (warm, pushed) = (p50(&|r| r.warm_ttft_ms), p50(&|r| r.push_ttft_ms));
        let cached = p50(&|r| r.push_cached_tokens as f64 / r.push_prompt_tokens.max(1) as f64);
        let has = mine.iter().filter(|r| r.push_has_change).count();
        out.push_str(&format!(
            "| {mode} | {} | {warm:.0} | {pushed:.0} | {:.2}× | {:.0}% | {has} of {} | {:.1} | {:.0} |\n",
            mine.len(),
            pushed / warm,
            cached * 100.0,
            mine.len(),
            p50(&|r| r.rebased_after_s),
            p50(&|r| r.after_ttft_ms),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_language_gets_a_definition_it_can_outline() {
        assert!(definition("src/a.rs", 3).unwrap().0.contains("pub fn cachet_bench_round_3()"));
        assert!(definition("a/b.py", 1).unwrap().0.contains("def cachet_bench_round_1():"));
        let (go, name) = definition("x.go", 2).unwrap();
        assert!(go.contains(&format!("func {name}()")) && name.starts_with('C'));
        assert!(definition("x.ts", 0).unwrap().0.starts_with("\nexport function"));
        assert_eq!(definition("README.md", 0), None);
        assert_eq!(definition("Makefile", 0), None);
    }

    #[test]
    fn the_middle_source_file_of_the_context_is_picked() {
        let dry = json!({"segments": [
            {"kind": "context_header"},
            {"kind": "file", "path": "Cargo.toml"},
            {"kind": "outline", "path": "src/a.rs"},
            {"kind": "outline", "path": "src/b.rs"},
            {"kind": "file", "path": "src/c.rs"},
            {"kind": "question"},
        ]});
        assert_eq!(pick_file(&dry).as_deref(), Some("src/b.rs"));
        assert_eq!(pick_file(&json!({"segments": []})), None);
    }

    #[test]
    fn the_signature_is_github_s() {
        // HMAC-SHA256("It's a Secret to Everybody", "Hello, World!") from GitHub's documentation.
        assert_eq!(
            sign("It's a Secret to Everybody", b"Hello, World!"),
            "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
        );
    }

    #[test]
    fn the_table_has_one_row_per_mode_with_medians() {
        let round = |mode: &str, warm: f64, push: f64| Round {
            mode: mode.into(),
            round: 0,
            file: "a.rs".into(),
            warm_ttft_ms: warm,
            warm_prompt_tokens: 100,
            warm_cached_tokens: 99,
            push_ttft_ms: push,
            push_prompt_tokens: 100,
            push_cached_tokens: 90,
            push_overlaid: mode == "overlay",
            push_has_change: true,
            rebased_after_s: 5.0,
            after_ttft_ms: warm,
            after_prompt_tokens: 100,
            after_cached_tokens: 99,
        };
        let md =
            markdown(&[round("overlay", 100.0, 120.0), round("rebuild", 100.0, 900.0), round("overlay", 100.0, 140.0)]);
        assert!(md.contains("| overlay | 2 | 100 | 130 | 1.30× | 90% | 2 of 2 | 5.0 | 100 |"), "{md}");
        assert!(md.contains("| rebuild | 1 | 100 | 900 | 9.00× |"), "{md}");
    }
}
