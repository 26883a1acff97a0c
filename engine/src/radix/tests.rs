//! Unit tests of the radix cache: scopes, splitting, locking, eviction order,
//! shares, invalidation and retention.

use super::*;
use std::time::{Duration, Instant};

impl RadixCache {
    /// Eviction for no tenant in particular.
    fn evict_for(&mut self, slots: usize, now: Instant) -> Vec<SlotId> {
        self.evict(slots, now, None)
    }
}

fn toks(ts: &[u32]) -> Vec<KeyElem> {
    ts.iter().map(|&t| KeyElem::Token(t)).collect()
}

/// Slots numbered from `base`, one per token element.
fn slots_for(key: &[KeyElem], base: u32) -> Vec<SlotId> {
    (0..key.iter().filter(|e| e.is_token()).count() as u32).map(|i| SlotId(base + i)).collect()
}

struct Fixture {
    cache: RadixCache,
    public: KeyElem,
    a: KeyElem,
    b: KeyElem,
}

fn fixture(capacity: usize) -> Fixture {
    let mut cache = RadixCache::new(capacity, 1.0);
    let public = cache.scope(&Scope::Public { template: "chatml".into() });
    let a = cache.scope(&Scope::Tenant { tenant: TenantKey::new("a"), salt: None });
    let b = cache.scope(&Scope::Tenant { tenant: TenantKey::new("b"), salt: None });
    Fixture { cache, public, a, b }
}

/// `Public` + `system` + `tenant` + `rest`.
fn prompt(f: &Fixture, tenant: KeyElem, system: &[u32], rest: &[u32]) -> Vec<KeyElem> {
    let mut k = vec![f.public];
    k.extend(toks(system));
    k.push(tenant);
    k.extend(toks(rest));
    k
}

#[test]
fn tenants_share_only_the_public_prefix() {
    let mut f = fixture(100);
    let ka = prompt(&f, f.a, &[1, 2, 3], &[10, 11, 12, 13]);
    let ins = f.cache.insert(&ka, &slots_for(&ka, 0), &InsertOpts::default());
    assert!(ins.duplicates.is_empty());
    f.cache.check_integrity().unwrap();
    // Tenant B with A's exact prompt: only the public system prompt matches.
    let kb = prompt(&f, f.b, &[1, 2, 3], &[10, 11, 12, 13]);
    let m = f.cache.match_prefix(&kb, usize::MAX);
    assert_eq!(m.slots, vec![SlotId(0), SlotId(1), SlotId(2)]);
    assert_eq!(m.len, 4);
    // Tenant A matches everything.
    let m = f.cache.match_prefix(&ka, usize::MAX);
    assert_eq!(m.slots.len(), 7);
    // A salt narrows: A with a salt only matches the public part.
    let salted = f.cache.scope(&Scope::Tenant { tenant: TenantKey::new("a"), salt: Some("user-1".into()) });
    let ks = prompt(&f, salted, &[1, 2, 3], &[10, 11, 12, 13]);
    assert_eq!(f.cache.match_prefix(&ks, usize::MAX).slots.len(), 3);
    assert_eq!(f.cache.tenant_usage(&TenantKey::new("a")), 4);
    f.cache.check_integrity().unwrap();
}

#[test]
fn match_splits_and_respects_the_token_limit() {
    let mut f = fixture(100);
    let k = prompt(&f, f.a, &[1, 2], &[5, 6, 7, 8]);
    f.cache.insert(&k, &slots_for(&k, 0), &InsertOpts::default());
    // A query diverging inside the tenant edge splits it.
    let q = prompt(&f, f.a, &[1, 2], &[5, 6, 9]);
    let m = f.cache.match_prefix(&q, usize::MAX);
    assert_eq!(m.slots, vec![SlotId(0), SlotId(1), SlotId(2), SlotId(3)]);
    f.cache.check_integrity().unwrap();
    // At most 3 tokens (e.g. to keep one to compute): stops inside an edge.
    let m = f.cache.match_prefix(&k, 3);
    assert_eq!(m.slots.len(), 3);
    assert_eq!(m.len, 5); // public, 1, 2, a, 5
    f.cache.check_integrity().unwrap();
    // Inserting a diverging key reports the caller's duplicate slots.
    let ins = f.cache.insert(&q, &[SlotId(0), SlotId(1), SlotId(50), SlotId(51), SlotId(52)], &InsertOpts::default());
    assert_eq!(ins.duplicates, vec![SlotId(50), SlotId(51)]);
    assert_eq!(f.cache.peek_prefix(&q), 5);
    f.cache.check_integrity().unwrap();
}

#[test]
fn locked_prefixes_survive_eviction() {
    let mut f = fixture(100);
    let now = Instant::now();
    let k1 = prompt(&f, f.a, &[1], &[2, 3]);
    let k2 = prompt(&f, f.a, &[1], &[4, 5]);
    f.cache.insert(&k1, &slots_for(&k1, 0), &InsertOpts::default());
    f.cache.insert(&k2, &[SlotId(0), SlotId(10), SlotId(11)], &InsertOpts::default());
    let m = f.cache.match_prefix(&k1, usize::MAX);
    f.cache.lock(m.node);
    f.cache.check_integrity().unwrap();
    // Only k2's own leaf is evictable.
    assert_eq!(f.cache.evictable_slots(), 2);
    let freed = f.cache.evict_for(100, now);
    assert_eq!(freed, vec![SlotId(10), SlotId(11)]);
    assert_eq!(f.cache.match_prefix(&k1, usize::MAX).slots.len(), 3);
    assert!(f.cache.unlock(m.node).is_empty());
    f.cache.check_integrity().unwrap();
    let freed = f.cache.evict_for(100, now);
    assert_eq!(freed.len(), 3);
    assert_eq!(f.cache.cached_slots(), 0);
    f.cache.check_integrity().unwrap();
}

#[test]
fn least_recently_used_goes_first() {
    let mut f = fixture(100);
    let now = Instant::now();
    let ks: Vec<Vec<KeyElem>> = (0..3).map(|i| prompt(&f, f.a, &[], &[100 + i, 7])).collect();
    for (i, k) in ks.iter().enumerate() {
        f.cache.insert(k, &slots_for(k, 10 * i as u32), &InsertOpts::default());
    }
    f.cache.match_prefix(&ks[0], usize::MAX);
    let freed = f.cache.evict_for(1, now);
    assert_eq!(freed, vec![SlotId(10), SlotId(11)], "the least recently used leaf (ks[1]) goes first");
    f.cache.check_integrity().unwrap();
}

#[test]
fn tenants_over_their_share_are_evicted_first() {
    let mut f = fixture(20);
    let now = Instant::now();
    let (ta, tb) = (TenantKey::new("a"), TenantKey::new("b"));
    f.cache.set_share(&ta, 0.5);
    f.cache.set_share(&tb, 0.5);
    let ka = prompt(&f, f.a, &[], &[1, 2, 3, 4]);
    f.cache.insert(&ka, &slots_for(&ka, 0), &InsertOpts::default());
    // B floods 12 slots (over its share of 10), more recently than A.
    for i in 0..4u32 {
        let kb = prompt(&f, f.b, &[], &[50 + i, 1, 2]);
        f.cache.insert(&kb, &slots_for(&kb, 100 + 10 * i), &InsertOpts::default());
    }
    // B's requests need room: B's own nodes go, over its share or not, and
    // A's older prefix (within A's share) stays.
    let freed = f.cache.evict(10, now, Some(&tb));
    assert!(freed.iter().all(|s| s.0 >= 100), "only B's nodes go: {freed:?}");
    assert_eq!(f.cache.tenant_usage(&ta), 4);
    f.cache.check_integrity().unwrap();
    // With nothing else left, another tenant's request may take A's.
    let freed = f.cache.evict(4, now, Some(&TenantKey::new("c")));
    assert!(freed.contains(&SlotId(0)), "{freed:?}");
    f.cache.check_integrity().unwrap();
}

#[test]
fn invalidation_cuts_at_the_span_start() {
    let mut f = fixture(100);
    let k = prompt(&f, f.a, &[1], &[2, 3, 4, 5, 6]);
    let file = Span { range: 5..7, tag: Tag { source: "src/lib.rs".into(), version: "v1".into() } };
    f.cache.insert(&k, &slots_for(&k, 0), &InsertOpts { spans: &[file], retention: None });
    f.cache.check_integrity().unwrap();
    // Keeping the current version frees nothing.
    assert!(f.cache.invalidate("src/lib.rs", Some("v1")).is_empty());
    let freed = f.cache.invalidate("src/lib.rs", None);
    // Elements: public 1 a 2 3 [4 5] 6 → the cut is before token 4.
    assert_eq!(freed, vec![SlotId(3), SlotId(4), SlotId(5)]);
    assert_eq!(f.cache.match_prefix(&k, usize::MAX).slots.len(), 3);
    f.cache.check_integrity().unwrap();
    assert!(f.cache.invalidate("unknown", None).is_empty());
}

#[test]
fn invalidating_one_source_keeps_a_span_another_source_shares() {
    let mut f = fixture(100);
    let k = prompt(&f, f.a, &[1], &[2, 3, 4, 5, 6]);
    let span =
        |source: &str, version: &str| Span { range: 5..6, tag: Tag { source: source.into(), version: version.into() } };
    // The same file, unchanged, at the same place in two branches' contexts.
    let spans = [span("repo:main:src/lib.rs", "v1"), span("repo:feature:src/lib.rs", "v1")];
    f.cache.insert(&k, &slots_for(&k, 0), &InsertOpts { spans: &spans, retention: None });
    // A push to `feature` changes the file: `main`'s requests still read it.
    assert!(f.cache.invalidate("repo:feature:src/lib.rs", None).is_empty());
    f.cache.check_integrity().unwrap();
    assert_eq!(f.cache.match_prefix(&k, usize::MAX).slots.len(), 6);
    // Invalidating `feature` again finds nothing of it left; `main`'s push cuts as ever.
    assert!(f.cache.invalidate("repo:feature:src/lib.rs", None).is_empty());
    assert_eq!(f.cache.invalidate("repo:main:src/lib.rs", None), vec![SlotId(3), SlotId(4), SlotId(5)]);
    f.cache.check_integrity().unwrap();
    // A different version at the same place is no reason to keep it.
    let k2 = prompt(&f, f.b, &[1], &[7, 8, 9, 10]);
    let spans = [span("x:main:f", "v1"), span("x:feature:f", "v2")];
    f.cache.insert(&k2, &slots_for(&k2, 40), &InsertOpts { spans: &spans, retention: None });
    assert_eq!(f.cache.invalidate("x:feature:f", None).len(), 2);
    f.cache.check_integrity().unwrap();
}

#[test]
fn invalidated_locked_nodes_go_on_release() {
    let mut f = fixture(100);
    let k = prompt(&f, f.a, &[], &[2, 3, 4, 5]);
    let span = Span { range: 3..5, tag: Tag { source: "f".into(), version: "1".into() } };
    f.cache.insert(&k, &slots_for(&k, 0), &InsertOpts { spans: &[span], retention: None });
    let m = f.cache.match_prefix(&k, usize::MAX);
    f.cache.lock(m.node);
    assert!(f.cache.invalidate("f", None).is_empty(), "locked: nothing freed yet");
    f.cache.check_integrity().unwrap();
    assert!(f.cache.is_doomed(m.node));
    assert_eq!(f.cache.live_prefix_len(m.node), 3); // public, a, 2
                                                    // Unreachable at once.
    assert_eq!(f.cache.match_prefix(&k, usize::MAX).slots.len(), 1);
    // A new insert of the same key makes fresh nodes beside the doomed ones.
    let ins = f.cache.insert(&k, &[SlotId(0), SlotId(20), SlotId(21), SlotId(22)], &InsertOpts::default());
    assert!(ins.duplicates.is_empty());
    f.cache.check_integrity().unwrap();
    let freed = f.cache.unlock(m.node);
    assert_eq!(freed, vec![SlotId(1), SlotId(2), SlotId(3)]);
    f.cache.check_integrity().unwrap();
    assert_eq!(f.cache.match_prefix(&k, usize::MAX).slots, vec![SlotId(0), SlotId(20), SlotId(21), SlotId(22)]);
}

#[test]
fn retained_sessions_outlive_unretained_prefixes_until_released() {
    let mut f = fixture(100);
    let t0 = Instant::now();
    let session = RetentionKey("session-1".into());
    f.cache.retain(&session, t0 + Duration::from_secs(60));
    let kept = prompt(&f, f.a, &[], &[1, 2, 3]);
    f.cache.insert(&kept, &slots_for(&kept, 0), &InsertOpts { spans: &[], retention: Some(&session) });
    let other = prompt(&f, f.a, &[], &[9, 8, 7]);
    f.cache.insert(&other, &slots_for(&other, 10), &InsertOpts::default());
    // The retained prefix is older, yet the unretained one goes first.
    let freed = f.cache.evict_for(1, t0);
    assert_eq!(freed, vec![SlotId(10), SlotId(11), SlotId(12)]);
    f.cache.check_integrity().unwrap();
    // After expiry it is evictable like any other.
    assert_eq!(f.cache.evict_for(1, t0 + Duration::from_secs(61)).len(), 3);
    // And after release.
    f.cache.retain(&session, t0 + Duration::from_secs(600));
    f.cache.insert(&kept, &slots_for(&kept, 30), &InsertOpts { spans: &[], retention: Some(&session) });
    f.cache.insert(&other, &slots_for(&other, 40), &InsertOpts::default());
    f.cache.release(&session);
    f.cache.match_prefix(&other, usize::MAX);
    let freed = f.cache.evict_for(1, t0);
    assert_eq!(freed, vec![SlotId(30), SlotId(31), SlotId(32)], "released: plain LRU");
    f.cache.check_integrity().unwrap();
}

#[test]
fn purging_a_tenant_drops_only_its_namespace() {
    let mut f = fixture(100);
    let ka = prompt(&f, f.a, &[1, 2], &[3, 4]);
    let salted = f.cache.scope(&Scope::Tenant { tenant: TenantKey::new("a"), salt: Some("u".into()) });
    let ks = prompt(&f, salted, &[1, 2], &[5]);
    let kb = prompt(&f, f.b, &[1, 2], &[3, 4]);
    f.cache.insert(&ka, &slots_for(&ka, 0), &InsertOpts::default());
    f.cache.insert(&ks, &[SlotId(0), SlotId(1), SlotId(10)], &InsertOpts::default());
    f.cache.insert(&kb, &[SlotId(0), SlotId(1), SlotId(20), SlotId(21)], &InsertOpts::default());
    let mut freed = f.cache.purge_tenant(&TenantKey::new("a"));
    freed.sort();
    assert_eq!(freed, vec![SlotId(2), SlotId(3), SlotId(10)]);
    assert_eq!(f.cache.tenant_usage(&TenantKey::new("a")), 0);
    assert_eq!(f.cache.match_prefix(&kb, usize::MAX).slots.len(), 4, "B keeps its cache");
    assert_eq!(f.cache.match_prefix(&ka, usize::MAX).slots.len(), 2, "the public prefix stays");
    f.cache.check_integrity().unwrap();
}

#[test]
fn interning_tables_shrink_back_to_what_the_tree_holds() {
    let mut f = fixture(100_000);
    let now = Instant::now();
    // One request each from 1,000 end users (salts), with a session (retention key) and a
    // tagged source each; all of it evicted afterwards.
    let kept = prompt(&f, f.a, &[1, 2], &[7, 8, 9]);
    let spans = [Span { range: 4..7, tag: Tag { source: "kept.rs".into(), version: "v1".into() } }];
    let held = f.cache.insert(&kept, &slots_for(&kept, 90_000), &InsertOpts { spans: &spans, retention: None }).node;
    f.cache.lock(held);
    for u in 0..1000u32 {
        let user =
            f.cache.scope(&Scope::Tenant { tenant: TenantKey::new("b"), salt: Some(format!("user-{u}").into()) });
        let mut key = vec![f.public];
        key.extend(toks(&[1, 2]));
        key.push(user);
        key.extend(toks(&[100 + u, 5]));
        let session = RetentionKey(format!("session-{u}").into());
        f.cache.retain(&session, now + Duration::from_secs(60));
        let spans = [Span { range: 4..5, tag: Tag { source: format!("f{u}.rs").into(), version: "v1".into() } }];
        f.cache.insert(&key, &slots_for(&key, 10 + 4 * u), &InsertOpts { spans: &spans, retention: Some(&session) });
        f.cache.release(&session);
    }
    assert!(f.cache.interned() > 3000, "{}", f.cache.interned());
    let before = f.cache.cached_slots();
    f.cache.evict_for(before, now);
    f.cache.compact_tables(now, []);
    f.cache.check_integrity().unwrap();
    // Left: the public scope, A's scope (still in the tree), kept.rs and its version.
    assert!(f.cache.interned() <= 6, "{}", f.cache.interned());

    // What stayed still matches, and new scopes reuse the freed ids without mixing anything up.
    let m = f.cache.match_prefix(&kept, usize::MAX);
    assert_eq!(m.len, kept.len());
    let fresh = f.cache.scope(&Scope::Tenant { tenant: TenantKey::new("c"), salt: Some("new".into()) });
    let kc = prompt(&f, fresh, &[1, 2], &[7, 8, 9]);
    assert_eq!(f.cache.match_prefix(&kc, usize::MAX).len, 3, "only the public prefix");
    // The kept source can still be invalidated by name.
    assert!(f.cache.unlock(held).is_empty());
    assert!(!f.cache.invalidate("kept.rs", None).is_empty());
    f.cache.check_integrity().unwrap();
}
