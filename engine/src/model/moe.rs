//! Mixture-of-experts feed-forward blocks (Qwen2-MoE, Qwen3-MoE).
//!
//! A router scores every expert for every token; each token goes through the `active` experts
//! with the highest softmax probability, and the block's output is the sum of their outputs
//! weighted by those probabilities (renormalised to sum to 1 where the model says so), plus, in
//! Qwen2-MoE, a shared expert scaled by the sigmoid of its own gate.
//!
//! Tokens are grouped by expert: each expert that any token of the pass chose runs once, as
//! an ordinary matmul over the rows routed to it, so its weights are read once per pass (a
//! grouped GEMM over the backend's own kernels) and a decode step reads only the chosen
//! experts' weights. When the pass routes few rows (decode), all its experts' projections go
//! to the backend as one [`Backend::matmul_picked`] call per stage (gate + up, then down), so
//! a step pays two parallel regions per layer rather than two per expert; a prompt pass runs
//! expert by expert through shared buffers. Either way each expert's output is the same, bit
//! for bit, and each token's expert outputs are added to the residual in expert order,
//! whatever else the pass holds, so a row's result does not depend on the batch.

use super::{ForwardScratch, Loader, Model};
use crate::config::MoeConfig;
use crate::weights::TensorName;
use crate::LoadError;
use cachet_kernels::backend::Backend;
use cachet_kernels::tensor::HostTensor;

struct Expert<B: Backend> {
    gate: B::Weight,
    up: B::Weight,
    down: B::Weight,
}

/// Qwen2-MoE's shared expert and its gate (`[1, hidden]`).
struct Shared<B: Backend> {
    expert: Expert<B>,
    gate: B::Weight,
}

/// One layer's experts.
pub(super) struct MoeFfn<B: Backend> {
    router: B::Weight,
    /// Every routed expert's gate, up and down projections, by expert.
    gates: Vec<B::Weight>,
    ups: Vec<B::Weight>,
    downs: Vec<B::Weight>,
    shared: Option<Shared<B>>,
    active: usize,
    norm_topk: bool,
}

impl<B: Backend> MoeFfn<B> {
    pub(super) fn load(ld: &mut Loader<'_, B>, l: usize, h: usize, m: &MoeConfig) -> Result<MoeFfn<B>, LoadError> {
        use TensorName::*;
        let (n, ff) = (m.experts, m.expert_ff);
        let router = ld.get(Router(l), &[n, h])?;
        let gates = stack(ld, GateExps(l), |e| ExpertGate(l, e), m, &[ff, h])?;
        let ups = stack(ld, UpExps(l), |e| ExpertUp(l, e), m, &[ff, h])?;
        let downs = stack(ld, DownExps(l), |e| ExpertDown(l, e), m, &[h, ff])?;
        let shared = match m.shared_ff {
            Some(sf) => Some(Shared {
                expert: Expert {
                    gate: ld.get(SharedGate(l), &[sf, h])?,
                    up: ld.get(SharedUp(l), &[sf, h])?,
                    down: ld.get(SharedDown(l), &[h, sf])?,
                },
                gate: ld.get(SharedRouter(l), &[h])?,
            }),
            None => None,
        };
        Ok(MoeFfn { router, gates, ups, downs, shared, active: m.active, norm_topk: m.norm_topk })
    }
}

/// Every expert's matrix `shape` of one kind: from the file's stack of them (`merged`, as
/// llama.cpp writes them; each expert's matrix is contiguous there, so each is a window of the
/// mapped file) or from one tensor per expert (Hugging Face checkpoints). A decode step reads
/// `active` of them: that share counts in the step's bytes.
fn stack<B: Backend>(
    ld: &mut Loader<'_, B>,
    merged: TensorName,
    one: impl Fn(usize) -> TensorName,
    m: &MoeConfig,
    shape: &[usize],
) -> Result<Vec<B::Weight>, LoadError> {
    let n = m.experts;
    let parts: Vec<(TensorName, HostTensor)> = match ld.src.get(merged)? {
        Some(t) => {
            let expected: Vec<usize> = [n].iter().chain(shape).copied().collect();
            if t.shape != expected {
                return Err(LoadError::Shape { name: ld.src.file_name(merged), expected, found: t.shape });
            }
            let bad = |e: cachet_kernels::quant::QuantError| LoadError::BadFile {
                path: ld.src.file_name(merged),
                reason: e.to_string(),
            };
            t.split_outer().map_err(bad)?.into_iter().enumerate().map(|(e, t)| (one(e), t)).collect()
        }
        None if ld.src.get(one(0))?.is_none() => {
            return Err(LoadError::MissingTensor(format!(
                "{} (or {})",
                ld.src.file_name(merged),
                ld.src.file_name(one(0))
            )))
        }
        None => (0..n).map(|e| Ok((one(e), ld.host(one(e))?))).collect::<Result<_, LoadError>>()?,
    };
    let bytes: usize = parts.iter().map(|(_, t)| t.bytes.len()).sum();
    let read = bytes / n * m.active;
    ld.step_bytes += read;
    ld.expert_bytes = (ld.expert_bytes.0 + bytes, ld.expert_bytes.1 + read);
    parts.into_iter().map(|(name, t)| ld.upload(name, t, shape)).collect()
}

/// Which rows of the pass go to which expert, with what weight (kept between passes).
#[derive(Debug, Default)]
pub(super) struct Routing {
    /// The router's output (or the shared expert's gate) on the host.
    logits: Vec<f32>,
    probs: Vec<f32>,
    rows: Vec<Vec<usize>>,
    weights: Vec<Vec<f32>>,
    all_rows: Vec<usize>,
    scales: Vec<f32>,
    /// The experts with rows in this pass, ascending.
    picked: Vec<usize>,
}

/// Routed rows of [`FUSED_ROWS`] or fewer (a pass's rows × active experts) take the fused path.
const FUSED_ROWS: usize = 256;

/// Per-expert buffers of the fused path: slot `i` holds the `i`th picked expert's rows.
pub(super) struct ExpertBufs<B: Backend> {
    routed: Vec<B::Buf>,
    gate: Vec<B::Buf>,
    up: Vec<B::Buf>,
    out: Vec<B::Buf>,
}

impl<B: Backend> Default for ExpertBufs<B> {
    fn default() -> Self {
        ExpertBufs { routed: Vec::new(), gate: Vec::new(), up: Vec::new(), out: Vec::new() }
    }
}

impl<B: Backend> ExpertBufs<B> {
    /// At least `n` slots (they are kept, so a steady decode does not allocate).
    fn reserve(&mut self, b: &B, n: usize) {
        for v in [&mut self.routed, &mut self.gate, &mut self.up, &mut self.out] {
            while v.len() < n {
                v.push(b.buf());
            }
        }
    }
}

impl Routing {
    /// Routes `n` rows of `experts` logits each to their `active` best experts.
    fn route(&mut self, n: usize, experts: usize, active: usize, norm_topk: bool) {
        self.rows.resize_with(experts, Vec::new);
        self.weights.resize_with(experts, Vec::new);
        self.rows.iter_mut().for_each(Vec::clear);
        self.weights.iter_mut().for_each(Vec::clear);
        for (row, logits) in self.logits.chunks_exact(experts).take(n).enumerate() {
            // Softmax over every expert, as the models were trained.
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            self.probs.clear();
            self.probs.extend(logits.iter().map(|&v| (v - max).exp()));
            let sum: f32 = self.probs.iter().sum();
            self.probs.iter_mut().for_each(|p| *p /= sum);
            // The `active` most probable (ties to the lower index), each once; NaN (from
            // non-finite scores) never wins over a number.
            let mut total = 0.0f32;
            for _ in 0..active {
                let mut best: Option<usize> = None;
                for (e, &p) in self.probs.iter().enumerate() {
                    if self.rows[e].last() == Some(&row) {
                        continue;
                    }
                    if best.is_none_or(|b| p > self.probs[b] || (self.probs[b].is_nan() && !p.is_nan())) {
                        best = Some(e);
                    }
                }
                let best = best.expect("active ≤ experts (checked when the config is read)");
                let p = self.probs[best];
                total += p;
                self.rows[best].push(row);
                self.weights[best].push(p);
            }
            if norm_topk && total > 0.0 {
                for (rows, weights) in self.rows.iter().zip(&mut self.weights) {
                    if rows.last() == Some(&row) {
                        *weights.last_mut().expect("one weight per row") /= total;
                    }
                }
            }
        }
    }
}

impl<B: Backend> Model<B> {
    /// Adds layer `m`'s output for the normalised rows `s.h` to the residual `s.x`.
    pub(super) fn moe_ffn(&self, b: &B, m: &MoeFfn<B>, s: &mut ForwardScratch<B>) {
        let n = b.buf_shape(&s.h).0;
        let r = &mut s.routing;
        b.matmul(&s.h, &mut [(&m.router, &mut s.router)]);
        b.download(&s.router, &mut r.logits);
        r.route(n, m.gates.len(), m.active, m.norm_topk);
        r.picked.clear();
        r.picked.extend((0..m.gates.len()).filter(|&e| !r.rows[e].is_empty()));
        if n * m.active <= FUSED_ROWS {
            let bufs = &mut s.experts;
            bufs.reserve(b, r.picked.len());
            for (slot, &e) in r.picked.iter().enumerate() {
                b.gather_rows(&s.h, &r.rows[e], &mut bufs.routed[slot]);
            }
            b.matmul_picked(&bufs.routed, &r.picked, &mut [(&m.gates, &mut bufs.gate), (&m.ups, &mut bufs.up)]);
            for (gate, up) in bufs.gate.iter_mut().zip(&bufs.up).take(r.picked.len()) {
                b.silu_mul(gate, up);
            }
            b.matmul_picked(&bufs.gate, &r.picked, &mut [(&m.downs, &mut bufs.out)]);
            for (out, &e) in bufs.out.iter().zip(&r.picked) {
                b.add_rows_scaled(&mut s.x, out, &r.rows[e], &r.weights[e]);
            }
        } else {
            for &e in &r.picked {
                b.gather_rows(&s.h, &r.rows[e], &mut s.routed);
                run_expert(b, [&m.gates[e], &m.ups[e], &m.downs[e]], &s.routed, &mut s.gate, &mut s.up, &mut s.o);
                b.add_rows_scaled(&mut s.x, &s.o, &r.rows[e], &r.weights[e]);
            }
        }
        if let Some(shared) = &m.shared {
            b.matmul(&s.h, &mut [(&shared.gate, &mut s.router)]);
            b.download(&s.router, &mut r.logits);
            r.scales.clear();
            r.scales.extend(r.logits.iter().map(|&g| 1.0 / (1.0 + (-g).exp())));
            r.all_rows.clear();
            r.all_rows.extend(0..n);
            let e = &shared.expert;
            run_expert(b, [&e.gate, &e.up, &e.down], &s.h, &mut s.gate, &mut s.up, &mut s.o);
            b.add_rows_scaled(&mut s.x, &s.o, &r.all_rows, &r.scales);
        }
    }
}

/// `out = down(silu(gate(x)) · up(x))`.
fn run_expert<B: Backend>(
    b: &B,
    [gate_w, up_w, down_w]: [&B::Weight; 3],
    x: &B::Buf,
    gate: &mut B::Buf,
    up: &mut B::Buf,
    out: &mut B::Buf,
) {
    b.matmul(x, &mut [(gate_w, &mut *gate), (up_w, &mut *up)]);
    b.silu_mul(gate, up);
    b.matmul(gate, &mut [(down_w, out)]);
}

#[cfg(test)]
mod tests {
    use super::Routing;

    #[test]
    fn routing_picks_the_most_probable_experts_and_renormalises() {
        let mut r = Routing { logits: vec![0.0, 2.0, 1.0, 2.0, /* row 1 */ 5.0, -1.0, 0.0, 0.5], ..Default::default() };
        r.route(2, 4, 2, false);
        // Row 0: experts 1 and 3 tie at the top; row 1: experts 0 and 3.
        assert_eq!(r.rows, vec![vec![1], vec![0], vec![], vec![0, 1]]);
        let p0 = 2f32.exp() / (1.0 + 2.0 * 2f32.exp() + 1f32.exp());
        assert!((r.weights[1][0] - p0).abs() < 1e-6 && (r.weights[3][0] - p0).abs() < 1e-6);
        r.route(2, 4, 2, true);
        assert!((r.weights[1][0] - 0.5).abs() < 1e-6, "{:?}", r.weights);
        let (a, d) = (r.weights[0][0], r.weights[3][1]);
        assert!((a + d - 1.0).abs() < 1e-6 && a > d, "{a} {d}");
    }

    /// Non-finite scores (a corrupt file) still route each row to `active` distinct experts:
    /// `add_rows_scaled` needs distinct rows per expert.
    #[test]
    fn non_finite_scores_still_route_to_distinct_experts() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut r = Routing { logits: vec![bad, 1.0, bad, 0.5, bad, bad, bad, bad], ..Default::default() };
            r.route(2, 4, 3, true);
            for row in 0..2 {
                let n = r.rows.iter().filter(|rows| rows.contains(&row)).count();
                assert_eq!(n, 3, "{bad}: row {row} in {:?}", r.rows);
            }
            assert!(r.rows.iter().all(|rows| rows.windows(2).all(|w| w[0] < w[1])), "{:?}", r.rows);
        }
    }
}
