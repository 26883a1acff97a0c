//! Causal attention over K/V held in a slot-indexed pool. A query at position
//! `p` reads the slots of positions `0..=p` in order, so its result is the
//! same whether it is part of a prefill chunk or a single decode step.
//!
//! Levels with a tile kernel (`Kernels::tile`: AVX2, AVX-512) split the work into
//! (block of query rows, KV head) tasks computed flash-attention style: the
//! keys in fixed blocks of [`KEY_BLOCK`] positions, each block's K and V read
//! and converted to f32 (from f16 or from `Q8_0` blocks: [`KvRows::to_f32`]'s
//! values) once for all the tile's query heads, an online
//! softmax across blocks. Every query's arithmetic is the same whatever tile
//! it is in (blocks start at fixed positions, and keys a query may not see
//! add exact zeros), so results stay independent of batching and chunking.
//! The scalar level uses one task per (query row, KV head) with
//! `Kernels::attend`.

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
pub(super) mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_op_in_unsafe_fn)]
pub(super) mod avx512;

use super::dot::Kernels;
use crate::backend::{AttnSeq, AttnShape, KvFormat};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::cell::RefCell;

/// K and V of one layer: `slots` rows of `kv_heads · head_dim` values each, in the pool's format.
#[derive(Debug)]
pub struct LayerKv {
    pub k: KvData,
    pub v: KvData,
}

/// K or V of one layer as stored.
#[derive(Debug, PartialEq)]
pub enum KvData {
    F16(Vec<f16>),
    /// `Q8_0` blocks (34 bytes per 32 values: an f16 scale, then 32 signed bytes).
    Q8(Vec<u8>),
}

/// Bytes of a `Q8_0` block of 32 values.
pub const Q8_BLOCK_BYTES: usize = 34;

impl KvData {
    /// `values` zeros in `format` (an allocation failure is `None`).
    pub fn zeros(format: KvFormat, values: usize) -> Option<KvData> {
        fn zeroed<T: Clone>(n: usize, zero: T) -> Option<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).ok()?;
            v.resize(n, zero);
            Some(v)
        }
        Some(match format {
            KvFormat::F16 => KvData::F16(zeroed(values, f16::ZERO)?),
            KvFormat::Q8_0 => KvData::Q8(zeroed(values / 32 * Q8_BLOCK_BYTES, 0u8)?),
        })
    }

    pub fn rows(&self) -> KvRows<'_> {
        match self {
            KvData::F16(v) => KvRows::F16(v),
            KvData::Q8(v) => KvRows::Q8(v),
        }
    }

    /// Stores the row `x` (heads of `hd` values) at value offset `at` (a row start); `Q8_0` rows
    /// rotated head by head ([`hadamard`]), then quantized.
    fn write(&mut self, at: usize, x: &[f32], hd: usize) {
        match self {
            KvData::F16(v) => v[at..at + x.len()].convert_from_f32_slice(x),
            KvData::Q8(v) => {
                let (mut stack, mut heap) = ([0f32; 2048], Vec::new());
                let rot = rotated(x, hd, &mut stack, &mut heap);
                let start = at / 32 * Q8_BLOCK_BYTES;
                let bytes = &mut v[start..start + x.len() / 32 * Q8_BLOCK_BYTES];
                crate::quant::quantize_row(crate::quant::DType::Q8_0, rot, bytes).expect("rows of whole blocks");
            }
        }
    }

    /// The 16-bit units of the row of `cols` values at value offset `at` (see
    /// [`KvFormat::row_units`]), appended to `out`.
    pub(crate) fn export_row(&self, at: usize, cols: usize, out: &mut Vec<u16>) {
        match self {
            KvData::F16(v) => out.extend(v[at..at + cols].iter().map(|x| x.to_bits())),
            KvData::Q8(v) => {
                let start = at / 32 * Q8_BLOCK_BYTES;
                let bytes = &v[start..start + cols / 32 * Q8_BLOCK_BYTES];
                out.extend(bytes.chunks_exact(2).map(|p| u16::from_le_bytes([p[0], p[1]])));
            }
        }
    }

    /// Writes a row given as [`KvData::export_row`] gives it.
    pub(crate) fn import_row(&mut self, at: usize, cols: usize, units: &[u16]) {
        match self {
            KvData::F16(v) => {
                for (dst, &bits) in v[at..at + cols].iter_mut().zip(units) {
                    *dst = f16::from_bits(bits);
                }
            }
            KvData::Q8(v) => {
                let start = at / 32 * Q8_BLOCK_BYTES;
                for (dst, &u) in v[start..start + cols / 32 * Q8_BLOCK_BYTES].chunks_exact_mut(2).zip(units) {
                    dst.copy_from_slice(&u.to_le_bytes());
                }
            }
        }
    }
}

/// The orthonormal Walsh–Hadamard transform of `x` in place, in pieces of [`rotation`]`(x.len())`
/// values: what `Q8_0` K and V rows are stored as. An outlier (a few channels of Qwen2's keys are
/// ten times the rest) is spread over the whole piece, so the block's scale no longer crushes the
/// other values of its block: llama.cpp does the same to its quantized K/V (Q and K, and V with
/// the output turned back). Its own inverse (the matrix is symmetric and orthonormal), so a query
/// rotated the same way gives the same dot products, and an output rotated again is the
/// attention over the unrotated V.
pub fn hadamard(x: &mut [f32]) {
    let n = rotation(x.len());
    let norm = 1.0 / (n as f32).sqrt();
    for piece in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (piece[j], piece[j + h]);
                    piece[j] = a + b;
                    piece[j + h] = a - b;
                }
            }
            h *= 2;
        }
        for v in piece.iter_mut() {
            *v *= norm;
        }
    }
}

/// `x` copied with each head of `hd` values rotated ([`hadamard`]): into `stack` when it fits,
/// else into `heap`.
fn rotated<'a>(x: &[f32], hd: usize, stack: &'a mut [f32], heap: &'a mut Vec<f32>) -> &'a mut [f32] {
    let out = if x.len() <= stack.len() {
        &mut stack[..x.len()]
    } else {
        heap.resize(x.len(), 0.0);
        &mut heap[..]
    };
    out.copy_from_slice(x);
    out.chunks_exact_mut(hd).for_each(hadamard);
    out
}

/// The size of [`hadamard`]'s pieces for a head of `hd` values: the largest power of two that
/// divides it (the whole head for 64 or 128).
pub fn rotation(hd: usize) -> usize {
    1 << hd.trailing_zeros().min(10)
}

/// Rows of K or V as the kernels read them.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F16(&'a [f16]),
    /// `Q8_0` blocks, [`Q8_BLOCK_BYTES`] per 32 values.
    Q8(&'a [u8]),
}

impl KvRows<'_> {
    /// Whether rows are stored rotated ([`hadamard`], per head): `Q8_0` rows are.
    pub fn rotated(self) -> bool {
        matches!(self, KvRows::Q8(_))
    }

    /// The `out.len()` values at value offset `at` (a head's start) in f32. A `Q8_0` value is
    /// its byte times its block's scale, which f32 holds exactly (8 by 11 significant bits), so
    /// every kernel's conversion gives these same values.
    pub fn to_f32(self, at: usize, out: &mut [f32]) {
        match self {
            KvRows::F16(v) => v[at..at + out.len()].convert_to_f32_slice(out),
            KvRows::Q8(v) => {
                let start = at / 32 * Q8_BLOCK_BYTES;
                for (block, dst) in v[start..].chunks_exact(Q8_BLOCK_BYTES).zip(out.chunks_mut(32)) {
                    let d = f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
                    for (o, &q) in dst.iter_mut().zip(&block[2..]) {
                        *o = q as i8 as f32 * d;
                    }
                }
            }
        }
    }
}

/// One task: `rep` query heads (contiguous in `q`, `hd` values each) attend
/// over the slots in `keys`, reading the `hd` values at `offset` of each slot
/// row (`kv_cols` wide) of `k` and `v`.
#[derive(Debug)]
pub struct Attend<'a> {
    pub q: &'a [f32],
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    pub kv_cols: usize,
    pub offset: usize,
    pub hd: usize,
    pub rep: usize,
    pub keys: &'a [u32],
    pub scale: f32,
}

/// A per-level attention kernel: writes `rep × hd` values to `out`, using
/// `scores` (at least `rep × keys.len()` long) as scratch.
pub type AttendFn = fn(&Attend<'_>, &mut [f32], &mut [f32]);

/// Keys per block of the tile kernels; blocks start at multiples of it.
pub const KEY_BLOCK: usize = 64;

/// One tile task: query rows `0..rows` of `q` (row `r` at position
/// `pos0 + r`, rows `q_cols` wide) and their query heads `head0..head0 + rep`,
/// which share the KV head read at `offset` of each slot row (`kv_cols`
/// wide). `keys` are the slots of positions `0..pos0 + rows`.
#[derive(Debug)]
pub struct Tile<'a> {
    pub q: &'a [f32],
    pub q_cols: usize,
    pub rows: usize,
    pub pos0: usize,
    pub head0: usize,
    pub rep: usize,
    pub hd: usize,
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
    pub kv_cols: usize,
    pub offset: usize,
    pub keys: &'a [u32],
    pub scale: f32,
}

/// Buffers of a tile kernel, kept per worker thread.
#[derive(Debug, Default)]
pub struct TileScratch {
    pub f: Vec<f32>,
    pub i: Vec<i32>,
}

/// A tile kernel: writes the tile's heads of its rows to `out` (laid out as
/// `q`).
///
/// # Safety
/// `out` must be valid for writes at `r * q_cols + head0 * hd ..+ rep * hd`
/// for every row `r < rows`, and nobody else may touch those values
/// meanwhile; the CPU must support the kernel's level.
pub type TileFn = unsafe fn(&Tile<'_>, &mut TileScratch, *mut f32);

/// A tile kernel's buffers, carved out of its [`TileScratch`] by [`TileBufs::carve`], with the
/// tile's `m = rows · rep` queries padded to `mp` (a whole number `mv` of vectors of `lanes`).
pub(super) struct TileBufs {
    pub m: usize,
    pub mv: usize,
    pub mp: usize,
    /// The queries transposed (`hd × mp`: lane = query) and pre-scaled; padding lanes are zero
    /// queries at the last row's position.
    pub qt: *mut f32,
    /// Scores of a key block (`KEY_BLOCK × mp`).
    pub s: *mut f32,
    /// A key block's K and V in f32 (`KEY_BLOCK × hd` each).
    pub kf: *mut f32,
    pub vf: *mut f32,
    /// The output accumulators (`m × hd`), zero.
    pub o: *mut f32,
    /// The running max (−∞), sum (0) and rescale factor of each query (`mp` each).
    pub mx: *mut f32,
    pub sum: *mut f32,
    pub alpha: *mut f32,
    /// Each query's position (`mp`).
    pub qpos: *mut i32,
}

impl TileBufs {
    /// Sizes `sc` for the tile (head size `hd`, vectors of `lanes` queries), carves it and sets
    /// every buffer's starting values; `None` for a tile without queries. The pointers are valid
    /// while `sc` is not touched otherwise.
    ///
    /// # Safety
    /// `t.q` must hold `rows` rows of `q_cols` values with heads `head0..head0 + rep` of `hd`
    /// values each in them (as [`attention`] builds tiles).
    #[inline(always)]
    pub(super) unsafe fn carve(t: &Tile<'_>, sc: &mut TileScratch, lanes: usize) -> Option<TileBufs> {
        const KB: usize = KEY_BLOCK;
        let (hd, rep) = (t.hd, t.rep);
        let m = t.rows * rep;
        if m == 0 {
            return None;
        }
        let mv = m.div_ceil(lanes);
        let mp = mv * lanes;
        // qt (hd × mp) | s (KB × mp) | kf, vf (KB × hd) | o (m × hd) | max, sum, alpha (mp).
        let total = hd * mp + KB * mp + 2 * KB * hd + m * hd + 3 * mp;
        if sc.f.len() < total {
            sc.f.resize(total, 0.0);
        }
        if sc.i.len() < mp {
            sc.i.resize(mp, 0);
        }
        // SAFETY: every offset below is within the `total` values just ensured.
        let (qt, s, kf, vf, o, mx, sum, alpha) = unsafe {
            let qt = sc.f.as_mut_ptr();
            let s = qt.add(hd * mp);
            let kf = s.add(KB * mp);
            let vf = kf.add(KB * hd);
            let o = vf.add(KB * hd);
            let mx = o.add(m * hd);
            let sum = mx.add(mp);
            (qt, s, kf, vf, o, mx, sum, sum.add(mp))
        };
        let b = TileBufs { m, mv, mp, qt, s, kf, vf, o, mx, sum, alpha, qpos: sc.i.as_mut_ptr() };
        // SAFETY: the reads of `t.q` are within its rows and heads (the caller's promise); the
        // writes are within the buffers carved above.
        unsafe {
            let rotated = t.k.rotated();
            let mut head = [0f32; 1024];
            for r in 0..t.rows {
                for h in 0..rep {
                    let i = r * rep + h;
                    let start = r * t.q_cols + (t.head0 + h) * hd;
                    let q = &mut head[..hd];
                    q.copy_from_slice(&t.q[start..start + hd]);
                    // Rotated keys: the query rotated the same way keeps every dot product.
                    if rotated {
                        hadamard(q);
                    }
                    for (d, &v) in q.iter().enumerate() {
                        *b.qt.add(d * mp + i) = v * t.scale;
                    }
                }
            }
            for d in 0..hd {
                for i in m..mp {
                    *b.qt.add(d * mp + i) = 0.0;
                }
            }
            for i in 0..mp {
                *b.qpos.add(i) = (t.pos0 + i.min(m - 1) / rep) as i32;
                *b.mx.add(i) = f32::NEG_INFINITY;
                *b.sum.add(i) = 0.0;
            }
            std::ptr::write_bytes(b.o, 0, m * hd);
        }
        Some(b)
    }

    /// Writes each query's output (its accumulators over its sum) to its head of its row in
    /// `out` (laid out as `t.q`).
    ///
    /// # Safety
    /// `out` as a [`TileFn`]'s; the buffers as [`TileBufs::carve`] left them, accumulated.
    #[inline(always)]
    pub(super) unsafe fn finish(&self, t: &Tile<'_>, out: *mut f32) {
        let hd = t.hd;
        let rotated = t.v.rotated();
        let mut head = [0f32; 1024];
        for i in 0..self.m {
            let (r, h) = (i / t.rep, i % t.rep);
            // SAFETY: `sum` and `o` hold `m` queries; `out`'s span is the caller's promise.
            unsafe {
                let inv = 1.0 / *self.sum.add(i);
                let o = &mut head[..hd];
                for (d, v) in o.iter_mut().enumerate() {
                    *v = *self.o.add(i * hd + d) * inv;
                }
                // Rotated values: the output turned back.
                if rotated {
                    hadamard(o);
                }
                std::ptr::copy_nonoverlapping(o.as_ptr(), out.add(r * t.q_cols + (t.head0 + h) * hd), hd);
            }
        }
    }
}

/// Query rows per tile: about 128 query heads per task.
fn tile_rows(rep: usize) -> usize {
    (128 / rep.max(1)).max(1)
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static TILE: RefCell<TileScratch> = RefCell::new(TileScratch::default());
}

/// Sizes this thread's score buffer (called on every worker at start-up, so
/// the first attention call does not allocate).
pub(crate) fn warm_thread() {
    SCORES.with(|cell| cell.borrow_mut().resize(1 << 16, 0.0));
    // A tile kernel's buffers for head sizes up to 128 and tiles of up to
    // 128 queries (see `tile_rows`): whatever thread picks up its first tile
    // during decode, it does not allocate.
    let (hd, m) = (128, 128);
    TILE.with(|cell| {
        let mut sc = cell.borrow_mut();
        sc.f.resize(hd * m + KEY_BLOCK * m + 2 * KEY_BLOCK * hd + m * hd + 3 * m, 0.0);
        sc.i.resize(m, 0);
    });
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes the heads of one (row, KV head) pair only.
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: a shared `OutPtr` only hands out the pointer; every write through it is a
// task's, to the values of its own (row, KV head) pair.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `q` and `out` are `rows × (n_heads · head_dim)`.
pub fn attention(
    kernels: &Kernels,
    q: &[f32],
    kv: &LayerKv,
    seqs: &[AttnSeq],
    slots: &[u32],
    s: &AttnShape,
    out: &mut [f32],
) {
    let (hd, nkv) = (s.head_dim, s.n_kv_heads);
    let rep = s.n_heads / nkv;
    let q_cols = s.n_heads * hd;
    let rows = seqs.last().map_or(0, |q| q.rows.end);
    let ptr = OutPtr(out.as_mut_ptr());
    if let Some(tile) = kernels.tile {
        // Tiles of `per` rows within each sequence, each run once per KV head,
        // found by walking the sequences (no allocation: decode steps make none).
        let per = tile_rows(rep);
        let tile_of = |mut n: usize| {
            for seq in seqs {
                let count = seq.rows.len().div_ceil(per);
                if n < count {
                    return (seq, seq.rows.start + n * per);
                }
                n -= count;
            }
            unreachable!("tile index past the last sequence")
        };
        let n_tiles: usize = seqs.iter().map(|q| q.rows.len().div_ceil(per)).sum();
        let task = |idx: usize| {
            let ((seq, row0), g) = (tile_of(idx / nkv), idx % nkv);
            let rows = per.min(seq.rows.end - row0);
            let pos0 = seq.first_pos + (row0 - seq.rows.start);
            let t = Tile {
                q: &q[row0 * q_cols..(row0 + rows) * q_cols],
                q_cols,
                rows,
                pos0,
                head0: g * rep,
                rep,
                hd,
                k: kv.k.rows(),
                v: kv.v.rows(),
                kv_cols: nkv * hd,
                offset: g * hd,
                keys: &slots[seq.slots.start..seq.slots.start + pos0 + rows],
                scale: s.scale,
            };
            // SAFETY: the tile's rows lie inside `out` (same shape as `q`), only
            // this task writes their heads `g*rep..(g+1)*rep`, and the kernel
            // came from `Kernels`, which checked the CPU.
            TILE.with(|cell| unsafe { tile(&t, &mut cell.borrow_mut(), ptr.get().add(row0 * q_cols)) });
        };
        let tasks = n_tiles * nkv;
        if tasks > 1 {
            (0..tasks).into_par_iter().for_each(task);
        } else {
            (0..tasks).for_each(task);
        }
        return;
    }
    let task = |idx: usize| {
        let (row, g) = (idx / nkv, idx % nkv);
        // Sequences cover consecutive rows: find the one holding `row`.
        let seq = &seqs[seqs.partition_point(|q| q.rows.end <= row)];
        let pos = seq.first_pos + (row - seq.rows.start);
        let keys = &slots[seq.slots.start..seq.slots.start + pos + 1];
        let start = row * q_cols + g * rep * hd;
        let a = Attend {
            q: &q[start..start + rep * hd],
            k: kv.k.rows(),
            v: kv.v.rows(),
            kv_cols: nkv * hd,
            offset: g * hd,
            hd,
            rep,
            keys,
            scale: s.scale,
        };
        // SAFETY: `start..start + rep*hd` lies inside `out` (same shape as `q`),
        // and only this task writes it.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr.get().add(start), rep * hd) };
        SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            let need = rep * keys.len();
            if scores.len() < need {
                // Geometric growth from 64K scores: a handful of allocations
                // over a long context, never one per token.
                let size = need.max(2 * scores.len()).max(1 << 16);
                scores.resize(size, 0.0);
            }
            (kernels.attend)(&a, &mut scores, dst);
        });
    };
    let tasks = rows * nkv;
    if tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// A tile row by row through a per-row kernel (head sizes a tile kernel does
/// not cover).
///
/// # Safety
/// As for [`TileFn`].
pub(super) unsafe fn tile_by_rows(t: &Tile<'_>, sc: &mut TileScratch, out: *mut f32, attend: AttendFn) {
    let n = t.rep * t.hd;
    for r in 0..t.rows {
        let keys = &t.keys[..t.pos0 + r + 1];
        let start = r * t.q_cols + t.head0 * t.hd;
        let a = Attend {
            q: &t.q[start..start + n],
            k: t.k,
            v: t.v,
            kv_cols: t.kv_cols,
            offset: t.offset,
            hd: t.hd,
            rep: t.rep,
            keys,
            scale: t.scale,
        };
        if sc.f.len() < t.rep * keys.len() {
            sc.f.resize(t.rep * keys.len(), 0.0);
        }
        // SAFETY: the caller guarantees these `n` values of `out`.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.add(start), n) };
        attend(&a, &mut sc.f, dst);
    }
}

/// The portable kernel: the reference the SIMD kernels are tested against.
pub fn attend_scalar(a: &Attend<'_>, scores: &mut [f32], out: &mut [f32]) {
    let (n, hd, rep) = (a.keys.len(), a.hd, a.rep);
    let mut buf = [0f32; 1024];
    let row = &mut buf[..hd];
    // Rotated keys and values ([`hadamard`]): the queries rotated the same way, the output back.
    let (mut stack, mut heap) = ([0f32; 2048], Vec::new());
    let q_all: &[f32] = if a.k.rotated() { rotated(&a.q[..rep * hd], hd, &mut stack, &mut heap) } else { a.q };
    for (j, &slot) in a.keys.iter().enumerate() {
        a.k.to_f32(slot as usize * a.kv_cols + a.offset, row);
        for h in 0..rep {
            let q = &q_all[h * hd..(h + 1) * hd];
            scores[h * n + j] = q.iter().zip(row.iter()).map(|(x, y)| x * y).sum::<f32>() * a.scale;
        }
    }
    for h in 0..rep {
        let sc = &mut scores[h * n..(h + 1) * n];
        let max = sc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0f32;
        for v in sc.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        sc.iter_mut().for_each(|v| *v *= inv);
    }
    out.fill(0.0);
    for (j, &slot) in a.keys.iter().enumerate() {
        a.v.to_f32(slot as usize * a.kv_cols + a.offset, row);
        for h in 0..rep {
            let w = scores[h * n + j];
            for (o, &v) in out[h * hd..(h + 1) * hd].iter_mut().zip(row.iter()) {
                *o += w * v;
            }
        }
    }
    if a.v.rotated() {
        out.chunks_exact_mut(hd).for_each(hadamard);
    }
}

/// Stores `k`/`v` rows (`kv_cols` wide, heads of `hd`) into their slots, each row on its own (so
/// a row's stored bits do not depend on what it was stored with).
pub fn store(kv: &mut LayerKv, k: &[f32], v: &[f32], kv_cols: usize, hd: usize, slots: &[u32]) {
    for (i, &slot) in slots.iter().enumerate() {
        let off = slot as usize * kv_cols;
        kv.k.write(off, &k[i * kv_cols..(i + 1) * kv_cols], hd);
        kv.v.write(off, &v[i * kv_cols..(i + 1) * kv_cols], hd);
    }
}
