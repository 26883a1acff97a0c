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
    while app.state.ledger.flush().await > 0 {
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
