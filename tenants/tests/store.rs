//! The Postgres store and the migrations, against a real Postgres (a private cluster per test
//! binary, a fresh database per test).

use crate::common;

use cachet_tenants::{
    Endpoint, FinishReason, Plan, RequestId, RequestStatus, SessionId, SloClass, StoreError, Tenant, TenantId,
    UsageRecord,
};
use chrono::{DateTime, Utc};
use common::fresh_store;

/// Now, at the microsecond precision Postgres keeps.
fn now() -> DateTime<Utc> {
    DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap()
}

fn usage(tenant: TenantId, seconds_ago: i64) -> UsageRecord {
    let plan = Plan::default();
    UsageRecord {
        id: RequestId::random(),
        tenant,
        session_id: Some(SessionId::random()),
        task_id: None,
        model: "qwen2.5-coder-0.5b-instruct".into(),
        endpoint: Endpoint::ChatCompletions,
        prompt_tokens: 2000,
        cached_tokens: 1500,
        computed_tokens: 500,
        output_tokens: 120,
        queue_ms: 3.5,
        ttft_ms: Some(41.25),
        e2e_ms: 900.0,
        compute_seconds: 0.75,
        cost: plan.cost(500, 1500, 120, 0.75),
        status: RequestStatus::Ok,
        finish_reason: Some(FinishReason::Stop),
        created_at: now() - chrono::Duration::seconds(seconds_ago),
        slo_class: Some(SloClass::Interactive),
        slo_met: Some(true),
        kv_transfer_ms: None,
        drafted_tokens: 0,
        accepted_tokens: 0,
    }
}

#[tokio::test]
async fn tenants_are_created_listed_fetched_and_soft_deleted() {
    let store = fresh_store().await;
    store.ping().await.unwrap();
    let free = Plan::by_name("free").unwrap();
    let acme = store.create_tenant("acme", &free).await.unwrap();
    let globex = store.create_tenant("  globex ", &Plan::default()).await.unwrap();
    assert_eq!((acme.name.as_str(), globex.name.as_str()), ("acme", "globex"), "names are trimmed");
    assert_eq!(acme.plan, free);
    assert!(acme.is_live());

    let names = |tenants: Vec<Tenant>| tenants.into_iter().map(|t| t.name).collect::<Vec<_>>();
    assert_eq!(names(store.list_tenants().await.unwrap()), ["acme", "globex"]);
    assert_eq!(store.get_tenant(acme.id).await.unwrap(), Some(acme.clone()));
    assert_eq!(store.get_tenant(TenantId::random()).await.unwrap(), None);

    assert!(store.set_plan(acme.id, &Plan::default()).await.unwrap());
    assert_eq!(store.get_tenant(acme.id).await.unwrap().unwrap().plan, Plan::default());
    assert!(!store.set_plan(TenantId::random(), &Plan::default()).await.unwrap());

    assert!(store.delete_tenant(acme.id).await.unwrap());
    assert!(!store.delete_tenant(acme.id).await.unwrap(), "already deleted");
    assert!(!store.delete_tenant(TenantId::random()).await.unwrap(), "unknown");
    assert_eq!(names(store.list_tenants().await.unwrap()), ["globex"]);
    let deleted = store.get_tenant(acme.id).await.unwrap().expect("deleted tenants stay readable");
    assert!(deleted.deleted_at.is_some_and(|at| at >= deleted.created_at));
    assert!(!store.set_plan(acme.id, &free).await.unwrap(), "a deleted tenant's plan is frozen");
}

#[tokio::test]
async fn names_are_unique_among_live_tenants() {
    let store = fresh_store().await;
    let first = store.create_tenant("acme", &Plan::default()).await.unwrap();
    let err = store.create_tenant("acme", &Plan::default()).await.unwrap_err();
    assert!(matches!(&err, StoreError::Conflict(m) if m.contains("acme")), "{err}");
    store.delete_tenant(first.id).await.unwrap();
    let second = store.create_tenant("acme", &Plan::default()).await.expect("the name is free again");
    assert_ne!(first.id, second.id);

    assert!(matches!(store.create_tenant("   ", &Plan::default()).await, Err(StoreError::Invalid(_))));
    assert!(matches!(store.create_tenant(&"x".repeat(201), &Plan::default()).await, Err(StoreError::Invalid(_))));
    let greedy = Plan { kv_share: 2.0, ..Plan::default() };
    assert!(matches!(store.create_tenant("greedy", &greedy).await, Err(StoreError::Invalid(_))));
}

#[tokio::test]
async fn usage_inserts_are_idempotent() {
    let store = fresh_store().await;
    let tenant = store.create_tenant("acme", &Plan::default()).await.unwrap().id;
    let first = usage(tenant, 0);
    assert_eq!(store.insert_usage(std::slice::from_ref(&first)).await.unwrap(), 1);
    assert_eq!(store.insert_usage(std::slice::from_ref(&first)).await.unwrap(), 0, "a retry inserts nothing");
    let second = usage(tenant, 0);
    assert_eq!(store.insert_usage(&[first.clone(), second.clone(), second.clone()]).await.unwrap(), 1);
    assert_eq!(store.insert_usage(&[]).await.unwrap(), 0);
    assert_eq!(store.usage(tenant, 100).await.unwrap().len(), 2);
    assert_eq!(store.usage_by_id(tenant, first.id).await.unwrap(), Some(first), "every field round-trips");

    // A batch larger than one statement.
    let many: Vec<UsageRecord> = (0..2500).map(|i| usage(tenant, i)).collect();
    assert_eq!(store.insert_usage(&many).await.unwrap(), 2500);
    assert_eq!(store.insert_usage(&many).await.unwrap(), 0);
}

/// Every word of the ledger's enums is written and read back as itself; the database refuses a
/// word none of them has (a row it could not read back), whoever writes it.
#[tokio::test]
async fn every_ledger_word_round_trips_and_no_other_word_is_stored() {
    let store = fresh_store().await;
    let tenant = store.create_tenant("acme", &Plan::default()).await.unwrap().id;
    let finishes = [None, Some(FinishReason::Stop), Some(FinishReason::Length)];
    let classes = [None, Some(SloClass::Interactive), Some(SloClass::Batch)];
    let mut rows = Vec::new();
    for (i, &status) in RequestStatus::ALL.iter().enumerate() {
        for (j, &endpoint) in Endpoint::ALL.iter().enumerate() {
            let mut row = usage(tenant, (i * 10 + j) as i64);
            row.status = status;
            row.endpoint = endpoint;
            row.finish_reason = finishes[(i + j) % 3];
            row.slo_class = classes[(i + 2 * j) % 3];
            rows.push(row);
        }
    }
    assert_eq!(store.insert_usage(&rows).await.unwrap(), rows.len() as u64);
    for row in &rows {
        assert_eq!(store.usage_by_id(tenant, row.id).await.unwrap().as_ref(), Some(row));
    }
    // A row that is valid but for `column = word`.
    let raw = |column: &str, word: &str| {
        let mut words =
            [("endpoint", "completions"), ("status", "ok"), ("finish_reason", "stop"), ("slo_class", "batch")];
        words.iter_mut().filter(|(c, _)| *c == column).for_each(|(_, w)| *w = word);
        let (columns, values): (Vec<&str>, Vec<String>) = words.iter().map(|(c, w)| (*c, format!("'{w}'"))).unzip();
        format!(
            "INSERT INTO requests (id, tenant_id, model, prompt_tokens, cached_tokens, computed_tokens, \
             output_tokens, queue_ms, e2e_ms, compute_seconds, cost, {}) \
             VALUES (gen_random_uuid(), '{tenant}', 'm', 0, 0, 0, 0, 0, 0, 0, 0, {})",
            columns.join(", "),
            values.join(", ")
        )
    };
    sqlx::query(&raw("endpoint", "responses")).execute(store.pool()).await.expect("the same row with known words");
    for (column, word) in [("endpoint", "chat"), ("status", "done"), ("finish_reason", "eos"), ("slo_class", "fast")] {
        let err = sqlx::query(&raw(column, word)).execute(store.pool()).await.unwrap_err();
        let code = err.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("23514"), "{column} = {word:?} must be refused: {err}");
    }
    assert_eq!(store.usage(tenant, 1000).await.unwrap().len(), rows.len() + 1, "nothing else was stored");
}

#[tokio::test]
async fn bad_usage_rows_are_refused_whole() {
    let store = fresh_store().await;
    let tenant = store.create_tenant("acme", &Plan::default()).await.unwrap().id;
    let good = usage(tenant, 0);
    let mut negative = usage(tenant, 0);
    negative.output_tokens = -1;
    let err = store.insert_usage(&[good.clone(), negative]).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    let mut nan = usage(tenant, 0);
    nan.cost = f64::NAN;
    assert!(matches!(store.insert_usage(&[nan]).await, Err(StoreError::Invalid(_))));
    let orphan = usage(TenantId::random(), 0);
    let err = store.insert_usage(&[good.clone(), orphan]).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
    assert!(store.usage(tenant, 10).await.unwrap().is_empty(), "the batch is all or nothing");
}

#[tokio::test]
async fn a_tenant_sees_only_its_own_usage_newest_first() {
    let store = fresh_store().await;
    let a = store.create_tenant("a", &Plan::default()).await.unwrap().id;
    let b = store.create_tenant("b", &Plan::default()).await.unwrap().id;
    let rows_a: Vec<UsageRecord> = (0..3).map(|i| usage(a, i * 10)).collect();
    let row_b = usage(b, 0);
    let mut all = rows_a.clone();
    all.push(row_b.clone());
    assert_eq!(store.insert_usage(&all).await.unwrap(), 4);

    let seen_a = store.usage(a, 10).await.unwrap();
    assert_eq!(seen_a, rows_a, "newest first, only a's rows");
    assert_eq!(store.usage(b, 10).await.unwrap(), std::slice::from_ref(&row_b));
    assert_eq!(store.usage(a, 2).await.unwrap().len(), 2);
    assert!(store.usage(a, -1).await.unwrap().is_empty());
    assert_eq!(store.usage_by_id(a, row_b.id).await.unwrap(), None, "b's row by id, asked as a");
    assert_eq!(store.usage_by_id(b, row_b.id).await.unwrap(), Some(row_b));
    assert!(store.usage(TenantId::random(), 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn migrating_twice_is_a_no_op() {
    let store = fresh_store().await;
    store.migrate().await.unwrap();
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations").fetch_one(store.pool()).await.unwrap();
    assert!(applied >= 1);
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable() {
    // Nothing listens on the port: the connection is refused at once (no wall-clock bound here;
    // a hang would show as the test never ending).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err =
        cachet_tenants::Store::connect(&format!("postgres://postgres@127.0.0.1:{port}/nothing")).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
}
