//! Admission control under a burst far above capacity: the excess is refused
//! at once with `Overloaded`, and every admitted interactive request meets
//! its time-to-first-token target. The engine's other tests run beside these
//! (one test binary), so the bounds leave room for a busy CPU, and the burst
//! is sized from the throughput the engine measures, so a fast CPU is not
//! let through whole.

use crate::common;
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

/// A burst for an engine computing `throughput` prompt tokens a second: prompts of about a tenth
/// of the target each (at most 1,500 tokens, so a fast machine's burst fits the pool), and five
/// times as many as fit within the 0.8 × target limit (40 at least). A fixed count of 40 let a
/// fast machine admit them all once the prompts reached their cap (the tiny model at 75k tokens
/// a second would compute 40 × 1,500 within the limit).
fn burst(throughput: f64, target: Duration) -> (usize, usize) {
    let len = ((throughput * target.as_secs_f64() / 10.0) as usize).clamp(32, 1500);
    let fit = throughput * 0.8 * target.as_secs_f64() / len as f64;
    (len, ((5.0 * fit).ceil() as usize).clamp(40, 400))
}

#[test]
fn overload_is_refused_early_and_admitted_requests_meet_their_target() {
    let (h, target) = busy_engine(77);
    let throughput = h.snapshot_blocking().unwrap().throughput;
    // Each prompt takes about a tenth of the target; send five times what fits at once.
    let (len, n) = burst(throughput, target);
    let streams: Vec<_> =
        (0..n).map(|i| h.submit(request(&format!("t{}", i % 4), tokens(200 + i as u64, len), 2))).collect();
    // Served in full, the burst would take about four targets. Admission keeps the predicted
    // wait of the admitted within the target; the wall clock of a shared machine is noisy
    // (a CI run measured 838 ms against 800), so it is checked with room to spare: well below
    // what the unrefused burst would take, not to the millisecond.
    let (mut admitted, mut refused) = (0, 0);
    for s in streams {
        let out = s.collect_blocking();
        match out.result {
            Ok(done) => {
                admitted += 1;
                let ttft = done.ttft.unwrap();
                assert!(
                    ttft <= 2 * target,
                    "an admitted request waited {ttft:?} for its first token (target {target:?})"
                );
            }
            Err(RequestError::Overloaded { retry_after }) => {
                refused += 1;
                assert!(retry_after >= Duration::from_secs(1));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(refused >= n / 4, "the burst was far above capacity: {admitted} admitted, {refused} refused");
    assert!(admitted >= 3, "{admitted} admitted");
    // What was admitted fits the target at the throughput the engine first published, with the
    // same room (the estimate rises as batched prefills run): the refusals came from the
    // prediction, not from luck.
    let fits = (throughput * 2.0 * target.as_secs_f64() / len as f64).ceil() as usize + 1;
    assert!(admitted <= fits, "{admitted} admitted, but only {fits} fit the target");
    h.check_integrity_blocking().unwrap();
}

/// The excess of a burst hears its refusal when it submits: the door judges it against what the
/// engine last published, without waiting for the engine's next step.
#[test]
fn the_excess_is_refused_at_the_door_without_waiting_for_a_step() {
    let (h, target) = busy_engine(79);
    let throughput = h.snapshot_blocking().unwrap().throughput;
    // A tenth of the target each (less on a fast machine): about eight fit within the
    // 0.8 × target limit, and five times as many are sent.
    let (len, n) = burst(throughput, target);
    // The door judges with the engine's fit of pass time against pass size; fitted on the one
    // or two passes the burst's first requests ran (on a tiny model mostly fixed cost), it was
    // several times off and let 23–28 of 40 through now and then. Passes of this size first.
    for i in 0..4 {
        h.submit(request("warm", tokens(900 + i, len), 2)).collect_blocking().result.unwrap();
    }
    let mut streams: Vec<_> = (0..n).map(|i| h.submit(request("one", tokens(500 + i as u64, len), 2))).collect();
    // Right after submitting, before any step could judge them: the door's refusals are there.
    let at_door = streams
        .iter_mut()
        .map(|s| s.try_next())
        .filter(|e| matches!(e, Some(Event::Error(RequestError::Overloaded { .. }))))
        .count();
    // About four in five are beyond the limit; how many the door sees as such rests on its
    // pass-time fit, which a shared machine's noise moves (19 and 21 of 40 in two runs of 40):
    // the property here is that a large part is refused before any step, not the fit's accuracy
    // (which `overload_is_refused_early_and_admitted_requests_meet_their_target` bounds).
    assert!(
        at_door >= n * 3 / 10,
        "{at_door} of {n} refused at once ({len}-token prompts at {throughput:.0} tokens/s)"
    );
    let snapshot = h.snapshot_blocking().unwrap();
    assert!(snapshot.refused_at_door >= (n * 3 / 10) as u64, "{} refused at the door", snapshot.refused_at_door);
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

/// Background work is invisible to admission control and yields to users: a long pre-warm
/// (a push's new context) is computing when a user's request arrives — the request is not
/// refused, is answered before the pre-warm finishes, and starts from what the pre-warm had
/// computed when it shares its prefix.
#[test]
fn a_prewarm_never_makes_a_user_wait_or_be_refused() {
    let (h, target) = busy_engine(81);
    let throughput = h.snapshot_blocking().unwrap().throughput;
    // About five targets of prefill for the pre-warm; a tenth of one for the user's own part.
    let context = tokens(900, ((throughput * target.as_secs_f64() * 5.0) as usize).clamp(512, 3500));
    let own = ((throughput * target.as_secs_f64() / 10.0) as usize).clamp(16, 400);
    let started = |h: &runtime::EngineHandle| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while h.snapshot_blocking().unwrap().kv_used == 0 {
            assert!(std::time::Instant::now() < deadline, "the pre-warm never started: {:?}", h.snapshot_blocking());
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // Another prompt altogether.
    let mut warm = request("t", context.clone(), 1);
    warm.prewarm = true;
    let mut background = h.submit(warm);
    started(&h);
    let user = h.submit(request("u", tokens(901, own), 2)).collect_blocking();
    let done = user.result.unwrap_or_else(|e| panic!("the user's request failed: {e}"));
    assert_eq!(done.output_tokens, 2);
    assert!(background.try_next().is_none(), "the pre-warm finished first");
    assert!(background.collect_blocking().result.is_ok());

    // The same tenant's turn on the pre-warm's prefix: it reuses what was computed so far.
    let h = busy_engine(82).0;
    let context = tokens(902, context.len());
    let mut warm = request("t", context.clone(), 1);
    warm.prewarm = true;
    let background = h.submit(warm);
    started(&h);
    let turn = [context.clone(), tokens(903, own)].concat();
    let user = h.submit(request("t", turn, 2)).collect_blocking();
    let done = user.result.unwrap_or_else(|e| panic!("the user's turn failed: {e}"));
    assert!(done.cached_tokens > 0, "nothing of the pre-warm's work was reused: {done:?}");
    let warmed = background.collect_blocking().result.unwrap();
    assert!(warmed.computed_prefill_tokens < context.len(), "the pre-warm computed its prompt again: {warmed:?}");
    let s = h.snapshot_blocking().unwrap();
    assert!(s.preempted_prewarms >= 1 && s.refused == 0, "{s:?}");
    h.check_integrity_blocking().unwrap();
}
