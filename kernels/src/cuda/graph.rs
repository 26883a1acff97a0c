//! CUDA graphs for repeated steps. On the GPU machines a kernel launched on its own costs about
//! 6.7 µs and one replayed from a graph about 1.4 µs (`scripts/gpu-launch-overhead.py`), and a
//! decode step of a small model is ~390 small kernels: launching them one by one is most of
//! the step.
//!
//! With `CudaOptions::graphs` on, the ops of [`super::CudaBackend`] do not launch as they are
//! called: each appends its kernel launches and index uploads to a list (the upload's bytes go
//! to a pinned host arena), and the list runs when something needs its results (a download, a
//! synchronize, an op that must run at once, an allocation, a buffer's drop). A list equal to
//! one seen before — same kernels, launch shapes, arguments (buffers included) and uploads
//! (destination, size, place in the arena), whatever the uploaded values — is the same work on
//! new data: the second time it is captured into a graph, and from then on it runs as one
//! graph launch; the graph's copies read the arena, which holds this step's values. Decode
//! steps repeat exactly in this sense (attention pads its work items and slot table to powers
//! of two, so their shapes change rarely); prefills rarely do and run kernel by kernel. Results are the same either way: the same kernels with the same arguments, in the
//! same order, on one stream.
//!
//! Measured on an H200 (docs/gpu.md): batch-1 decode of the 0.5B model 6% faster, batches of 8
//! and 64 4–7% slower, so it is off by default. The kernels' own time, not their launches,
//! dominates the step there; and the step's host work (every op recording its launches) now
//! runs before the graph starts rather than alongside the GPU.

use super::check;
use cudarc::driver::sys::{self, CUdeviceptr, CUfunction};
use cudarc::driver::{result, CudaGraph, CudaStream, LaunchConfig};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// Bytes of the pinned arena for uploads; a list that needs more runs at once.
const ARENA_BYTES: usize = 8 << 20;
/// Graphs kept (a decode at one batch size needs a new one every 64 positions).
const MAX_GRAPHS: usize = 16;
/// Most arguments of one kernel.
const MAX_ARGS: usize = 14;

/// A kernel argument, as the kernel reads it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Arg {
    Ptr(CUdeviceptr),
    U32(u32),
    U64(u64),
    F32(f32),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Item {
    Launch { func: usize, grid: (u32, u32, u32), block: (u32, u32, u32), shared: u32, args: Vec<u64> },
    Upload { dst: CUdeviceptr, offset: usize, len: usize },
}

/// Page-locked host memory (copies from it are asynchronous and can be captured).
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the arena is only touched under the recorder's mutex.
unsafe impl Send for Pinned {}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host; nothing reads it after the backend is gone.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}

/// A captured graph. Launched only under the recorder's mutex.
struct Graph(CudaGraph);

// SAFETY: a graph's handles may be used from any thread when calls are not concurrent (the
// mutex); CudaGraph itself holds raw pointers only.
unsafe impl Send for Graph {}

/// Counts, for tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Lists run by launching a graph (captured then, or before).
    pub graph_runs: u64,
    /// Lists run kernel by kernel.
    pub eager_runs: u64,
    /// Graphs captured.
    pub captures: u64,
}

/// The backend's recorder, shared with its buffers: dropping a buffer runs the queued work
/// first (it may use the buffer).
#[derive(Clone)]
pub(super) struct Queue(pub(super) Arc<Mutex<Recorder>>);

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Queue")
    }
}

impl Queue {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs what is queued, from any thread (binds the context first).
    pub(super) fn flush(&self) {
        let mut r = self.lock();
        if r.items.is_empty() {
            return;
        }
        check("binding the context", r.stream.context().bind_to_thread());
        r.flush();
    }

    /// For the drop of a buffer: runs what is queued unless the thread is unwinding (a panic
    /// inside a drop would abort).
    pub(super) fn flush_on_drop(&self) {
        if !std::thread::panicking() {
            self.flush();
        }
    }
}

pub(super) struct Recorder {
    stream: Arc<CudaStream>,
    /// Off: every op launches at once (also after a capture failed).
    enabled: bool,
    items: Vec<Item>,
    arena: Option<Pinned>,
    used: usize,
    /// Lists run once, waiting to be seen again.
    seen: HashSet<Vec<Item>>,
    graphs: HashMap<Vec<Item>, Graph>,
    order: VecDeque<Vec<Item>>,
    pub(super) stats: GraphStats,
}

impl Recorder {
    pub(super) fn new(enabled: bool, stream: Arc<CudaStream>) -> Recorder {
        Recorder {
            stream,
            enabled,
            items: Vec::new(),
            arena: None,
            used: 0,
            seen: HashSet::new(),
            graphs: HashMap::new(),
            order: VecDeque::new(),
            stats: GraphStats::default(),
        }
    }

    /// Stops recording (after running what is queued): every op launches at once.
    pub(super) fn disable(&mut self) {
        self.flush();
        self.enabled = false;
    }

    /// Queues a launch (recording) or launches it.
    pub(super) fn launch(&mut self, what: &str, func: CUfunction, cfg: LaunchConfig, args: &[Arg]) {
        assert!(args.len() <= MAX_ARGS, "{what}: {} arguments", args.len());
        let args: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => p,
                Arg::U32(v) => u64::from(v),
                Arg::U64(v) => v,
                Arg::F32(v) => u64::from(v.to_bits()),
            })
            .collect();
        let item = Item::Launch {
            func: func as usize,
            grid: cfg.grid_dim,
            block: cfg.block_dim,
            shared: cfg.shared_mem_bytes,
            args,
        };
        if self.enabled {
            self.items.push(item);
        } else {
            run_item(&self.stream, &item, None);
        }
    }

    /// Queues a copy of `data` to `dst` (recording: through the arena), or copies it at once.
    pub(super) fn upload(&mut self, dst: CUdeviceptr, data: &[u32]) {
        if data.is_empty() {
            return;
        }
        let bytes = std::mem::size_of_val(data);
        if self.enabled && self.used.next_multiple_of(16) + bytes > ARENA_BYTES {
            // The arena is full: run what is queued (then it is free again).
            self.flush();
        }
        let offset = self.used.next_multiple_of(16);
        if !self.enabled || offset + bytes > ARENA_BYTES {
            // Not recording, or too large for the arena (nothing is queued then): copy now.
            // SAFETY: dst holds at least `data.len()` u32 (the callers size it); a pageable
            // copy returns once `data` has been read.
            check("uploading indices", unsafe { result::memcpy_htod_async(dst, data, self.stream.cu_stream()) });
            return;
        }
        let arena = self.arena.get_or_insert_with(|| {
            // SAFETY: a plain page-locked allocation, freed by Pinned's drop.
            let ptr = check("allocating pinned memory", unsafe { result::malloc_host(ARENA_BYTES, 0) });
            Pinned { ptr: ptr.cast(), len: ARENA_BYTES }
        });
        debug_assert!(offset + bytes <= arena.len);
        // SAFETY: in bounds (checked above); no queued copy reads the arena (the list that
        // last used it finished before this one started: `flush` waits).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), arena.ptr.add(offset), bytes) };
        self.used = offset + bytes;
        self.items.push(Item::Upload { dst, offset, len: bytes });
    }

    /// Runs the queued list: as a graph when it was seen before, else kernel by kernel. Waits
    /// for nothing except, when the arena is to be reused, the list's own completion.
    pub(super) fn flush(&mut self) {
        if self.items.is_empty() {
            return;
        }
        let stream = &self.stream.clone();
        let items = std::mem::take(&mut self.items);
        let arena = self.arena.as_ref().map(|a| a.ptr as *const u8);
        if let Some(Graph(graph)) = self.graphs.get(&items) {
            check("launching a graph", graph.launch());
            self.stats.graph_runs += 1;
        } else if self.seen.contains(&items) {
            match capture(stream, &items, arena) {
                Ok(graph) => {
                    check("launching a graph", graph.launch());
                    self.stats.graph_runs += 1;
                    self.stats.captures += 1;
                    self.seen.remove(&items);
                    if self.order.len() == MAX_GRAPHS {
                        if let Some(old) = self.order.pop_front() {
                            self.graphs.remove(&old);
                        }
                    }
                    self.order.push_back(items.clone());
                    self.graphs.insert(items.clone(), Graph(graph));
                }
                Err(e) => {
                    tracing::warn!("CUDA graph capture failed ({e}); launching kernels one by one from now on");
                    self.enabled = false;
                    for item in &items {
                        run_item(stream, item, arena);
                    }
                    self.stats.eager_runs += 1;
                }
            }
        } else {
            for item in &items {
                run_item(stream, item, arena);
            }
            self.stats.eager_runs += 1;
            if self.seen.len() > 64 {
                self.seen.clear();
            }
            self.seen.insert(items.clone());
        }
        // The next list writes the arena from its start: this one's copies must have read it.
        if self.used > 0 {
            check("synchronize", stream.synchronize());
            self.used = 0;
        }
        self.items = items;
        self.items.clear();
    }
}

fn capture(stream: &Arc<CudaStream>, items: &[Item], arena: Option<*const u8>) -> Result<CudaGraph, String> {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(|e| format!("begin: {e}"))?;
    let mut failed = None;
    for item in items {
        if let Err(e) = try_run_item(stream, item, arena) {
            failed = Some(e);
            break;
        }
    }
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    if let Some(e) = failed {
        return Err(format!("recording: {e}"));
    }
    graph.map_err(|e| format!("end: {e}"))?.ok_or_else(|| "an empty graph".to_string())
}

fn run_item(stream: &CudaStream, item: &Item, arena: Option<*const u8>) {
    check("launching a queued kernel", try_run_item(stream, item, arena));
}

fn try_run_item(stream: &CudaStream, item: &Item, arena: Option<*const u8>) -> Result<(), result::DriverError> {
    match item {
        Item::Launch { func, grid, block, shared, args } => {
            let mut values = args.clone();
            let mut params: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
            // SAFETY: the op that queued it checked its arguments against the kernel's
            // signature; a u32 or f32 parameter reads the low 4 bytes of its u64 (little
            // endian), a pointer all 8; the buffers are alive (nothing is freed while a list
            // is queued: allocations and frees flush it first).
            unsafe {
                result::launch_kernel(*func as CUfunction, *grid, *block, *shared, stream.cu_stream(), &mut params)
            }
        }
        Item::Upload { dst, offset, len } => {
            let base = arena.expect("an upload through the arena");
            // SAFETY: `offset..offset + len` was written by `upload` and lies inside the arena.
            let src = unsafe { std::slice::from_raw_parts(base.add(*offset), *len) };
            // SAFETY: dst holds at least len bytes (checked when queued); the arena is pinned.
            unsafe { result::memcpy_htod_async(*dst, src, stream.cu_stream()) }
        }
    }
}

/// What a kernel argument is made of: a device buffer (its address) or a scalar.
pub(super) trait KernelArg {
    fn arg(&self, stream: &CudaStream) -> Arg;
}

impl KernelArg for u32 {
    fn arg(&self, _: &CudaStream) -> Arg {
        Arg::U32(*self)
    }
}

impl KernelArg for u64 {
    fn arg(&self, _: &CudaStream) -> Arg {
        Arg::U64(*self)
    }
}

impl KernelArg for f32 {
    fn arg(&self, _: &CudaStream) -> Arg {
        Arg::F32(*self)
    }
}

macro_rules! device_arg {
    ($($t:ty),*) => {$(
        impl<T> KernelArg for $t {
            fn arg(&self, stream: &CudaStream) -> Arg {
                Arg::Ptr(cudarc::driver::DevicePtr::device_ptr(self, stream).0)
            }
        }
    )*};
}
device_arg!(cudarc::driver::CudaSlice<T>, cudarc::driver::CudaView<'_, T>, cudarc::driver::CudaViewMut<'_, T>);

impl<A: KernelArg + ?Sized> KernelArg for &A {
    fn arg(&self, stream: &CudaStream) -> Arg {
        (**self).arg(stream)
    }
}

impl<A: KernelArg + ?Sized> KernelArg for &mut A {
    fn arg(&self, stream: &CudaStream) -> Arg {
        (**self).arg(stream)
    }
}

/// `launch!(backend, "what", &function, config; arguments…)`: launches (or queues) a kernel
/// with its arguments in the kernel's order. The caller states, in a SAFETY comment, that they
/// match the kernel's signature and that the buffers are large enough.
macro_rules! launch {
    ($be:expr, $what:expr, $func:expr, $cfg:expr; $($a:expr),* $(,)?) => {{
        let args = [$($crate::cuda::graph::KernelArg::arg(&$a, &$be.stream)),*];
        $be.launch($what, $func, $cfg, &args)
    }};
}
pub(super) use launch;
