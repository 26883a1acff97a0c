//! The usage ledger: one row per request, matching the response's usage;
//! nothing lost or doubled when Postgres goes away for 20 s.

use crate::helpers::*;
use cachet_tenants::{RequestId, RequestStatus, SessionId, TaskId};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use uuid::Uuid;

fn request_id(v: &Value) -> RequestId {
    let id = v["id"].as_str().unwrap();
    RequestId(Uuid::parse_str(id.rsplit('-').next().unwrap()).unwrap())
}

#[tokio::test]
async fn ledger_rows_match_the_responses() {
    let app = spawn_app().await;
    let (tenant, token) = app.tenant("acme").await;
    let session = SessionId::random();
    let r = app.post(&token, "/v1/tasks", json!({ "title": "answer questions" })).await;
    assert_eq!(r.status(), 201);
    let task: TaskId = r.json::<Value>().await.unwrap()["id"].as_str().unwrap().parse().unwrap();
    // A task id the tenant does not have is refused before anything runs.
    let mut unknown = app.chat_body("x", 1);
    unknown["task_id"] = json!(Uuid::new_v4());
    error(app.chat(&token, unknown).await, 404).await;
    let mut responses = Vec::new();
    for i in 0..4 {
        let mut body = app.chat_body(&format!("question {} about the same code ", i % 2).repeat(10), 5);
        body["session_id"] = json!(session);
        let r = app
            .client
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header("X-Cachet-Task", task.to_string())
            .json(&body)
            .send()
            .await
            .unwrap();
        responses.push(r.json::<Value>().await.unwrap());
    }
    let rows = app.ledger(tenant).await;
    assert_eq!(rows.len(), 4);
    for v in &responses {
        let row = rows.iter().find(|r| r.id == request_id(v)).expect("a row per response");
        let u = &v["usage"];
        assert_eq!(row.prompt_tokens, u["prompt_tokens"].as_i64().unwrap());
        assert_eq!(row.output_tokens, u["completion_tokens"].as_i64().unwrap());
        assert_eq!(row.cached_tokens, u["prompt_tokens_details"]["cached_tokens"].as_i64().unwrap());
        assert_eq!(row.status, RequestStatus::Ok);
        assert_eq!(row.session_id, Some(session));
        assert_eq!(row.task_id, Some(task));
        assert_eq!(row.model, app.model());
        assert!(row.cost > 0.0);
        assert!(row.ttft_ms.unwrap() <= row.e2e_ms);
    }
}

/// Speculative decoding in the ledger: a row counts the tokens drafted into its request's passes
/// and those confirmed, and its output tokens once (as the response's usage does, whose
/// `completion_tokens_details` carries the same counts).
#[tokio::test]
async fn ledger_rows_count_drafted_and_confirmed_tokens() {
    let app = spawn_app().await;
    let (tenant, token) = app.tenant("acme").await;
    let mut responses = Vec::new();
    for i in 0..4 {
        let body = app.chat_body(&format!("repeat after me: {i} abc abc abc abc abc abc abc abc abc abc"), 64);
        responses.push(app.chat(&token, body).await.json::<Value>().await.unwrap());
    }
    let rows = app.ledger(tenant).await;
    let mut confirmed = 0;
    for v in &responses {
        let row = rows.iter().find(|r| r.id == request_id(v)).expect("a row per response");
        assert_eq!(row.output_tokens, v["usage"]["completion_tokens"].as_i64().unwrap());
        assert!(row.accepted_tokens <= row.drafted_tokens, "{row:?}");
        // The response says the same, in OpenAI's fields for predicted tokens.
        let d = &v["usage"]["completion_tokens_details"];
        assert_eq!(row.accepted_tokens, d["accepted_prediction_tokens"].as_i64().unwrap(), "{v}");
        assert_eq!(row.drafted_tokens - row.accepted_tokens, d["rejected_prediction_tokens"].as_i64().unwrap(), "{v}");
        assert!(row.accepted_tokens < row.output_tokens.max(1), "{row:?}");
        confirmed += row.accepted_tokens;
    }
    assert!(confirmed > 0, "no drafted token was confirmed in four repetitive answers: {rows:?}");
}

/// An agent that knows nothing of tasks (Codex sends its run id as `session-id`) gets one task per
/// run: every request of the run lands in it, another tenant's run with the same id is another
/// task neither can see, an explicit task wins, and the outcome is recorded like any task's.
#[tokio::test]
async fn an_agent_run_is_one_task_by_the_session_id_its_client_sends() {
    let app = spawn_app().await;
    let (acme, a) = app.tenant("acme").await;
    let (beta, b) = app.tenant("beta").await;
    let send = |token: &str, path: &str, body: Value, headers: Vec<(&'static str, String)>| {
        let mut r = app.client.post(format!("{}{path}", app.address)).bearer_auth(token).json(&body);
        for (k, v) in headers {
            r = r.header(k, v);
        }
        async move {
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    let run = "019b0c3c-0b5e-7863-aa06-7b6594d5ffc3".to_string();
    let codex = || vec![("session-id", run.clone()), ("originator", "codex_exec".to_string())];
    let responses = json!({"model": app.model(), "input": "list the files", "max_output_tokens": 3});
    let first = send(&a, "/v1/responses", responses.clone(), codex()).await;
    let second = send(&a, "/v1/chat/completions", app.chat_body("and now?", 3), codex()).await;
    let theirs = send(&b, "/v1/responses", responses.clone(), codex()).await;
    // An explicit task wins; a value that cannot be an id (too long) groups nothing.
    let explicit: Value = app.post(&a, "/v1/tasks", json!({ "title": "mine" })).await.json().await.unwrap();
    let mut named = codex();
    named.push(("x-cachet-task", explicit["id"].as_str().unwrap().to_string()));
    let named = send(&a, "/v1/chat/completions", app.chat_body("x", 2), named).await;
    let long = send(&a, "/v1/chat/completions", app.chat_body("y", 2), vec![("session-id", "z".repeat(201))]).await;

    let found = |token: &str| {
        let url = format!("/v1/tasks?client_session={run}");
        let token = token.to_string();
        let app = &app;
        async move {
            let v: Value = app.get(&token, &url).await.json().await.unwrap();
            assert_eq!(v["data"].as_array().unwrap().len(), 1, "{v}");
            v["data"][0].clone()
        }
    };
    let ours = found(&a).await;
    let other = found(&b).await;
    assert_eq!(ours["title"], format!("codex_exec session {run}"));
    assert_eq!(ours["client_session"], run.as_str());
    assert_eq!(ours["status"], "open");
    assert_ne!(ours["id"], other["id"], "the same client id from two tenants is two tasks");
    let task: TaskId = ours["id"].as_str().unwrap().parse().unwrap();
    error(app.get(&b, &format!("/v1/tasks/{task}")).await, 404).await;
    error(app.get(&a, "/v1/tasks?limit=0").await, 400).await;
    let listed: Value = app.get(&a, "/v1/tasks").await.json().await.unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 2, "the run's task and the explicit one: {listed}");

    // `chatcmpl-<id>` and `resp_<id>`.
    let response_id = |v: &Value| {
        let id = v["id"].as_str().unwrap().rsplit(['-', '_']).next().unwrap();
        RequestId(Uuid::parse_str(id).expect("a request id"))
    };
    let rows = app.ledger(acme).await;
    let task_of = |v: &Value| rows.iter().find(|r| r.id == response_id(v)).expect("a row").task_id;
    assert_eq!(task_of(&first), Some(task));
    assert_eq!(task_of(&second), Some(task));
    assert_eq!(task_of(&named).map(|t| t.to_string()), explicit["id"].as_str().map(String::from));
    assert_eq!(task_of(&long), None);
    let their_rows = app.ledger(beta).await;
    assert_eq!(their_rows.len(), 1);
    assert_eq!(their_rows[0].id, response_id(&theirs));
    assert_eq!(their_rows[0].task_id.map(|t| t.to_string()), other["id"].as_str().map(String::from));

    // The benchmark (or a CI job) records the run's outcome; its cost is the run's requests.
    let closed = app.post(&a, &format!("/v1/tasks/{task}/outcome"), json!({"status": "succeeded"})).await;
    assert_eq!(closed.status(), 200);
    let got: Value = app.get(&a, &format!("/v1/tasks/{task}")).await.json().await.unwrap();
    assert_eq!(got["requests"], 2);
    assert!(got["cost"].as_f64().unwrap() > 0.0);
}

/// Postgres stops for 20 s while requests keep coming; afterwards every
/// served request has exactly one row.
#[tokio::test]
async fn no_row_is_lost_or_doubled_when_postgres_goes_away() {
    // Its own cluster: stopping the shared one would break the other tests.
    let (_dir, mut cluster, app) = spawn_on_own_cluster().await;
    let (tenant, token) = app.tenant("acme").await;

    let mut ids = Vec::new();
    let serve = |ids: &mut Vec<RequestId>, v: Value| ids.push(request_id(&v));
    for i in 0..5 {
        serve(&mut ids, app.chat(&token, app.chat_body(&format!("before {i}"), 3)).await.json().await.unwrap());
    }
    // pg_ctl blocks this test's thread for a moment; the server runs on its own.
    cluster.stop().unwrap();
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(20) {
        let r = app.chat(&token, app.chat_body("during the outage", 3)).await;
        assert_eq!(r.status(), 200, "requests are served while Postgres is down");
        serve(&mut ids, r.json().await.unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The spool holds the tenants' usage while Postgres is away: only cachet's user reads it.
    let spool = app.data_dir.path().join("ledger-spool.jsonl");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&spool).unwrap().permissions().mode() & 0o777, 0o600);
    cluster.restart().unwrap();
    for i in 0..5 {
        serve(&mut ids, app.chat(&token, app.chat_body(&format!("after {i}"), 3)).await.json().await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.state.accounting.ledger.flush().await > 0 {
        assert!(Instant::now() < deadline, "the spool did not drain");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rows = app.state.store.usage(tenant, 10_000).await.unwrap();
    let stored: Vec<RequestId> = rows.iter().map(|r| r.id).collect();
    let unique: HashSet<RequestId> = stored.iter().copied().collect();
    assert_eq!(unique.len(), stored.len(), "a row was written twice");
    assert_eq!(unique, ids.iter().copied().collect::<HashSet<_>>(), "rows lost");
    assert!(ids.len() > 30, "the stream kept going: {} requests", ids.len());
    app.handle.stop(true).await;
}
