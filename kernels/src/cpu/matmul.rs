//! Quantized matrix multiplication on the CPU: `out[t][n] = Σ_k x[t][k] · w[n][k]`.
//!
//! Activations are quantized once per call (per distinct dot-product format),
//! weights stay in their file format, and each output element is one call of
//! the level's row dot product — the same call whatever the batch, so a row's
//! result does not depend on what else is in the batch.

use super::dot::{gemm_by_dot, GemmFn, GemmJob, Kernels};
use super::CpuBuf;
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

fn run<W: Block, A: Sync>(
    w: &[W],
    x: &[A],
    t: usize,
    n: usize,
    out: &mut [f32],
    dot: fn(&[W], &[A]) -> f32,
    gemm: Option<GemmFn<W, A>>,
) {
    let wpr = w.len() / n;
    let apr = x.len() / t;
    let threads = rayon::current_num_threads().max(1);
    // Whole 4-row tiles per task, about four tasks per thread.
    let rows_per_task = (n / (threads * 4)).clamp(4, 256) / 4 * 4;
    let tasks = n.div_ceil(rows_per_task);
    let ptr = OutPtr(out.as_mut_ptr());
    (0..tasks).into_par_iter().for_each(|task| {
        let rows = task * rows_per_task..((task + 1) * rows_per_task).min(n);
        for t0 in (0..t).step_by(TOKEN_TILE) {
            let job = GemmJob {
                w,
                wpr,
                x,
                apr,
                rows: rows.clone(),
                toks: t0..(t0 + TOKEN_TILE).min(t),
                out: ptr.get(),
                ldo: n,
            };
            // SAFETY: the job's rows and tokens are inside `out` (t × n), and no
            // other task writes these rows; the kernels come from `Kernels`,
            // which checked the CPU.
            unsafe {
                match gemm {
                    Some(g) => g(&job),
                    None => gemm_by_dot(&job, dot),
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

/// `x` is `t × k` f32; each job's output gets `t × rows(w)` values. All jobs
/// share `x`, which is quantized once per dot-product format.
pub fn matmul_many(
    kernels: &Kernels,
    x: &[f32],
    t: usize,
    jobs: &mut [(&CpuMatrix, &mut CpuBuf)],
    s: &mut MatmulScratch,
) {
    if t == 0 {
        return;
    }
    let k = x.len() / t;
    let uses = |f: fn(DType) -> bool| jobs.iter().any(|(w, _)| f(w.tensor.dtype));
    if uses(|d| matches!(d, DType::Q4_0 | DType::Q5_0 | DType::Q8_0)) {
        s.q8a.resize(t * k / 32, BlockQ8A::default());
        x.par_chunks(k).zip(s.q8a.par_chunks_mut(k / 32)).for_each(|(xr, qr)| (kernels.quant_q8a)(xr, qr));
    }
    if uses(|d| matches!(d, DType::Q4_K | DType::Q5_K | DType::Q6_K)) {
        s.q8k.resize(t * k / 256, BlockQ8K::default());
        x.par_chunks(k).zip(s.q8k.par_chunks_mut(k / 256)).for_each(|(xr, qr)| (kernels.quant_q8k)(xr, qr));
    }
    for (w, out) in jobs.iter_mut() {
        let n = w.rows();
        debug_assert_eq!(w.cols(), k);
        out.data.resize(t * n, 0.0);
        (out.rows, out.cols) = (t, n);
        let out = out.data.as_mut_slice();
        let bytes = w.tensor.bytes.as_slice();
        match w.tensor.dtype {
            DType::F32 => run(view::<f32>(bytes), x, t, n, out, kernels.f32, None),
            DType::F16 => run(view::<f16>(bytes), x, t, n, out, kernels.f16, None),
            DType::BF16 => run(view::<bf16>(bytes), x, t, n, out, kernels.bf16, None),
            DType::Q4_0 => run(view(bytes), &s.q8a, t, n, out, kernels.q4_0, kernels.gemm_q4_0),
            DType::Q5_0 => run(view(bytes), &s.q8a, t, n, out, kernels.q5_0, kernels.gemm_q5_0),
            DType::Q8_0 => run(view(bytes), &s.q8a, t, n, out, kernels.q8_0, kernels.gemm_q8_0),
            DType::Q4_K => run(view(bytes), &s.q8k, t, n, out, kernels.q4_k, kernels.gemm_q4_k),
            DType::Q5_K => run(view(bytes), &s.q8k, t, n, out, kernels.q5_k, kernels.gemm_q5_k),
            DType::Q6_K => run(view(bytes), &s.q8k, t, n, out, kernels.q6_k, kernels.gemm_q6_k),
        }
    }
}
