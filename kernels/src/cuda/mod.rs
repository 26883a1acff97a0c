//! The CUDA backend: the same ops as the CPU backend on an NVIDIA GPU, so the
//! scheduler, radix cache and model code run unchanged.
//!
//! - Always compiled: cudarc loads `libcuda`, `libcublas` and `libnvrtc` at
//!   run time, so building needs no CUDA toolkit. [`probe`] says whether a
//!   device can be used (and never panics).
//! - Kernels are the `.cu` sources of `kernels/cuda/`, compiled by NVRTC when
//!   the first backend of a process starts on a GPU architecture.
//! - Weights keep their file format on the device; matmuls dequantize on the
//!   fly. For prefill (at least [`CudaOptions::dense_min_rows`] rows) cuBLAS
//!   multiplies a bf16 copy made at load, when the memory allows.
//! - The KV pool has the CPU pool's layout: per layer, K and V as
//!   `slots × (kv_heads · head_dim)` f16, addressed by slot.
//! - Batch invariance: every kernel computes a row the same way whatever else
//!   is in the batch (fixed reduction order per row). The cuBLAS prefill path
//!   does not promise that; [`CudaOptions::batch_invariant`] turns it off.
//!
//! Device failures inside an op (which the [`Backend`] trait cannot return)
//! panic with the driver's message.
//!
//! ```
//! use cachet_kernels::backend::Backend;
//! use cachet_kernels::cuda::{self, CudaBackend};
//!
//! match cuda::probe() {
//!     Ok(info) => {
//!         println!("found {info}");
//!         if let Ok(gpu) = CudaBackend::new(info.ordinal) {
//!             let (mut x, mut y) = (gpu.buf(), gpu.buf());
//!             gpu.upload(&mut x, 1, 4, &[1.0, 2.0, 3.0, 4.0]);
//!             gpu.upload(&mut y, 1, 4, &[0.5; 4]);
//!             gpu.add(&mut x, &y);
//!             let mut out = Vec::new();
//!             gpu.download(&x, &mut out);
//!             assert_eq!(out, [1.5, 2.5, 3.5, 4.5]);
//!         }
//!     }
//!     Err(why) => println!("CPU only: {why}"),
//! }
//! ```

mod attention;
mod graph;
mod matmul;
mod module;
mod ops;
mod probe;
mod scratch;
mod timing;

pub use graph::GraphStats;
pub use matmul::CudaWeight;
pub use module::{compile, kernel_names, nvrtc_available, nvrtc_options, programs, CompileError, Program, HEADERS};
pub use probe::{device_count, probe, probe_device, CudaDeviceInfo, CudaUnavailable};
pub use timing::{CudaProfile, OpTime};

use crate::backend::*;
use crate::tensor::HostTensor;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};
use module::Kernels;
use scratch::Scratch;
use std::sync::{Arc, Mutex};

/// Choices of the CUDA backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// Make a dense bf16 copy of each weight matrix at load (when it fits) and
    /// multiply batches of at least `dense_min_rows` rows with cuBLAS.
    pub dense_prefill: bool,
    /// Fewest rows of `x` for which a matmul uses the dense copy.
    pub dense_min_rows: usize,
    /// Device memory left free when deciding whether a dense copy fits.
    pub dense_reserve_bytes: u64,
    /// Run repeated steps as CUDA graphs (see `graph.rs`); off, every op launches its kernels
    /// as it is called. Off by default: on an H200 it made batch-1 decode 6% faster but
    /// batches of 8 and 64 4–7% slower (docs/gpu.md), because the step's host work then runs
    /// before the GPU starts instead of alongside it.
    pub graphs: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions { dense_prefill: true, dense_min_rows: 32, dense_reserve_bytes: 2 << 30, graphs: false }
    }
}

impl CudaOptions {
    /// Only the dequantizing kernels: a row's result never depends on the
    /// batch (as on the CPU), at the cost of slower long prefills.
    pub fn batch_invariant() -> CudaOptions {
        CudaOptions { dense_prefill: false, ..CudaOptions::default() }
    }
}

/// A row-major f32 matrix in device memory. Its allocation only grows.
#[derive(Debug, Default)]
pub struct CudaBuf {
    data: Option<CudaSlice<f32>>,
    rows: usize,
    cols: usize,
    /// The backend's queue: work queued on this buffer runs before it is freed.
    queue: Option<graph::Queue>,
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        if let (Some(_), Some(q)) = (&self.data, &self.queue) {
            q.flush_on_drop();
        }
    }
}

impl CudaBuf {
    fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// The allocation (the buffer must have been sized).
    fn slice(&self) -> &CudaSlice<f32> {
        self.data.as_ref().expect("a sized CUDA buffer")
    }

    fn slice_mut(&mut self) -> &mut CudaSlice<f32> {
        self.data.as_mut().expect("a sized CUDA buffer")
    }
}

/// The KV pool in device memory: per layer, K and V as f16 bits,
/// `slots × (kv_heads · head_dim)` each (the CPU pool's layout).
#[derive(Debug)]
pub struct CudaKv {
    pub layout: KvLayout,
    layers: Vec<(CudaSlice<u16>, CudaSlice<u16>)>,
    queue: graph::Queue,
}

impl Drop for CudaKv {
    fn drop(&mut self) {
        self.queue.flush_on_drop();
    }
}

/// The CUDA backend on one device.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// `None` when libcublas cannot be loaded: then every matmul uses the
    /// dequantizing kernels.
    blas: Option<CudaBlas>,
    kernels: Kernels,
    info: CudaDeviceInfo,
    options: CudaOptions,
    /// Index tables and partial results reused across calls.
    scratch: Mutex<Scratch>,
    /// Per-op host and GPU time, when asked for ([`CudaBackend::with_timing`]).
    timing: Option<timing::Timing>,
    /// Launches and uploads queued since the last flush, and the graphs of repeated lists.
    queue: graph::Queue,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("device", &self.info).field("options", &self.options).finish()
    }
}

/// Whether libcublas can be loaded.
fn blas_loads() -> bool {
    // SAFETY: only tries to open the library (libloading), touching no state.
    std::panic::catch_unwind(|| unsafe { cudarc::cublas::sys::is_culib_present() }).unwrap_or(false)
}

/// Panics with the driver's message: the ops of [`Backend`] cannot fail.
fn check<T>(what: &str, r: Result<T, DriverError>) -> T {
    r.unwrap_or_else(|e| panic!("CUDA {what}: {e}"))
}

impl CudaBackend {
    /// A backend on device `ordinal` with the default options.
    pub fn new(ordinal: usize) -> Result<CudaBackend, BackendError> {
        CudaBackend::with_options(ordinal, CudaOptions::default())
    }

    /// A backend on device `ordinal`: creates its context, stream and cuBLAS
    /// handle and loads the kernels (compiling them with NVRTC the first time).
    pub fn with_options(ordinal: usize, options: CudaOptions) -> Result<CudaBackend, BackendError> {
        let unavailable = |e: CudaUnavailable| BackendError::Device(e.to_string());
        let count = device_count().map_err(unavailable)?;
        if ordinal >= count {
            return Err(unavailable(CudaUnavailable::NoDevice { ordinal, count }));
        }
        if !module::nvrtc_available() {
            return Err(BackendError::Device(CompileError::NoNvrtc.to_string()));
        }
        let built = probe::guarded(|| {
            let device = |e: DriverError| CudaUnavailable::Driver(e.to_string());
            let ctx = CudaContext::new(ordinal).map_err(device)?;
            // SAFETY: the backend queues all its work on one stream, so the
            // events cudarc would create per allocation (to order uses across
            // streams) are not needed.
            unsafe { ctx.disable_event_tracking() };
            let info = probe::info(&ctx)?;
            // A stream of its own: graphs cannot be captured on the legacy default stream.
            let stream = ctx.new_stream().map_err(device)?;
            let kernels = Kernels::load(&ctx, info.compute_capability).map_err(CudaUnavailable::Driver)?;
            let blas = if blas_loads() {
                Some(
                    CudaBlas::new(stream.clone())
                        .map_err(|e| CudaUnavailable::Driver(format!("cuBLAS (libcublas): {e}")))?,
                )
            } else {
                None
            };
            Ok((ctx, stream, kernels, blas, info))
        });
        let (ctx, stream, kernels, blas, info) = built.map_err(unavailable)?;
        let mut options = options;
        options.dense_prefill &= blas.is_some();
        let queue = graph::Queue(Arc::new(Mutex::new(graph::Recorder::new(options.graphs, stream.clone()))));
        Ok(CudaBackend {
            ctx,
            stream,
            blas,
            kernels,
            info,
            options,
            scratch: Mutex::new(Scratch::default()),
            timing: None,
            queue,
        })
    }

    /// Times every op from now on (host time, and GPU time from events on the stream); read
    /// with [`CudaBackend::profile`].
    /// (Graphs are turned off: each op's GPU time is measured as it is launched.)
    pub fn with_timing(mut self) -> CudaBackend {
        self.queue.lock().disable();
        self.timing = Some(timing::Timing::new(self.ctx.clone(), true));
        self
    }

    /// Times every op's host work only (no events: the step runs at its usual speed).
    pub fn with_host_timing(mut self) -> CudaBackend {
        self.timing = Some(timing::Timing::new(self.ctx.clone(), false));
        self
    }

    /// The totals so far (waits for the stream); `None` without [`CudaBackend::with_timing`].
    pub fn profile(&self) -> Option<CudaProfile> {
        self.flush();
        self.timing.as_ref().map(|t| t.flush(&self.stream))
    }

    /// Every op starts here: it makes the backend's context current on the calling thread (the
    /// engine runs on a thread of its own, and cudarc frees a dropped buffer in the context
    /// current on the dropping thread), and times the op when asked to.
    fn enter(&self, op: &'static str) -> timing::Span<'_> {
        check("binding the context", self.ctx.bind_to_thread());
        timing::Span::start(self.timing.as_ref(), &self.stream, op)
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &CudaDeviceInfo {
        &self.info
    }

    /// The options in effect (`dense_prefill` is off when libcublas is missing).
    pub fn options(&self) -> &CudaOptions {
        &self.options
    }

    /// Counts of graph and kernel-by-kernel runs so far.
    pub fn graph_stats(&self) -> GraphStats {
        self.queue.lock().stats
    }

    /// Runs the queued launches and uploads (see [`graph`]): before anything reads results on
    /// the host, allocates or frees device memory, or queues work outside the recorder.
    fn flush(&self) {
        check("binding the context", self.ctx.bind_to_thread());
        self.queue.lock().flush();
    }

    /// Launches `func` (or queues it, see [`graph`]).
    fn launch(
        &self,
        what: &str,
        func: &cudarc::driver::CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        args: &[graph::Arg],
    ) {
        self.queue.lock().launch(what, func.cu_function(), cfg, args);
    }

    /// Copies `data` to the start of `dst` (or queues the copy).
    fn upload_to(&self, dst: &CudaSlice<u32>, data: &[u32]) {
        assert!(dst.len() >= data.len(), "an upload of {} values into {}", data.len(), dst.len());
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(dst, &self.stream);
        self.queue.lock().upload(ptr, data);
    }

    /// Waits until every queued op has finished.
    pub fn synchronize(&self) {
        self.flush();
        check("synchronize", self.stream.synchronize());
    }

    /// Layer `layer` of the pool as f16 values `(K, V)`, each
    /// `slots × (kv_heads · head_dim)` (the CPU pool's layout), for tests.
    pub fn read_kv(&self, kv: &CudaKv, layer: usize) -> (Vec<half::f16>, Vec<half::f16>) {
        self.flush();
        let n = kv.layout.slots * kv.layout.kv_heads * kv.layout.head_dim;
        let read = |s: &CudaSlice<u16>| {
            let mut host = vec![0u16; n];
            if n > 0 {
                check("reading the KV pool", self.stream.memcpy_dtoh(&s.slice(0..n), host.as_mut_slice()));
            }
            self.synchronize();
            host.into_iter().map(half::f16::from_bits).collect()
        };
        let (k, v) = &kv.layers[layer];
        (read(k), read(v))
    }

    fn scratch(&self) -> std::sync::MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for CudaBackend {
    type Weight = CudaWeight;
    type Buf = CudaBuf;
    type Kv = CudaKv;

    fn name(&self) -> String {
        let (major, minor) = self.info.compute_capability;
        let gib = self.info.total_memory as f64 / (1u64 << 30) as f64;
        let blas = if self.blas.is_some() { "" } else { ", no cuBLAS" };
        format!("cuda ({}, sm_{major}{minor}, {gib:.0} GiB{blas})", self.info.name)
    }

    fn load(&self, t: HostTensor) -> Result<CudaWeight, BackendError> {
        let _op = self.enter("load");
        self.flush();
        matmul::load(self, t)
    }

    fn weight_shape(&self, w: &CudaWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn buf(&self) -> CudaBuf {
        CudaBuf { data: None, rows: 0, cols: 0, queue: Some(self.queue.clone()) }
    }

    fn resize(&self, b: &mut CudaBuf, rows: usize, cols: usize) {
        let _op = self.enter("resize");
        let need = rows * cols;
        if b.data.as_ref().is_none_or(|d| d.len() < need) {
            // Queued work may use the old allocation: run it before freeing that. Drop the old
            // allocation first, so its memory can be reused.
            self.flush();
            b.data = None;
            b.data = Some(check("allocating a buffer", self.stream.alloc_zeros::<f32>(need.max(1))));
        }
        b.rows = rows;
        b.cols = cols;
    }

    fn buf_shape(&self, b: &CudaBuf) -> (usize, usize) {
        (b.rows, b.cols)
    }

    fn upload(&self, b: &mut CudaBuf, rows: usize, cols: usize, data: &[f32]) {
        let _op = self.enter("upload");
        assert_eq!(data.len(), rows * cols, "upload of {} values as {rows}×{cols}", data.len());
        self.flush();
        self.resize(b, rows, cols);
        if !data.is_empty() {
            let mut dst = b.slice_mut().slice_mut(0..data.len());
            check("upload", self.stream.memcpy_htod(data, &mut dst));
        }
    }

    fn download(&self, b: &CudaBuf, out: &mut Vec<f32>) {
        let _op = self.enter("download");
        self.flush();
        out.clear();
        out.resize(b.len(), 0.0);
        if !out.is_empty() {
            check("download", self.stream.memcpy_dtoh(&b.slice().slice(0..b.len()), out.as_mut_slice()));
        }
        self.synchronize();
    }

    fn kv(&self, layout: KvLayout) -> Result<CudaKv, BackendError> {
        let _op = self.enter("kv");
        if layout.format != KvFormat::F16 {
            // The kernels read f16 K/V; 8-bit K/V on the GPU (fp8 or Q8_0) is issue 54's next part.
            return Err(BackendError::Unsupported(format!(
                "a {} KV pool on CUDA (the CUDA backend stores f16 K/V; use kv_format = \"f16\")",
                layout.format.name()
            )));
        }
        self.flush();
        let per_layer = layout.slots * layout.kv_heads * layout.head_dim;
        let oom = |e: DriverError| match e.0 {
            cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                BackendError::OutOfMemory { what: "KV pool", bytes: layout.bytes() }
            }
            _ => BackendError::Device(format!("allocating the KV pool: {e}")),
        };
        let mut layers = Vec::with_capacity(layout.layers);
        for _ in 0..layout.layers {
            let k = self.stream.alloc_zeros::<u16>(per_layer.max(1)).map_err(oom)?;
            let v = self.stream.alloc_zeros::<u16>(per_layer.max(1)).map_err(oom)?;
            layers.push((k, v));
        }
        Ok(CudaKv { layout, layers, queue: self.queue.clone() })
    }

    fn memory_available(&self) -> Option<u64> {
        let _op = self.enter("memory_available");
        self.ctx.mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn embed(&self, table: &CudaWeight, tokens: &[u32], out: &mut CudaBuf) -> Result<(), BackendError> {
        let _op = self.enter("embed");
        matmul::embed(self, table, tokens, out)
    }

    fn matmul(&self, x: &CudaBuf, jobs: &mut [(&CudaWeight, &mut CudaBuf)]) {
        let _op = self.enter("matmul");
        matmul::matmul(self, x, jobs);
    }

    fn add_bias(&self, x: &mut CudaBuf, bias: &CudaWeight) {
        let _op = self.enter("add_bias");
        ops::add_bias(self, x, bias);
    }

    fn add(&self, x: &mut CudaBuf, y: &CudaBuf) {
        let _op = self.enter("add");
        ops::add(self, x, y);
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaWeight, eps: f32, out: &mut CudaBuf) {
        let _op = self.enter("rms_norm");
        ops::rms_norm(self, x, w, eps, out);
    }

    fn rms_norm_heads(&self, x: &mut CudaBuf, w: &CudaWeight, eps: f32, head_dim: usize) {
        let _op = self.enter("rms_norm_heads");
        ops::rms_norm_heads(self, x, w, eps, head_dim);
    }

    fn rope_table(&self, positions: &[u32], rope: &RopeConfig, out: &mut CudaBuf) {
        let _op = self.enter("rope_table");
        ops::rope_table(self, positions, rope, out);
    }

    fn rope(&self, x: &mut CudaBuf, table: &CudaBuf, rope: &RopeConfig) {
        let _op = self.enter("rope");
        ops::rope(self, x, table, rope);
    }

    fn silu_mul(&self, gate: &mut CudaBuf, up: &CudaBuf) {
        let _op = self.enter("silu_mul");
        ops::silu_mul(self, gate, up);
    }

    fn kv_export(&self, kv: &CudaKv, layer: usize, slots: &[u32], out: &mut Vec<u16>) -> Result<(), BackendError> {
        let _op = self.enter("kv_export");
        ops::kv_export(self, kv, layer, slots, out)
    }

    fn kv_import(&self, kv: &mut CudaKv, layer: usize, slots: &[u32], rows: &[u16]) -> Result<(), BackendError> {
        let _op = self.enter("kv_import");
        ops::kv_import(self, kv, layer, slots, rows)
    }

    fn kv_store(&self, kv: &mut CudaKv, layer: usize, k: &CudaBuf, v: &CudaBuf, slots: &[u32]) {
        let _op = self.enter("kv_store");
        ops::kv_store(self, kv, layer, k, v, slots);
    }

    fn attention(
        &self,
        q: &CudaBuf,
        kv: &CudaKv,
        layer: usize,
        seqs: &[AttnSeq],
        slots: &[u32],
        shape: &AttnShape,
        out: &mut CudaBuf,
    ) {
        let _op = self.enter("attention");
        attention::attention(self, q, kv, layer, seqs, slots, shape, out);
    }

    fn gather_rows(&self, x: &CudaBuf, rows: &[usize], out: &mut CudaBuf) {
        let _op = self.enter("gather_rows");
        ops::gather_rows(self, x, rows, out);
    }

    fn add_rows_scaled(&self, x: &mut CudaBuf, y: &CudaBuf, rows: &[usize], scales: &[f32]) {
        let _op = self.enter("add_rows_scaled");
        ops::add_rows_scaled(self, x, y, rows, scales);
    }
}
