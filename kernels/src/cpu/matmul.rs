//! Quantized matrix multiplication on the CPU: `out[t][n] = Σ_k x[t][k] · w[n][k]`.
//!
//! Activations are quantized once per call (per distinct dot-product format),
//! weights stay in their file format, and each output element is one call of
//! the level's row dot product — the same call whatever the batch, so a row's
//! result does not depend on what else is in the batch.

use super::dot::{gemm_by_dot, GemmFn, GemmJob, Kernels, SimdLevel};
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
    /// Each input's first block in `q8a` and `q8k`.
    offsets: Vec<(usize, usize)>,
    plan: Vec<Plan>,
}

/// Output pointer shared by the tasks; each task writes a disjoint set of
/// columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements and the buffer outlives the parallel scope.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: a shared `OutPtr` only hands out the pointer; every write through it is a
// kernel's, to the elements of its own task's rows.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Tokens per job for the kernels that read weights in place (register tiles of a few rows and
/// tokens): a tile's activations stay in L2 while a weight row is reused.
const TOKEN_TILE: usize = 64;

/// Tokens per job for the kernels that repack each group of weight rows once per job (the AVX2
/// level's quantized GEMMs, and at the AVX-512 level the VNNI 16-row tiles that give the same
/// bits): a whole prompt pass's tokens, so the repacking is not repeated for every 64 of them.
/// The 1.5B's pp512 at the AVX2 level: 105 → 112–121 tokens/s over 64-token jobs (Intel Xeon,
/// 2026-12-07, `docs/performance.md`).
const PACKED_TOKEN_TILE: usize = 512;

/// The token tile for kernels of `level` (see [`TOKEN_TILE`], [`PACKED_TOKEN_TILE`]).
fn token_tile(level: SimdLevel) -> usize {
    if level == SimdLevel::Avx2 {
        PACKED_TOKEN_TILE
    } else {
        TOKEN_TILE
    }
}

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

/// Rows `rows` of `w` (`n` rows) against the `t` activation rows `x`, in token tiles of `tile`.
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
    tile: usize,
) {
    let (wpr, apr) = (w.len() / n, x.len() / t);
    for t0 in (0..t).step_by(tile) {
        let job = GemmJob { w, wpr, x, apr, rows: rows.clone(), toks: t0..(t0 + tile).min(t), out: out.get(), ldo: n };
        // SAFETY: the job's rows and tokens are inside the output (t × n), and no other task
        // writes these rows; the kernels come from `Kernels`, which checked the CPU.
        // `GemmFn` also needs `apr >= wpr` (the SIMD kernels read `wpr` blocks of every
        // activation row unchecked): `matmul_jobs` asserts `x.cols == w.cols()` for every job
        // before any kernel runs (a real assert: debug assertions are off for this crate).
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

/// The work of one parallel region: `jobs()` matmuls, job `j` multiplying input
/// `job(j).0` (a `t × k` f32 buffer) by the weight `job(j).1` into `out(j)`.
pub(crate) trait Jobs: Sync {
    fn inputs(&self) -> usize;
    fn input(&self, i: usize) -> &CpuBuf;
    fn jobs(&self) -> usize;
    fn job(&self, j: usize) -> (usize, &CpuMatrix);
    fn out(&mut self, j: usize) -> &mut CpuBuf;
}

/// Jobs sharing one input ([`crate::backend::Backend::matmul`]).
pub(crate) struct Shared<'a, 'w, 'o> {
    pub x: &'a CpuBuf,
    pub jobs: &'a mut [(&'w CpuMatrix, &'o mut CpuBuf)],
}

impl Jobs for Shared<'_, '_, '_> {
    fn inputs(&self) -> usize {
        1
    }
    fn input(&self, _: usize) -> &CpuBuf {
        self.x
    }
    fn jobs(&self) -> usize {
        self.jobs.len()
    }
    fn job(&self, j: usize) -> (usize, &CpuMatrix) {
        (0, self.jobs[j].0)
    }
    fn out(&mut self, j: usize) -> &mut CpuBuf {
        self.jobs[j].1
    }
}

/// Each input `i` of `xs` times the `pick[i]`th weight of each group
/// ([`crate::backend::Backend::matmul_picked`]); job `j` is group `j / n`, input `j % n`.
pub(crate) struct Picked<'a, 'w, 'o> {
    pub xs: &'a [CpuBuf],
    pub pick: &'a [usize],
    pub groups: &'a mut [(&'w [CpuMatrix], &'o mut [CpuBuf])],
}

impl Jobs for Picked<'_, '_, '_> {
    fn inputs(&self) -> usize {
        self.pick.len()
    }
    fn input(&self, i: usize) -> &CpuBuf {
        &self.xs[i]
    }
    fn jobs(&self) -> usize {
        self.groups.len() * self.pick.len()
    }
    fn job(&self, j: usize) -> (usize, &CpuMatrix) {
        let i = j % self.pick.len();
        (i, &self.groups[j / self.pick.len()].0[self.pick[i]])
    }
    fn out(&mut self, j: usize) -> &mut CpuBuf {
        let n = self.pick.len();
        &mut self.groups[j / n].1[j % n]
    }
}

/// Runs `jobs` in one parallel region. Each input is quantized once per
/// dot-product format its jobs use; each job's rows are split into tasks
/// (whole 4-row tiles, about four per thread and job) and all the jobs' tasks
/// run together, so a thread that finishes one weight's rows goes on to the
/// next instead of waiting at a barrier per weight (one fork-join per call: a
/// mixture of experts' one-token gate + up calls 2–3% faster, `cargo bench -p
/// cachet-kernels --bench kernels -- --only decode-experts`). A job's values do
/// not depend on the other jobs: each output element is the same row dot
/// product (or GEMM tile over the job's own tokens) as in a call of its own.
pub(crate) fn matmul_jobs(kernels: &Kernels, jobs: &mut impl Jobs, s: &mut MatmulScratch) {
    let n = jobs.jobs();
    let uses = |f: fn(DType) -> bool| (0..n).any(|j| f(jobs.job(j).1.tensor.dtype));
    let a_fmt = uses(|d| matches!(d, DType::Q4_0 | DType::Q5_0 | DType::Q8_0));
    let k_fmt = uses(|d| matches!(d, DType::Q4_K | DType::Q5_K | DType::Q6_K));
    // Each input's activations, quantized: its first block in `q8a` / `q8k`.
    s.offsets.clear();
    let (mut a_len, mut k_len) = (0, 0);
    for i in 0..jobs.inputs() {
        s.offsets.push((a_len, k_len));
        let x = jobs.input(i);
        a_len += if a_fmt { x.data.len() / 32 } else { 0 };
        k_len += if k_fmt { x.data.len() / 256 } else { 0 };
    }
    s.q8a.resize(a_len, BlockQ8A::default());
    s.q8k.resize(k_len, BlockQ8K::default());
    for i in 0..jobs.inputs() {
        let x = jobs.input(i);
        let ((a0, k0), k) = (s.offsets[i], x.cols);
        if a_fmt && x.rows > 0 {
            let q = &mut s.q8a[a0..a0 + x.data.len() / 32];
            x.data.par_chunks(k).zip(q.par_chunks_mut(k / 32)).for_each(|(xr, qr)| (kernels.quant_q8a)(xr, qr));
        }
        if k_fmt && x.rows > 0 {
            let q = &mut s.q8k[k0..k0 + x.data.len() / 256];
            x.data.par_chunks(k).zip(q.par_chunks_mut(k / 256)).for_each(|(xr, qr)| (kernels.quant_q8k)(xr, qr));
        }
    }
    let threads = rayon::current_num_threads().max(1);
    s.plan.clear();
    let mut total = 0;
    for j in 0..n {
        let (i, w) = jobs.job(j);
        let (rows, t) = (w.rows(), jobs.input(i).rows);
        // Not a debug assertion: the SIMD kernels read `w.cols()` columns of every input row
        // unchecked, so a narrower input must stop here (debug assertions are off for this crate).
        assert_eq!(w.cols(), jobs.input(i).cols, "matmul: the input's columns must match the weight's");
        let out = jobs.out(j);
        out.data.resize(t * rows, 0.0);
        (out.rows, out.cols) = (t, rows);
        let out = OutPtr(out.data.as_mut_ptr());
        let rows_per_task = (rows / (threads * 4)).clamp(4, 256) / 4 * 4;
        let tasks = if t == 0 { 0 } else { rows.div_ceil(rows_per_task) };
        s.plan.push(Plan { start: total, tasks, rows_per_task, out });
        total += tasks;
    }
    let (plan, offsets, q8a, q8k) = (&s.plan, &s.offsets, &s.q8a, &s.q8k);
    let jobs = &*jobs;
    (0..total).into_par_iter().for_each(|task| {
        let j = plan.partition_point(|p| p.start + p.tasks <= task);
        let (p, (i, w)) = (plan[j], jobs.job(j));
        let x = jobs.input(i);
        let (t, n, (a0, k0)) = (x.rows, w.rows(), offsets[i]);
        let task = task - p.start;
        let rows = task * p.rows_per_task..((task + 1) * p.rows_per_task).min(n);
        let bytes = w.tensor.bytes.as_slice();
        let xa = || &q8a[a0..a0 + x.data.len() / 32];
        let xk = || &q8k[k0..k0 + x.data.len() / 256];
        let x = x.data.as_slice();
        let (q32, qk) = (token_tile(kernels.q32_level), token_tile(kernels.k_level));
        match w.tensor.dtype {
            DType::F32 => run_task(view::<f32>(bytes), x, t, n, rows, p.out, kernels.f32, None, TOKEN_TILE),
            DType::F16 => run_task(view::<f16>(bytes), x, t, n, rows, p.out, kernels.f16, None, TOKEN_TILE),
            DType::BF16 => run_task(view::<bf16>(bytes), x, t, n, rows, p.out, kernels.bf16, None, TOKEN_TILE),
            DType::Q4_0 => run_task(view(bytes), xa(), t, n, rows, p.out, kernels.q4_0, kernels.gemm_q4_0, q32),
            DType::Q5_0 => run_task(view(bytes), xa(), t, n, rows, p.out, kernels.q5_0, kernels.gemm_q5_0, q32),
            DType::Q8_0 => run_task(view(bytes), xa(), t, n, rows, p.out, kernels.q8_0, kernels.gemm_q8_0, q32),
            DType::Q4_K => run_task(view(bytes), xk(), t, n, rows, p.out, kernels.q4_k, kernels.gemm_q4_k, qk),
            DType::Q5_K => run_task(view(bytes), xk(), t, n, rows, p.out, kernels.q5_k, kernels.gemm_q5_k, qk),
            DType::Q6_K => run_task(view(bytes), xk(), t, n, rows, p.out, kernels.q6_k, kernels.gemm_q6_k, qk),
        }
    });
}
