//! Where a step's time goes on the GPU (`cachet bench --device cuda --profile`): each op of
//! [`crate::backend::Backend`] records a CUDA event on the stream when it starts and when its
//! work is queued, and keeps the host time it took. GPU time of an op is the span between its
//! two events; the span between one op's end and the next op's start is time the GPU had
//! nothing queued (it waited for the host). Off unless asked for: events cost host time.

use super::check;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Events kept before their spans are read (which waits for the stream).
const FLUSH_EVENTS: usize = 8192;

/// One op's totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpTime {
    pub calls: u64,
    /// Host time inside the op (launches, uploads, waits).
    pub host: Duration,
    /// GPU time between the op's start and end events.
    pub gpu: Duration,
}

/// Totals per op, and the GPU time with nothing queued between ops.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CudaProfile {
    pub ops: BTreeMap<&'static str, OpTime>,
    pub gpu_idle: Duration,
}

#[derive(Default)]
struct Inner {
    pool: Vec<CudaEvent>,
    used: usize,
    /// (op, start event, end event), in stream order.
    marks: Vec<(&'static str, usize, usize)>,
    depth: usize,
    profile: CudaProfile,
}

pub(super) struct Timing {
    ctx: Arc<CudaContext>,
    /// Record events (GPU time); without them only host time is kept, at almost no cost, to
    /// see how much of a step the host's own work takes.
    events: bool,
    inner: Mutex<Inner>,
}

impl Timing {
    pub(super) fn new(ctx: Arc<CudaContext>, events: bool) -> Timing {
        Timing { ctx, events, inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn event(&self, inner: &mut Inner, stream: &CudaStream) -> usize {
        if inner.used == inner.pool.len() {
            inner.pool.push(check("creating an event", self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))));
        }
        let i = inner.used;
        inner.used += 1;
        check("recording an event", inner.pool[i].record(stream));
        i
    }

    /// Reads every recorded span (waits for the stream) and frees the events for reuse.
    pub(super) fn flush(&self, stream: &CudaStream) -> CudaProfile {
        let mut inner = self.lock();
        check("synchronize", stream.synchronize());
        let inner = &mut *inner;
        let ms = |a: usize, b: usize| {
            let ms = check("reading an event", inner.pool[a].elapsed_ms(&inner.pool[b]));
            Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3)
        };
        for (i, &(op, start, end)) in inner.marks.iter().enumerate() {
            inner.profile.ops.entry(op).or_default().gpu += ms(start, end);
            if let Some(&(_, next, _)) = inner.marks.get(i + 1) {
                inner.profile.gpu_idle += ms(end, next);
            }
        }
        inner.marks.clear();
        inner.used = 0;
        inner.profile.clone()
    }
}

/// An op being timed; ends when dropped. Ops inside ops (a resize inside a matmul) count for
/// the outer one.
pub(super) struct Span<'a> {
    timing: Option<(&'a Timing, &'a CudaStream)>,
    op: &'static str,
    start: usize,
    host: Instant,
}

impl<'a> Span<'a> {
    pub(super) fn start(timing: Option<&'a Timing>, stream: &'a CudaStream, op: &'static str) -> Span<'a> {
        let host = Instant::now();
        let Some(t) = timing else { return Span { timing: None, op, start: 0, host } };
        let mut inner = t.lock();
        inner.depth += 1;
        if inner.depth > 1 {
            return Span { timing: None, op, start: 0, host };
        }
        if inner.used + 2 > FLUSH_EVENTS {
            drop(inner);
            t.flush(stream);
            inner = t.lock();
        }
        let start = if t.events { t.event(&mut inner, stream) } else { 0 };
        Span { timing: Some((t, stream)), op, start, host }
    }
}

impl Drop for Span<'_> {
    fn drop(&mut self) {
        let Some((t, stream)) = self.timing else { return };
        let host = self.host.elapsed();
        let mut inner = t.lock();
        if t.events {
            let end = t.event(&mut inner, stream);
            inner.marks.push((self.op, self.start, end));
        }
        let entry = inner.profile.ops.entry(self.op).or_default();
        entry.calls += 1;
        entry.host += host;
        inner.depth = 0;
    }
}
