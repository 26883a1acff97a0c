//! Quantized matrix multiplication on the CPU: `out[t][n] = Σ_k x[t][k] · w[n][k]`.
//!
//! Activations are quantized once per call (per distinct dot-product format),
//! weights stay in their file format, and each output element is one call of
//! the level's row dot product — the same call whatever the batch, so a row's
//! result does not depend on what else is in the batch.

use super::dot::Kernels;
use crate::quant::*;
use crate::tensor::HostTensor;
use half::{bf16, f16};
use rayon::prelude::*;

/// Reusable activation buffers (no allocation per call once warm).
#[derive(Debug, Default)]
pub struct MatmulScratch {
    q8a: Vec<BlockQ8A>,
    q8k: Vec<BlockQ8K>,
}

/// Which activation form a weight format's dot product takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ActForm {
    F32,
    Q8A,
    Q8K,
}

fn act_form(dtype: DType) -> ActForm {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => ActForm::F32,
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => ActForm::Q8A,
        DType::Q4_K | DType::Q5_K | DType::Q6_K => ActForm::Q8K,
    }
}

/// Output pointer shared by the tasks; each task writes a disjoint set of
/// columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements and the buffer outlives the parallel scope.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Tokens per tile: a tile's activations stay in L2 while a weight row is reused.
const TOKEN_TILE: usize = 64;

fn run<W: Block, A: Sync>(w: &[W], x: &[A], t: usize, n: usize, out: &mut [f32], dot: fn(&[W], &[A]) -> f32) {
    let wpr = w.len() / n;
    let apr = x.len() / t;
    let threads = rayon::current_num_threads().max(1);
    let rows_per_task = (n / (threads * 4)).clamp(4, 256);
    let tasks = n.div_ceil(rows_per_task);
    let ptr = OutPtr(out.as_mut_ptr());
    (0..tasks).into_par_iter().for_each(|task| {
        let rows = task * rows_per_task..((task + 1) * rows_per_task).min(n);
        for t0 in (0..t).step_by(TOKEN_TILE) {
            for r in rows.clone() {
                let wr = &w[r * wpr..(r + 1) * wpr];
                for ti in t0..(t0 + TOKEN_TILE).min(t) {
                    let v = dot(wr, &x[ti * apr..(ti + 1) * apr]);
                    // SAFETY: ti < t and r < n, so the index is in bounds; no
                    // other task writes column r.
                    unsafe { *ptr.get().add(ti * n + r) = v };
                }
            }
        }
    });
}

/// The blocks of a weight. `HostTensor::new` checked length and alignment.
fn view<T: Block>(bytes: &[u8]) -> &[T] {
    cast_blocks(bytes).expect("weight bytes are validated when the tensor is made")
}

/// A weight matrix ready for the CPU kernels.
#[derive(Debug)]
pub struct CpuMatrix {
    pub(crate) tensor: HostTensor,
}

impl CpuMatrix {
    pub(crate) fn rows(&self) -> usize {
        self.tensor.rows()
    }
    pub(crate) fn cols(&self) -> usize {
        self.tensor.cols()
    }
}

/// `x` is `t × k` f32, each `out` is `t × rows(w)`; all weights share `x`.
pub fn matmul_many(
    kernels: &Kernels,
    x: &[f32],
    t: usize,
    jobs: &mut [(&CpuMatrix, &mut [f32])],
    s: &mut MatmulScratch,
) {
    if t == 0 {
        return;
    }
    let k = x.len() / t;
    let forms: Vec<ActForm> = jobs.iter().map(|(w, _)| act_form(w.tensor.dtype)).collect();
    if forms.contains(&ActForm::Q8A) {
        s.q8a.resize(t * k / 32, BlockQ8A::default());
        x.par_chunks(k).zip(s.q8a.par_chunks_mut(k / 32)).for_each(|(xr, qr)| quantize_q8a(xr, qr));
    }
    if forms.contains(&ActForm::Q8K) {
        s.q8k.resize(t * k / 256, BlockQ8K::default());
        x.par_chunks(k).zip(s.q8k.par_chunks_mut(k / 256)).for_each(|(xr, qr)| quantize_q8k(xr, qr));
    }
    for (w, out) in jobs.iter_mut() {
        debug_assert_eq!(w.cols(), k);
        debug_assert_eq!(out.len(), t * w.rows());
        let n = w.rows();
        let bytes = w.tensor.bytes.as_slice();
        match w.tensor.dtype {
            DType::F32 => run(view::<f32>(bytes), x, t, n, out, kernels.f32),
            DType::F16 => run(view::<f16>(bytes), x, t, n, out, kernels.f16),
            DType::BF16 => run(view::<bf16>(bytes), x, t, n, out, kernels.bf16),
            DType::Q4_0 => run(view(bytes), &s.q8a, t, n, out, kernels.q4_0),
            DType::Q5_0 => run(view(bytes), &s.q8a, t, n, out, kernels.q5_0),
            DType::Q8_0 => run(view(bytes), &s.q8a, t, n, out, kernels.q8_0),
            DType::Q4_K => run(view(bytes), &s.q8k, t, n, out, kernels.q4_k),
            DType::Q5_K => run(view(bytes), &s.q8k, t, n, out, kernels.q5_k),
            DType::Q6_K => run(view(bytes), &s.q8k, t, n, out, kernels.q6_k),
        }
    }
}
