//! Attacks on a multi-tenant server, each tried as an attacker would (issue "Multi-tenant
//! hardening"): what must hold for the service to be safe to run for many tenants.

use crate::helpers::*;
use cachet_tenants::{Endpoint, FinishReason, RequestId, RequestStatus, SloClass, TaskId};
use serde_json::{json, Value};
use uuid::Uuid;

fn no_redirect() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The `cachet_token` cookie a response sets, as `name=value`.
fn session_cookie(r: &reqwest::Response) -> String {
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Max-Age="), "{set}");
    set.split(';').next().unwrap().to_string()
}

#[tokio::test]
async fn no_token_reaches_the_logs() {
    // Every way a credential travels to the server: a URL (refused, but still requested), the
    // Authorization header, the sign-in form, a sign-in link's code, the session cookie.
    let app = spawn_app().await;
    let (_, token) = app.tenant("logged").await;
    let web = no_redirect();
    let url = |path: &str| format!("{}{path}", app.address);
    let r = web.get(url(&format!("/reports?token={token}&from=2026-11-01"))).send().await.unwrap();
    assert_eq!(r.status(), 400, "a token in a URL is refused");
    assert!(r.headers().get("set-cookie").is_none());
    let r = web.get(url(&format!("/v1/reports/usage?token={token}"))).send().await.unwrap();
    assert_eq!(r.status(), 401, "and never used");
    assert_eq!(web.get(url("/reports")).bearer_auth(&token).send().await.unwrap().status(), 200);
    let r = web.post(url("/reports/sign-in")).form(&[("token", token.as_str())]).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let cookie = session_cookie(&r);
    assert_eq!(web.get(url("/reports")).header("cookie", &cookie).send().await.unwrap().status(), 200);
    let link = sign_in_link(&app, &token).await;
    let code = link.split("code=").nth(1).unwrap().to_string();
    assert_eq!(web.get(&link).send().await.unwrap().status(), 303);
    assert_eq!(web.get(url("/admin/tenants")).bearer_auth(OPERATOR).send().await.unwrap().status(), 200);

    let logs = logs();
    assert!(logs.contains("/reports/sign-in") && logs.contains("status=303"), "the access log is captured:\n{logs}");
    let minted = cookie.split_once('=').unwrap().1.to_string();
    let mut secrets = vec![token.clone(), minted, code, OPERATOR.to_string(), SECRET.to_string()];
    secrets.extend(issued_tokens());
    for secret in secrets {
        assert!(!logs.contains(&secret), "a credential ({}…) is in the logs", &secret[..12]);
    }
}

#[tokio::test]
async fn the_report_page_signs_in_by_form_or_one_time_link_and_never_by_url() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("acme").await;
    let (_, other) = app.tenant("other").await;
    let web = no_redirect();
    let url = |path: &str| format!("{}{path}", app.address);

    // Not signed in: the sign-in page (a form posting the token in the body).
    let r = web.get(url("/reports")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let page = r.text().await.unwrap();
    assert!(page.contains(r#"<form method="post" action="/reports/sign-in">"#), "{page}");

    // The form: same-origin posts only (a cross-site form cannot sign a victim in).
    let form = |header: (&'static str, String), token: String| {
        web.post(url("/reports/sign-in")).header(header.0, header.1).form(&[("token", token)]).send()
    };
    let r = form(("origin", "http://evil.example".into()), token.clone()).await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("set-cookie").is_none());
    let r = form(("sec-fetch-site", "cross-site".into()), token.clone()).await.unwrap();
    assert_eq!(r.status(), 403);
    let r = form(("origin", app.address.clone()), "not-a-token".into()).await.unwrap();
    assert_eq!(r.status(), 401);
    let r = form(("origin", app.address.clone()), token.clone()).await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["location"].to_str().unwrap()), (303, "/reports"));
    let cookie = session_cookie(&r);
    assert!(!cookie.contains(&token), "the cookie holds a session token, not the tenant's own");
    let page = web.get(url("/reports")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));
    assert!(page.text().await.unwrap().contains("acme — usage"));
    let bad = web.get(url("/reports")).header("cookie", "cachet_token=nope").send().await.unwrap();
    assert_eq!(bad.status(), 401);

    // A link: once, keeping the window it carries.
    let link = sign_in_link(&app, &token).await;
    let r = web.get(format!("{link}&from=2026-11-01")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["location"].to_str().unwrap()), (303, "/reports?from=2026-11-01"));
    let fresh = session_cookie(&r);
    assert_eq!(web.get(url("/reports")).header("cookie", &fresh).send().await.unwrap().status(), 200);
    assert_eq!(web.get(&link).send().await.unwrap().status(), 401, "used");
    assert_eq!(web.get(url("/reports/sign-in?code=0000")).send().await.unwrap().status(), 401);

    // Someone else's link does not silently switch a signed-in browser to their account: it must
    // sign out first, and the link stays good for when it does.
    let theirs = sign_in_link(&app, &other).await;
    let r = web.get(&theirs).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(r.status(), 409);
    assert!(r.headers().get("set-cookie").is_none());
    assert!(r.text().await.unwrap().contains("tenant acme"));
    let r = web.post(url("/reports/sign-out")).header("origin", "http://evil.example").send().await.unwrap();
    assert_eq!(r.status(), 403, "no cross-site sign-out either");
    let r = web.post(url("/reports/sign-out")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert!(r.headers()["set-cookie"].to_str().unwrap().contains("Max-Age=0"));
    let r = web.get(&theirs).send().await.unwrap();
    assert_eq!(r.status(), 303, "the link still works after signing out");

    // The operator gets links too; links need the bearer header (a cookie cannot mint them).
    let op = sign_in_link(&app, OPERATOR).await;
    let r = web.get(&op).send().await.unwrap();
    let op_cookie = session_cookie(&r);
    let page = web.get(url("/reports")).header("cookie", &op_cookie).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("All tenants — usage"));
    let r = web.post(url("/v1/reports/sign-in-links")).header("cookie", &fresh).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string());
}

#[tokio::test]
async fn a_request_cannot_label_itself_with_another_tenants_session() {
    let app = spawn_app().await;
    let (_, a) = app.tenant("a").await;
    let (_, b) = app.tenant("b").await;
    let repo = app.register(&b, app.source_repo("b-repo", &[("src/lib.rs", Some("pub fn f() {}\n"))])).await;
    let theirs = app.session(&b, &repo).await;
    // The mirrors hold tenants' source code: only cachet's user reads them.
    use std::os::unix::fs::PermissionsExt;
    let mirrors = app.data_dir.path().join("mirrors");
    assert_eq!(std::fs::metadata(&mirrors).unwrap().permissions().mode() & 0o777, 0o700);
    let mut body = app.chat_body("hi", 1);
    body["session_id"] = json!(theirs);
    error(app.chat(&a, body.clone()).await, 404).await;
    let r = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&a)
        .header("x-cachet-session", theirs.as_str())
        .json(&app.chat_body("hi", 1))
        .send()
        .await
        .unwrap();
    error(r, 404).await;
    // A label of the tenant's own choosing, and the session's owner, are served.
    assert_eq!(app.chat(&b, body.clone()).await.status(), 200);
    body["session_id"] = json!(Uuid::new_v4());
    assert_eq!(app.chat(&a, body).await.status(), 200);
}

/// An id that is not a UUID, in a path, a body or a header, is a JSON error that says which kind
/// of id it expected; it never reaches the store.
#[tokio::test]
async fn malformed_ids_are_json_errors_naming_the_kind_of_id() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("a").await;
    for (path, kind) in
        [("/v1/sessions/not-a-uuid", "session"), ("/v1/tasks/42", "task"), ("/v1/repos/..%2F..%2Fetc", "repository")]
    {
        let e = error(app.get(&token, path).await, 404).await;
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(&format!("invalid {kind} id")), "{path}: {e}");
    }
    let e = error(app.post(&token, "/v1/tasks/42/outcome", json!({"status": "succeeded"})).await, 404).await;
    assert!(e["message"].as_str().unwrap().contains("invalid task id \"42\""), "{e}");
    let e = error(app.post(&token, "/v1/sessions", json!({"repo": "shop"})).await, 400).await;
    assert!(e["message"].as_str().unwrap().contains("invalid repository id \"shop\""), "{e}");
    let mut body = app.chat_body("hi", 1);
    body["task_id"] = json!("t-1");
    let e = error(app.chat(&token, body).await, 400).await;
    assert!(e["message"].as_str().unwrap().contains("invalid task id \"t-1\""), "{e}");
    let r = app
        .client
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-cachet-session", "s-1")
        .json(&app.chat_body("hi", 1))
        .send()
        .await
        .unwrap();
    let e = error(r, 400).await;
    assert!(e["message"].as_str().unwrap().contains("x-cachet-session header: invalid session id"), "{e}");
}

#[tokio::test]
async fn while_postgres_is_down_only_tasks_checked_before_are_taken() {
    // Its own cluster: stopping the shared one would break the other tests.
    let (_dir, mut cluster, app) = spawn_on_own_cluster().await;
    let (_, a) = app.tenant("a").await;
    let (_, b) = app.tenant("b").await;
    let task = |token: String| {
        let app = &app;
        async move {
            let r = app.post(&token, "/v1/tasks", json!({ "title": "secret project" })).await;
            assert_eq!(r.status(), 201);
            r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
        }
    };
    let (mine, theirs) = (task(a.clone()).await, task(b.clone()).await);
    let with_task = |task: &str| {
        let mut body = app.chat_body("hi", 1);
        body["task_id"] = json!(task);
        body
    };
    assert_eq!(app.chat(&a, with_task(&mine)).await.status(), 200);
    error(app.chat(&a, with_task(&theirs)).await, 404).await;
    cluster.stop().unwrap();
    assert_eq!(app.chat(&a, with_task(&mine)).await.status(), 200, "a task checked before goes on");
    let e = error(app.chat(&a, with_task(&theirs)).await, 503).await;
    assert!(e["message"].as_str().unwrap().contains("without it"), "{e}");
    cluster.restart().unwrap();
    app.handle.stop(true).await;
}

#[tokio::test]
async fn reports_never_join_another_tenants_task() {
    // A ledger row naming another tenant's task (as one accepted during an outage before the fix
    // above could be): neither the title nor the cost crosses tenants.
    let app = spawn_app().await;
    let (a, a_token) = app.tenant("a").await;
    let (b, b_token) = app.tenant("b").await;
    let theirs = app.post(&b_token, "/v1/tasks", json!({ "title": "b's secret project" })).await;
    let theirs: TaskId = theirs.json::<Value>().await.unwrap()["id"].as_str().unwrap().parse().unwrap();
    let row = |tenant, cost| cachet_tenants::UsageRecord {
        id: RequestId::random(),
        tenant,
        session_id: None,
        task_id: Some(theirs),
        model: "tiny".into(),
        endpoint: Endpoint::ChatCompletions,
        prompt_tokens: 10,
        cached_tokens: 0,
        computed_tokens: 10,
        output_tokens: 1,
        queue_ms: 1.0,
        ttft_ms: Some(10.0),
        e2e_ms: 20.0,
        compute_seconds: 0.1,
        cost,
        status: RequestStatus::Ok,
        finish_reason: Some(FinishReason::Stop),
        created_at: chrono::Utc::now(),
        slo_class: Some(SloClass::Interactive),
        slo_met: Some(true),
        kv_transfer_ms: None,
        drafted_tokens: 0,
        accepted_tokens: 0,
    };
    app.state.store.insert_usage(&[row(a, 5.0), row(b, 1.0)]).await.unwrap();
    let text = app.get(&a_token, "/v1/reports/usage?group_by=task").await.text().await.unwrap();
    assert!(!text.contains("secret project") && !text.contains(&theirs.to_string()), "{text}");
    let v: Value = app.get(OPERATOR, "/admin/reports/usage?group_by=task").await.json().await.unwrap();
    let task = v["rows"].as_array().unwrap().iter().find(|r| r["key"] == theirs.to_string()).expect("b's task row");
    assert_eq!(task["task_cost"], 1.0, "only b's own requests count for b's task: {task}");
}

#[tokio::test]
async fn a_refused_turn_leaves_the_session_history_as_it_was() {
    let (app, token) = spawn_tight("acme", 2).await;
    let repo = app.register(&token, app.source_repo("r", &[("src/lib.rs", Some("pub fn f() {}\n"))])).await;
    let session = app.session(&token, &repo).await;
    for i in 0..2 {
        let r = app.message(&token, &session, json!({ "content": format!("question {i}"), "max_tokens": 2 })).await;
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["cachet"]["turn"], 2 * i, "the user turn's number, told before it is stored: {v}");
    }
    let r = app.message(&token, &session, json!({ "content": "one too many", "max_tokens": 2 })).await;
    assert_eq!(error(r, 429).await["code"], "rate_limit_exceeded");
    let history: Value = app.get(&token, &format!("/v1/sessions/{session}")).await.json().await.unwrap();
    let turns = history["turns"].as_array().unwrap();
    let roles: Vec<&str> = turns.iter().map(|t| t["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant"], "no question without its answer");
}

/// A TCP listener on `host` that counts connections and answers each with `reply` (if any).
async fn listener(host: &str, reply: Option<String>) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind((host, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(reply) = reply.clone() {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(reply.as_bytes()).await;
            }
        }
    });
    (port, count)
}

#[tokio::test]
async fn a_repository_url_cannot_reach_the_server_or_its_network() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("ssrf").await;
    let (port, hits) = listener("127.0.0.1", None).await;
    let db_port = app.state.settings.database.private_port;
    for url in [
        format!("http://127.0.0.1:{port}/x.git"),
        format!("http://localhost:{port}/x.git"),
        format!("http://2130706433:{port}/x.git"),
        format!("http://0x7f.0.0.1:{port}/x.git"),
        format!("http://127.1:{port}/x.git"),
        format!("http://[::ffff:127.0.0.1]:{port}/x.git"),
        format!("http://[::1]:{port}/x.git"),
        format!("https://127.0.0.1:{db_port}/x.git"),
        format!("{}/v1/models", app.address),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "ssh://git@10.0.0.1/r.git".to_string(),
        "git@192.168.1.1:r.git".to_string(),
    ] {
        let r = app.post(&token, "/v1/repos", json!({ "url": url })).await;
        assert_eq!(r.status(), 400, "{url}");
        let body: Value = r.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("not allowed") || message.contains("cannot be resolved"), "{url}: {message}");
    }
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was connected to");
    assert!(app.get(&token, "/v1/repos").await.json::<Value>().await.unwrap()["data"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn fetch_failures_tell_the_tenant_nothing_about_what_answered_and_follow_no_redirect() {
    // An operator who allows private hosts (an internal git server): a closed port, a port that
    // answers with something that is not git, and one that redirects elsewhere all give the
    // tenant the same answer, and the redirect is not followed.
    let app = spawn_with(|s| s.context.allow_private_hosts = true).await;
    let (_, token) = app.tenant("scan").await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let http = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    let (web, _) = listener("127.0.0.1", Some(http.to_string())).await;
    let (target, followed) = listener("127.0.0.2", None).await;
    let redirect = format!(
        "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.2:{target}/x.git/info/refs?service=git-upload-pack\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let (moved, _) = listener("127.0.0.1", Some(redirect)).await;
    let mut answers = Vec::new();
    for port in [closed, web, moved] {
        let r = app.post(&token, "/v1/repos", json!({ "url": format!("http://127.0.0.1:{port}/x.git") })).await;
        assert_eq!(r.status(), 502, "port {port}");
        let body: Value = r.json().await.unwrap();
        answers.push(body["error"]["message"].as_str().unwrap().to_string());
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert!(!answers[0].contains("127.0.0.1") && !answers[0].contains("refused"), "{}", answers[0]);
    assert_eq!(followed.load(std::sync::atomic::Ordering::SeqCst), 0, "the redirect was not followed");
    assert!(logs().contains("fetching a repository failed"), "the operator's log has the detail");
}

#[tokio::test]
async fn a_server_whose_engine_thread_died_says_so_and_exits_with_an_error() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("alive").await;
    app.chat(&token, app.chat_body("still there?", 2)).await;
    let readyz = || async { app.client.get(format!("{}/readyz", app.address)).send().await };
    assert_eq!(readyz().await.unwrap().status(), 200);

    app.state.model.served.get().unwrap().engine.halt();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let run = app.run.lock().unwrap().take().unwrap();
    // Not ready (while it still answers), then stopped with an error.
    let mut said = false;
    while !run.is_finished() {
        if let Ok(r) = readyz().await {
            if r.status() == 503 {
                let body: Value = r.json().await.unwrap();
                assert!(body["model"]["error"].as_str().unwrap().contains("engine"), "{body}");
                said = true;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server is still running (503 seen: {said}; watchdog: {})",
            logs().contains("stopping the server")
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let outcome = run.await.unwrap();
    assert!(outcome.as_ref().is_err_and(|e| e.contains("engine thread stopped")), "{outcome:?}");
    assert!(said, "/readyz never said the engine was gone");
    assert!(readyz().await.is_err(), "nothing listens any more");
}

#[tokio::test]
async fn a_prompt_longer_than_any_context_is_refused_before_it_is_tokenized() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("long").await;
    let context = app.state.model.served.get().unwrap().engine.max_context();
    // More bytes than the context could hold at 32 bytes a token: refused on its size alone.
    let text = "word ".repeat(context * 40 / 5);
    for (path, body) in [
        ("/v1/chat/completions", app.chat_body(&text, 1)),
        ("/v1/completions", json!({ "model": app.model(), "prompt": text, "max_tokens": 1 })),
        ("/tokenize", json!({ "prompt": text })),
    ] {
        let r = app.post(&token, path, body).await;
        let e = error(r, 413).await;
        assert!(e["message"].as_str().unwrap().contains("far longer"), "{path}: {e}");
        assert_eq!(e["code"], "context_length_exceeded");
    }
    // Within the bytes but over the tokens: tokenized (off the HTTP workers), then refused by count.
    let text = "word ".repeat(context + 16);
    let e = error(app.post(&token, "/v1/chat/completions", app.chat_body(&text, 1)).await, 413).await;
    assert!(e["message"].as_str().unwrap().contains("but the prompt has"), "{e}");
}

#[tokio::test]
async fn a_slow_remote_delays_no_other_registration_and_a_lost_secret_can_be_replaced() {
    let app = spawn_with(|s| s.context.allow_private_hosts = true).await;
    let (_, slow_tenant) = app.tenant("slow").await;
    let (_, other) = app.tenant("other").await;
    // A remote that accepts the connection and then says nothing (until told to hang up).
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (hang_up, mut told) = tokio::sync::oneshot::channel::<()>();
    let (connected, on_connect) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (socket, _) = l.accept().await.unwrap();
        let _ = connected.send(());
        let _ = (&mut told).await;
        drop(socket);
    });
    let slow = {
        let (client, url, token) = (app.client.clone(), format!("{}/v1/repos", app.address), slow_tenant.clone());
        tokio::spawn(async move {
            let body = json!({ "url": format!("http://127.0.0.1:{port}/stuck.git") });
            client.post(url).bearer_auth(token).json(&body).send().await.unwrap().status().as_u16()
        })
    };
    on_connect.await.unwrap();
    // The slow fetch is under way: another tenant registers meanwhile.
    let repo = app.register(&other, app.source_repo("quick", &[("src/lib.rs", Some("pub fn f() {}\n"))])).await;
    assert!(!slow.is_finished(), "the slow registration ended first: nothing was shown");
    let _ = hang_up.send(());
    assert_eq!(slow.await.unwrap(), 502);

    // The secret shown at registration is lost: a new one replaces it, the old one stops working.
    let body = serde_json::to_vec(&json!({ "zen": "ping" })).unwrap();
    let hook = |secret: &str| {
        app.client
            .post(format!("{}/v1/webhooks/git/{}", app.address, repo.id))
            .header("x-github-event", "ping")
            .header("x-github-delivery", Uuid::new_v4().to_string())
            .header("x-hub-signature-256", sign(secret, &body))
            .body(body.clone())
            .send()
    };
    assert_eq!(hook(&repo.secret).await.unwrap().status(), 200);
    let path = format!("/v1/repos/{}/webhook-secret", repo.id);
    error(app.post(&slow_tenant, &path, json!({})).await, 404).await;
    let r = app.post(&other, &path, json!({})).await;
    assert_eq!(r.status(), 200);
    let fresh = r.json::<Value>().await.unwrap()["webhook"]["secret"].as_str().unwrap().to_string();
    assert_ne!(fresh, repo.secret);
    assert_eq!(hook(&repo.secret).await.unwrap().status(), 401);
    assert_eq!(hook(&fresh).await.unwrap().status(), 200);
}

/// Polls a repository until its registration is no longer `fetching`.
async fn registration_end(app: &TestApp, token: &str, id: &str) -> Value {
    for _ in 0..600 {
        let v: Value = app.get(token, &format!("/v1/repos/{id}")).await.json().await.unwrap();
        if v["status"] != "fetching" {
            return v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("repository {id} still fetching after 30 s");
}

#[tokio::test]
async fn a_registration_is_a_job_that_outlives_its_request() {
    // The server answers at once (it waits 0 s for the fetch): as for a client that gave up.
    let app = spawn_with(|s| {
        s.context.allow_private_hosts = true;
        s.context.registration_wait_secs = 0;
    })
    .await;
    let (_, token) = app.tenant("acme").await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (hang_up, told) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (socket, _) = l.accept().await.unwrap();
        let _ = told.await;
        drop(socket);
    });
    let r = app
        .post(&token, "/v1/repos", json!({ "url": format!("http://127.0.0.1:{port}/shop.git"), "name": "shop" }))
        .await;
    assert_eq!(r.status(), 202);
    let id = r.headers()["location"].to_str().unwrap().trim_start_matches("/v1/repos/").to_string();
    let v: Value = r.json().await.unwrap();
    assert_eq!((v["id"].as_str(), v["status"].as_str()), (Some(id.as_str()), Some("fetching")));
    assert!(v["webhook"]["secret"].as_str().unwrap().starts_with("whsec_"), "{v}");
    // While it fetches: listed as fetching, its name taken, no session on it.
    let list: Value = app.get(&token, "/v1/repos").await.json().await.unwrap();
    assert_eq!(list["data"][0]["status"], "fetching", "{list}");
    let again =
        app.post(&token, "/v1/repos", json!({ "url": format!("http://127.0.0.1:{port}/x.git"), "name": "shop" }));
    error(again.await, 409).await;
    let e = error(app.post(&token, "/v1/sessions", json!({ "repo": id })).await, 409).await;
    assert!(e["message"].as_str().unwrap().contains("still being fetched"), "{e}");
    // A push meanwhile is signed with the secret of the 202 and answered 503: deliver it later.
    let pending = Registered {
        id: id.clone(),
        secret: v["webhook"]["secret"].as_str().unwrap().into(),
        source: app.source_repo("unused", &[("a", Some("a"))]),
        head: String::new(),
    };
    let hook = app.push_hook(&pending, &"0".repeat(40), &"1".repeat(40), Some("d-1")).await;
    assert_eq!(hook.status(), 503);

    // The remote hangs up: the job records the failure (generic words), the name is free again.
    let _ = hang_up.send(());
    let v = registration_end(&app, &token, &id).await;
    assert_eq!(v["status"], "failed", "{v}");
    let why = v["error"].as_str().unwrap();
    assert!(why.contains("could not be fetched") && !why.contains("127.0.0.1"), "{why}");
    let e = error(app.post(&token, "/v1/sessions", json!({ "repo": id })).await, 409).await;
    assert!(e["message"].as_str().unwrap().contains("registration failed"), "{e}");

    let source = app.source_repo("shop", &[("src/lib.rs", Some("pub fn f() {}\n"))]);
    let url = source.path().display().to_string();
    let r = app.post(&token, "/v1/repos", json!({ "url": url, "name": "shop" })).await;
    assert_eq!(r.status(), 202);
    let fresh = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let v = registration_end(&app, &token, &fresh).await;
    assert_eq!((v["status"].as_str(), v["default_branch"].as_str()), (Some("ready"), Some("main")), "{v}");
    let r = app.post(&token, "/v1/sessions", json!({ "repo": fresh })).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn a_registration_a_dead_process_left_fetching_is_taken_up_again() {
    // The sweeper runs every second (a quarter of the task idle time).
    let app = spawn_with(|s| s.tasks.idle_secs = 4).await;
    let (tenant, token) = app.tenant("acme").await;
    let source = app.source_repo("shop", &[("src/lib.rs", Some("pub fn f() {}\n"))]);
    // What a process killed during the fetch leaves: the row, `fetching`, untouched for an hour.
    let store = &app.state.store;
    let url = source.path().display().to_string();
    let new = cachet_tenants::store::NewRepository {
        id: cachet_tenants::RepoId::random(),
        tenant,
        name: "shop",
        source: &url,
        default_branch: None,
        webhook_secret: "whsec_0123456789abcdef0123456789abcdef",
        options: &json!({}),
    };
    let id = store.create_repository(&new).await.unwrap().id;
    sqlx::query("UPDATE repositories SET updated_at = now() - interval '1 hour' WHERE id = $1")
        .bind(id)
        .execute(store.pool())
        .await
        .unwrap();
    let v = registration_end(&app, &token, &id.to_string()).await;
    assert_eq!((v["status"].as_str(), v["default_branch"].as_str()), (Some("ready"), Some("main")), "{v}");
    let r = app.post(&token, "/v1/sessions", json!({ "repo": id })).await;
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

#[tokio::test]
async fn another_tenants_identical_long_prompt_is_cold_and_only_the_public_prefix_is_cached() {
    let app = spawn_with(|s| {
        s.model.public_system_prompt = "You are a careful coding assistant. ".repeat(8);
        s.engine.pool_tokens = 16384;
    })
    .await;
    let public = app.state.model.served.get().unwrap().public.clone().expect("a public prefix").1.len() as u64;
    let (_, a) = app.tenant("victim").await;
    // A's private 1,500-token prompt, which the attacker guessed exactly.
    let secret: String = (0..1500).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect();
    let body = app.chat_body(&secret, 1);
    let (_, cold) = first_token(&app, &a, body.clone()).await;
    let prompt = cold["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt >= 1500, "{cold}");
    // Side by side, alternating: the victim's warm turn, then a fresh attacker tenant's probe.
    let (warm, probe) = timing_probe(&app, &a, &body, prompt, public).await;
    // What the attacker can time: a cold prompt, not the victim's cache hit.
    assert!(probe > 2.0 * warm, "probe {probe:.1} ms vs the victim's warm turn {warm:.1} ms");
}

// ---- Second hardening round (issue "Hardening, second round") ----

/// The words of a refused registration with the path it named taken out.
async fn refused_registration(app: &TestApp, token: &str, path: &str) -> String {
    let r = app.post(token, "/v1/repos", json!({ "url": path })).await;
    let e = error(r, 400).await;
    e["message"].as_str().unwrap().replace(path, "<path>")
}

#[tokio::test]
async fn another_tenants_mirror_cannot_be_read_through_a_git_file_a_symlink_or_alternates() {
    let app = spawn_app().await;
    let (_, victim) = app.tenant("victim").await;
    let (_, attacker) = app.tenant("attacker").await;
    let secret = app.register(&victim, app.source_repo("secret", &[("secret.txt", Some("TOP SECRET\n"))])).await;
    let mirror = app.state.settings.server.data_dir.join("mirrors").join(format!("{}.git", secret.id.replace('-', "")));
    assert!(mirror.is_dir(), "{}", mirror.display());
    let sources = app.sources();
    // A `.git` file naming the mirror (as a worktree or submodule writes one).
    std::fs::create_dir_all(sources.join("gitdir")).unwrap();
    std::fs::write(sources.join("gitdir/.git"), format!("gitdir: {}\n", mirror.display())).unwrap();
    // A `.git` symlink to it.
    std::fs::create_dir_all(sources.join("symlink")).unwrap();
    std::os::unix::fs::symlink(&mirror, sources.join("symlink/.git")).unwrap();
    // A repository of its own that borrows the mirror's objects, with a branch at the secret.
    let borrow = app.source_repo("borrow", &[("a.txt", Some("a\n"))]);
    std::fs::write(borrow.path().join(".git/objects/info/alternates"), format!("{}/objects\n", mirror.display()))
        .unwrap();
    std::fs::write(borrow.path().join(".git/refs/heads/main"), format!("{}\n", secret.head)).unwrap();

    let words = refused_registration(&app, &attacker, "/no/such/repository").await;
    for path in [sources.join("gitdir"), sources.join("symlink"), borrow.path().to_path_buf()] {
        let path = path.display().to_string();
        assert_eq!(refused_registration(&app, &attacker, &path).await, words, "{path}");
    }
    // Nothing was registered, and the victim's repository is the victim's alone.
    let listed: Value = app.get(&attacker, "/v1/repos").await.json().await.unwrap();
    assert!(listed["data"].as_array().unwrap().is_empty(), "{listed}");
}

#[tokio::test]
async fn a_refused_local_path_does_not_tell_whether_it_exists() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("prober").await;
    let words = refused_registration(&app, &token, "/no/such/path").await;
    for path in ["/etc", "/root", "/proc/self", "/no/such/path/either", "/tmp"] {
        assert_eq!(refused_registration(&app, &token, path).await, words, "{path}");
    }
    let inside_missing = app.sources().join("missing").display().to_string();
    assert_eq!(refused_registration(&app, &token, &inside_missing).await, words);
}

#[tokio::test]
async fn stop_strings_are_capped_by_their_bytes() {
    let app = spawn_app().await;
    let (_, token) = app.tenant("stops").await;
    let mut body = app.chat_body("hi", 2);
    body["stop"] = json!(vec!["x".repeat(300); 32]);
    let e = error(app.chat(&token, body.clone()).await, 400).await;
    assert_eq!(e["param"], "stop", "{e}");
    assert!(e["message"].as_str().unwrap().contains("8192 bytes"), "{e}");
    body["stop"] = json!(vec!["x".repeat(256); 32]);
    assert_eq!(app.chat(&token, body).await.status(), 200, "32 stops of 256 bytes are fine");
}

/// Sends `head` and then `drip` every `gap`, until the server answers or closes (at most 120
/// drips); what it answered (empty if nothing) and how many drips it took.
async fn trickle(address: &str, head: String, drip: &'static [u8], gap: std::time::Duration) -> (String, usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = address.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(host).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut drips = 0;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        tokio::select! {
            n = socket.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            () = tokio::time::sleep(gap) => {
                drips += 1;
                if socket.write_all(drip).await.is_err() {
                    // The server closed its side; read what it said.
                    let _ = socket.read_to_end(&mut answer).await;
                    break;
                }
            }
        }
        assert!(drips < 120, "the trickle was never cut off; the server said {:?}", String::from_utf8_lossy(&answer));
    }
    (String::from_utf8_lossy(&answer).into_owned(), drips)
}

#[tokio::test]
async fn a_body_that_trickles_in_is_cut_off_and_its_connection_closed() {
    let app = spawn_with(|s| s.server.body_timeout_secs = 2).await;
    let (_, token) = app.tenant("slow").await;
    let gap = std::time::Duration::from_millis(250);
    let webhook = format!(
        "POST /v1/webhooks/git/{} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 900000\r\n\r\n{{",
        Uuid::new_v4()
    );
    let chat = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{{\r\n"
    );
    let (a, b) =
        tokio::join!(trickle(&app.address, webhook, b" ", gap), trickle(&app.address, chat, b"1\r\n \r\n", gap));
    for (answer, drips) in [a, b] {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("request_timeout"), "{answer}");
        // The deadline is 2 s, a drip every 250 ms: cut off well before 40 drips.
        assert!(drips < 40, "cut off after {drips} drips");
    }
    // A body that comes in time is served as ever.
    assert_eq!(app.chat(&token, app.chat_body("hi", 1)).await.status(), 200);
}

#[tokio::test]
async fn a_non_streaming_request_whose_client_goes_away_stops_generating() {
    use tokio::io::AsyncWriteExt;
    let app = spawn_app().await;
    let (tenant, token) = app.tenant("gone").await;
    let mut body = app.chat_body("Write a very long story.", 4000);
    body["ignore_eos"] = json!(true);
    let body = body.to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let host = app.address.trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(&host).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    // Until the engine is generating for it.
    for polls in 0.. {
        let rows = app.ledger(tenant).await;
        if rows.first().is_some_and(|r| r.output_tokens > 0) {
            break;
        }
        assert!(polls < 3000, "the request never started");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(socket);
    let gone = std::time::Instant::now();
    // The row ends either way: cancelled, or (without the fix) finished at its 4,000 tokens.
    let row = loop {
        let rows = app.ledger(tenant).await;
        if let Some(r) = rows.first().filter(|r| r.status != RequestStatus::Running) {
            break r.clone();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let stopped = gone.elapsed();
    eprintln!("stopped {stopped:?} after the client left, at {} output tokens", row.output_tokens);
    assert_eq!(row.status, RequestStatus::Cancelled);
    assert!(row.output_tokens > 0 && row.output_tokens < 4000, "billed what was generated: {}", row.output_tokens);
    assert!(row.cost > 0.0, "and billed");
}

#[tokio::test]
async fn engine_thread_work_a_request_controls_is_bounded() {
    // Neighbours of the attacks above: what a request makes the engine do at every token.
    let app = spawn_app().await;
    let (_, token) = app.tenant("neighbours").await;
    let mut body = app.chat_body("hi", 2);
    body["logit_bias"] = json!((0..1025).map(|i| (i.to_string(), json!(1))).collect::<serde_json::Map<_, _>>());
    assert_eq!(error(app.chat(&token, body).await, 400).await["param"], "logit_bias");
    let mut body = app.chat_body("hi", 2);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(21);
    assert_eq!(error(app.chat(&token, body).await, 400).await["param"], "top_logprobs");
    // A grammar over the size limit is refused before it is compiled.
    let mut body = app.chat_body("hi", 2);
    body["grammar"] = json!({ "regex": "a".repeat((1 << 20) + 1) });
    let r = app.chat(&token, body).await;
    assert!([400, 413].contains(&r.status().as_u16()), "{}", r.status());
    // A large schema that compiles (a 20,000-value enum) is served, off the engine thread.
    let values: Vec<String> = (0..20_000).map(|i| format!("v{i}")).collect();
    let mut body = app.chat_body("pick one", 8);
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "pick",
        "schema": {"type": "object", "properties": {"v": {"enum": values}}, "required": ["v"]}}});
    assert_eq!(app.chat(&token, body).await.status(), 200);
}
