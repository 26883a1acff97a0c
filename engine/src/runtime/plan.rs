//! What a step runs: the scheduler's plan, chunk by chunk, as the runner and the grammar masks
//! read it (its own module, so that the scheduler's step, the runner and the masks depend on it
//! and not on each other).

/// One planned chunk: `len` tokens of running sequence `seq` (by id); `logits`: it samples.
/// A decoding sequence's chunk may carry `draft` drafted tokens after its last one (speculative
/// decoding, the sequence's `draft`): `len` is then `1 + draft`, with logits at every position.
pub(super) struct Planned {
    pub seq: u64,
    pub len: usize,
    pub logits: bool,
    pub draft: usize,
}
