//! Admission control under a burst far above capacity: the excess is refused
//! at once with `Overloaded`, and every admitted interactive request meets
//! its time-to-first-token target. Its own test binary, so no other test in
//! the process competes for the CPU while it measures.

mod common;
use common::tokens;

use cachet_engine::generate::GenerateParams;
use cachet_engine::kv_pool::PoolSize;
use cachet_engine::radix::TenantKey;
use cachet_engine::runtime::{self, EngineConfig, Event, Request, RequestError};
use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::quant::DType;
use std::time::Duration;

fn request(tenant: &str, prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request::new(TenantKey::new(tenant), prompt, GenerateParams { max_tokens, ignore_eos: true, ..Default::default() })
}

/// An engine on a tiny model (random weights from `seed`) with an 800 ms TTFT target, refusing
/// what is predicted past 0.8 × it.
fn busy_engine(seed: u64) -> (runtime::EngineHandle, Duration) {
    let target = Duration::from_millis(800);
    let mut config = EngineConfig { pool: PoolSize::Tokens(8192), ..Default::default() };
    config.interactive.ttft = target;
    config.overload_factor = 0.8;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    Tiny::random(TinyArch::Qwen2, seed, false).write_gguf(DType::Q8_0, &path).unwrap();
    let backend = CpuBackend::new(2).unwrap();
    let loaded = cachet_engine::loader::load(&path, &backend).unwrap();
    (runtime::start(backend, loaded, config).unwrap(), target)
}

#[test]
fn overload_is_refused_early_and_admitted_requests_meet_their_target() {
    let (h, target) = busy_engine(77);
    let throughput = h.snapshot_blocking().unwrap().throughput;
    // Each prompt takes about a tenth of the target; send forty at once.
    let len = ((throughput * target.as_secs_f64() / 10.0) as usize).clamp(32, 1500);
    let streams: Vec<_> = (0..40).map(|i| h.submit(request(&format!("t{}", i % 4), tokens(200 + i, len), 2))).collect();
    let (mut admitted, mut refused) = (0, 0);
    for s in streams {
        let out = s.collect_blocking();
        match out.result {
            Ok(done) => {
                admitted += 1;
                let ttft = done.ttft.unwrap();
                assert!(ttft <= target, "an admitted request waited {ttft:?} for its first token (target {target:?})");
            }
            Err(RequestError::Overloaded { retry_after }) => {
                refused += 1;
                assert!(retry_after >= Duration::from_secs(1));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused >= 10, "the burst was far above capacity: {admitted} admitted, {refused} refused");
    assert!(admitted >= 3, "{admitted} admitted");
    h.check_integrity_blocking().unwrap();
}

/// The excess of a burst hears its refusal when it submits: the door judges it against what the
/// engine last published, without waiting for the engine's next step.
#[test]
fn the_excess_is_refused_at_the_door_without_waiting_for_a_step() {
    let (h, target) = busy_engine(79);
    let throughput = h.snapshot_blocking().unwrap().throughput;
    // A tenth of the target each: about eight fit within the 0.8 × target limit.
    let len = ((throughput * target.as_secs_f64() / 10.0) as usize).clamp(32, 1500);
    let mut streams: Vec<_> = (0..40).map(|i| h.submit(request("one", tokens(500 + i, len), 2))).collect();
    // Right after submitting, before any step could judge them: the door's refusals are there.
    let at_door = streams
        .iter_mut()
        .map(|s| s.try_next())
        .filter(|e| matches!(e, Some(Event::Error(RequestError::Overloaded { .. }))))
        .count();
    assert!(at_door >= 20, "{at_door} of 40 refused at once");
    let snapshot = h.snapshot_blocking().unwrap();
    assert!(snapshot.refused_at_door >= 20, "{} refused at the door", snapshot.refused_at_door);
    assert!(snapshot.refused >= at_door as u64);
    drop(streams);
    h.check_integrity_blocking().unwrap();
}

/// A target no request can meet, even alone: refusing would not make any of them faster, so
/// an idle engine serves the first and a busy one admits (and serves) those behind it.
#[test]
fn requests_that_cannot_make_their_target_even_alone_are_served() {
    let mut config = EngineConfig { pool: PoolSize::Tokens(4096), ..Default::default() };
    config.interactive.ttft = Duration::from_micros(1);
    config.overload_factor = 1.0;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    Tiny::random(TinyArch::Qwen2, 78, false).write_gguf(DType::Q8_0, &path).unwrap();
    let backend = CpuBackend::new(1).unwrap();
    let loaded = cachet_engine::loader::load(&path, &backend).unwrap();
    let h = runtime::start(backend, loaded, config).unwrap();
    let alone = h.submit(request("a", tokens(1, 200), 4)).collect_blocking();
    assert!(alone.result.is_ok(), "an idle engine refused: {:?}", alone.result.err());
    let first = h.submit(request("a", tokens(2, 200), 64));
    let behind: Vec<_> = (0..2).map(|i| h.submit(request("b", tokens(3 + i, 200), 4))).collect();
    for s in behind {
        let r = s.collect_blocking().result;
        assert!(r.is_ok(), "a request beyond reach was refused: {:?}", r.err());
    }
    assert!(first.collect_blocking().result.is_ok());
    h.check_integrity_blocking().unwrap();
}
