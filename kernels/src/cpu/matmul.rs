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
    plan: Vec<Plan>,
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

/// One job's share of a call's parallel region: tasks `start..start + tasks` of the region are
/// its row ranges of `rows_per_task` rows.
#[derive(Debug, Clone, Copy)]
struct Plan {
    start: usize,
    tasks: usize,
    rows_per_task: usize,
    out: OutPtr,
}

impl std::fmt::Debug for OutPtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:p}", self.0)
    }
}

/// Rows `rows` of `w` (`n` rows) against the `t` activation rows `x`, in token tiles.
#[allow(clippy::too_many_arguments)]
fn run_task<W: Block, A: Sync>(
    w: &[W],
    x: &[A],
    t: usize,
    n: usize,
    rows: std::ops::Range<usize>,
    out: OutPtr,
    dot: fn(&[W], &[A]) -> f32,
    gemm: Option<GemmFn<W, A>>,
) {
    let (wpr, apr) = (w.len() / n, x.len() / t);
    for t0 in (0..t).step_by(TOKEN_TILE) {
        let job =
            GemmJob { w, wpr, x, apr, rows: rows.clone(), toks: t0..(t0 + TOKEN_TILE).min(t), out: out.get(), ldo: n };
        // SAFETY: the job's rows and tokens are inside the output (t × n), and no other task
        // writes these rows; the kernels come from `Kernels`, which checked the CPU.
        unsafe {
            match gemm {
                Some(g) => g(&job),
                None => gemm_by_dot(&job, dot),
            }
        }
    }
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
/// share `x`, which is quantized once per dot-product format, and one parallel
/// region: each job's rows are split into tasks (whole 4-row tiles, about four
/// per thread and job) and all the jobs' tasks run together, so a thread that
/// finishes one weight's rows goes on to the next instead of waiting at a
/// barrier per weight (one fork-join per call: a mixture of experts' one-token
/// gate + up calls 2–3% faster, `cargo bench -p cachet-kernels --bench kernels
/// -- --only decode-experts`).
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
    let threads = rayon::current_num_threads().max(1);
    s.plan.clear();
    let mut total = 0;
    for (w, out) in jobs.iter_mut() {
        let n = w.rows();
        debug_assert_eq!(w.cols(), k);
        out.data.resize(t * n, 0.0);
        (out.rows, out.cols) = (t, n);
        let rows_per_task = (n / (threads * 4)).clamp(4, 256) / 4 * 4;
        let tasks = n.div_ceil(rows_per_task);
        s.plan.push(Plan { start: total, tasks, rows_per_task, out: OutPtr(out.data.as_mut_ptr()) });
        total += tasks;
    }
    let (plan, q8a, q8k) = (&s.plan, &s.q8a, &s.q8k);
    let jobs = &*jobs;
    (0..total).into_par_iter().for_each(|i| {
        let j = plan.partition_point(|p| p.start + p.tasks <= i);
        let (p, w) = (plan[j], jobs[j].0);
        let n = w.rows();
        let task = i - p.start;
        let rows = task * p.rows_per_task..((task + 1) * p.rows_per_task).min(n);
        let bytes = w.tensor.bytes.as_slice();
        match w.tensor.dtype {
            DType::F32 => run_task(view::<f32>(bytes), x, t, n, rows, p.out, kernels.f32, None),
            DType::F16 => run_task(view::<f16>(bytes), x, t, n, rows, p.out, kernels.f16, None),
            DType::BF16 => run_task(view::<bf16>(bytes), x, t, n, rows, p.out, kernels.bf16, None),
            DType::Q4_0 => run_task(view(bytes), q8a, t, n, rows, p.out, kernels.q4_0, kernels.gemm_q4_0),
            DType::Q5_0 => run_task(view(bytes), q8a, t, n, rows, p.out, kernels.q5_0, kernels.gemm_q5_0),
            DType::Q8_0 => run_task(view(bytes), q8a, t, n, rows, p.out, kernels.q8_0, kernels.gemm_q8_0),
            DType::Q4_K => run_task(view(bytes), q8k, t, n, rows, p.out, kernels.q4_k, kernels.gemm_q4_k),
            DType::Q5_K => run_task(view(bytes), q8k, t, n, rows, p.out, kernels.q5_k, kernels.gemm_q5_k),
            DType::Q6_K => run_task(view(bytes), q8k, t, n, rows, p.out, kernels.q6_k, kernels.gemm_q6_k),
        }
    });
}
