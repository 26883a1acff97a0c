//! Row-wise element ops on f32 matrices. Each row is computed the same way
//! whatever the number of rows, so results do not depend on the batch.

use crate::backend::{RopeConfig, RopeStyle};
use rayon::prelude::*;

/// Below this many rows, ops run on the calling thread.
const PAR_ROWS: usize = 16;

fn for_rows(x: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if x.len() / cols.max(1) >= PAR_ROWS {
        x.par_chunks_mut(cols).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        x.chunks_mut(cols).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// `out = w * (x * 1/sqrt(mean(x²) + eps))`, per group of `w.len()` values.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let g = w.len();
    out.copy_from_slice(x);
    rms_norm_inplace(out, w, eps, g);
}

/// In-place RMSNorm of every group of `group` values.
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32, group: usize) {
    for_rows(x, group, |_, r| {
        let ss: f32 = r.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / group as f32 + eps).sqrt();
        for (v, &wi) in r.iter_mut().zip(w) {
            *v = wi * (*v * inv);
        }
    });
}

/// Inverse frequencies `theta^(-2i/d)` as Hugging Face computes them (f32).
pub(crate) fn inv_freq(rope: &RopeConfig, i: usize) -> f32 {
    let exponent = (2 * i) as f32 / rope.head_dim as f32;
    1.0 / rope.theta.powf(exponent)
}

/// Per position: `head_dim/2` cosines then `head_dim/2` sines.
pub fn rope_table(positions: &[u32], rope: &RopeConfig, out: &mut [f32]) {
    let half = rope.head_dim / 2;
    let mut buf = [0f32; 512];
    let freqs = &mut buf[..half];
    for (i, f) in freqs.iter_mut().enumerate() {
        *f = inv_freq(rope, i);
    }
    for (&p, row) in positions.iter().zip(out.chunks_mut(rope.head_dim)) {
        for (i, &f) in freqs.iter().enumerate() {
            let angle = p as f32 * f;
            row[i] = angle.cos();
            row[half + i] = angle.sin();
        }
    }
}

/// Rotates every head of every row of `x` (`cols` wide) by its table row.
pub fn rope(x: &mut [f32], cols: usize, table: &[f32], rope: &RopeConfig) {
    let d = rope.head_dim;
    let half = d / 2;
    for_rows(x, cols, |i, row| {
        let (cos, sin) = table[i * d..(i + 1) * d].split_at(half);
        for head in row.chunks_exact_mut(d) {
            match rope.style {
                RopeStyle::Neox => {
                    for j in 0..half {
                        let (a, b) = (head[j], head[j + half]);
                        head[j] = a * cos[j] - b * sin[j];
                        head[j + half] = b * cos[j] + a * sin[j];
                    }
                }
                RopeStyle::Interleaved => {
                    for j in 0..half {
                        let (a, b) = (head[2 * j], head[2 * j + 1]);
                        head[2 * j] = a * cos[j] - b * sin[j];
                        head[2 * j + 1] = b * cos[j] + a * sin[j];
                    }
                }
            }
        }
    });
}

/// `gate = silu(gate) * up`, row by row with the level's kernel.
pub fn silu_mul(gate: &mut [f32], up: &[f32], cols: usize, kernel: fn(&mut [f32], &[f32])) {
    for_rows(gate, cols, |i, g| kernel(g, &up[i * cols..(i + 1) * cols]));
}

/// The portable `silu(gate) * up`.
pub fn silu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (v, &u) in gate.iter_mut().zip(up) {
        *v = *v / (1.0 + (-*v).exp()) * u;
    }
}

/// `x += y`, with `y` repeating every `y.len()` values (a bias) or matching.
pub fn add(x: &mut [f32], y: &[f32], cols: usize) {
    let broadcast = y.len() == cols;
    for_rows(x, cols, |i, r| {
        let y = if broadcast { y } else { &y[i * cols..(i + 1) * cols] };
        for (a, b) in r.iter_mut().zip(y) {
            *a += b;
        }
    });
}
