//! Usage reports against a seeded ledger: every aggregate is checked against numbers worked out
//! by hand (costs are multiples of 1/1024, so sums are exact in binary floating point).

use crate::common;

use cachet_tenants::report::{GroupBy, Report, ReportRow};
use cachet_tenants::store::{NewRepository, TaskStatus};
use cachet_tenants::{
    Endpoint, Plan, RepoId, RequestId, RequestStatus, SessionId, SloClass, Store, TaskId, TenantId, UsageRecord,
};
use chrono::{DateTime, TimeZone, Utc};
use common::fresh_store;

fn at(day: u32, hour: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, day, hour, 0, 0).unwrap()
}

const K: f64 = 1.0 / 1024.0;

struct Req {
    session: Option<SessionId>,
    task: Option<TaskId>,
    when: DateTime<Utc>,
    tokens: [i64; 4], // prompt, cached, computed, output
    cost: f64,
    ttft: Option<f64>,
    slo_met: Option<bool>,
}

fn record(tenant: TenantId, r: &Req) -> UsageRecord {
    UsageRecord {
        id: RequestId::random(),
        tenant,
        session_id: r.session,
        task_id: r.task,
        model: "m".into(),
        endpoint: Endpoint::SessionMessages,
        prompt_tokens: r.tokens[0],
        cached_tokens: r.tokens[1],
        computed_tokens: r.tokens[2],
        output_tokens: r.tokens[3],
        queue_ms: 1.0,
        ttft_ms: r.ttft,
        e2e_ms: 1000.0,
        compute_seconds: 0.5,
        cost: r.cost,
        status: if r.slo_met.is_some() { RequestStatus::Ok } else { RequestStatus::Cancelled },
        finish_reason: None,
        created_at: r.when,
        slo_class: Some(SloClass::Interactive),
        slo_met: r.slo_met,
        kv_transfer_ms: None,
        drafted_tokens: 0,
        accepted_tokens: 0,
    }
}

async fn repo(store: &Store, tenant: TenantId, name: &str) -> RepoId {
    let new = NewRepository {
        id: RepoId::random(),
        tenant,
        name,
        source: "/srv/git/x",
        default_branch: Some("main"),
        webhook_secret: "whsec_0123456789abcdef0123456789abcdef",
        options: &serde_json::json!({}),
    };
    store.create_repository(&new).await.unwrap().id
}

/// Sets a task's times (and outcome) to known instants.
async fn task(
    store: &Store,
    tenant: TenantId,
    session: Option<SessionId>,
    created: DateTime<Utc>,
    outcome: Option<(TaskStatus, DateTime<Utc>)>,
) -> TaskId {
    let t = store.create_task(tenant, session, "a task").await.unwrap();
    if let Some((status, _)) = outcome {
        store.close_task(tenant, t.id, status, None).await.unwrap();
    }
    sqlx::query("UPDATE tasks SET created_at = $2, last_active_at = $2, closed_at = $3 WHERE id = $1")
        .bind(t.id)
        .bind(created)
        .bind(outcome.map(|(_, when)| when))
        .execute(store.pool())
        .await
        .unwrap();
    t.id
}

struct Seed {
    tenant: TenantId,
    other: TenantId,
    r1: RepoId,
    r2: RepoId,
    t1: TaskId,
    t4: TaskId,
}

async fn seed(store: &Store) -> Seed {
    let tenant = store.create_tenant("acme", &Plan::default()).await.unwrap().id;
    let other = store.create_tenant("globex", &Plan::default()).await.unwrap().id;
    let (r1, r2) = (repo(store, tenant, "shop").await, repo(store, tenant, "web").await);
    let s1 = store.create_session(tenant, r1, "main").await.unwrap().id;
    let s2 = store.create_session(tenant, r1, "main").await.unwrap().id;
    let s3 = store.create_session(tenant, r2, "main").await.unwrap().id;
    let t1 = task(store, tenant, Some(s1), at(1, 9), Some((TaskStatus::Succeeded, at(3, 13)))).await;
    let t2 = task(store, tenant, Some(s1), at(2, 9), Some((TaskStatus::Failed, at(3, 14)))).await;
    let t3 = task(store, tenant, Some(s3), at(3, 9), Some((TaskStatus::Succeeded, at(3, 15)))).await;
    let t4 = task(store, tenant, None, at(2, 8), None).await;
    let t5 = task(store, tenant, Some(s2), at(2, 9), Some((TaskStatus::Abandoned, at(2, 20)))).await;
    let reqs = [
        Req {
            session: Some(s1),
            task: Some(t1),
            when: at(2, 10),
            tokens: [1000, 600, 400, 100],
            cost: 10.0 * K,
            ttft: Some(100.0),
            slo_met: Some(true),
        },
        Req {
            session: Some(s1),
            task: Some(t1),
            when: at(2, 11),
            tokens: [2000, 1500, 500, 50],
            cost: 20.0 * K,
            ttft: Some(200.0),
            slo_met: Some(true),
        },
        Req {
            session: Some(s1),
            task: Some(t2),
            when: at(3, 9),
            tokens: [500, 0, 500, 10],
            cost: 5.0 * K,
            ttft: Some(300.0),
            slo_met: Some(false),
        },
        Req {
            session: Some(s3),
            task: Some(t3),
            when: at(3, 10),
            tokens: [4000, 3000, 1000, 200],
            cost: 40.0 * K,
            ttft: Some(400.0),
            slo_met: Some(true),
        },
        Req {
            session: None,
            task: None,
            when: at(3, 12),
            tokens: [100, 0, 100, 5],
            cost: 1.0 * K,
            ttft: None,
            slo_met: None,
        },
        Req {
            session: Some(s2),
            task: Some(t5),
            when: at(2, 12),
            tokens: [300, 100, 200, 0],
            cost: 3.0 * K,
            ttft: Some(50.0),
            slo_met: Some(true),
        },
        // Before the window: not a request of the report, but part of what task 1 cost.
        Req {
            session: Some(s1),
            task: Some(t1),
            when: at(1, 10),
            tokens: [999, 0, 999, 1],
            cost: 512.0 * K,
            ttft: Some(9.0),
            slo_met: Some(true),
        },
    ];
    let rows: Vec<UsageRecord> = reqs.iter().map(|r| record(tenant, r)).collect();
    store.insert_usage(&rows).await.unwrap();
    // Another tenant's activity, in the window: never in acme's numbers.
    let theirs = Req {
        session: None,
        task: None,
        when: at(2, 10),
        tokens: [7777, 7000, 777, 77],
        cost: 300.0 * K,
        ttft: Some(1.0),
        slo_met: Some(true),
    };
    store.insert_usage(&[record(other, &theirs)]).await.unwrap();
    let _ = task(store, other, None, at(2, 9), Some((TaskStatus::Succeeded, at(2, 10)))).await;
    Seed { tenant, other, r1, r2, t1, t4 }
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

fn row<'a>(r: &'a Report, key: &str) -> &'a ReportRow {
    r.rows.iter().find(|x| x.key == key).unwrap_or_else(|| panic!("no row {key} in {:?}", r.rows))
}

#[tokio::test]
async fn totals_and_days_are_exact() {
    let store = fresh_store().await;
    let s = seed(&store).await;
    let r = store.usage_report(Some(s.tenant), at(2, 0), at(4, 0), GroupBy::Day).await.unwrap();
    let t = &r.total;
    assert_eq!((t.key.as_str(), t.requests), ("total", 6));
    assert_eq!([t.prompt_tokens, t.cached_tokens, t.computed_tokens, t.output_tokens], [7900, 5200, 2700, 365]);
    assert_eq!(t.cache_hit_ratio, Some(5200.0 / 7900.0));
    assert_eq!(t.cost, 79.0 * K);
    assert_eq!([t.tasks_succeeded, t.tasks_failed, t.tasks_abandoned, t.tasks_open], [2, 1, 1, 1]);
    assert_eq!(t.success_rate, Some(0.5));
    // All the tasks' requests, whenever they ran (task 1's before the window too).
    assert_eq!(t.task_cost, (10.0 + 20.0 + 512.0 + 5.0 + 40.0 + 3.0) * K);
    assert_eq!(t.cost_per_successful_task, Some(590.0 * K / 2.0));
    assert!(close(t.ttft_p50_ms, 200.0) && close(t.ttft_p95_ms, 380.0), "{:?} {:?}", t.ttft_p50_ms, t.ttft_p95_ms);
    assert_eq!(t.slo_attainment, Some(0.8));
    assert_eq!(t.goodput_rps, 4.0 / (2.0 * 86400.0));

    assert_eq!(r.rows.iter().map(|x| x.key.as_str()).collect::<Vec<_>>(), ["2026-11-02", "2026-11-03"]);
    let d1 = row(&r, "2026-11-02");
    assert_eq!((d1.requests, d1.prompt_tokens, d1.cached_tokens, d1.output_tokens), (3, 3300, 2200, 150));
    assert_eq!(d1.cost, 33.0 * K);
    assert_eq!([d1.tasks_succeeded, d1.tasks_failed, d1.tasks_abandoned, d1.tasks_open], [0, 0, 1, 1]);
    assert_eq!((d1.success_rate, d1.cost_per_successful_task), (Some(0.0), None), "no success: no cost per success");
    assert_eq!(d1.task_cost, 3.0 * K);
    assert!(close(d1.ttft_p50_ms, 100.0) && close(d1.ttft_p95_ms, 190.0));
    assert_eq!((d1.slo_attainment, d1.goodput_rps), (Some(1.0), 3.0 / 86400.0));
    let d2 = row(&r, "2026-11-03");
    assert_eq!((d2.requests, d2.prompt_tokens, d2.computed_tokens), (3, 4600, 1600));
    assert_eq!([d2.tasks_succeeded, d2.tasks_failed, d2.tasks_abandoned, d2.tasks_open], [2, 1, 0, 0]);
    assert_eq!(d2.task_cost, (542.0 + 5.0 + 40.0) * K);
    assert_eq!(d2.cost_per_successful_task, Some(587.0 * K / 2.0));
    assert_eq!(d2.success_rate, Some(2.0 / 3.0));
    assert!(close(d2.ttft_p50_ms, 350.0) && close(d2.ttft_p95_ms, 395.0));
    assert_eq!(d2.slo_attainment, Some(0.5));
}

#[tokio::test]
async fn grouping_by_repo_session_and_task() {
    let store = fresh_store().await;
    let s = seed(&store).await;
    let by_repo = store.usage_report(Some(s.tenant), at(2, 0), at(4, 0), GroupBy::Repo).await.unwrap();
    let shop = row(&by_repo, &s.r1.to_string());
    assert_eq!((shop.label.as_deref(), shop.requests, shop.cost), (Some("shop"), 4, 38.0 * K));
    assert_eq!([shop.tasks_succeeded, shop.tasks_failed, shop.tasks_abandoned], [1, 1, 1]);
    assert_eq!(shop.cost_per_successful_task, Some((542.0 + 5.0 + 3.0) * K));
    let web = row(&by_repo, &s.r2.to_string());
    assert_eq!((web.label.as_deref(), web.requests, web.cost_per_successful_task), (Some("web"), 1, Some(40.0 * K)));
    let none = row(&by_repo, "none");
    assert_eq!((none.requests, none.tasks_open, none.cost_per_successful_task), (1, 1, None));

    let by_task = store.usage_report(Some(s.tenant), at(2, 0), at(4, 0), GroupBy::Task).await.unwrap();
    let t1 = row(&by_task, &s.t1.to_string());
    assert_eq!((t1.label.as_deref(), t1.requests, t1.cost), (Some("a task"), 2, 30.0 * K));
    assert_eq!((t1.task_cost, t1.cost_per_successful_task), (542.0 * K, Some(542.0 * K)));
    let open = row(&by_task, &s.t4.to_string());
    assert_eq!((open.requests, open.tasks_open, open.success_rate), (0, 1, None));
    assert_eq!(row(&by_task, "none").requests, 1, "requests without a task");

    let by_session = store.usage_report(Some(s.tenant), at(2, 0), at(4, 0), GroupBy::Session).await.unwrap();
    assert_eq!(by_session.rows.iter().map(|r| r.requests).sum::<i64>(), 6);
    assert_eq!(by_session.total, by_repo.total);
}

#[tokio::test]
async fn tenants_see_only_their_own_and_the_operator_sees_all() {
    let store = fresh_store().await;
    let s = seed(&store).await;
    let theirs = store.usage_report(Some(s.other), at(2, 0), at(4, 0), GroupBy::Day).await.unwrap();
    assert_eq!((theirs.total.requests, theirs.total.prompt_tokens, theirs.total.tasks_succeeded), (1, 7777, 1));
    assert_eq!(theirs.total.cost_per_successful_task, Some(0.0));
    let all = store.usage_report(None, at(2, 0), at(4, 0), GroupBy::Day).await.unwrap();
    assert_eq!((all.total.requests, all.total.prompt_tokens), (7, 7900 + 7777));
    assert_eq!(all.total.tasks_succeeded, 3);
}

#[tokio::test]
async fn empty_windows_and_zero_denominators() {
    let store = fresh_store().await;
    let s = seed(&store).await;
    let r = store.usage_report(Some(s.tenant), at(20, 0), at(21, 0), GroupBy::Day).await.unwrap();
    assert!(r.rows.is_empty());
    let t = &r.total;
    assert_eq!((t.requests, t.cost, t.task_cost, t.goodput_rps), (0, 0.0, 0.0, 0.0));
    assert_eq!((t.cache_hit_ratio, t.success_rate, t.cost_per_successful_task), (None, None, None));
    assert_eq!((t.ttft_p50_ms, t.slo_attainment), (None, None));
    assert!(store.usage_report(Some(s.tenant), at(3, 0), at(2, 0), GroupBy::Day).await.is_err());
    // CSV: a header, the rows, the total; empty cells for None.
    let csv = store.usage_report(Some(s.tenant), at(2, 0), at(4, 0), GroupBy::Day).await.unwrap().csv();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(lines[0].starts_with("key,label,requests,"));
    assert!(lines[1].starts_with("2026-11-02,,3,3300,2200,"));
    assert!(lines[3].starts_with("total,,6,7900,5200,2700,365,"));
}

#[tokio::test]
async fn an_outcome_is_recorded_once_and_idle_tasks_are_abandoned() {
    let store = fresh_store().await;
    let s = seed(&store).await;
    let t = store.create_task(s.tenant, None, "fix the build").await.unwrap();
    let done = store.close_task(s.tenant, t.id, TaskStatus::Succeeded, Some(&serde_json::json!({"ci": "green"}))).await;
    assert_eq!(done.unwrap().status, TaskStatus::Succeeded);
    let again = store.close_task(s.tenant, t.id, TaskStatus::Failed, None).await;
    assert!(matches!(again, Err(cachet_tenants::store::OutcomeError::AlreadyClosed("succeeded"))));
    let foreign = store.close_task(s.other, s.t4, TaskStatus::Failed, None).await;
    assert!(matches!(foreign, Err(cachet_tenants::store::OutcomeError::NotFound)));
    assert!(store.create_task(s.tenant, Some(SessionId::random()), "x").await.is_err(), "unknown session");
    assert!(store.create_task(s.tenant, None, "  ").await.is_err(), "empty title");
    // Task 4 has been open since the 2nd.
    assert_eq!(store.abandon_idle_tasks(at(10, 0)).await.unwrap(), 1);
    assert_eq!(store.task(s.tenant, s.t4).await.unwrap().unwrap().status, TaskStatus::Abandoned);
}
