//! Launches of the element-wise and row-wise kernels of `ops.cu`.

use super::graph::launch;
use super::scratch::{upload_cached, upload_u32};
use super::{CudaBackend, CudaBuf, CudaKv, CudaWeight};
use crate::backend::{Backend, BackendError, RopeConfig, RopeStyle};
use crate::quant::DType;
use cudarc::driver::LaunchConfig;

/// A grid-stride launch over `n` elements.
pub(super) fn grid(n: usize) -> LaunchConfig {
    const THREADS: u32 = 256;
    let blocks = n.div_ceil(THREADS as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// A launch with one block per group of `group` values.
fn per_group(groups: usize, group: usize) -> LaunchConfig {
    let threads = group.next_multiple_of(32).clamp(32, 256) as u32;
    LaunchConfig { grid_dim: (groups as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// The f32 values of a vector weight (norms and biases are loaded as f32).
fn vector(w: &CudaWeight, len: usize) -> &cudarc::driver::CudaSlice<u8> {
    assert_eq!(w.dtype, DType::F32, "vectors are loaded as f32");
    assert_eq!(w.rows * w.cols, len, "a vector of {len} values");
    &w.bytes
}

pub(super) fn add(be: &CudaBackend, x: &mut CudaBuf, y: &CudaBuf) {
    // As on the CPU: `y` matches `x`, or is one row repeated (a bias).
    let broadcast = y.len() == x.cols && x.rows != 1;
    assert!(broadcast || y.len() == x.len(), "add of {}×{} and {}×{}", x.rows, x.cols, y.rows, y.cols);
    add_raw(be, x, y.slice(), broadcast as u32);
}

pub(super) fn add_bias(be: &CudaBackend, x: &mut CudaBuf, bias: &CudaWeight) {
    let b = vector(bias, x.cols);
    add_raw(be, x, b, 1);
}

fn add_raw<T>(be: &CudaBackend, x: &mut CudaBuf, y: &cudarc::driver::CudaSlice<T>, broadcast: u32) {
    let n = x.len() as u64;
    if n == 0 {
        return;
    }
    let cols = x.cols as u32;
    // SAFETY: add_f32(float*, const float*, u64, u32, u32); x holds n values,
    // y n (or cols when broadcast) f32 values.
    launch!(be, "add", &be.kernels.add, grid(n as usize); x.slice_mut(), y, n, cols, broadcast);
}

pub(super) fn silu_mul(be: &CudaBackend, gate: &mut CudaBuf, up: &CudaBuf) {
    assert_eq!(gate.len(), up.len(), "silu_mul of different shapes");
    let n = gate.len() as u64;
    if n == 0 {
        return;
    }
    // SAFETY: silu_mul_f32(float*, const float*, u64); both hold n values.
    launch!(be, "silu_mul", &be.kernels.silu_mul, grid(n as usize); gate.slice_mut(), up.slice(), n);
}

pub(super) fn rms_norm(be: &CudaBackend, x: &CudaBuf, w: &CudaWeight, eps: f32, out: &mut CudaBuf) {
    be.resize(out, x.rows, x.cols);
    if x.len() == 0 {
        return;
    }
    let wv = vector(w, x.cols);
    let group = x.cols as u32;
    // SAFETY: rms_norm_f32(const float*, const float*, float*, u32, float);
    // one block per row of `cols` values; out has x's shape.
    launch!(be, "rms_norm", &be.kernels.rms_norm, per_group(x.rows, x.cols); x.slice(), wv, out.slice_mut(), group, eps);
}

pub(super) fn rms_norm_heads(be: &CudaBackend, x: &mut CudaBuf, w: &CudaWeight, eps: f32, head_dim: usize) {
    assert!(head_dim > 0 && x.cols.is_multiple_of(head_dim), "rows of {} are not whole heads of {head_dim}", x.cols);
    if x.len() == 0 {
        return;
    }
    let wv = vector(w, head_dim);
    let group = head_dim as u32;
    let groups = x.len() / head_dim;
    // SAFETY: rms_norm_inplace_f32(float*, const float*, u32, float); one
    // block per head of head_dim values.
    launch!(be, "rms_norm_heads", &be.kernels.rms_norm_inplace, per_group(groups, head_dim); x.slice_mut(), wv, group, eps);
}

pub(super) fn rope_table(be: &CudaBackend, positions: &[u32], rope: &RopeConfig, out: &mut CudaBuf) {
    let d = rope.head_dim;
    be.resize(out, positions.len(), d);
    if positions.is_empty() {
        return;
    }
    let half = d / 2;
    // Positions, then the inverse frequencies as f32 bits (the CPU's values).
    let mut host: Vec<u32> = positions.to_vec();
    host.extend((0..half).map(|i| crate::cpu::ops::inv_freq(rope, i).to_bits()));
    let mut scratch = be.scratch();
    let idx = upload_u32(be, &mut scratch.idx, &host);
    let pos = idx.slice(0..positions.len());
    let freq = idx.slice(positions.len()..host.len());
    let (n, h, scale) = (positions.len() as u32, half as u32, crate::cpu::ops::rope_scale(rope));
    // SAFETY: rope_table_f32(const u32*, const u32*, float*, u32, u32, float); out
    // holds n × head_dim values.
    launch!(be, "rope_table", &be.kernels.rope_table, grid(positions.len() * half); pos, freq, out.slice_mut(), n, h, scale);
}

pub(super) fn rope(be: &CudaBackend, x: &mut CudaBuf, table: &CudaBuf, rope: &RopeConfig) {
    let d = rope.head_dim;
    assert!(d.is_multiple_of(2) && x.cols.is_multiple_of(d), "rows of {} are not whole heads of {d}", x.cols);
    assert_eq!((table.rows, table.cols), (x.rows, d), "a RoPE table row per row of x");
    if x.len() == 0 {
        return;
    }
    let (rows, cols, hd) = (x.rows as u32, x.cols as u32, d as u32);
    let interleaved = (rope.style == RopeStyle::Interleaved) as u32;
    let cfg = grid(x.len() / 2);
    // SAFETY: rope_f32(float*, const float*, u32, u32, u32, u32); x is
    // rows × cols, table rows × head_dim.
    launch!(be, "rope", &be.kernels.rope, cfg; x.slice_mut(), table.slice(), rows, cols, hd, interleaved);
}

pub(super) fn gather_rows(be: &CudaBackend, x: &CudaBuf, rows: &[usize], out: &mut CudaBuf) {
    be.resize(out, rows.len(), x.cols);
    if rows.is_empty() || x.cols == 0 {
        return;
    }
    let host: Vec<u32> = rows
        .iter()
        .map(|&r| {
            assert!(r < x.rows, "row {r} of a {}-row buffer", x.rows);
            r as u32
        })
        .collect();
    let mut scratch = be.scratch();
    let idx = upload_u32(be, &mut scratch.idx, &host);
    let (n, cols) = (rows.len() as u32, x.cols as u32);
    // SAFETY: gather_rows_f32(const float*, const u32*, float*, u32, u32);
    // every index is a row of x (checked), out holds n × cols values.
    launch!(be, "gather_rows", &be.kernels.gather_rows, grid(rows.len() * x.cols); x.slice(), idx, out.slice_mut(), n, cols);
}

pub(super) fn add_rows_scaled(be: &CudaBackend, x: &mut CudaBuf, y: &CudaBuf, rows: &[usize], scales: &[f32]) {
    crate::backend::check_add_rows(x.rows, x.cols, y.rows, y.cols, rows, scales);
    if rows.is_empty() || x.cols == 0 {
        return;
    }
    // One table: the rows, then the scales' bits.
    let host: Vec<u32> = rows.iter().map(|&r| r as u32).chain(scales.iter().map(|s| s.to_bits())).collect();
    let mut scratch = be.scratch();
    let table = upload_u32(be, &mut scratch.idx, &host);
    let (n, cols) = (rows.len() as u32, x.cols as u32);
    // SAFETY: add_rows_scaled_f32(float*, const float*, const u32*, u32, u32); every row is a
    // row of x (checked) and distinct (the caller's contract), y holds n × cols values, the
    // table 2n.
    launch!(be, "add_rows_scaled", &be.kernels.add_rows_scaled, grid(rows.len() * x.cols); x.slice_mut(), y.slice(), table, n, cols);
}

/// Rows of `slots` of `layer` to the host (see [`crate::backend::Backend::kv_export`]): one
/// gather into device buffers, one copy each for K and V.
pub(super) fn kv_export(
    be: &CudaBackend,
    kv: &CudaKv,
    layer: usize,
    slots: &[u32],
    out: &mut Vec<u16>,
) -> Result<(), BackendError> {
    let cols = kv.layout.check_rows(layer, slots, None)?;
    let n = slots.len() * cols;
    out.clear();
    out.resize(2 * n, 0);
    if n == 0 {
        return Ok(());
    }
    let device = |e: cudarc::driver::DriverError| BackendError::Device(format!("K/V export: {e}"));
    let k_out = be.stream.alloc_zeros::<u16>(n).map_err(device)?;
    let v_out = be.stream.alloc_zeros::<u16>(n).map_err(device)?;
    {
        let mut scratch = be.scratch();
        let idx = upload_u32(be, &mut scratch.idx, slots);
        let (kc, vc) = &kv.layers[layer];
        let (rows, c) = (slots.len() as u32, cols as u32);
        // SAFETY: kv_gather_f16(const u16*, const u16*, const u32*, u16*, u16*, u32, u32);
        // every slot is inside the layer (checked), k_out and v_out hold n values each.
        launch!(be, "kv_gather", &be.kernels.kv_gather, grid(n); kc, vc, idx, k_out, v_out, rows, c);
    }
    let (k, v) = out.split_at_mut(n);
    be.flush();
    be.stream.memcpy_dtoh(&k_out, k).map_err(device)?;
    be.stream.memcpy_dtoh(&v_out, v).map_err(device)?;
    be.synchronize();
    Ok(())
}

/// Rows in `kv_export`'s layout into `slots` of `layer`: one copy each for K and V, one scatter.
pub(super) fn kv_import(
    be: &CudaBackend,
    kv: &mut CudaKv,
    layer: usize,
    slots: &[u32],
    rows: &[u16],
) -> Result<(), BackendError> {
    let cols = kv.layout.check_rows(layer, slots, Some(rows.len()))?;
    let n = slots.len() * cols;
    if n == 0 {
        return Ok(());
    }
    let device = |e: cudarc::driver::DriverError| BackendError::Device(format!("K/V import: {e}"));
    let k = be.stream.clone_htod(&rows[..n]).map_err(device)?;
    let v = be.stream.clone_htod(&rows[n..]).map_err(device)?;
    let mut scratch = be.scratch();
    let idx = upload_u32(be, &mut scratch.idx, slots);
    let (kc, vc) = &mut kv.layers[layer];
    let (count, c) = (slots.len() as u32, cols as u32);
    // SAFETY: kv_scatter_f16(const u16*, const u16*, u16*, u16*, const u32*, u32, u32);
    // every slot is inside the layer (checked), k and v hold n values each.
    launch!(be, "kv_scatter", &be.kernels.kv_scatter, grid(n); k, v, kc, vc, idx, count, c);
    drop(scratch);
    // The host rows are borrowed only until the copies are queued; wait so that `k` and `v`
    // outlive the scatter.
    be.synchronize();
    Ok(())
}

pub(super) fn kv_store(be: &CudaBackend, kv: &mut CudaKv, layer: usize, k: &CudaBuf, v: &CudaBuf, slots: &[u32]) {
    let cols = kv.layout.kv_heads * kv.layout.head_dim;
    assert_eq!((k.rows, k.cols), (slots.len(), cols), "K rows per slot");
    assert_eq!((v.rows, v.cols), (slots.len(), cols), "V rows per slot");
    if let Some(&s) = slots.iter().find(|&&s| s as usize >= kv.layout.slots) {
        panic!("slot {s} outside a pool of {} slots", kv.layout.slots);
    }
    if slots.is_empty() || cols == 0 {
        return;
    }
    let mut scratch = be.scratch();
    let idx = upload_cached(be, &mut scratch.kv_slots, slots);
    let (kc, vc) = &mut kv.layers[layer];
    let (n, c) = (slots.len() as u32, cols as u32);
    // SAFETY: kv_store_f16(const float*, const float*, u16*, u16*, const u32*,
    // u32, u32); every slot is inside the layer (checked), k and v hold
    // n × cols values.
    launch!(be, "kv_store", &be.kernels.kv_store, grid(slots.len() * cols); k.slice(), v.slice(), kc, vc, idx, n, c);
}
