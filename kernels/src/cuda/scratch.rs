//! Device buffers reused across calls: the index tables each op uploads
//! (tokens, slots, positions), the bf16 activations of cuBLAS GEMMs and the
//! partial results of attention. They only grow.
//!
//! Every use is queued on the backend's one stream, so a later upload into the
//! same buffer cannot overtake a kernel still reading it.

use super::CudaBackend;
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

/// The backend's reusable buffers (behind its mutex).
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub idx: Option<CudaSlice<u32>>,
    /// The slot table of `kv_store` and the tables of `attention`: every layer of a step uploads
    /// the same ones, so each is uploaded only when it differs from the last.
    pub kv_slots: Cached,
    pub attention: Cached,
    pub bf16: Option<CudaSlice<u16>>,
    pub part_o: Option<CudaSlice<f32>>,
    pub part_ml: Option<CudaSlice<f32>>,
}

/// `slot`, grown to hold at least `need` elements (at least doubling).
pub(super) fn grown<'a, T: DeviceRepr + ValidAsZeroBits>(
    be: &CudaBackend,
    slot: &'a mut Option<CudaSlice<T>>,
    need: usize,
) -> &'a mut CudaSlice<T> {
    let have = slot.as_ref().map_or(0, |s| s.len());
    if have < need || slot.is_none() {
        let size = need.max(2 * have).max(1024);
        // Queued work may use the old buffer: run it before freeing that.
        be.flush();
        *slot = None;
        *slot = Some(super::check("allocating scratch", be.stream.alloc_zeros::<T>(size)));
    }
    slot.as_mut().expect("allocated above")
}

/// Copies `data` into the index scratch and returns it.
pub(super) fn upload_u32<'a>(
    be: &CudaBackend,
    slot: &'a mut Option<CudaSlice<u32>>,
    data: &[u32],
) -> &'a CudaSlice<u32> {
    let buf = grown(be, slot, data.len());
    be.upload_to(buf, data);
    buf
}

/// An index table on the device with a host copy of what it holds.
#[derive(Debug, Default)]
pub(super) struct Cached {
    buf: Option<CudaSlice<u32>>,
    host: Vec<u32>,
}

/// Like [`upload_u32`], but skips the copy when the buffer already holds `data` (nothing else
/// writes it, and uses are ordered on the one stream).
pub(super) fn upload_cached<'a>(be: &CudaBackend, c: &'a mut Cached, data: &[u32]) -> &'a CudaSlice<u32> {
    if c.buf.is_none() || c.host != data {
        c.host.clear();
        upload_u32(be, &mut c.buf, data);
        c.host.extend_from_slice(data);
    }
    c.buf.as_ref().expect("uploaded above")
}
