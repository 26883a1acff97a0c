//! Causal attention over K/V held in a slot-indexed pool. A query at position
//! `p` reads the slots of positions `0..=p` in order, so its result is the
//! same whether it is part of a prefill chunk or a single decode step.

use super::dot::Dots;
use crate::backend::{AttnSeq, AttnShape};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;
use std::cell::RefCell;

/// K and V of one layer: `slots × (kv_heads · head_dim)` f16 each.
#[derive(Debug)]
pub struct LayerKv {
    pub k: Vec<f16>,
    pub v: Vec<f16>,
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each task writes the heads of one (row, kv head) pair only.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `q` and `out` are `rows × (n_heads · head_dim)`.
pub fn attention(dots: &Dots, q: &[f32], kv: &LayerKv, seqs: &[AttnSeq<'_>], s: &AttnShape, out: &mut [f32]) {
    let (hd, nkv) = (s.head_dim, s.n_kv_heads);
    let rep = s.n_heads / nkv;
    let q_cols = s.n_heads * hd;
    let kv_cols = nkv * hd;
    let row_seq: Vec<(usize, usize)> =
        seqs.iter().enumerate().flat_map(|(i, sq)| sq.rows.clone().map(move |r| (r, i))).collect();
    let ptr = OutPtr(out.as_mut_ptr());
    let task = |idx: usize| {
        let (row, si) = row_seq[idx / nkv];
        let g = idx % nkv;
        let seq = &seqs[si];
        let pos = seq.first_pos + (row - seq.rows.start);
        let keys = &seq.slots[..=pos];
        let n = keys.len();
        SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            buf.resize(rep * n + (rep + 1) * hd, 0.0);
            let (scores, rest) = buf.split_at_mut(rep * n);
            let (tmp, acc) = rest.split_at_mut(hd);
            let qh = |h: usize| &q[row * q_cols + (g * rep + h) * hd..][..hd];
            for (j, &slot) in keys.iter().enumerate() {
                let off = slot as usize * kv_cols + g * hd;
                kv.k[off..off + hd].convert_to_f32_slice(tmp);
                for h in 0..rep {
                    scores[h * n + j] = (dots.f32)(qh(h), tmp) * s.scale;
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
            acc.fill(0.0);
            for (j, &slot) in keys.iter().enumerate() {
                let off = slot as usize * kv_cols + g * hd;
                kv.v[off..off + hd].convert_to_f32_slice(tmp);
                for h in 0..rep {
                    let w = scores[h * n + j];
                    for (a, &v) in acc[h * hd..(h + 1) * hd].iter_mut().zip(tmp.iter()) {
                        *a += w * v;
                    }
                }
            }
            for h in 0..rep {
                let dst = row * q_cols + (g * rep + h) * hd;
                // SAFETY: `dst..dst+hd` is inside `out` (row < rows, head < n_heads)
                // and only this task writes heads g*rep..(g+1)*rep of this row.
                unsafe { std::ptr::copy_nonoverlapping(acc[h * hd..].as_ptr(), ptr.get().add(dst), hd) };
            }
        });
    };
    let tasks = row_seq.len() * nkv;
    if tasks > 1 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// Stores `k`/`v` rows (`kv_cols` wide) into their slots.
pub fn store(kv: &mut LayerKv, k: &[f32], v: &[f32], kv_cols: usize, slots: &[u32]) {
    for (i, &slot) in slots.iter().enumerate() {
        let off = slot as usize * kv_cols;
        kv.k[off..off + kv_cols].convert_from_f32_slice(&k[i * kv_cols..(i + 1) * kv_cols]);
        kv.v[off..off + kv_cols].convert_from_f32_slice(&v[i * kv_cols..(i + 1) * kv_cols]);
    }
}
