//! Change fan-out through LISTEN/NOTIFY: another replica's invalidations arrive, one's own do
//! not, a rolled-back one never does; deletions of tenants and repositories reach every replica;
//! after the listening connection is killed the listener reconnects and catches up on what was
//! recorded meanwhile. Also the session turn lease that keeps one turn at a time across replicas.

use crate::common;

use cachet_tenants::store::fanout::{Change, ChangeListener};
use cachet_tenants::store::{Invalidation, NewRepository};
use cachet_tenants::{Plan, RepoId, Store, TenantId};
use common::fresh_store;
use std::time::Duration;
use uuid::Uuid;

async fn repo(store: &Store) -> RepoId {
    repo_of(store, "acme").await.1
}

async fn repo_of(store: &Store, name: &str) -> (TenantId, RepoId) {
    let tenant = store.create_tenant(name, &Plan::default()).await.unwrap();
    let new = NewRepository {
        id: RepoId::random(),
        tenant: tenant.id,
        name: "shop",
        source: "/srv/git/shop",
        default_branch: Some("main"),
        webhook_secret: "whsec_0123456789abcdef0123456789abcdef",
        options: &serde_json::json!({}),
    };
    (tenant.id, store.create_repository(&new).await.unwrap().id)
}

fn push(repo: RepoId, delivery: &str) -> Invalidation {
    Invalidation {
        repo,
        delivery_id: delivery.into(),
        git_ref: "refs/heads/main".into(),
        before: "a".repeat(40),
        after: "b".repeat(40),
        paths: vec!["src/cart.rs".into()],
        evicted_tokens: 12,
        prewarmed: 1,
    }
}

async fn record(store: &Store, inv: &Invalidation, origin: Uuid, commit: bool) {
    let mut tx = store.pool().begin().await.unwrap();
    Store::record_invalidation(&mut tx, inv, origin).await.unwrap();
    if commit {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
}

/// The next changes, as short names: a push by its delivery id, deletions by kind.
async fn next(l: &mut ChangeListener) -> Vec<String> {
    let got = tokio::time::timeout(Duration::from_secs(20), l.next()).await.expect("a change in time");
    got.unwrap()
        .into_iter()
        .map(|c| match c {
            Change::Invalidation(i) => i.delivery_id,
            Change::TenantDeleted(t) => format!("tenant {t}"),
            Change::RepositoryDeleted(r) => format!("repo {r}"),
            Change::PublicPrefixes => "public prefixes".into(),
        })
        .collect()
}

/// Kills the listening connection (the only one that ran LISTEN).
async fn kill_listener(store: &Store) {
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(killed, [true]);
}

#[tokio::test]
async fn other_replicas_invalidations_arrive_own_and_rolled_back_ones_do_not() {
    let store = fresh_store().await;
    let repo = repo(&store).await;
    let (me, other) = (Uuid::new_v4(), Uuid::new_v4());
    record(&store, &push(repo, "before-listening"), other, true).await;
    let mut l = store.listen_changes(me).await.unwrap();

    record(&store, &push(repo, "mine"), me, true).await;
    record(&store, &push(repo, "rolled-back"), other, false).await;
    record(&store, &push(repo, "theirs"), other, true).await;
    let got = next(&mut l).await;
    assert_eq!(got, ["theirs"]);
    let inv = tokio::time::timeout(Duration::from_millis(300), l.next()).await;
    assert!(inv.is_err(), "nothing else is pending: {inv:?}");
}

#[tokio::test]
async fn after_the_connection_is_killed_the_listener_catches_up() {
    let store = fresh_store().await;
    let repo = repo(&store).await;
    let (me, other) = (Uuid::new_v4(), Uuid::new_v4());
    let mut l = store.listen_changes(me).await.unwrap();
    record(&store, &push(repo, "one"), other, true).await;
    assert_eq!(next(&mut l).await, ["one"]);

    // Kill the listening connection, then record two pushes whose notices nobody hears.
    kill_listener(&store).await;
    record(&store, &push(repo, "two"), other, true).await;
    record(&store, &push(repo, "three"), me, true).await;
    // Both come back, in order (its own too: applying a push twice is harmless).
    // The public prefixes are reloaded too: their notices may have been missed as well.
    assert_eq!(next(&mut l).await, ["two", "three", "public prefixes"]);
    // And the new connection listens.
    record(&store, &push(repo, "four"), other, true).await;
    assert_eq!(next(&mut l).await, ["four"]);
}

#[tokio::test]
async fn deletions_reach_every_replica_the_deleting_one_too() {
    let store = fresh_store().await;
    let (tenant, repo) = repo_of(&store, "acme").await;
    let mut l = store.listen_changes(Uuid::new_v4()).await.unwrap();
    store.delete_repository(tenant, repo).await.unwrap().unwrap();
    assert_eq!(next(&mut l).await, [format!("repo {repo}")]);
    assert!(store.delete_repository(tenant, repo).await.unwrap().is_none(), "already deleted");
    assert!(store.delete_tenant(tenant).await.unwrap());
    assert!(!store.delete_tenant(tenant).await.unwrap());
    // The second attempts changed nothing and announced nothing.
    assert_eq!(next(&mut l).await, [format!("tenant {tenant}")]);
    let more = tokio::time::timeout(Duration::from_millis(300), l.next()).await;
    assert!(more.is_err(), "nothing else is pending: {more:?}");
}

#[tokio::test]
async fn deletions_missed_while_disconnected_are_caught_up() {
    let store = fresh_store().await;
    let (tenant, repo) = repo_of(&store, "acme").await;
    let (kept, _) = repo_of(&store, "globex").await;
    let mut l = store.listen_changes(Uuid::new_v4()).await.unwrap();
    kill_listener(&store).await;
    store.delete_repository(tenant, repo).await.unwrap().unwrap();
    store.delete_tenant(tenant).await.unwrap();
    let mut got = next(&mut l).await;
    got.sort();
    assert_eq!(got, ["public prefixes".to_string(), format!("repo {repo}"), format!("tenant {tenant}")]);
    assert!(!got.contains(&format!("tenant {kept}")));
}

#[tokio::test]
async fn a_session_turn_lease_is_exclusive_renewable_and_expires() {
    let store = fresh_store().await;
    let (tenant, repo) = repo_of(&store, "acme").await;
    let session = store.create_session(tenant, repo, "main").await.unwrap().owned();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let short = Duration::from_millis(300);
    assert!(store.begin_turn(session, a, short, None).await.unwrap());
    assert!(!store.begin_turn(session, b, short, None).await.unwrap(), "held by a");
    assert!(store.renew_turn(session, a, short).await.unwrap());
    assert!(!store.renew_turn(session, b, short).await.unwrap(), "b holds nothing");
    store.end_turn(session, b).await.unwrap();
    assert!(!store.begin_turn(session, b, short, None).await.unwrap(), "b cannot end a's turn");
    let c = Uuid::new_v4();
    assert!(store.begin_turn(session, c, short, Some(a)).await.unwrap(), "a's ended turn is taken over");
    store.end_turn(session, a).await.unwrap();
    assert!(!store.begin_turn(session, b, short, None).await.unwrap(), "a's late release leaves c's lease");
    store.end_turn(session, c).await.unwrap();
    assert!(store.begin_turn(session, b, short, None).await.unwrap(), "given back");
    // b's holder dies: its lease expires and a may go.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(store.begin_turn(session, a, Duration::from_secs(60), None).await.unwrap(), "expired");
    assert!(!store.renew_turn(session, b, short).await.unwrap(), "b lost it");
}

#[tokio::test]
async fn public_prefixes_are_stored_as_given_and_every_change_is_announced() {
    let store = fresh_store().await;
    let mut l = store.listen_changes(Uuid::new_v4()).await.unwrap();
    // Keys out of alphabetical order: they come back in the order given (a template renders them so).
    let source = serde_json::json!({"tools": [{"type": "function", "function": {"name": "f", "description": "d"}}],
                                    "messages": [{"role": "system", "content": "You are an agent."}]});
    let added = store.add_public_prefix("agent", &source, true).await.unwrap();
    assert_eq!(next(&mut l).await, ["public prefixes"]);
    assert_eq!(added.source.to_string(), source.to_string());
    let taken = store.add_public_prefix("agent", &serde_json::json!({"text": "x"}), false).await;
    assert!(matches!(taken, Err(cachet_tenants::StoreError::Conflict(_))), "{taken:?}");
    let listed = store.list_public_prefixes().await.unwrap();
    assert_eq!(listed, std::slice::from_ref(&added));
    assert_eq!(listed[0].source.to_string(), source.to_string());
    assert!(store.remove_public_prefix(added.id).await.unwrap());
    assert_eq!(next(&mut l).await, ["public prefixes"]);
    assert!(!store.remove_public_prefix(added.id).await.unwrap(), "already removed");
    assert!(store.list_public_prefixes().await.unwrap().is_empty());
    let more = tokio::time::timeout(Duration::from_millis(300), l.next()).await;
    assert!(more.is_err(), "the failed changes announced nothing: {more:?}");
}
