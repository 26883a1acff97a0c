//! Dequantization to f32. The arithmetic follows the reference formulas (and
//! their operation order) of the `gguf` Python package, so results are exact
//! against it.

use super::*;
use half::{bf16, f16};

/// Dequantizes `out.len()` values of `dtype` from `bytes`.
pub fn dequantize_row(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    dtype.check(bytes, out.len())?;
    let view = |_| QuantError::Misaligned { dtype, align: dtype.align() };
    match dtype {
        DType::F32 => out.copy_from_slice(cast_blocks::<f32>(bytes).ok_or(()).map_err(view)?),
        DType::F16 => {
            for (o, v) in out.iter_mut().zip(cast_blocks::<f16>(bytes).ok_or(()).map_err(view)?) {
                *o = v.to_f32();
            }
        }
        DType::BF16 => {
            for (o, v) in out.iter_mut().zip(cast_blocks::<bf16>(bytes).ok_or(()).map_err(view)?) {
                *o = v.to_f32();
            }
        }
        DType::Q4_0 => each_block(cast_blocks(bytes).ok_or(()).map_err(view)?, out, q4_0),
        DType::Q5_0 => each_block(cast_blocks(bytes).ok_or(()).map_err(view)?, out, q5_0),
        DType::Q8_0 => each_block(cast_blocks(bytes).ok_or(()).map_err(view)?, out, q8_0),
        DType::Q4_K => each_block(cast_blocks(bytes).ok_or(()).map_err(view)?, out, q4_k),
        DType::Q5_K => each_block(cast_blocks(bytes).ok_or(()).map_err(view)?, out, q5_k),
        DType::Q6_K => each_block(cast_blocks(bytes).ok_or(()).map_err(view)?, out, q6_k),
    }
    Ok(())
}

fn each_block<T: Block>(blocks: &[T], out: &mut [f32], f: fn(&T, &mut [f32])) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(T::LEN)) {
        f(b, o);
    }
}

fn q4_0(b: &BlockQ4_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for j in 0..16 {
        y[j] = d * ((b.qs[j] & 0xF) as i32 - 8) as f32;
        y[j + 16] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
    }
}

fn q5_0(b: &BlockQ5_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    let qh = u32::from_le_bytes(b.qh);
    for j in 0..16 {
        let h0 = ((qh >> j) & 1) << 4;
        let h1 = ((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (((b.qs[j] & 0xF) as u32 | h0) as i32 - 16) as f32;
        y[j + 16] = d * (((b.qs[j] >> 4) as u32 | h1) as i32 - 16) as f32;
    }
}

fn q8_0(b: &BlockQ8_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (o, &q) in y.iter_mut().zip(&b.qs) {
        *o = d * q as f32;
    }
}

fn q4_k(b: &BlockQ4K, y: &mut [f32]) {
    let d = b.d.to_f32();
    let dmin = b.dmin.to_f32();
    for j in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * j, &b.scales);
        let (sc1, m1) = scale_min_k4(2 * j + 1, &b.scales);
        let (d0, dm0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
        let qs = &b.qs[32 * j..32 * j + 32];
        for l in 0..32 {
            y[64 * j + l] = d0 * (qs[l] & 0xF) as f32 - dm0;
            y[64 * j + 32 + l] = d1 * (qs[l] >> 4) as f32 - dm1;
        }
    }
}

fn q5_k(b: &BlockQ5K, y: &mut [f32]) {
    let d = b.d.to_f32();
    let dmin = b.dmin.to_f32();
    for j in 0..4 {
        let (sc0, m0) = scale_min_k4(2 * j, &b.scales);
        let (sc1, m1) = scale_min_k4(2 * j + 1, &b.scales);
        let (d0, dm0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
        let qs = &b.qs[32 * j..32 * j + 32];
        for l in 0..32 {
            let h0 = ((b.qh[l] >> (2 * j)) & 1) << 4;
            let h1 = ((b.qh[l] >> (2 * j + 1)) & 1) << 4;
            y[64 * j + l] = d0 * ((qs[l] & 0xF) | h0) as f32 - dm0;
            y[64 * j + 32 + l] = d1 * ((qs[l] >> 4) | h1) as f32 - dm1;
        }
    }
}

fn q6_k(b: &BlockQ6K, y: &mut [f32]) {
    let d = b.d.to_f32();
    for half in 0..2 {
        let ql = &b.ql[64 * half..64 * half + 64];
        let qh = &b.qh[32 * half..32 * half + 32];
        let sc = &b.scales[8 * half..8 * half + 8];
        let y = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * sc[is] as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
}
