//! One batched forward pass over ragged sequences: prefill chunks and decode
//! tokens of several sequences go through every matmul together, and each
//! sequence attends over its own slots.

use super::{Ffn, Model};
use crate::EngineError;
use cachet_kernels::backend::{AttnSeq, AttnShape, Backend};

/// Which positions of a sequence chunk need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// None (a prefill chunk that is not the last).
    None,
    /// The last token of the chunk (the usual case).
    Last,
    /// Every token of the chunk (scoring, tests).
    All,
}

/// New tokens of one sequence.
#[derive(Clone, Debug)]
pub struct SeqChunk<'a> {
    /// Tokens to run, at positions `start_pos..start_pos + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; positions before it must already hold K/V.
    pub start_pos: usize,
    /// The KV slot of every position `0..start_pos + tokens.len()`.
    pub slots: &'a [u32],
    pub logits: LogitsFor,
}

/// Activation buffers, kept between passes so steady-state decoding does not
/// allocate.
pub struct ForwardScratch<B: Backend> {
    pub(super) x: B::Buf,
    pub(super) h: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    pub(super) o: B::Buf,
    pub(super) gate: B::Buf,
    pub(super) up: B::Buf,
    rope: B::Buf,
    last: B::Buf,
    logits: B::Buf,
    /// Mixture-of-experts layers: the router's scores, the rows routed to one expert, and each
    /// picked expert's buffers on the fused path.
    pub(super) router: B::Buf,
    pub(super) routed: B::Buf,
    pub(super) experts: super::moe::ExpertBufs<B>,
    pub(super) routing: super::moe::Routing,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    store_slots: Vec<u32>,
    logit_rows: Vec<usize>,
    /// Every sequence's slots, concatenated, and each one's part of them.
    all_slots: Vec<u32>,
    attn_seqs: Vec<AttnSeq>,
}

impl<B: Backend> std::fmt::Debug for ForwardScratch<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardScratch").finish_non_exhaustive()
    }
}

impl<B: Backend> ForwardScratch<B> {
    pub fn new(b: &B) -> ForwardScratch<B> {
        ForwardScratch {
            x: b.buf(),
            h: b.buf(),
            q: b.buf(),
            k: b.buf(),
            v: b.buf(),
            attn: b.buf(),
            o: b.buf(),
            gate: b.buf(),
            up: b.buf(),
            rope: b.buf(),
            last: b.buf(),
            logits: b.buf(),
            router: b.buf(),
            routed: b.buf(),
            experts: Default::default(),
            routing: Default::default(),
            tokens: Vec::new(),
            positions: Vec::new(),
            store_slots: Vec::new(),
            logit_rows: Vec::new(),
            all_slots: Vec::new(),
            attn_seqs: Vec::new(),
        }
    }
}

/// Reserves room for `extra` more elements, at least doubling and never
/// below 4096, so a sequence growing one token per step reallocates a few
/// times over its life rather than at every small power of two.
fn grow<T>(v: &mut Vec<T>, extra: usize) {
    let need = v.len() + extra;
    if need > v.capacity() {
        v.reserve(need.max(2 * v.capacity()).max(4096) - v.len());
    }
}

impl<B: Backend> Model<B> {
    /// Runs one batch (`seqs`, each a chunk of one sequence), storing each new
    /// token's K/V in its slot of `kv`, and writes into `logits` one row of
    /// `vocab_size` values per requested position, in batch order. Once the
    /// scratch buffers have grown to the batch's size, a pass allocates nothing.
    pub fn forward(
        &self,
        b: &B,
        kv: &mut B::Kv,
        seqs: &[SeqChunk<'_>],
        s: &mut ForwardScratch<B>,
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.prepare(seqs, s)?;
        b.scope(|| self.run(b, kv, s))?;
        b.download(&s.logits, logits);
        Ok(())
    }

    /// Checks the batch and flattens its tokens, positions and new slots.
    fn prepare(&self, seqs: &[SeqChunk<'_>], s: &mut ForwardScratch<B>) -> Result<(), EngineError> {
        let c = &self.config;
        s.tokens.clear();
        s.positions.clear();
        s.store_slots.clear();
        s.logit_rows.clear();
        s.all_slots.clear();
        s.attn_seqs.clear();
        for (i, seq) in seqs.iter().enumerate() {
            let end = seq.start_pos + seq.tokens.len();
            if seq.tokens.is_empty() {
                return Err(EngineError::BadBatch(format!("sequence {i} has no tokens")));
            }
            if seq.slots.len() != end {
                return Err(EngineError::BadBatch(format!(
                    "sequence {i} has {} slots for {end} positions",
                    seq.slots.len()
                )));
            }
            if end > c.max_context {
                return Err(EngineError::ContextTooLong { tokens: end, limit: c.max_context });
            }
            if let Some(&t) = seq.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(EngineError::TokenOutOfRange { token: t, vocab: c.vocab_size });
            }
            let row0 = s.tokens.len();
            let slot0 = s.all_slots.len();
            grow(&mut s.all_slots, seq.slots.len());
            s.all_slots.extend_from_slice(seq.slots);
            s.attn_seqs.push(AttnSeq {
                rows: row0..row0 + seq.tokens.len(),
                first_pos: seq.start_pos,
                slots: slot0..s.all_slots.len(),
            });
            s.tokens.extend_from_slice(seq.tokens);
            s.positions.extend((seq.start_pos..end).map(|p| p as u32));
            s.store_slots.extend_from_slice(&seq.slots[seq.start_pos..]);
            match seq.logits {
                LogitsFor::None => {}
                LogitsFor::Last => s.logit_rows.push(s.tokens.len() - 1),
                LogitsFor::All => s.logit_rows.extend(row0..s.tokens.len()),
            }
        }
        Ok(())
    }

    fn run(&self, b: &B, kv: &mut B::Kv, s: &mut ForwardScratch<B>) -> Result<(), EngineError> {
        let c = &self.config;
        let rope = c.rope();
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        b.embed(&self.embed, &s.tokens, &mut s.x)?;
        b.rope_table(&s.positions, &rope, &mut s.rope);
        let last_layer = self.layers.len().saturating_sub(1);
        // Whether `s.x` holds only the rows that want logits (in `logit_rows` order).
        let mut pruned = false;
        for (l, layer) in self.layers.iter().enumerate() {
            b.rms_norm(&s.x, &layer.attn_norm, c.rms_eps, &mut s.h);
            b.matmul(&s.h, &mut [(&layer.wq, &mut s.q), (&layer.wk, &mut s.k), (&layer.wv, &mut s.v)]);
            if let Some([bq, bk, bv]) = &layer.bias {
                b.add_bias(&mut s.q, bq);
                b.add_bias(&mut s.k, bk);
                b.add_bias(&mut s.v, bv);
            }
            if let Some([nq, nk]) = &layer.qk_norm {
                b.rms_norm_heads(&mut s.q, nq, c.rms_eps, c.head_dim);
                b.rms_norm_heads(&mut s.k, nk, c.rms_eps, c.head_dim);
            }
            b.rope(&mut s.q, &s.rope, &rope);
            b.rope(&mut s.k, &s.rope, &rope);
            b.kv_store(kv, l, &s.k, &s.v, &s.store_slots);
            b.attention(&s.q, kv, l, &s.attn_seqs, &s.all_slots, &shape, &mut s.attn);
            b.matmul(&s.attn, &mut [(&layer.wo, &mut s.o)]);
            b.add(&mut s.x, &s.o);

            // The last layer's feed-forward block only for the rows whose logits are wanted:
            // every row's K/V is stored above and nothing else reads the other rows (llama.cpp
            // does the same). A prompt chunk with no logits skips the block; a whole prompt
            // saves one layer's feed-forward work (for a mixture of experts, one layer's
            // experts), and each kept row's result is the same as without the pruning.
            if l == last_layer && s.logit_rows.len() < s.tokens.len() {
                if s.logit_rows.is_empty() {
                    break;
                }
                b.gather_rows(&s.x, &s.logit_rows, &mut s.last);
                std::mem::swap(&mut s.x, &mut s.last);
                pruned = true;
            }

            b.rms_norm(&s.x, &layer.ffn_norm, c.rms_eps, &mut s.h);
            match &layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    b.matmul(&s.h, &mut [(gate, &mut s.gate), (up, &mut s.up)]);
                    b.silu_mul(&mut s.gate, &s.up);
                    b.matmul(&s.gate, &mut [(down, &mut s.o)]);
                    b.add(&mut s.x, &s.o);
                }
                Ffn::Moe(m) => self.moe_ffn(b, m, s),
            }
        }
        if pruned {
            b.rms_norm(&s.x, &self.norm, c.rms_eps, &mut s.h);
        } else {
            b.gather_rows(&s.x, &s.logit_rows, &mut s.last);
            b.rms_norm(&s.last, &self.norm, c.rms_eps, &mut s.h);
        }
        if s.logit_rows.is_empty() {
            b.resize(&mut s.logits, 0, c.vocab_size);
        } else {
            b.matmul(&s.h, &mut [(self.output(), &mut s.logits)]);
        }
        Ok(())
    }
}
