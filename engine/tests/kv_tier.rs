//! The disk tier end to end on tiny random-weight models: a prompt's K/V is written in chunks,
//! a new engine on the same directory (a restart) loads them instead of computing them and
//! answers token for token as the first did; a corrupt chunk is discarded and recomputed;
//! another model's chunks are ignored; another tenant never finds them; a push and a deleted
//! tenant take theirs off the disk.

use crate::common::{pool, tokens};

use cachet_engine::generate::GenerateParams;
use cachet_engine::kv_transfer::disk::DiskTier;
use cachet_engine::kv_transfer::{chain_key, KvRecord, RecordScope};
use cachet_engine::radix::{Tag, TenantKey};
use cachet_engine::runtime::{self, Completion, EngineHandle, KvTierConfig, Request, TokenSpan};
use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::backend::KvFormat;
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::quant::DType;
use std::path::{Path, PathBuf};

const CHUNK: usize = 32;

fn model(dir: &Path, seed: u64) -> PathBuf {
    let path = dir.join(format!("tiny-{seed}.gguf"));
    Tiny::random(TinyArch::Qwen2, seed, false).write_gguf(DType::Q8_0, &path).unwrap();
    path
}

fn engine(model: &Path, tier: Option<&Path>) -> EngineHandle {
    engine_in(model, tier, KvFormat::F16)
}

fn engine_in(model: &Path, tier: Option<&Path>, kv_format: KvFormat) -> EngineHandle {
    let cfg = runtime::EngineConfig {
        kv_tier: tier.map(|dir| KvTierConfig { dir: dir.to_path_buf(), max_bytes: 1 << 30, chunk_tokens: CHUNK }),
        kv_format: Some(kv_format),
        ..pool(4096)
    };
    let backend = CpuBackend::new(2).unwrap();
    let loaded = cachet_engine::loader::load(model, &backend).unwrap();
    runtime::start(backend, loaded, cfg).unwrap()
}

/// Flushes the tier and stops the engine (its writer joined): a clean shutdown.
fn stop(h: EngineHandle) {
    h.flush_kv_tier_blocking();
    h.halt();
    while h.is_running() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn request(tenant: &str, prompt: &[u32]) -> Request {
    Request::new(
        TenantKey::new(tenant),
        prompt.to_vec(),
        GenerateParams { max_tokens: 12, ignore_eos: true, ..Default::default() },
    )
}

fn run(h: &EngineHandle, req: Request) -> (Vec<u32>, Completion) {
    let out = h.submit(req).collect_blocking();
    (out.tokens, out.result.unwrap_or_else(|e| panic!("request failed: {e}")))
}

fn no_leaks(h: &EngineHandle) {
    h.check_integrity_blocking().unwrap();
    let s = h.snapshot_blocking().unwrap();
    assert_eq!(s.kv_used, s.cached_slots, "slots held outside the cache with nothing running: {s:?}");
}

/// The file of chunk `k` of `prompt` under `tenant`.
fn chunk_file(tier: &Path, tenant: &str, prompt: &[u32], k: usize) -> PathBuf {
    let scope = RecordScope::Tenant { tenant: tenant.into(), salt: None };
    let mut parent = [0u8; 32];
    for c in prompt.chunks_exact(CHUNK).take(k + 1) {
        parent = chain_key(&parent, &scope, c);
    }
    DiskTier::file(tier, &parent)
}

#[test]
fn a_restarted_engine_loads_the_prompt_from_disk_and_answers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (m, tier) = (model(dir.path(), 5), dir.path().join("tier"));
    let prompt = tokens(1, 200);
    let h = engine(&m, Some(&tier));
    let (first, done) = run(&h, request("acme", &prompt));
    assert_eq!(done.cached_tokens, 0);
    stop(h);

    let h = engine(&m, Some(&tier));
    let s = h.snapshot_blocking().unwrap();
    assert_eq!(s.kv_tier_chunks, 6, "200 tokens are 6 whole chunks of {CHUNK}: {s:?}");
    // A prompt sharing 100 tokens first: the three whole chunks inside them, from disk.
    let mut fork = prompt[..100].to_vec();
    fork.extend(tokens(9, 60));
    let (forked, done) = run(&h, request("acme", &fork));
    assert_eq!(done.cached_tokens, 96);
    // Then the whole prompt: 100 tokens in memory (the fork's), the rest of chunk 3 and chunks
    // 4 and 5 from disk.
    let (again, done) = run(&h, request("acme", &prompt));
    assert_eq!(again, first, "the prefix loaded from disk must give the same output as computing it");
    assert_eq!(done.cached_tokens, 192);
    assert_eq!(h.snapshot_blocking().unwrap().kv_tier_loaded_tokens, 96 + 92);
    // Another tenant with the same tokens finds nothing of acme's.
    let (other, done) = run(&h, request("globex", &prompt));
    assert_eq!((other, done.cached_tokens), (first.clone(), 0));
    no_leaks(&h);
    stop(h);
    let h = engine(&m, None);
    assert_eq!(run(&h, request("acme", &fork)).0, forked, "computed alone");
}

/// A prefill server's job in `dir`: a 150-token prompt run with [`Request::kv_tail`] on an engine
/// with a tier, stopped. Returns the model, the tier, the prompt and its output.
fn prefill_job(dir: &Path) -> (PathBuf, PathBuf, Vec<u32>, Vec<u32>) {
    let (m, tier) = (model(dir, 5), dir.join("tier"));
    let prompt = tokens(3, 150);
    let h = engine(&m, Some(&tier));
    let mut job = request("acme", &prompt);
    job.kv_tail = true;
    let (first, _) = run(&h, job);
    stop(h);
    (m, tier, prompt, first)
}

#[test]
fn a_prefill_jobs_tail_chunk_leaves_only_the_last_token_to_compute() {
    let dir = tempfile::tempdir().unwrap();
    let (m, tier, prompt, first) = prefill_job(dir.path());
    let h = engine(&m, Some(&tier));
    let s = h.snapshot_blocking().unwrap();
    // 149 tokens before the last one: 4 whole chunks of 32 and a tail of 21.
    assert_eq!(s.kv_tier_chunks, 5, "{s:?}");
    let (again, done) = run(&h, request("acme", &prompt));
    assert_eq!(again, first, "the tail loaded from disk must give the same output as computing it");
    assert_eq!(done.cached_tokens, 149);
    // A prompt that goes on past the tail's end finds the whole chunks only on disk (the tail's
    // key names its length): in memory first, then after a restart.
    let mut longer = prompt.clone();
    longer.extend(tokens(4, 10));
    let (_, done) = run(&h, request("acme", &longer));
    assert_eq!(done.cached_tokens, 150, "the run before cached its whole prompt in memory: {done:?}");
    no_leaks(&h);
    stop(h);
    let h = engine(&m, Some(&tier));
    let (_, done) = run(&h, request("acme", &longer));
    assert_eq!(done.cached_tokens, 128);
    // Without the flag, no tail is stored.
    let other = tokens(5, 150);
    run(&h, request("acme", &other));
    stop(h);
    let h = engine(&m, Some(&tier));
    assert_eq!(run(&h, request("acme", &other)).1.cached_tokens, 128);
    no_leaks(&h);
    stop(h);
}

/// The chunks a prefill job (`kv_tail`) of `prompt` left in `tier`, in prompt order.
fn prefilled(tier: &Path, h: &EngineHandle, prompt: &[u32]) -> Vec<KvRecord> {
    let (mut disk, _) = DiskTier::open(tier, h.kv_fingerprint(), 1 << 30).unwrap();
    runtime::chunk_spans(&request("acme", prompt), CHUNK)
        .iter()
        .map(|(k, _)| disk.get(k).unwrap().expect("the prefill job stored every chunk"))
        .collect()
}

/// Runs `prompt` on `h` with its K/V arriving through a feed, fed from another thread: the
/// chunks of `feed` one by one, a few milliseconds apart, then the feed ends. Returns the output,
/// the completion and the slots the engine held once the second chunk was in.
fn run_fed(h: &EngineHandle, prompt: &[u32], feed: Vec<KvRecord>) -> (Vec<u32>, Completion, usize) {
    let (tx, remote) = h.remote_kv(0);
    let mut req = request("acme", prompt);
    req.remote_kv = Some(remote);
    let stream = h.submit(req);
    let h2 = h.clone();
    let feeder = std::thread::spawn(move || {
        let mut held = 0;
        for (i, r) in feed.into_iter().enumerate() {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.push(r);
            if i == 1 {
                std::thread::sleep(std::time::Duration::from_millis(20));
                held = h2.snapshot_blocking().unwrap().kv_used;
            }
        }
        tx.finish();
        held
    });
    let out = stream.collect_blocking();
    let held = feeder.join().unwrap();
    (out.tokens, out.result.unwrap_or_else(|e| panic!("request failed: {e}")), held)
}

#[test]
fn k_v_fed_into_reserved_slots_answers_as_computing_it_and_what_does_not_arrive_is_computed() {
    let dir = tempfile::tempdir().unwrap();
    let (m, tier, prompt, first) = prefill_job(dir.path());
    let h = engine(&m, Some(&tier));
    let records = prefilled(&tier, &h, &prompt);
    stop(h);
    // 149 tokens before the last one: 4 whole chunks of 32 and a tail of 21.
    assert_eq!(records.iter().map(|r| r.tokens.len()).collect::<Vec<_>>(), [32, 32, 32, 32, 21]);

    // A decode engine without a tier of its own: every chunk arrives; it holds the prompt's
    // slots from admission (early reservation) and computes only the last token.
    let h = engine(&m, None);
    let (out, done, held) = run_fed(&h, &prompt, records.clone());
    assert_eq!(out, first, "K/V fed into the slots must give the output of computing it");
    assert_eq!((done.cached_tokens, done.computed_prefill_tokens), (0, 1), "{done:?}");
    assert!(held >= 149, "the slots are reserved while the K/V arrives: {held} in use");
    no_leaks(&h);
    stop(h);

    // The feed ends after two chunks (a prefill server that died): the rest is computed here.
    let h = engine(&m, None);
    let (out, done, _) = run_fed(&h, &prompt, records[..2].to_vec());
    assert_eq!(out, first);
    assert_eq!(done.computed_prefill_tokens, 150 - 64, "{done:?}");
    no_leaks(&h);
    stop(h);
    // Rows of another prompt end the feed where they would have gone: computed instead.
    let h = engine(&m, None);
    let other = tokens(4, 150);
    let mut mixed = records[..1].to_vec();
    mixed.push(records[1].clone());
    mixed[1].tokens = other[32..64].to_vec();
    let (out, done, _) = run_fed(&h, &prompt, mixed);
    assert_eq!(out, first);
    assert_eq!(done.computed_prefill_tokens, 150 - 32, "{done:?}");
    no_leaks(&h);
    stop(h);
    // A feed that sends nothing: computed as any request.
    let h = engine(&m, None);
    let (out, done, _) = run_fed(&h, &prompt, Vec::new());
    assert_eq!((out, done.computed_prefill_tokens), (first, 150));
    no_leaks(&h);
    stop(h);
}

#[test]
fn a_corrupt_chunk_is_discarded_and_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let (m, tier) = (model(dir.path(), 5), dir.path().join("tier"));
    let prompt = tokens(2, 170);
    let h = engine(&m, Some(&tier));
    let (first, _) = run(&h, request("acme", &prompt));
    stop(h);
    // Chunk 2 corrupted in place, chunk 4 truncated.
    let file = chunk_file(&tier, "acme", &prompt, 2);
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();
    let file4 = chunk_file(&tier, "acme", &prompt, 4);
    let bytes = std::fs::read(&file4).unwrap();
    std::fs::write(&file4, &bytes[..bytes.len() / 3]).unwrap();

    let h = engine(&m, Some(&tier));
    assert!(!file4.exists(), "a truncated chunk is deleted when the tier opens");
    let (again, done) = run(&h, request("acme", &prompt));
    assert_eq!(again, first);
    assert_eq!(done.cached_tokens, 64, "the chunks before the corrupt one");
    no_leaks(&h);
    stop(h);
    // Recomputed and stored again, whole.
    let h = engine(&m, Some(&tier));
    let (again, done) = run(&h, request("acme", &prompt));
    assert_eq!((again, done.cached_tokens), (first, 160));
    stop(h);
}

#[test]
fn another_models_chunks_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, tier) = (model(dir.path(), 5), model(dir.path(), 6), dir.path().join("tier"));
    let prompt = tokens(3, 150);
    let h = engine(&a, Some(&tier));
    run(&h, request("acme", &prompt));
    stop(h);
    let h = engine(&b, Some(&tier));
    let s = h.snapshot_blocking().unwrap();
    assert_eq!(s.kv_tier_chunks, 0, "model A's chunks are not model B's: {s:?}");
    let (out, done) = run(&h, request("acme", &prompt));
    assert_eq!(done.cached_tokens, 0);
    stop(h);
    let h = engine(&b, None);
    assert_eq!(run(&h, request("acme", &prompt)).0, out);
    assert!(chunk_file(&tier, "acme", &prompt, 0).exists(), "another model's chunks are left alone");
}

/// A pool of 8-bit K/V writes its chunks in its own format and reads them back after a restart
/// (the same output as computing them); chunks of an f16 pool in the same directory are another
/// format's, ignored rather than misread, and the other way round.
#[test]
fn a_q8_0_pool_reads_its_own_chunks_and_never_another_formats() {
    let dir = tempfile::tempdir().unwrap();
    let (m, tier) = (model(dir.path(), 5), dir.path().join("tier"));
    let prompt = tokens(5, 200);
    let h = engine_in(&m, Some(&tier), KvFormat::F16);
    let (f16_out, _) = run(&h, request("acme", &prompt));
    stop(h);
    let h = engine_in(&m, Some(&tier), KvFormat::Q8_0);
    assert_eq!(h.snapshot_blocking().unwrap().kv_tier_chunks, 0, "the f16 pool's chunks are not this pool's");
    let (first, done) = run(&h, request("acme", &prompt));
    assert_eq!(done.cached_tokens, 0);
    no_leaks(&h);
    stop(h);
    let h = engine_in(&m, Some(&tier), KvFormat::Q8_0);
    assert_eq!(h.snapshot_blocking().unwrap().kv_tier_chunks, 6);
    let (again, done) = run(&h, request("acme", &prompt));
    assert_eq!((again, done.cached_tokens), (first.clone(), 192), "loaded from disk, the same answer");
    stop(h);
    // The q8_0 pool's chunks took the f16 ones' names (a chunk's file is named by its tokens and
    // scope): an f16 pool finds none it can read, and computes.
    let h = engine_in(&m, Some(&tier), KvFormat::F16);
    assert_eq!(h.snapshot_blocking().unwrap().kv_tier_chunks, 0, "the q8_0 pool's chunks are not this pool's");
    let (out, done) = run(&h, request("acme", &prompt));
    assert_eq!((out, done.cached_tokens), (f16_out, 0));
    stop(h);
    let h = engine_in(&m, None, KvFormat::Q8_0);
    assert_eq!(run(&h, request("acme", &prompt)).0, first, "computed alone");
}

#[test]
fn a_push_and_a_deleted_tenant_take_their_chunks_off_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (m, tier) = (model(dir.path(), 5), dir.path().join("tier"));
    let prompt = tokens(4, 200);
    let h = engine(&m, Some(&tier));
    let mut req = request("acme", &prompt);
    let tag = |v: &str| Tag { source: "repo:main:src/a.rs".into(), version: v.into() };
    req.spans = vec![TokenSpan { range: 40..80, tag: tag("v1") }];
    run(&h, req);
    run(&h, request("globex", &prompt));
    h.flush_kv_tier_blocking();
    assert_eq!(h.snapshot_blocking().unwrap().kv_tier_chunks, 12);
    // The push: chunks 1 and 2 hold the file, and chunks 3..5 were computed after it.
    h.invalidate_blocking("repo:main:src/a.rs", Some("v2")).unwrap();
    assert_eq!(h.snapshot_blocking().unwrap().kv_tier_chunks, 7);
    assert!(chunk_file(&tier, "acme", &prompt, 0).exists() && !chunk_file(&tier, "acme", &prompt, 1).exists());
    h.purge_tenant(TenantKey::new("globex"));
    assert_eq!(h.snapshot_blocking().unwrap().kv_tier_chunks, 1);
    assert!(!chunk_file(&tier, "globex", &prompt, 0).exists());
    stop(h);
    let h = engine(&m, Some(&tier));
    assert_eq!(run(&h, request("acme", &prompt)).1.cached_tokens, 32);
    stop(h);
}
