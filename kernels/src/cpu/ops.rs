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

/// Inverse frequencies `theta^(-2i/d)` as Hugging Face computes them (f32), with YaRN's blend of
/// interpolated (`/ factor`) and kept frequencies where the model has it (transformers'
/// `_compute_yarn_parameters`, its f32 steps in its order).
pub(crate) fn inv_freq(rope: &RopeConfig, i: usize) -> f32 {
    let exponent = (2 * i) as f32 / rope.head_dim as f32;
    let pos_freq = rope.theta.powf(exponent);
    let Some(yarn) = rope.yarn else { return 1.0 / pos_freq };
    let (extrapolation, interpolation) = (1.0 / pos_freq, 1.0 / (yarn.factor * pos_freq));
    // The ends in f64 (Python floats), the ramp in f32 (a float32 tensor).
    let (low, high) = yarn.range(rope.head_dim, rope.theta);
    let high = if low == high { high + 0.001 } else { high };
    let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
    let keep = 1.0 - ramp;
    interpolation * (1.0 - keep) + extrapolation * keep
}

/// What every cosine and sine is multiplied by (YaRN's attention factor; 1 without it).
pub(crate) fn rope_scale(rope: &RopeConfig) -> f32 {
    rope.yarn.map_or(1.0, |y| y.attention_factor)
}

/// Per position: `head_dim/2` cosines then `head_dim/2` sines.
pub fn rope_table(positions: &[u32], rope: &RopeConfig, out: &mut [f32]) {
    let half = rope.head_dim / 2;
    let mut buf = [0f32; 512];
    let freqs = &mut buf[..half];
    for (i, f) in freqs.iter_mut().enumerate() {
        *f = inv_freq(rope, i);
    }
    let scale = rope_scale(rope);
    for (&p, row) in positions.iter().zip(out.chunks_mut(rope.head_dim)) {
        for (i, &f) in freqs.iter().enumerate() {
            let angle = p as f32 * f;
            row[i] = angle.cos() * scale;
            row[half + i] = angle.sin() * scale;
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
