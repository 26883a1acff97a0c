//! The model side of a step: one forward pass over the planned chunks, the grammar masks of the
//! sequences that sample computed on another thread beside it, and a token sampled for each of
//! them. Owns the backend, the model, the K/V storage and the forward buffers; knows nothing of
//! queues, tenants or the prefix cache (that is the [`super::Scheduler`]'s).

use super::kv::KvError;
use super::masks;
use super::plan::Planned;
use super::request::RequestError;
use super::seq::Seq;
use crate::kv_pool::SlotId;
use crate::model::{ForwardScratch, LogitsFor, Model, SeqChunk};
use crate::sampler::TokenLogprobs;
use crate::EngineError;
use cachet_kernels::backend::Backend;
use std::time::Instant;

/// A sampled token and, if the request asked, its log-probabilities.
pub(super) type Sampled = Result<(u32, Option<Box<TokenLogprobs>>), RequestError>;

/// What one pass gave the scheduler.
pub(super) struct Ran {
    /// Per planned chunk, its sequence's index in `running` (the runner leaves the order as it is).
    pub index: Vec<usize>,
    /// Seconds the forward pass took.
    pub secs: f64,
    /// Why the forward pass failed (every planned sequence fails with it).
    pub failed: Option<String>,
    /// Per planned chunk, in plan order: the tokens it sampled (none for a chunk without logits
    /// or of a pre-warm; one, or with a draft one per position up to the first that differs
    /// from the draft: the tokens decoding one at a time would have given).
    pub sampled: Vec<Vec<Sampled>>,
    /// How the grammar masks went, when some sequence was constrained.
    pub grammar: Option<masks::Timing>,
}

pub(super) struct Runner<B: Backend> {
    backend: B,
    model: Model<B>,
    kv: B::Kv,
    /// 16-bit units of a stored K (or V) row (the pool's format).
    row_units: usize,
    scratch: ForwardScratch<B>,
    logits: Vec<f32>,
}

impl<B: Backend> Runner<B> {
    pub fn new(backend: B, model: Model<B>, kv: B::Kv, layout: cachet_kernels::backend::KvLayout) -> Runner<B> {
        let scratch = ForwardScratch::new(&backend);
        Runner { backend, model, kv, row_units: layout.row_units(), scratch, logits: Vec::new() }
    }

    /// One forward pass (the logits stay in the runner).
    pub fn forward(&mut self, chunks: &[SeqChunk<'_>]) -> Result<(), EngineError> {
        self.model.forward(&self.backend, &mut self.kv, chunks, &mut self.scratch, &mut self.logits)
    }

    /// Copies the K/V rows of `slots` out of the pool: 16-bit units per row, and per layer K's
    /// rows then V's rows as stored (a [`crate::kv_transfer::KvRecord`]'s layout).
    pub fn export(&self, slots: &[u32]) -> Result<(u32, Vec<Vec<u16>>), KvError> {
        let c = self.model.config();
        let layers = (0..c.n_layers)
            .map(|l| {
                let mut rows = Vec::new();
                self.backend.kv_export(&self.kv, l, slots, &mut rows).map(|()| rows)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| KvError::Rows(e.to_string()))?;
        Ok((self.row_units as u32, layers))
    }

    /// Writes `record`'s rows from row `skip` on into `slots` (one slot per row).
    pub fn import(&mut self, slots: &[u32], record: &crate::kv_transfer::KvRecord, skip: usize) -> Result<(), KvError> {
        let c = self.model.config();
        let cols = self.row_units;
        let n = record.tokens.len();
        if record.kv_cols as usize != cols || record.layers.len() != c.n_layers || skip + slots.len() != n {
            return Err(KvError::Rows(format!(
                "a chunk of {n} rows × {} units in {} layers does not fit {} slots after {skip} of a model of {cols} \
                 units in {} layers",
                record.kv_cols,
                record.layers.len(),
                slots.len(),
                c.n_layers
            )));
        }
        let mut rows = Vec::with_capacity(2 * slots.len() * cols);
        for (l, layer) in record.layers.iter().enumerate() {
            rows.clear();
            rows.extend_from_slice(&layer[skip * cols..n * cols]);
            rows.extend_from_slice(&layer[(n + skip) * cols..2 * n * cols]);
            self.backend.kv_import(&mut self.kv, l, slots, &rows).map_err(|e| KvError::Rows(e.to_string()))?;
        }
        Ok(())
    }

    /// Runs `plan` over the `running` sequences it names: the forward pass, then a token for each
    /// chunk that samples (the sequences' samplers and grammars advance; their tokens, computed
    /// positions and accounting are the scheduler's to update).
    pub fn run(&mut self, plan: &[Planned], running: &mut [Seq]) -> Ran {
        let index: Vec<usize> =
            plan.iter().map(|p| running.iter().position(|s| s.id == p.seq).expect("planned")).collect();
        // Grammars: the masks of the sequences that sample this step are computed on another
        // thread while the forward pass runs; the step waits only for what is not ready.
        let mut constrained = masks::take(plan, &index, running);
        // A drafted chunk runs the sequence's last token then its draft, with logits at each.
        let drafted: Vec<Vec<u32>> = plan
            .iter()
            .zip(&index)
            .map(|(p, &i)| {
                let s = &running[i];
                if p.draft == 0 {
                    return Vec::new();
                }
                std::iter::once(s.tokens[s.computed]).chain(s.draft.iter().copied()).collect()
            })
            .collect();
        let chunks: Vec<SeqChunk<'_>> = plan
            .iter()
            .zip(&index)
            .zip(&drafted)
            .map(|((p, &i), drafted)| {
                let s = &running[i];
                SeqChunk {
                    tokens: if p.draft > 0 { drafted } else { &s.tokens[s.computed..s.computed + p.len] },
                    start_pos: s.computed,
                    slots: SlotId::raw(&s.slots[..s.computed + p.len]),
                    logits: match (p.logits, p.draft) {
                        (false, _) => LogitsFor::None,
                        (true, 0) => LogitsFor::Last,
                        (true, _) => LogitsFor::All,
                    },
                }
            })
            .collect();
        let start = Instant::now();
        let (backend, model, kv, scratch, logits) =
            (&self.backend, &self.model, &mut self.kv, &mut self.scratch, &mut self.logits);
        let (result, computed) = std::thread::scope(|scope| {
            let job = (!constrained.is_empty()).then(|| scope.spawn(|| masks::compute(&mut constrained)));
            let result = model.forward(backend, kv, &chunks, scratch, logits);
            (result, masks::join(job, Instant::now()))
        });
        let secs = start.elapsed().as_secs_f64();
        drop(chunks);
        let (mut masks, grammar) = masks::give_back(running, constrained, computed);
        let mut sampled: Vec<Vec<Sampled>> = Vec::with_capacity(plan.len());
        if let Err(e) = result {
            return Ran { index, secs, failed: Some(e.to_string()), sampled, grammar };
        }
        let vocab = self.model.config().vocab_size;
        let mut row = 0;
        for (p, &i) in plan.iter().zip(&index) {
            if !p.logits {
                sampled.push(Vec::new());
                continue;
            }
            let rows = 1 + p.draft;
            let first = row;
            row += rows;
            let seq = &mut running[i];
            if seq.req.prewarm {
                sampled.push(Vec::new());
                continue;
            }
            // Position by position, as decoding one token at a time would (the sampler's
            // penalties and random draws advance with each token): the drafted token at a
            // position is kept only if it is the token sampled there.
            // The first position's grammar mask was computed beside the pass; a later position's is
            // computed here, from the grammar's state after the tokens before it.
            let mut mask = masks.remove(&seq.id);
            let mut got = Vec::with_capacity(rows);
            for j in 0..rows {
                let logits = &mut self.logits[(first + j) * vocab..(first + j + 1) * vocab];
                if j > 0 {
                    mask = seq.constraint.as_mut().map(|c| c.mask());
                }
                let token = masks::sample(seq, logits, mask.take());
                // Past a token that ends the output — its grammar complete, an end-of-sequence or
                // stop id — decoding one at a time would sample nothing more.
                let ends = |t: u32| seq.constraint.as_ref().is_some_and(|c| c.finished()) || seq.output.stops_at(t);
                let more = matches!(&token, Ok((t, _)) if j < p.draft && *t == seq.draft[j] && !ends(*t));
                got.push(token);
                if !more {
                    break;
                }
            }
            sampled.push(got);
        }
        Ran { index, secs, failed: None, sampled, grammar }
    }
}
