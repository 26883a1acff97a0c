//! Grammars within a step: the constraints of the sequences that sample are
//! taken out of them, their masks computed on another thread while the forward
//! pass runs, and given back with the masks; sampling then masks the logits
//! first and feeds the grammar the token it picked.

use super::plan::Planned;
use super::request::RequestError;
use super::seq::Seq;
use super::Scheduler;
use crate::constraint::Constraint;
use crate::sampler::{log_softmax_top, TokenLogprobs};
use llguidance::toktrie::SimpleVob;
use std::collections::HashMap;
use std::time::Instant;

/// A sequence's mask, or why the grammar could not give one.
pub(super) type Mask = Result<SimpleVob, crate::constraint::MatchError>;

/// The masks of a step, computed beside its forward pass.
pub(super) struct Computed {
    masks: Vec<Mask>,
    /// Time computing them, and time the step waited for them after its forward pass.
    secs: f64,
    wait: f64,
}

/// Computes the masks of `constrained` in order (run beside the forward pass).
pub(super) fn compute(constrained: &mut [(u64, Constraint)]) -> (Vec<Mask>, f64) {
    let t = Instant::now();
    let masks = constrained.iter_mut().map(|(_, c)| c.mask()).collect();
    (masks, t.elapsed().as_secs_f64())
}

/// Waits for the mask thread; `forward_done` is when the forward pass ended.
pub(super) fn join(
    job: Option<std::thread::ScopedJoinHandle<'_, (Vec<Mask>, f64)>>,
    forward_done: Instant,
) -> Option<Computed> {
    let (masks, secs) = job?.join().unwrap_or_else(|_| (Vec::new(), 0.0));
    Some(Computed { masks, secs, wait: forward_done.elapsed().as_secs_f64() })
}

/// How a step's masks went: how many, the time computing them (beside the forward pass), and
/// the time the step waited for them after its forward pass.
pub(super) struct Timing {
    pub masks: usize,
    pub secs: f64,
    pub wait: f64,
}

/// Takes the constraints of the planned sequences that sample this step (`index`: each planned
/// chunk's sequence in `running`).
pub(super) fn take(plan: &[Planned], index: &[usize], running: &mut [Seq]) -> Vec<(u64, Constraint)> {
    plan.iter()
        .zip(index)
        .filter(|(p, _)| p.logits)
        .filter_map(|(p, &i)| running[i].constraint.take().map(|c| (p.seq, c)))
        .collect()
}

/// Gives the constraints back to their sequences; returns their masks by sequence id, and how
/// computing them went.
pub(super) fn give_back(
    running: &mut [Seq],
    constrained: Vec<(u64, Constraint)>,
    computed: Option<Computed>,
) -> (HashMap<u64, Mask>, Option<Timing>) {
    let mut computed_masks = Vec::new().into_iter();
    let mut timing = None;
    if let Some(c) = computed {
        timing = Some(Timing { masks: c.masks.len(), secs: c.secs, wait: c.wait });
        computed_masks = c.masks.into_iter();
    }
    let mut masks = HashMap::with_capacity(constrained.len());
    for (id, c) in constrained {
        let i = running.iter().position(|s| s.id == id).expect("planned sequences are running");
        running[i].constraint = Some(c);
        masks.insert(
            id,
            computed_masks
                .next()
                .unwrap_or_else(|| Err(crate::constraint::MatchError("the grammar engine failed".into()))),
        );
    }
    (masks, timing)
}

impl Scheduler {
    /// Counts a step's grammar work.
    pub(super) fn record_grammar(&mut self, t: &Timing) {
        metrics::histogram!("cachet:grammar_mask_seconds").record(t.secs);
        metrics::histogram!("cachet:grammar_mask_wait_seconds").record(t.wait);
        self.stats.grammar_steps += 1;
        self.stats.grammar_masks += t.masks as u64;
        self.stats.grammar_mask_seconds += t.secs;
        self.stats.grammar_wait_seconds += t.wait;
    }
}

/// Picks `seq`'s next token from `logits`: the grammar's mask first (so penalties and
/// temperature only see allowed tokens), then the sampler; the grammar takes the token.
pub(super) fn sample(
    seq: &mut Seq,
    logits: &mut [f32],
    mask: Option<Mask>,
) -> Result<(u32, Option<Box<TokenLogprobs>>), RequestError> {
    // Bias and penalties, then the log-probabilities (if asked), then the mask: the
    // mask leaves the allowed tokens' logits as they were, so the order does not
    // change which token is drawn.
    seq.sampler.adjust(logits);
    let top = seq.req.params.logprobs.map(|n| log_softmax_top(logits, n));
    if let Some(mask) = mask {
        let allowed = match (&mask, &seq.constraint) {
            (Ok(m), Some(c)) => c.apply(m, logits),
            _ => false,
        };
        if !allowed {
            let why = mask.err().map_or_else(|| "the grammar allows no token here".into(), |e| e.0);
            return Err(RequestError::Grammar(why));
        }
    }
    let token = seq.sampler.pick(logits);
    if let Some(c) = &mut seq.constraint {
        c.commit(token).map_err(|e| RequestError::Grammar(e.0))?;
    }
    let logprobs = top.map(|(lse, top)| {
        let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| l - lse);
        Box::new(TokenLogprobs { logprob, top })
    });
    Ok((token, logprobs))
}
