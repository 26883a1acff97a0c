//! The scheduler alone — no model, no thread: stepped by hand with a fake runner (every
//! sequence that samples gets the same token; a pass takes 1 ms of a manual clock) and a
//! made-up pass cost, so that chunk sizes, admission order and reported times are exact.

use super::clock::Clock;
use super::pace::PassModel;
use super::request::{Completion, Outcome, Request};
use super::runner::Ran;
use super::{EngineConfig, Policy, Scheduler, SloTargets};
use crate::generate::GenerateParams;
use crate::kv_pool::{PoolSize, Slots};
use crate::radix::TenantKey;
use crate::tokenizer::{GgufTokenizerSpec, Tokenizer};
use std::time::{Duration, Instant};

/// Byte tokens, an end-of-sequence token and padding: 320 ids, as the tiny test models have.
fn tokenizer() -> Tokenizer {
    let mut spec = GgufTokenizerSpec::byte_alphabet("gpt2", Some("qwen2"));
    let eos = spec.push_token("<|im_end|>", GgufTokenizerSpec::TOKEN_CONTROL);
    while spec.tokens.len() < 320 {
        let pad = format!("[PAD{}]", spec.tokens.len());
        spec.push_token(&pad, GgufTokenizerSpec::TOKEN_UNUSED);
    }
    spec.eos_token_id = Some(eos);
    Tokenizer::from_gguf(spec).unwrap()
}

/// A scheduler over 4,096 slots for a model of 320 tokens and a 4,096-token context, with the
/// throughput estimate a first pass would have given it.
fn engine(cfg: EngineConfig) -> Scheduler {
    let mut s = Scheduler::new(cfg, tokenizer(), 320, 4096, Slots::new(4096));
    s.pace.throughput = 10_000.0;
    s.clock = Clock::Manual(Instant::now());
    s
}

/// The token the fake runner samples (a byte: no stop, no end of sequence).
const TOKEN: u32 = 65;

/// How long the fake runner's pass takes on the manual clock.
const PASS: Duration = Duration::from_millis(1);

impl Scheduler {
    /// One step with a fake runner: what the scheduler plans "runs" at once and every sequence
    /// that samples gets [`TOKEN`] (a drafted chunk: one per position while the draft says
    /// [`TOKEN`], then one more).
    fn step(&mut self) {
        let now = self.clock.now();
        if let Some(plan) = self.schedule(now) {
            let running = &self.running;
            let index = plan.iter().map(|p| running.iter().position(|s| s.id == p.seq).expect("planned")).collect();
            let sampled = plan
                .iter()
                .map(|p| {
                    let seq = running.iter().find(|s| s.id == p.seq).expect("planned");
                    if p.logits && !seq.req.prewarm {
                        let confirmed = seq.draft.iter().take_while(|&&t| t == TOKEN).count().min(p.draft);
                        (0..=confirmed).map(|_| Ok((TOKEN, None))).collect()
                    } else {
                        Vec::new()
                    }
                })
                .collect();
            self.clock.advance(PASS);
            let secs = PASS.as_secs_f64();
            self.postprocess(&plan, Ran { index, secs, failed: None, sampled, grammar: None }, now);
        }
        self.publish_stats();
        self.after_step();
    }
}

fn cfg() -> EngineConfig {
    EngineConfig {
        pool: PoolSize::Tokens(4096),
        overload_factor: 0.0,
        min_prefill_chunk: 8,
        pace_margin: 1.0,
        draft_tokens: 0,
        interactive: SloTargets { ttft: Duration::from_secs(3), itl: Duration::from_millis(250) },
        ..EngineConfig::default()
    }
}

/// `fixed` seconds a pass plus `per_token` a token.
fn cost(fixed: f64, per_token: f64) -> PassModel {
    let mut m = PassModel::default();
    for n in [1, 100, 1, 300] {
        m.observe(n, fixed + per_token * n as f64);
    }
    m
}

/// 10 ms a pass plus 2 ms a token: 120 tokens fit in 250 ms.
fn pass_cost() -> PassModel {
    cost(0.010, 0.002)
}

/// Queues a request of `prompt` tokens (its event stream is dropped: nobody listens).
fn submit(e: &mut Scheduler, prompt: usize, max_tokens: usize) -> u64 {
    let params = GenerateParams { max_tokens, ignore_eos: true, ..Default::default() };
    let tokens = (0..prompt as u32).map(|i| (i * 7 + 3 + prompt as u32) % 300).collect();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::mem::forget(rx);
    let id = e.intake.next_id;
    e.submit(Request::new(TenantKey::new("t"), tokens, params), tx);
    id
}

/// Queues a pre-warm of a `prompt`-token prompt.
fn submit_prewarm(e: &mut Scheduler, prompt: usize) -> u64 {
    let params = GenerateParams { max_tokens: 1, ..Default::default() };
    let tokens: Vec<u32> = (0..prompt as u32).map(|i| (i * 7 + 3) % 300).collect();
    let mut warm = Request::new(TenantKey::new("t"), tokens, params);
    warm.prewarm = true;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::mem::forget(rx);
    let id = e.intake.next_id;
    e.submit(warm, tx);
    id
}

fn computed(e: &Scheduler, id: u64) -> usize {
    e.running.iter().find(|s| s.id == id).map_or(0, |s| s.computed)
}

/// A decodes; B's 600-token prompt arrives; one step.
fn chunk_next_to_a_decoder(cfg: EngineConfig, cost: PassModel) -> (usize, usize) {
    chunk_next_to(cfg, cost, 1000)
}

/// [`chunk_next_to_a_decoder`] with A asking for `a_tokens` tokens.
fn chunk_next_to(cfg: EngineConfig, cost: PassModel, a_tokens: usize) -> (usize, usize) {
    let mut e = engine(cfg);
    let a = submit(&mut e, 10, a_tokens);
    e.step();
    assert!(e.running[0].first_token.is_some(), "A decodes after one step");
    let b = submit(&mut e, 600, 4);
    e.pace = cost;
    let before = e.running[0].generated();
    e.step();
    assert_eq!(e.running.iter().find(|s| s.id == a).unwrap().generated(), before + 1, "A got its token");
    (computed(&e, b), e.step_budget(e.clock.now()))
}

#[test]
fn background_work_alone_runs_in_passes_a_user_would_wait_little_for() {
    let mut e = engine(cfg());
    e.pace = pass_cost();
    let id = submit_prewarm(&mut e, 2000);
    // A tenth of the 3 s TTFT target: (0.3 − 0.01) / 0.002 = 145 tokens, not the 512 budget.
    assert_eq!(e.step_budget(e.clock.now()), 145);
    e.step();
    assert_eq!(computed(&e, id), 145);
    // A user's request next to it: the usual budget.
    submit(&mut e, 10, 4);
    assert_eq!(e.step_budget(e.clock.now()), 512);
}

#[test]
fn a_prompt_next_to_a_decoder_comes_in_chunks_that_fit_the_inter_token_target() {
    let (chunk, _) = chunk_next_to_a_decoder(cfg(), pass_cost());
    // (250 − 10) / 2 = 120 tokens in the pass, one of them A's.
    assert_eq!(chunk, 119);
}

#[test]
fn pacing_aims_below_the_target_by_its_margin() {
    let (chunk, _) = chunk_next_to_a_decoder(EngineConfig { pace_margin: 0.8, ..cfg() }, pass_cost());
    // (0.8 × 250 − 10) / 2 = 95 tokens in the pass, one of them A's.
    assert_eq!(chunk, 94);
}

#[test]
fn without_pacing_the_prompt_fills_the_token_budget() {
    let (chunk, budget) = chunk_next_to_a_decoder(EngineConfig { pace_prefill: false, ..cfg() }, pass_cost());
    assert_eq!(chunk, 511);
    assert_eq!(budget, 512);
}

#[test]
fn when_decoders_alone_fill_the_target_prompts_still_move() {
    let (chunk, _) = chunk_next_to_a_decoder(cfg(), cost(0.300, 0.002));
    assert_eq!(chunk, 8, "min_prefill_chunk");
}

#[test]
fn a_prompt_that_can_wait_for_the_decoders_waits_rather_than_stretch_their_gaps() {
    // A decode pass takes 302 ms, past the 250 ms inter-token target: any prompt token in it
    // stretches A's gaps. A has 9 tokens left (2.7 s); B's 600 tokens then take 1.6 s (passes
    // of 512 at 2 ms a token): 4.3 s, within a 10 s TTFT target. B waits for A.
    let patient = EngineConfig {
        interactive: SloTargets { ttft: Duration::from_secs(10), itl: Duration::from_millis(250) },
        ..cfg()
    };
    let (chunk, _) = chunk_next_to(patient, cost(0.300, 0.002), 10);
    assert_eq!(chunk, 0, "A decodes alone");
    // With a 3 s target B cannot wait that long: it gets min_prefill_chunk beside A.
    let (chunk, _) = chunk_next_to(cfg(), cost(0.300, 0.002), 10);
    assert_eq!(chunk, 8);
}

#[test]
fn while_decoders_leave_room_the_prompt_gets_only_that_room() {
    // (250 − 240) / 2 = 5 tokens fit: A's and 4 of the prompt's, fewer than min_prefill_chunk
    // (8), which only applies once the decoders alone fill the target.
    let (chunk, _) = chunk_next_to_a_decoder(cfg(), cost(0.240, 0.002));
    assert_eq!(chunk, 4);
}

#[test]
fn batch_decoders_allow_bigger_chunks_and_no_decoder_means_the_full_budget() {
    let batch =
        EngineConfig { interactive: SloTargets { ttft: Duration::from_secs(3), itl: Duration::from_secs(1) }, ..cfg() };
    let (chunk, _) = chunk_next_to_a_decoder(batch, pass_cost());
    assert_eq!(chunk, 494, "(1000 − 10) / 2 = 495 tokens, one of them A's");

    let mut e = engine(cfg());
    let b = submit(&mut e, 600, 4);
    e.pace = pass_cost();
    e.step();
    assert_eq!(computed(&e, b), 512);
}

/// 10 ms a prompt token: 600 tokens take 6 s (past the 3 s TTFT target), 50 take 0.5 s.
fn slow() -> PassModel {
    cost(0.0, 0.010)
}

/// `late` (600 tokens) arrives first, `fine` (50 tokens) second; one step with a 64-token budget.
fn admission_order(policy: Policy) -> (usize, usize) {
    let mut e = engine(EngineConfig { policy, token_budget: 64, pace_prefill: false, ..cfg() });
    let late = submit(&mut e, 600, 4);
    let fine = submit(&mut e, 50, 4);
    e.pace = slow();
    e.step();
    (computed(&e, late), computed(&e, fine))
}

#[test]
fn under_slo_a_request_that_can_still_make_it_goes_before_a_hopeless_one() {
    // Earliest deadline first would start `late` (it arrived first); it cannot make its target
    // anyway, so `fine` goes first and `late` gets what is left of the budget.
    assert_eq!(admission_order(Policy::Slo), (14, 50));
    assert_eq!(admission_order(Policy::Fcfs), (64, 0));
}

#[test]
fn a_hopeless_running_prompt_yields_its_chunk_to_a_new_one_that_can_make_it() {
    let mut e = engine(EngineConfig { token_budget: 64, pace_prefill: false, ..cfg() });
    let late = submit(&mut e, 600, 4);
    e.step();
    assert_eq!(computed(&e, late), 64);
    let fine = submit(&mut e, 50, 4);
    e.pace = slow();
    e.step();
    assert_eq!((computed(&e, late), computed(&e, fine)), (64 + 14, 50));
    // Once nobody else can make it, the hopeless prompt gets the whole budget again.
    e.pace = slow();
    e.step();
    assert_eq!(computed(&e, late), 64 + 14 + 63, "one token of the pass is fine's first decode step");
    // Nothing is dropped: both finish.
    for _ in 0..100 {
        if e.running.is_empty() && e.waiting.is_empty() {
            break;
        }
        e.step();
    }
    assert!(e.running.is_empty() && e.waiting.is_empty());
    assert_eq!(e.stats.finished, 2);
}

#[test]
fn only_what_waiting_would_fix_is_refused() {
    // Limit 2 × 3 s = 6 s at 100 prompt tokens/s (7.5 s with the engine's slack after the
    // door). The first (590 tokens, 5.9 s) is queued; a second like it would wait 5.9 s behind
    // it (11.8 s): the queue makes it late, so it is refused. One of 1000 tokens needs 10 s even alone: refusing it helps nobody, so it is
    // admitted (served behind what can still make its target).
    let mut e = engine(EngineConfig { policy: Policy::Slo, overload_factor: 2.0, pace_prefill: false, ..cfg() });
    e.pace = slow();
    submit(&mut e, 590, 4);
    submit(&mut e, 590, 4);
    assert_eq!((e.waiting.len(), e.stats.refused), (1, 1), "the queue made it late");
    submit(&mut e, 1000, 4);
    assert_eq!((e.waiting.len(), e.stats.refused), (2, 1), "too long even alone: admitted");
    // Re-checked every step, it is still not refused; and it is served.
    let mut steps = 0;
    while !(e.running.is_empty() && e.waiting.is_empty()) && steps < 10_000 {
        e.step();
        steps += 1;
    }
    assert_eq!((e.stats.finished, e.stats.refused), (2, 1));
}

#[test]
fn a_prefix_the_disk_tier_holds_is_not_counted_as_work() {
    // As above, but the disk tier holds the prompt's first 512 tokens (a context that survived a
    // restart): each request has 78 tokens to compute, the second waits 0.78 s behind the first,
    // and neither is refused.
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(EngineConfig { policy: Policy::Slo, overload_factor: 2.0, pace_prefill: false, ..cfg() });
    e.pace = slow();
    let tokens = (0..590u32).map(|i| (i * 7 + 3 + 590) % 300).collect();
    let prompt = Request::new(TenantKey::new("t"), tokens, GenerateParams::default());
    e.kv.set_tier(super::tier::holding(dir.path(), &prompt, 256, 2).0);
    submit(&mut e, 590, 4);
    submit(&mut e, 590, 4);
    assert_eq!((e.waiting.len(), e.stats.refused), (2, 0));
    assert_eq!(e.waiting[1].stored, 512);
}

#[test]
fn admission_control_does_not_count_hopeless_requests_ahead_of_one_that_can_make_it() {
    // The engine refuses what is predicted past 2 × 3 s × 1.25 (its slack after the door).
    // `late` (700 tokens, 7 s alone) is queued; `fine` (100 tokens, 1 s) would be predicted at
    // 8 s behind it under first come first served, but under `slo` it goes first, so it is
    // predicted at 1 s and accepted.
    let admitted = |policy| {
        let mut e = engine(EngineConfig { policy, overload_factor: 2.0, pace_prefill: false, ..cfg() });
        e.pace = slow();
        submit(&mut e, 700, 4);
        submit(&mut e, 100, 4);
        (e.waiting.len(), e.stats.refused)
    };
    assert_eq!(admitted(Policy::Slo), (2, 0));
    assert_eq!(admitted(Policy::Fcfs), (1, 1));
}

/// Moves a request's arrival (and so its deadline) `secs` into the past.
fn age(e: &mut Scheduler, id: u64, secs: u64) {
    let d = Duration::from_secs(secs);
    let seq = e.running.iter_mut().chain(e.waiting.iter_mut()).find(|s| s.id == id).expect("queued or running");
    seq.arrival = seq.arrival.checked_sub(d).expect("the clock is older than that");
    seq.deadline = seq.deadline.checked_sub(d).expect("the clock is older than that");
}

/// `late` (600 tokens) runs one pass of 64 tokens (the budget), then has waited past its
/// patience; `fine` (`prompt` tokens) arrives; one step with `cost`. Returns (engine, late, fine).
fn overdue_then_newcomer(prompt: usize, cost: PassModel) -> (Scheduler, u64, u64) {
    let mut e = engine(EngineConfig { token_budget: 64, pace_prefill: false, ..cfg() });
    let late = submit(&mut e, 600, 4);
    e.step();
    assert_eq!(computed(&e, late), 64);
    age(&mut e, late, 10);
    let fine = submit(&mut e, prompt, 4);
    e.pace = cost;
    e.step();
    (e, late, fine)
}

#[test]
fn an_overdue_prompt_gets_a_bounded_share_and_a_newcomer_that_can_make_it_the_rest() {
    // `late` (600 tokens, 6 s alone) has waited past its patience (3 s): it is not starved any
    // more, but its earlier deadline does not let it take whole passes from `fine` (50 tokens,
    // 0.5 s), which can still make its target. Before, `late` took all 64 tokens of the pass
    // and `fine` waited for its whole prompt; agents' short follow-ups waited a minute so.
    let (e, late, fine) = overdue_then_newcomer(50, slow());
    // 8 (min_prefill_chunk) for `late` first, 50 for `fine`, the 6 left for `late` again.
    assert_eq!((computed(&e, late), computed(&e, fine)), (64 + 8 + 6, 50));

    // The same when the overdue request is still waiting: admitted first, for its share.
    let mut e = engine(EngineConfig { token_budget: 64, pace_prefill: false, ..cfg() });
    let late = submit(&mut e, 600, 4);
    age(&mut e, late, 10);
    let fine = submit(&mut e, 50, 4);
    e.pace = slow();
    e.step();
    assert_eq!((computed(&e, late), computed(&e, fine)), (8, 50));
    for _ in 0..100 {
        if e.running.is_empty() && e.waiting.is_empty() {
            break;
        }
        e.step();
    }
    assert_eq!(e.stats.finished, 2, "both are served");
}

#[test]
fn overdue_prompts_share_one_bounded_share_so_a_burst_of_them_cannot_take_the_passes() {
    // Two overdue prompts (a burst that arrived long ago) and a newcomer that can make it: the
    // two together get min_prefill_chunk (8), the earliest deadline first, not 8 each.
    let mut e = engine(EngineConfig { token_budget: 64, pace_prefill: false, ..cfg() });
    let first = submit(&mut e, 600, 4);
    let second = submit(&mut e, 600, 4);
    age(&mut e, first, 11);
    age(&mut e, second, 10);
    let fine = submit(&mut e, 50, 4);
    e.pace = slow();
    e.step();
    assert_eq!((computed(&e, first), computed(&e, second), computed(&e, fine)), (8, 0, 50));
}

#[test]
fn an_overdue_prompt_moves_by_its_share_while_hopeful_ones_fill_the_passes() {
    // A steady stream of requests that can make their targets never stops the overdue one.
    let mut e = engine(EngineConfig { token_budget: 64, pace_prefill: false, ..cfg() });
    let late = submit(&mut e, 600, 1);
    age(&mut e, late, 10);
    for _ in 0..5 {
        submit(&mut e, 60, 1);
        e.pace = slow();
        e.step();
    }
    assert!(computed(&e, late) >= 5 * 8, "{} tokens after 5 passes", computed(&e, late));
}

/// A decodes (asking for `a_tokens`); a prompt of `b_prompt` tokens arrives; one step: the
/// prompt's tokens computed in it.
fn prompt_next_to(cfg: EngineConfig, cost: PassModel, a_tokens: usize, b_prompt: usize) -> usize {
    let mut e = engine(cfg);
    submit(&mut e, 10, a_tokens);
    e.step();
    let b = submit(&mut e, b_prompt, 4);
    e.pace = cost;
    e.step();
    computed(&e, b)
}

#[test]
fn a_lax_target_does_not_keep_a_short_prompt_waiting_long_beside_decoders() {
    // A decode pass takes 302 ms, past the 250 ms inter-token target, and A has 28 tokens left
    // (8.5 s). B's 100 tokens take 0.5 s alone: a 60 s target would let it wait for A, but
    // that is 18 times its time alone; past 3 times it gets min_prefill_chunk beside A.
    let lax = |prompt_slowdown| EngineConfig {
        interactive: SloTargets { ttft: Duration::from_secs(60), itl: Duration::from_millis(250) },
        prompt_slowdown,
        ..cfg()
    };
    assert_eq!(prompt_next_to(lax(3.0), cost(0.300, 0.002), 30, 100), 8);
    assert_eq!(prompt_next_to(lax(0.0), cost(0.300, 0.002), 30, 100), 0, "only the target counts");
    // A long prompt (600 tokens, 1.5 s alone) moves too while A has 28 tokens left (8.5 + 1.5 s
    // is past 3 × 1.5 s), and waits when A has 9 left (2.7 + 1.5 s is within it).
    assert_eq!(prompt_next_to(lax(3.0), cost(0.300, 0.002), 30, 600), 8);
    assert_eq!(prompt_next_to(lax(3.0), cost(0.300, 0.002), 10, 600), 0);
}

#[test]
fn prompts_that_arrive_together_get_passes_of_their_own_once_a_pass_is_efficient() {
    // 10 ms a pass and 2 ms a token: past 45 prompt tokens the fixed cost is under a tenth of
    // the pass. Four 96-token prompts: the first pass carries the first alone, so it gets its
    // first token after one prompt's time, not four.
    let together = |cost: PassModel| {
        let mut e = engine(cfg());
        let ids: Vec<u64> = (0..4).map(|_| submit(&mut e, 96, 4)).collect();
        e.pace = cost;
        e.step();
        ids.iter().map(|&id| computed(&e, id)).collect::<Vec<_>>()
    };
    assert_eq!(together(pass_cost()), [96, 0, 0, 0]);
    // Short prompts share a pass until it is efficient: 30 + 30 tokens, then no third.
    let mut e = engine(cfg());
    let ids: Vec<u64> = (0..3).map(|_| submit(&mut e, 30, 4)).collect();
    e.pace = pass_cost();
    e.step();
    assert_eq!(ids.iter().map(|&id| computed(&e, id)).collect::<Vec<_>>(), [30, 30, 0]);
    // Where the fixed cost is a pass of thousands of tokens (a GPU), they are packed.
    assert_eq!(together(cost(0.005, 0.000_01)), [96, 96, 96, 96]);
}

#[test]
fn an_overdue_prompt_s_share_is_not_stretched_past_a_follow_up_that_can_make_it() {
    // 50 ms a pass and 10 ms a token: past 45 prompt tokens a pass is efficient. `late` (600
    // tokens, overdue) gets its share (8), `fine` (50) its prompt; the pass is then full, and
    // `late` does not take the rest of the budget (it would make `fine` wait 4.5 s more).
    let mut e = engine(EngineConfig { pace_prefill: false, ..cfg() });
    let late = submit(&mut e, 600, 4);
    age(&mut e, late, 10);
    let fine = submit(&mut e, 50, 4);
    e.pace = cost(0.050, 0.010);
    e.step();
    assert_eq!((computed(&e, late), computed(&e, fine)), (8, 50));
    // Alone, it has the passes to itself again.
    e.pace = cost(0.050, 0.010);
    e.step();
    assert_eq!(computed(&e, late), 8 + 511, "one token of the pass is fine's first decode step");
}

#[test]
fn passes_of_prompts_that_are_late_anyway_are_kept_short_for_whoever_arrives_next() {
    // 2000 tokens at about 500 a second: 4 s, past the 3 s target even alone. Its passes are
    // kept to a tenth of the target (145 tokens), so a request arriving during one waits little.
    let mut e = engine(cfg());
    let late = submit(&mut e, 2000, 4);
    e.pace = pass_cost();
    assert_eq!(e.step_budget(e.clock.now()), 145);
    e.step();
    assert_eq!(computed(&e, late), 145);
    // One that can make its target gets full passes.
    let mut e = engine(cfg());
    submit(&mut e, 1000, 4);
    e.pace = pass_cost();
    assert_eq!(e.step_budget(e.clock.now()), 512);
}

#[test]
fn in_a_paced_pass_with_little_room_an_overdue_prompt_takes_at_most_half() {
    // A decodes; a pass of 230 ms plus 2 ms a token fits 10 tokens in the 250 ms target, 9
    // beside A's. `late` (overdue) and `fine` (50 tokens, can make its target) share them.
    let mut e = engine(cfg());
    submit(&mut e, 10, 1000);
    e.step();
    let late = submit(&mut e, 600, 4);
    age(&mut e, late, 10);
    let fine = submit(&mut e, 50, 4);
    e.pace = cost(0.230, 0.002);
    e.step();
    assert_eq!((computed(&e, late), computed(&e, fine)), (4, 5));
}

#[test]
fn a_pass_that_finishes_a_prompt_that_can_make_it_is_not_padded_with_late_work() {
    // `late` (600 tokens, overdue) and `fine` (20 tokens): with 10 ms a pass and 2 ms a token a
    // pass is efficient past 45 prompt tokens. `late` gets its share (8), `fine` its 20, and
    // `late` only the 17 more that keep the pass efficient, not the 36 left of the budget.
    let (e, late, fine) = overdue_then_newcomer(20, pass_cost());
    assert_eq!(computed(&e, fine), 20);
    // 45 by the line, 46 by the fit's rounding.
    assert!((64 + 8 + 17..=64 + 8 + 18).contains(&computed(&e, late)), "{}", computed(&e, late));
}

/// Reported times are the scheduler's clock's: a request that waited 2 s reports exactly 2 s in
/// the queue, and its first token one pass later.
#[test]
fn queue_time_and_time_to_first_token_are_read_from_the_scheduler_s_clock() {
    let mut e = engine(cfg());
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None::<(Outcome, Completion)>));
    let params = GenerateParams { max_tokens: 2, ignore_eos: true, ..Default::default() };
    let mut req = Request::new(TenantKey::new("t"), (0..40).map(|i| i % 300).collect(), params);
    let hook = seen.clone();
    req.on_complete = Some(std::sync::Arc::new(move |o: Outcome, c: &Completion| {
        *hook.lock().unwrap() = Some((o, c.clone()));
    }));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::mem::forget(rx);
    e.submit(req, tx);
    e.clock.advance(Duration::from_secs(2));
    for _ in 0..10 {
        e.step();
    }
    let (outcome, c) = seen.lock().unwrap().clone().expect("the request finished");
    assert_eq!(outcome, Outcome::Finished);
    assert_eq!(c.queue_time, Duration::from_secs(2));
    assert_eq!(c.ttft, Some(Duration::from_secs(2) + PASS), "one pass computes the prompt and samples");
    assert_eq!(c.e2e, Duration::from_secs(2) + 2 * PASS, "two tokens, two passes");
}

/// A pre-warm running when a user's short prompt arrives on a CPU-like machine (a pass costs
/// about its tokens): the pass that gives the user its first token carries the user's prompt
/// and at most a tenth more time of background work, not the rest of the token budget.
#[test]
fn a_users_first_token_does_not_wait_for_background_work_filling_its_pass() {
    let mut e = engine(cfg());
    e.pace = cost(0.030, 0.006);
    let prewarm = submit_prewarm(&mut e, 2000);
    e.step();
    // Alone, (0.3 − 0.03) / 0.006 = 45 tokens a pass.
    assert_eq!(computed(&e, prewarm), 45);
    let user = submit(&mut e, 20, 4);
    e.step();
    let got = e.running.iter().find(|s| s.id == user).expect("admitted").generated();
    assert_eq!(got, 1, "the user's prompt is done in one pass");
    // That pass: 20 user tokens, 0.03 + 20 × 0.006 = 150 ms; a tenth of it is 2 tokens' time.
    let background = computed(&e, prewarm).saturating_sub(45);
    assert!(background <= 2, "{background} pre-warm tokens rode along with the user's first token");
    // Once the user decodes, the pre-warm moves again within the pacing.
    for _ in 0..4 {
        e.step();
    }
    assert!(computed(&e, prewarm) > 47, "the pre-warm resumed: {}", computed(&e, prewarm));
}

/// Queues a request of tenant `tenant` (see [`submit`]).
fn submit_as(e: &mut Scheduler, tenant: &str, prompt: usize, max_tokens: usize) -> u64 {
    let params = GenerateParams { max_tokens, ignore_eos: true, ..Default::default() };
    let tokens = (0..prompt as u32).map(|i| (i * 11 + 5 + prompt as u32) % 300).collect();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::mem::forget(rx);
    let id = e.intake.next_id;
    e.submit(Request::new(TenantKey::new(tenant), tokens, params), tx);
    id
}

/// Tokens request `id` has produced (None once it has finished).
fn produced(e: &Scheduler, id: u64) -> Option<usize> {
    e.running.iter().find(|s| s.id == id).map(|s| s.generated())
}

/// One step with the pass cost `cost` (the fake runner's 1 ms passes would otherwise become
/// the fit).
fn step_at(e: &mut Scheduler, cost: &PassModel) {
    e.pace = cost.clone();
    e.step();
}

/// Tenant A decodes a long answer; tenant B's 8-token question arrives. Returns the engine
/// after B's admission step, A's and B's ids.
fn long_beside_short(cost: &PassModel, b_tenant: &str) -> (Scheduler, u64, u64) {
    let mut e = engine(cfg());
    let a = submit_as(&mut e, "a", 20, 1000);
    for _ in 0..3 {
        step_at(&mut e, cost);
    }
    let b = submit_as(&mut e, b_tenant, 20, 8);
    step_at(&mut e, cost);
    assert_eq!(produced(&e, b), Some(1), "B's prompt is done in its admission pass");
    (e, a, b)
}

/// Where a pass costs about its tokens (10 ms + 2 ms a token), another tenant's short request
/// runs its passes alone while the long one can wait: B's remaining 7 tokens take 7 passes and
/// A pauses (its gaps stay far within the 250 ms target); then A goes on.
#[test]
fn the_express_lane_runs_a_tenants_short_request_alone_while_the_others_can_wait() {
    let cost = pass_cost();
    let (mut e, a, b) = long_beside_short(&cost, "b");
    let paused = produced(&e, a).unwrap();
    for _ in 0..7 {
        step_at(&mut e, &cost);
    }
    assert_eq!(produced(&e, b), None, "B finished in 7 passes of its own");
    assert_eq!(produced(&e, a), Some(paused), "A waited");
    step_at(&mut e, &cost);
    assert_eq!(produced(&e, a), Some(paused + 1), "A goes on");
}

/// The lane closes for a pass once a decoder could not wait through it and the next one within
/// its inter-token target, and opens again after it.
#[test]
fn the_express_lane_closes_when_a_decoder_would_miss_its_inter_token_target() {
    let cost = pass_cost();
    let (mut e, a, b) = long_beside_short(&cost, "b");
    let paused = produced(&e, a).unwrap();
    step_at(&mut e, &cost);
    assert_eq!((produced(&e, a), produced(&e, b)), (Some(paused), Some(2)), "express");
    // 230 ms since A's last token: 230 + 12 + 14 ms > 250 ms, so A is in the next pass.
    e.clock.advance(Duration::from_millis(229));
    step_at(&mut e, &cost);
    assert_eq!((produced(&e, a), produced(&e, b)), (Some(paused + 1), Some(3)), "together");
    step_at(&mut e, &cost);
    assert_eq!((produced(&e, a), produced(&e, b)), (Some(paused + 1), Some(4)), "express again");
}

/// Within one tenant requests share passes, and where a token adds little to a pass (a GPU) the
/// lane stays closed: the long request gets a token every pass.
#[test]
fn the_express_lane_stays_closed_within_a_tenant_and_where_tokens_cost_little() {
    for (cost, tenant) in [(pass_cost(), "a"), (cost(0.010, 0.000_01), "b")] {
        let (mut e, a, b) = long_beside_short(&cost, tenant);
        let before = produced(&e, a).unwrap();
        for k in 1..=3 {
            step_at(&mut e, &cost);
            assert_eq!(produced(&e, a), Some(before + k));
            assert_eq!(produced(&e, b), Some(1 + k));
        }
    }
}

/// Another tenant's prompt that would miss its TTFT target by waiting through the lane's pass
/// gets the usual pass instead.
#[test]
fn the_express_lane_does_not_hold_a_prompt_that_must_start() {
    let cost = pass_cost();
    let (mut e, a, b) = long_beside_short(&cost, "b");
    // C waited 2.99 s of its 3 s target: it cannot wait 26 ms more.
    let c = submit_as(&mut e, "c", 20, 4);
    e.clock.advance(Duration::from_millis(2_990));
    let before = (produced(&e, a).unwrap(), produced(&e, b).unwrap());
    step_at(&mut e, &cost);
    assert_eq!(produced(&e, c), Some(1), "C was admitted and computed");
    assert_eq!((produced(&e, a), produced(&e, b)), (Some(before.0 + 1), Some(before.1 + 1)));
}

/// Speculative decoding where a token adds little to a pass: once the output repeats, the
/// drafter's guesses (the fake model always samples [`TOKEN`]) are drafted and confirmed,
/// several tokens a pass; the request still ends at its `max_tokens`, and the slots it holds
/// are exactly its computed positions.
#[test]
fn drafts_that_pay_are_planned_and_confirmed_tokens_save_passes() {
    let cost = cost(0.010, 0.000_1);
    let mut e = engine(EngineConfig { draft_tokens: 8, ..cfg() });
    let id = submit(&mut e, 20, 60);
    step_at(&mut e, &cost);
    let mut steps = 1;
    while produced(&e, id).is_some() {
        step_at(&mut e, &cost);
        steps += 1;
        if let Some(seq) = e.running.iter().find(|s| s.id == id) {
            assert_eq!(seq.slots.len(), seq.computed, "slots beyond the computed positions");
            assert_eq!(seq.computed + 1, seq.tokens.len());
        }
        assert!(steps < 60, "no draft was confirmed");
    }
    assert!(steps < 20, "{steps} steps for 60 tokens");
    let (drafted, accepted) = (e.stats.drafted_tokens, e.stats.accepted_tokens);
    assert!(accepted >= 40 && drafted >= accepted, "{steps} steps, {drafted} drafted, {accepted} confirmed");
    assert_eq!(e.kv.free() + e.kv.usage().cached, e.kv.capacity(), "slots leaked");
}

/// Where every token of a pass costs as much as a pass's fixed part and the drafter is often
/// wrong, nothing is drafted.
#[test]
fn drafts_that_do_not_pay_are_not_planned() {
    let cost = cost(0.001, 0.020);
    let mut e = engine(EngineConfig { draft_tokens: 8, ..cfg() });
    let id = submit(&mut e, 20, 30);
    step_at(&mut e, &cost);
    e.running[0].drafter.accept = 0.5;
    for _ in 0..5 {
        step_at(&mut e, &cost);
        e.running[0].drafter.accept = 0.5;
    }
    assert_eq!(e.stats.drafted_tokens, 0);
    assert_eq!(produced(&e, id), Some(6));
}

/// A tenant asking again what it asked before drafts the earlier answer (its recent answers,
/// found by the prompt's last tokens) from its first decode step on: fewer passes than cold.
#[test]
fn a_tenants_earlier_answer_drafts_its_request_that_asks_the_same() {
    let cost = cost(0.010, 0.000_1);
    let steps = |e: &mut Scheduler, tenant: &str| {
        let id = submit_as(e, tenant, 20, 60);
        step_at(e, &cost);
        let mut steps = 1;
        while produced(e, id).is_some() {
            step_at(e, &cost);
            steps += 1;
        }
        steps
    };
    let mut e = engine(EngineConfig { draft_tokens: 8, ..cfg() });
    let cold = steps(&mut e, "a");
    let accepted = e.stats.accepted_tokens;
    let again = steps(&mut e, "a");
    assert!(again < cold, "asked again: {again} passes, cold {cold}");
    assert!(e.stats.accepted_tokens - accepted > accepted, "more confirmed than cold");
    // Off, nothing is kept.
    let mut off = engine(EngineConfig { draft_tokens: 0, ..cfg() });
    steps(&mut off, "a");
    assert_eq!(off.recent.tokens(), 0);
}

/// Tenant B's copy of tenant A's answer drafts exactly as it would had A never run: drafts come
/// from the request's own text and its own tenant's answers, so B's decode speed tells B nothing
/// of what A wrote.
#[test]
fn a_tenants_drafts_never_come_from_another_tenants_text() {
    let cost = cost(0.010, 0.000_1);
    let run = |a_first: bool| {
        let mut e = engine(EngineConfig { draft_tokens: 8, ..cfg() });
        if a_first {
            let a = submit_as(&mut e, "a", 20, 60);
            step_at(&mut e, &cost);
            while produced(&e, a).is_some() {
                step_at(&mut e, &cost);
            }
            assert!(e.stats.accepted_tokens > 0, "A's answer was drafted");
        }
        let before = (e.stats.drafted_tokens, e.stats.accepted_tokens);
        // The same prompt: B's answer is a copy of A's.
        let b = submit_as(&mut e, "b", 20, 60);
        step_at(&mut e, &cost);
        let mut steps = 1;
        while produced(&e, b).is_some() {
            step_at(&mut e, &cost);
            steps += 1;
        }
        (steps, e.stats.drafted_tokens - before.0, e.stats.accepted_tokens - before.1)
    };
    assert_eq!(run(true), run(false));
}
