//! The CPU backend: quantized weights used in place (memory-mapped), integer
//! dot products at the best SIMD level of the machine, and a rayon thread pool
//! of the configured size.

mod attention;
pub mod dot;
mod matmul;
pub mod ops;
mod peak;

pub use attention::{
    hadamard, rotation, Attend, AttendFn, KvData, KvRows, LayerKv, Tile, TileFn, TileScratch, KEY_BLOCK,
};
pub use dot::{Kernels, SimdLevel};
use matmul::{matmul_jobs, Picked, Shared};
pub use matmul::{CpuMatrix, MatmulScratch};
pub use peak::int8_peak;

use crate::backend::*;
use crate::quant::{dequantize_row, DType};
use crate::tensor::HostTensor;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time spent per op (and per weight shape for matmuls), when profiling.
pub type Profile = Vec<OpTime>;

/// Time, calls and multiply-adds of one op label so far.
type OpTotals = (Duration, u64, u64);

/// One op's share of a profiled run.
#[derive(Clone, Debug, PartialEq)]
pub struct OpTime {
    /// The op, with its weights' formats and shapes for a matmul.
    pub label: String,
    pub time: Duration,
    pub calls: u64,
    /// Multiply-adds it did: int8 ones in a quantized matmul, f32 ones in attention (scores and
    /// values); 0 for the element-wise ops.
    pub macs: u64,
}

/// A row-major f32 matrix in host memory.
#[derive(Clone, Debug, Default)]
pub struct CpuBuf {
    pub data: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
}

/// The KV pool in host memory.
#[derive(Debug)]
pub struct CpuKv {
    pub layout: KvLayout,
    pub layers: Vec<LayerKv>,
}

/// The CPU backend.
#[derive(Debug)]
pub struct CpuBackend {
    kernels: Kernels,
    pool: Arc<rayon::ThreadPool>,
    /// Activation buffers reused across matmul calls.
    scratch: Mutex<MatmulScratch>,
    /// Per-label (time, calls) when profiling is on.
    profile: Option<Mutex<HashMap<String, OpTotals>>>,
}

impl CpuBackend {
    /// A backend with `threads` worker threads (0: one per core) at the best
    /// SIMD level of this CPU (capped by `CACHET_SIMD`).
    pub fn new(threads: usize) -> Result<CpuBackend, BackendError> {
        CpuBackend::with_level(threads, SimdLevel::detect())
    }

    /// A backend at a given SIMD level; an error if this CPU lacks it.
    pub fn with_level(threads: usize, level: SimdLevel) -> Result<CpuBackend, BackendError> {
        let kernels = Kernels::for_level(level)
            .ok_or_else(|| BackendError::Unsupported(format!("this CPU cannot run {} kernels", level.name())))?;
        CpuBackend::with_kernels(threads, kernels)
    }

    /// A backend running `kernels` (one of [`Kernels::variants`]).
    pub fn with_kernels(threads: usize, kernels: Kernels) -> Result<CpuBackend, BackendError> {
        let level = kernels.level;
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("cachet-cpu-{i}"))
            .build()
            .map_err(|e| BackendError::Unsupported(format!("thread pool: {e}")))?;
        pool.broadcast(|_| {
            attention::warm_thread();
            dot::warm_thread(level);
        });
        Ok(CpuBackend { kernels, pool: Arc::new(pool), scratch: Mutex::new(MatmulScratch::default()), profile: None })
    }

    /// Records the time of every op (see [`CpuBackend::profile`]).
    pub fn with_profiling(mut self) -> CpuBackend {
        self.profile = Some(Mutex::new(HashMap::new()));
        self
    }

    /// Time per op label, longest first (empty unless profiling).
    pub fn profile(&self) -> Profile {
        let Some(p) = &self.profile else { return Vec::new() };
        let map = p.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Profile =
            map.iter().map(|(k, &(time, calls, macs))| OpTime { label: k.clone(), time, calls, macs }).collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.time));
        v
    }

    fn timed<R>(&self, label: impl FnOnce() -> String, f: impl FnOnce() -> R) -> R {
        self.timed_macs(label, || 0, f)
    }

    /// [`CpuBackend::timed`] for an op that does `macs()` multiply-adds (counted only when
    /// profiling).
    fn timed_macs<R>(&self, label: impl FnOnce() -> String, macs: impl FnOnce() -> u64, f: impl FnOnce() -> R) -> R {
        let Some(p) = &self.profile else { return f() };
        let start = Instant::now();
        let r = f();
        let took = start.elapsed();
        let mut map = p.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.entry(label()).or_default();
        e.0 += took;
        e.1 += 1;
        e.2 += macs();
        r
    }

    /// The SIMD level in use.
    pub fn level(&self) -> SimdLevel {
        self.kernels.level
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    fn vector<'a>(&self, w: &'a CpuMatrix) -> &'a [f32] {
        crate::quant::cast_blocks::<f32>(w.tensor.bytes.as_slice()).expect("vectors are loaded as f32")
    }
}

impl Backend for CpuBackend {
    type Weight = CpuMatrix;
    type Buf = CpuBuf;
    type Kv = CpuKv;

    fn name(&self) -> String {
        let k = self.kernels;
        let mut choices = String::new();
        if k.k_level != k.level {
            choices += &format!(", K formats {}", k.k_level.name());
        }
        if k.q32_level != k.level {
            choices += &format!(", 32-value formats {}", k.q32_level.name());
        }
        if k.few_level != k.level {
            choices += &format!(", few-token {}", k.few_level.name());
        }
        format!("cpu ({}{choices}, {} threads)", k.level.name(), self.threads())
    }

    fn load(&self, t: HostTensor) -> Result<CpuMatrix, BackendError> {
        if t.shape.len() > 2 {
            return Err(BackendError::Unsupported(format!("{}-dimensional tensor", t.shape.len())));
        }
        // Vectors (norm weights, biases) are used as f32 directly.
        if t.rows() == 1 && t.dtype != DType::F32 {
            let values = t.to_f32()?;
            return Ok(CpuMatrix { tensor: HostTensor::from_f32(t.shape.clone(), &values) });
        }
        let t = HostTensor::new(t.dtype, t.shape, t.bytes)?;
        Ok(CpuMatrix { tensor: t })
    }

    fn weight_shape(&self, w: &CpuMatrix) -> (usize, usize) {
        (w.rows(), w.cols())
    }

    fn buf(&self) -> CpuBuf {
        CpuBuf::default()
    }

    fn resize(&self, b: &mut CpuBuf, rows: usize, cols: usize) {
        b.data.resize(rows * cols, 0.0);
        b.rows = rows;
        b.cols = cols;
    }

    fn buf_shape(&self, b: &CpuBuf) -> (usize, usize) {
        (b.rows, b.cols)
    }

    fn upload(&self, b: &mut CpuBuf, rows: usize, cols: usize, data: &[f32]) {
        self.resize(b, rows, cols);
        b.data.copy_from_slice(data);
    }

    fn download(&self, b: &CpuBuf, out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(&b.data);
    }

    fn kv(&self, layout: KvLayout) -> Result<CpuKv, BackendError> {
        layout.check_format()?;
        let per_layer = layout.slots * layout.cols();
        let mut layers = Vec::new();
        for _ in 0..layout.layers {
            let alloc = || {
                KvData::zeros(layout.format, per_layer)
                    .ok_or(BackendError::OutOfMemory { what: "KV pool", bytes: layout.bytes() })
            };
            layers.push(LayerKv { k: alloc()?, v: alloc()? });
        }
        Ok(CpuKv { layout, layers })
    }

    fn kv_formats(&self) -> &'static [KvFormat] {
        &KvFormat::ALL
    }

    fn memory_available(&self) -> Option<u64> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    fn reads_host_weights(&self) -> bool {
        true
    }

    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    fn embed(&self, table: &CpuMatrix, tokens: &[u32], out: &mut CpuBuf) -> Result<(), BackendError> {
        let (vocab, cols) = (table.rows(), table.cols());
        self.resize(out, tokens.len(), cols);
        let row_bytes = table.tensor.dtype.bytes_for(cols)?;
        let bytes = table.tensor.bytes.as_slice();
        for (&tok, row) in tokens.iter().zip(out.data.chunks_mut(cols)) {
            let t = tok as usize;
            if t >= vocab {
                return Err(BackendError::TokenOutOfRange { token: tok, vocab });
            }
            dequantize_row(table.tensor.dtype, &bytes[t * row_bytes..(t + 1) * row_bytes], row)?;
        }
        Ok(())
    }

    fn matmul(&self, x: &CpuBuf, jobs: &mut [(&CpuMatrix, &mut CpuBuf)]) {
        // Built only when profiling (no allocation on the hot path otherwise).
        let shapes: Vec<(DType, usize, usize)> = if self.profile.is_some() {
            jobs.iter().map(|(w, _)| (w.tensor.dtype, w.rows(), w.cols())).collect()
        } else {
            Vec::new()
        };
        let macs = shapes.iter().map(|&(_, r, c)| (r * c * x.rows) as u64).sum::<u64>();
        let label = move || {
            let parts: Vec<String> = shapes.iter().map(|(d, r, c)| format!("{d} {r}x{c}")).collect();
            format!("matmul {}", parts.join(" + "))
        };
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch: &mut MatmulScratch = &mut guard;
        let mut jobs = Shared { x, jobs };
        self.timed_macs(label, || macs, || self.pool.install(|| matmul_jobs(&self.kernels, &mut jobs, scratch)));
    }

    fn matmul_picked(&self, xs: &[CpuBuf], pick: &[usize], groups: &mut [PickedGroup<'_, Self>]) {
        check_picked(xs.len(), pick, groups.iter().map(|(w, o)| (w.len(), o.len())));
        let label = || {
            let parts: Vec<String> = groups
                .iter()
                .filter_map(|(w, _)| w.first())
                .map(|w| format!("{} {}x{}", w.tensor.dtype, w.rows(), w.cols()))
                .collect();
            format!("matmul picked {} × ({})", pick.len(), parts.join(" + "))
        };
        let label = if self.profile.is_some() { label() } else { String::new() };
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch: &mut MatmulScratch = &mut guard;
        let mut jobs = Picked { xs, pick, groups };
        self.timed(move || label, || self.pool.install(|| matmul_jobs(&self.kernels, &mut jobs, scratch)));
    }

    fn add_bias(&self, x: &mut CpuBuf, bias: &CpuMatrix) {
        let b = self.vector(bias);
        self.timed(|| "add_bias".into(), || self.pool.install(|| ops::add(&mut x.data, b, x.cols)));
    }

    fn add(&self, x: &mut CpuBuf, y: &CpuBuf) {
        self.timed(|| "add".into(), || self.pool.install(|| ops::add(&mut x.data, &y.data, x.cols)));
    }

    fn rms_norm(&self, x: &CpuBuf, w: &CpuMatrix, eps: f32, out: &mut CpuBuf) {
        self.resize(out, x.rows, x.cols);
        let w = self.vector(w);
        self.timed(|| "rms_norm".into(), || self.pool.install(|| ops::rms_norm(&x.data, w, eps, &mut out.data)));
    }

    fn rms_norm_heads(&self, x: &mut CpuBuf, w: &CpuMatrix, eps: f32, head_dim: usize) {
        let w = self.vector(w);
        self.pool.install(|| ops::rms_norm_inplace(&mut x.data, w, eps, head_dim));
    }

    fn rope_table(&self, positions: &[u32], rope: &RopeConfig, out: &mut CpuBuf) {
        self.resize(out, positions.len(), rope.head_dim);
        ops::rope_table(positions, rope, &mut out.data);
    }

    fn rope(&self, x: &mut CpuBuf, table: &CpuBuf, rope: &RopeConfig) {
        let cols = x.cols;
        self.timed(|| "rope".into(), || self.pool.install(|| ops::rope(&mut x.data, cols, &table.data, rope)));
    }

    fn silu_mul(&self, gate: &mut CpuBuf, up: &CpuBuf) {
        let cols = gate.cols;
        self.timed(
            || "silu_mul".into(),
            || self.pool.install(|| ops::silu_mul(&mut gate.data, &up.data, cols, self.kernels.silu_mul)),
        );
    }

    fn kv_export(&self, kv: &CpuKv, layer: usize, slots: &[u32], out: &mut Vec<u16>) -> Result<(), BackendError> {
        let units = kv.layout.check_rows(layer, slots, None)?;
        let cols = kv.layout.cols();
        let l = &kv.layers[layer];
        out.clear();
        out.reserve(2 * slots.len() * units);
        for half in [&l.k, &l.v] {
            for &s in slots {
                half.export_row(s as usize * cols, cols, out);
            }
        }
        Ok(())
    }

    fn kv_import(&self, kv: &mut CpuKv, layer: usize, slots: &[u32], rows: &[u16]) -> Result<(), BackendError> {
        let units = kv.layout.check_rows(layer, slots, Some(rows.len()))?;
        let cols = kv.layout.cols();
        let l = &mut kv.layers[layer];
        let (k, v) = rows.split_at(slots.len() * units);
        for (half, src) in [(&mut l.k, k), (&mut l.v, v)] {
            for (i, &s) in slots.iter().enumerate() {
                half.import_row(s as usize * cols, cols, &src[i * units..(i + 1) * units]);
            }
        }
        Ok(())
    }

    fn kv_store(&self, kv: &mut CpuKv, layer: usize, k: &CpuBuf, v: &CpuBuf, slots: &[u32]) {
        let (cols, hd) = (kv.layout.cols(), kv.layout.head_dim);
        self.timed(|| "kv_store".into(), || attention::store(&mut kv.layers[layer], &k.data, &v.data, cols, hd, slots));
    }

    fn attention(
        &self,
        q: &CpuBuf,
        kv: &CpuKv,
        layer: usize,
        seqs: &[AttnSeq],
        slots: &[u32],
        shape: &AttnShape,
        out: &mut CpuBuf,
    ) {
        self.resize(out, q.rows, q.cols);
        // Scores and values: two multiply-adds per query head, key and head value.
        let macs = || {
            let keys: usize = seqs.iter().map(|s| (0..s.rows.len()).map(|r| s.first_pos + r + 1).sum::<usize>()).sum();
            (2 * keys * shape.n_heads * shape.head_dim) as u64
        };
        self.timed_macs(
            || "attention".into(),
            macs,
            || {
                self.pool.install(|| {
                    attention::attention(&self.kernels, &q.data, &kv.layers[layer], seqs, slots, shape, &mut out.data)
                })
            },
        );
    }

    fn gather_rows(&self, x: &CpuBuf, rows: &[usize], out: &mut CpuBuf) {
        self.resize(out, rows.len(), x.cols);
        for (i, &r) in rows.iter().enumerate() {
            out.data[i * x.cols..(i + 1) * x.cols].copy_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
    }

    fn add_rows_scaled(&self, x: &mut CpuBuf, y: &CpuBuf, rows: &[usize], scales: &[f32]) {
        crate::backend::check_add_rows(x.rows, x.cols, y.rows, y.cols, rows, scales);
        let cols = x.cols;
        self.timed(
            || "add_rows_scaled".into(),
            || {
                for ((&r, &s), src) in rows.iter().zip(scales).zip(y.data.chunks_exact(cols)) {
                    for (d, &v) in x.data[r * cols..(r + 1) * cols].iter_mut().zip(src) {
                        *d += s * v;
                    }
                }
            },
        );
    }
}
