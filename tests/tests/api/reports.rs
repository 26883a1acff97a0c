//! Tasks and usage reports through the API: outcomes recorded once, cost per successful task from
//! real requests over a real repository, tenant isolation, CSV, the browser page and its charts in
//! a real headless Chromium.

use crate::helpers::*;
use cachet_tenants::store::TaskStatus;
use cachet_tenants::{Endpoint, FinishReason, RequestId, RequestStatus, SloClass, TaskId, TenantId, UsageRecord};
use chrono::{DateTime, Duration as Days, TimeZone, Utc};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tokio::process::Command;
use uuid::Uuid;

fn shop(app: &TestApp) -> cachet_context::testing::TestRepo {
    app.source_repo(
        "shop",
        &[
            ("src/lib.rs", Some("pub mod cart;\n")),
            ("src/cart.rs", Some("pub struct Cart {\n    items: Vec<u64>,\n}\n\nimpl Cart {\n    pub fn total(&self) -> u64 {\n        self.items.iter().sum()\n    }\n}\n")),
            ("main.py", Some("def checkout(cart):\n    return cart.total()\n")),
        ],
    )
}

async fn open_task(app: &TestApp, token: &str, session: &str, title: &str) -> String {
    let r = app.post(token, "/v1/tasks", json!({ "session_id": session, "title": title })).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "open");
    v["id"].as_str().unwrap().to_string()
}

async fn outcome(app: &TestApp, token: &str, task: &str, status: &str) -> reqwest::Response {
    app.post(token, &format!("/v1/tasks/{task}/outcome"), json!({ "status": status, "evidence": { "tests": status } }))
        .await
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-300)
}

/// A fixed window around now (a fixed end keeps goodput, a rate over the window, repeatable).
fn window() -> String {
    let day = |d: i64| (Utc::now() + Days::days(d)).format("%Y-%m-%d").to_string();
    format!("from={}&to={}", day(-1), day(1))
}

fn report_url(group_by: &str) -> String {
    format!("/v1/reports/usage?{}&group_by={group_by}", window())
}

#[tokio::test]
async fn cost_per_successful_task_is_what_the_ledger_rows_add_up_to() {
    let app = spawn_app().await;
    let (acme, token) = app.tenant("acme").await;
    let repo = app.register(&token, shop(&app)).await;
    let session = app.session(&token, &repo).await;
    let fix = open_task(&app, &token, &session, "fix the total").await;
    let port = open_task(&app, &token, &session, "port checkout to Rust").await;

    // Task 1: two session messages (the task id in the body).
    for q in ["Why is the total wrong?", "And now?"] {
        let r = app
            .message(&token, &session, json!({ "content": q, "max_tokens": 3, "temperature": 0, "task_id": fix }))
            .await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    // Task 2: a session message and a chat completion carrying the task in its header.
    let r = app
        .message(
            &token,
            &session,
            json!({ "content": "Port main.py", "max_tokens": 4, "temperature": 0, "task_id": port }),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-cachet-task", &port)
        .json(&app.chat_body("Write the Rust version of checkout.", 5))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A request with no task: in the cost, not in any task's.
    assert_eq!(app.chat(&token, app.chat_body("hello", 2)).await.status(), 200);

    // Outcomes: once each; a bad status, an unknown task and a request for a closed task refused.
    assert_eq!(outcome(&app, &token, &fix, "succeeded").await.status(), 200);
    assert_eq!(outcome(&app, &token, &port, "failed").await.status(), 200);
    let again = error(outcome(&app, &token, &fix, "failed").await, 409).await;
    assert!(again["message"].as_str().unwrap().contains("succeeded"), "{again}");
    error(outcome(&app, &token, &Uuid::new_v4().to_string(), "failed").await, 404).await;
    let open = open_task(&app, &token, &session, "still open").await;
    error(outcome(&app, &token, &open, "finished").await, 400).await;
    let late = app.message(&token, &session, json!({ "content": "one more", "max_tokens": 2, "task_id": fix })).await;
    error(late, 409).await;

    // The hand computation, from the ledger rows themselves.
    let rows = app.ledger(acme).await;
    assert_eq!(rows.len(), 5, "{rows:?}");
    let of = |task: &str| {
        rows.iter().filter(|r| r.task_id.map(|t| t.to_string()).as_deref() == Some(task)).collect::<Vec<_>>()
    };
    let (fix_rows, port_rows) = (of(&fix), of(&port));
    assert_eq!((fix_rows.len(), port_rows.len()), (2, 2));
    assert!(rows.iter().all(|r| r.cost > 0.0 && r.slo_class == Some(SloClass::Interactive) && r.slo_met.is_some()));
    let fix_cost: f64 = fix_rows.iter().map(|r| r.cost).sum();
    let port_cost: f64 = port_rows.iter().map(|r| r.cost).sum();
    let all_cost: f64 = rows.iter().map(|r| r.cost).sum();
    let expected = (fix_cost + port_cost) / 1.0; // one task succeeded
    let prompt: i64 = rows.iter().map(|r| r.prompt_tokens).sum();
    let cached: i64 = rows.iter().map(|r| r.cached_tokens).sum();
    let met = rows.iter().filter(|r| r.slo_met == Some(true)).count() as f64;
    let mut ttfts: Vec<f64> = rows.iter().filter_map(|r| r.ttft_ms).collect();
    ttfts.sort_by(f64::total_cmp);

    let r = app.get(&token, &report_url("day")).await;
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.unwrap();
    let total = &report["total"];
    assert_eq!(total["requests"], 5);
    assert_eq!(total["prompt_tokens"], prompt);
    assert_eq!(total["cached_tokens"], cached);
    assert!(close(total["cost"].as_f64().unwrap(), all_cost), "{total}");
    assert!(close(total["task_cost"].as_f64().unwrap(), fix_cost + port_cost), "{total}");
    assert!(close(total["cost_per_successful_task"].as_f64().unwrap(), expected), "{total} vs {expected}");
    assert_eq!(
        (total["tasks_succeeded"].as_i64(), total["tasks_failed"].as_i64(), total["tasks_open"].as_i64()),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(total["success_rate"], 0.5);
    assert!(close(total["slo_attainment"].as_f64().unwrap(), met / 5.0));
    assert!(close(total["cache_hit_ratio"].as_f64().unwrap(), cached as f64 / prompt as f64));
    assert!(close(total["ttft_p50_ms"].as_f64().unwrap(), ttfts[2]), "{total} {ttfts:?}");
    assert_eq!(report["rows"].as_array().unwrap().len(), 1, "one day");

    // By task: each task's own cost; by session: the session's four requests.
    let by_task: Value = app.get(&token, &report_url("task")).await.json().await.unwrap();
    let row = |key: &str| {
        by_task["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key)
            .cloned()
            .unwrap_or_else(|| panic!("{key}: {by_task}"))
    };
    assert!(close(row(&fix)["cost_per_successful_task"].as_f64().unwrap(), fix_cost));
    assert_eq!(row(&fix)["label"], "fix the total");
    assert_eq!(row(&port)["cost_per_successful_task"], Value::Null, "no success: no ratio");
    assert!(close(row(&port)["task_cost"].as_f64().unwrap(), port_cost));
    assert_eq!(row("none")["requests"], 1);
    let by_session: Value = app.get(&token, &report_url("session")).await.json().await.unwrap();
    let srow = by_session["rows"].as_array().unwrap().iter().find(|r| r["key"] == session.as_str()).unwrap();
    assert_eq!(srow["requests"], 3, "the chat completion named no session");
    let by_repo: Value = app.get(&token, &report_url("repo")).await.json().await.unwrap();
    assert!(
        by_repo["rows"].as_array().unwrap().iter().any(|r| r["key"] == repo.id.as_str() && r["label"] == "shop"),
        "{by_repo}"
    );

    // A task shows what it cost so far.
    let t: Value = app.get(&token, &format!("/v1/tasks/{fix}")).await.json().await.unwrap();
    assert_eq!((t["status"].as_str(), t["requests"].as_i64()), (Some("succeeded"), Some(2)));
    assert!(close(t["cost"].as_f64().unwrap(), fix_cost));

    // CSV, by header and by parameter.
    let csv = app
        .client
        .get(format!("{}{}", app.address, report_url("day")))
        .bearer_auth(&token)
        .header("accept", "text/csv")
        .send()
        .await
        .unwrap();
    assert!(csv.headers()["content-type"].to_str().unwrap().starts_with("text/csv"));
    let text = csv.text().await.unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("key,label,requests,") && lines[2].starts_with("total,,5,"));
    let by_param = app.get(&token, &format!("{}&format=csv", report_url("day"))).await.text().await.unwrap();
    assert_eq!(by_param, text);

    // Bad windows and groupings are 400s.
    error(app.get(&token, "/v1/reports/usage?group_by=week").await, 400).await;
    error(app.get(&token, "/v1/reports/usage?from=2026-12-01&to=2026-11-01").await, 400).await;
    error(app.get(&token, "/v1/reports/usage?from=yesterday").await, 400).await;
}

#[tokio::test]
async fn a_tenant_sees_none_of_another_tenants_numbers() {
    let app = spawn_app().await;
    let (acme, a) = app.tenant("acme").await;
    let (_, b) = app.tenant("globex").await;
    let repo = app.register(&a, shop(&app)).await;
    let session = app.session(&a, &repo).await;
    let task = open_task(&app, &a, &session, "acme's task").await;
    let r = app.message(&a, &session, json!({ "content": "hi", "max_tokens": 2, "task_id": task })).await;
    assert_eq!(r.status(), 200);
    assert_eq!(outcome(&app, &a, &task, "succeeded").await.status(), 200);

    let theirs: Value = app.get(&b, &report_url("task")).await.json().await.unwrap();
    assert_eq!(theirs["rows"], json!([]), "{theirs}");
    let total = &theirs["total"];
    for k in ["requests", "prompt_tokens", "cached_tokens", "output_tokens", "tasks_succeeded", "tasks_open"] {
        assert_eq!(total[k], 0, "{k}: {total}");
    }
    assert_eq!(total["cost"], 0.0);
    assert_eq!(total["cost_per_successful_task"], Value::Null);
    // Asking for acme by id, touching acme's task, or charging a request to it: refused.
    error(app.get(&b, &format!("/v1/reports/usage?tenant={acme}")).await, 403).await;
    error(app.get(&b, &format!("/v1/tasks/{task}")).await, 404).await;
    error(outcome(&app, &b, &task, "failed").await, 404).await;
    error(app.post(&b, "/v1/tasks", json!({ "session_id": session, "title": "x" })).await, 404).await;
    let mut body = app.chat_body("charge it to acme", 2);
    body["task_id"] = json!(task);
    error(app.chat(&b, body).await, 404).await;
    error(app.get(&b, "/admin/reports/usage").await, 403).await;

    // acme sees its own; the operator sees acme's, and everyone's.
    let own: Value = app.get(&a, &report_url("day")).await.json().await.unwrap();
    assert_eq!((own["total"]["requests"].as_i64(), own["total"]["tasks_succeeded"].as_i64()), (Some(1), Some(1)));
    let op: Value =
        app.get(OPERATOR, &format!("/admin/reports/usage?{}&tenant={acme}", window())).await.json().await.unwrap();
    assert_eq!(op["total"], own["total"]);
    let all: Value = app.get(OPERATOR, &format!("/admin/reports/usage?{}", window())).await.json().await.unwrap();
    assert_eq!(all["total"]["requests"], 1);

    // `cachet report` prints the same numbers from the database.
    let cli = cli_report(&app, Some(acme), "json").await;
    let cli: Value = serde_json::from_str(&cli).unwrap();
    assert_eq!(cli["total"], own["total"]);
    let table = cli_report(&app, Some(acme), "table").await;
    let total_line = table.lines().find(|l| l.starts_with("total")).unwrap_or_else(|| panic!("{table}"));
    assert!(total_line.contains("100.0%"), "one success of one closed task: {total_line}");
    let csv = cli_report(&app, None, "csv").await;
    assert!(csv.lines().last().unwrap().starts_with("total,,1,"), "{csv}");

    // The page: a tenant's own only.
    let page = app.get(&b, "/reports").await.text().await.unwrap();
    assert!(page.contains("globex — usage") && !page.contains("acme"));
    assert_eq!(page.matches("no data in this window").count(), 4);
}

/// `cachet report` against the app's database, over [`window`].
async fn cli_report(app: &TestApp, tenant: Option<TenantId>, format: &str) -> String {
    let config = app.data_dir.path().join("report.toml");
    std::fs::write(&config, format!("[database]\nurl = \"{}\"\n", app.database_url)).unwrap();
    let day = |d: i64| (Utc::now() + Days::days(d)).format("%Y-%m-%d").to_string();
    let args = cachet_api::cli::report::ReportArgs {
        data: cachet_api::cli::serve::DataArgs {
            data_dir: Some(app.data_dir.path().to_path_buf()),
            config: Some(config),
            json: false,
        },
        tenant: tenant.map(|t| t.to_string()),
        from: Some(day(-1)),
        to: Some(day(1)),
        group_by: "day".into(),
        format: format.into(),
    };
    tokio::task::spawn_blocking(move || cachet_api::cli::report::render(args)).await.unwrap().expect("cachet report")
}

/// Debian's Chromium, if installed (`REQUIRE_CHROMIUM=1` makes its absence a failure).
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(std::env::var("REQUIRE_CHROMIUM").is_err(), "REQUIRE_CHROMIUM is set but no chromium is installed");
        eprintln!("skipped: no chromium (apt-get install chromium)");
    }
    found
}

/// Runs headless Chromium on `url` with `args`; returns stdout and the console messages it logged.
/// (Asynchronously: the service under test runs on this test's runtime.)
async fn headless(chromium: &Path, profile: &Path, url: &str, args: &[String]) -> (String, Vec<String>) {
    let run = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), run)
        .await
        .expect("chromium finished within two minutes")
        .expect("chromium runs");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    let console =
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.contains(":CONSOLE")).map(str::to_string).collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

fn seeded(
    tenant: TenantId,
    task: Option<TaskId>,
    when: DateTime<Utc>,
    cost: f64,
    ttft: f64,
    cached: i64,
) -> UsageRecord {
    UsageRecord {
        id: RequestId::random(),
        tenant,
        session_id: None,
        task_id: task,
        model: "tiny".into(),
        endpoint: Endpoint::ChatCompletions,
        prompt_tokens: 1000,
        cached_tokens: cached,
        computed_tokens: 1000 - cached,
        output_tokens: 50,
        queue_ms: 1.0,
        ttft_ms: Some(ttft),
        e2e_ms: ttft + 500.0,
        compute_seconds: 0.5,
        cost,
        status: RequestStatus::Ok,
        finish_reason: Some(FinishReason::Stop),
        created_at: when,
        slo_class: Some(SloClass::Interactive),
        slo_met: Some(ttft < 400.0),
        kv_transfer_ms: None,
        drafted_tokens: 0,
        accepted_tokens: 0,
    }
}

#[tokio::test]
async fn chromium_renders_the_report_charts() {
    let Some(chromium) = chromium() else { return };
    let app = spawn_app().await;
    let (acme, token) = app.tenant("acme").await;
    // Two weeks of tasks: cache reuse grows, cost per success falls, a few fail or are abandoned.
    let store = &app.state.store;
    let day0 = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
    let mut rows = Vec::new();
    for d in 0..14i64 {
        for k in 0..3i64 {
            let task = store.create_task(acme, None, &format!("task {d}.{k}")).await.unwrap();
            let status = match (d + k) % 5 {
                0 => TaskStatus::Failed,
                4 if k == 2 => TaskStatus::Abandoned,
                _ => TaskStatus::Succeeded,
            };
            store.close_task(acme, task.id, status, None).await.unwrap();
            let when = day0 + Days::days(d) + Days::hours(9 + k);
            sqlx::query("UPDATE tasks SET created_at = $2, last_active_at = $2, closed_at = $2 WHERE id = $1")
                .bind(task.id)
                .bind(when)
                .execute(store.pool())
                .await
                .unwrap();
            for i in 0..4i64 {
                let cached = ((d * 60 + i * 20) as f64).min(950.0) as i64;
                let ttft = 600.0 - 30.0 * d as f64 + 40.0 * k as f64 + 10.0 * i as f64;
                rows.push(seeded(
                    acme,
                    Some(task.id),
                    when + Days::minutes(i),
                    0.002 - 0.0001 * d as f64,
                    ttft,
                    cached,
                ));
            }
        }
    }
    store.insert_usage(&rows).await.unwrap();

    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reports-page");
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("reports.png");
    let _ = std::fs::remove_file(&png);
    // A one-time sign-in link per browser run (each opens in a fresh profile).
    let link = || async { format!("{}&from=2026-11-01&to=2026-11-15", sign_in_link(&app, &token).await) };
    let url = link().await;

    // The DOM after load: four charts with drawn series, and nothing logged to the console.
    let profile = tempfile::tempdir().unwrap();
    let (dom, console) = headless(&chromium, profile.path(), &url, &["--dump-dom".into()]).await;
    assert!(console.is_empty(), "console messages: {console:#?}");
    for id in ["chart-cost-per-task", "chart-cache-hit", "chart-ttft", "chart-outcomes"] {
        let start = dom.find(&format!("<svg id=\"{id}\"")).unwrap_or_else(|| panic!("no {id} in the page: {dom}"));
        let svg = &dom[start..start + dom[start..].find("</svg>").unwrap()];
        let paths: Vec<&str> = svg.split("<path class=\"series").skip(1).collect();
        assert!(!paths.is_empty(), "{id} draws no series");
        for p in paths {
            let d = p.split("d=\"").nth(1).unwrap().split('"').next().unwrap();
            assert!(d.starts_with('M') && d.len() > 20, "{id}: empty path {d:?}");
        }
        assert!(!svg.contains("NaN") && !svg.contains("no data"), "{id}");
    }
    assert_eq!(dom.matches("<circle class=\"point").count(), 14 * 4, "14 days × (cost, hit ratio, p50, p95)");

    // The screenshot, kept for people to look at.
    let profile = tempfile::tempdir().unwrap();
    let (_, console) = headless(
        &chromium,
        profile.path(),
        &link().await,
        &[format!("--screenshot={}", png.display()), "--window-size=1280,1800".into()],
    )
    .await;
    assert!(console.is_empty(), "console messages: {console:#?}");
    let bytes = std::fs::read(&png).expect("the screenshot was written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let (w, h) =
        (u32::from_be_bytes(bytes[16..20].try_into().unwrap()), u32::from_be_bytes(bytes[20..24].try_into().unwrap()));
    assert_eq!((w, h), (1280, 1800));
    // A blank page compresses to a few kilobytes; charts, figures and a table do not.
    assert!(bytes.len() > 40_000, "the screenshot looks empty ({} bytes)", bytes.len());
    eprintln!("screenshot: {}", png.display());
}
