//! Weights on the device and the ops that read them: embedding rows and
//! matmuls.
//!
//! A weight keeps its file format. `matmul_<format>` (matmul.cu) dequantizes
//! on the fly, batch invariantly; for prefill-sized batches a dense bf16 copy
//! made at load (when it fits) goes through cuBLAS instead (bf16 inputs, f32
//! accumulation and output). F32 weights need no copy (fp32 GEMM, no TF32),
//! nor do BF16 ones.

use super::graph::launch;
use super::scratch::{grown, upload_u32};
use super::{CudaBackend, CudaBuf};
use crate::backend::{Backend, BackendError};
use crate::quant::DType;
use crate::tensor::HostTensor;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DriverError, LaunchConfig};
use std::ffi::c_void;

/// Warps (weight rows) per block and tokens per block of `matmul_<format>`
/// (MM_WARPS and MM_TILE of matmul.cu).
const MM_WARPS: usize = 4;
const MM_TILE: usize = 8;

/// A weight matrix (or vector, one row) in device memory.
#[derive(Debug)]
pub struct CudaWeight {
    pub(super) dtype: DType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    row_bytes: usize,
    /// The bytes in the file's format (vectors: f32).
    pub(super) bytes: CudaSlice<u8>,
    dense: Dense,
    /// The backend's queue: work queued on this weight runs before it is freed.
    queue: super::graph::Queue,
}

impl Drop for CudaWeight {
    fn drop(&mut self) {
        self.queue.flush_on_drop();
    }
}

/// What cuBLAS multiplies for prefill.
#[derive(Debug)]
enum Dense {
    /// Nothing: the dequantizing kernel does every matmul.
    None,
    /// The weight itself (F32, BF16).
    Native,
    /// A bf16 copy.
    Bf16(CudaSlice<u16>),
}

impl CudaWeight {
    /// The format the weight is stored in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether prefill-sized matmuls with this weight go through cuBLAS.
    pub fn has_dense_copy(&self) -> bool {
        !matches!(self.dense, Dense::None)
    }
}

fn device_error(what: &'static str, bytes: usize) -> impl Fn(DriverError) -> BackendError {
    move |e| match e.0 {
        cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => BackendError::OutOfMemory { what, bytes },
        _ => BackendError::Device(format!("{what}: {e}")),
    }
}

pub(super) fn load(be: &CudaBackend, t: HostTensor) -> Result<CudaWeight, BackendError> {
    if t.shape.len() > 2 {
        return Err(BackendError::Unsupported(format!("{}-dimensional tensor", t.shape.len())));
    }
    // Vectors (norm weights, biases) are used as f32, as on the CPU.
    let t = if t.rows() == 1 && t.dtype != DType::F32 {
        HostTensor::from_f32(t.shape.clone(), &t.to_f32()?)
    } else {
        HostTensor::new(t.dtype, t.shape, t.bytes)?
    };
    let (dtype, rows, cols) = (t.dtype, t.rows(), t.cols());
    let row_bytes = dtype.bytes_for(cols)?;
    let host = t.bytes.as_slice();
    let bytes = if host.is_empty() { be.stream.alloc_zeros::<u8>(1) } else { be.stream.clone_htod(host) }
        .map_err(device_error("weights", host.len()))?;
    let mut w = CudaWeight { dtype, rows, cols, row_bytes, bytes, dense: Dense::None, queue: be.queue.clone() };
    if be.options.dense_prefill && rows > 1 && cols > 0 {
        w.dense = match dtype {
            DType::F32 | DType::BF16 => Dense::Native,
            _ => dense_copy(be, &w)?.map_or(Dense::None, Dense::Bf16),
        };
    }
    Ok(w)
}

/// The bf16 copy of `w`, if it fits next to the reserve.
fn dense_copy(be: &CudaBackend, w: &CudaWeight) -> Result<Option<CudaSlice<u16>>, BackendError> {
    let n = w.rows * w.cols;
    let free = be.memory_available().unwrap_or(0);
    if free < (2 * n) as u64 + be.options.dense_reserve_bytes {
        return Ok(None);
    }
    let out = be.stream.alloc_zeros::<u16>(n).map_err(device_error("dense weights", 2 * n))?;
    let (cols, row_bytes) = (w.cols as u32, w.row_bytes as u64);
    let cfg = LaunchConfig { grid_dim: (w.rows as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: to_bf16_<format>(const u8*, u16*, u32, u64); one block per row
    // of `row_bytes` bytes; out holds rows × cols values.
    launch!(be, "dequantizing to bf16", be.kernels.to_bf16.get(w.dtype), cfg; w.bytes, out, cols, row_bytes);
    Ok(Some(out))
}

pub(super) fn embed(
    be: &CudaBackend,
    table: &CudaWeight,
    tokens: &[u32],
    out: &mut CudaBuf,
) -> Result<(), BackendError> {
    let vocab = table.rows;
    if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(BackendError::TokenOutOfRange { token, vocab });
    }
    be.resize(out, tokens.len(), table.cols);
    if tokens.is_empty() || table.cols == 0 {
        return Ok(());
    }
    let mut scratch = be.scratch();
    let idx = upload_u32(be, &mut scratch.idx, tokens);
    let (cols, row_bytes) = (table.cols as u32, table.row_bytes as u64);
    let cfg = LaunchConfig { grid_dim: (tokens.len() as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: embed_<format>(const u8*, const u32*, float*, u32, u64); one
    // block per token, every token is a row of the table (checked above).
    launch!(be, "embedding", be.kernels.embed.get(table.dtype), cfg; table.bytes, idx, out.slice_mut(), cols, row_bytes);
    Ok(())
}

pub(super) fn matmul(be: &CudaBackend, x: &CudaBuf, jobs: &mut [(&CudaWeight, &mut CudaBuf)]) {
    let (t, k) = (x.rows, x.cols);
    for (w, out) in jobs.iter_mut() {
        assert_eq!(w.cols, k, "matmul of x with {k} columns by a weight with {}", w.cols);
        be.resize(out, t, w.rows);
    }
    if t == 0 || k == 0 {
        return;
    }
    let dense = be.options.dense_prefill && t >= be.options.dense_min_rows;
    let needs_bf16 = dense && jobs.iter().any(|(w, _)| matches!(w.dense, Dense::Bf16(_)) || w.dtype == DType::BF16);
    let mut scratch = be.scratch();
    let xb = if needs_bf16 {
        let n = (t * k) as u64;
        let buf = grown(be, &mut scratch.bf16, t * k);
        // SAFETY: activations_to_bf16(const float*, u16*, u64); both hold t × k values.
        launch!(be, "activations to bf16", &be.kernels.activations_to_bf16, super::ops::grid(t * k); x.slice(), *buf, n);
        Some(&*buf)
    } else {
        None
    };
    for (w, out) in jobs.iter_mut().filter(|(w, _)| w.rows > 0) {
        match (&w.dense, xb) {
            (Dense::Bf16(copy), Some(xb)) if dense => gemm(be, copy, cudaDataType::CUDA_R_16BF, xb, t, w.rows, k, out),
            (Dense::Native, Some(xb)) if dense && w.dtype == DType::BF16 => {
                gemm(be, &w.bytes, cudaDataType::CUDA_R_16BF, xb, t, w.rows, k, out)
            }
            (Dense::Native, _) if dense && w.dtype == DType::F32 => {
                gemm(be, &w.bytes, cudaDataType::CUDA_R_32F, x.slice(), t, w.rows, k, out)
            }
            _ => dequantizing(be, w, x, out),
        }
    }
}

/// `out = x · wᵀ` with `matmul_<format>`: a warp per weight row and MM_TILE
/// tokens per block.
fn dequantizing(be: &CudaBackend, w: &CudaWeight, x: &CudaBuf, out: &mut CudaBuf) {
    let (t, n, k) = (x.rows, w.rows, w.cols);
    let tiles = t.div_ceil(MM_TILE);
    assert!(tiles <= 65535, "a matmul of {t} rows");
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(MM_WARPS) as u32, tiles as u32, 1),
        block_dim: (32 * MM_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (n32, k32, t32, row_bytes) = (n as u32, k as u32, t as u32, w.row_bytes as u64);
    // SAFETY: matmul_<format>(const u8*, const float*, float*, u32, u32, u32,
    // u64); w is n rows of row_bytes, x t × k (k a whole number of blocks,
    // checked at load), out t × n.
    launch!(be, "matmul", be.kernels.matmul.get(w.dtype), cfg; w.bytes, x.slice(), out.slice_mut(), n32, k32, t32, row_bytes);
}

/// `out (t × n) = x (t × k) · wᵀ (w: n × k)` with cuBLAS, row-major: in
/// cuBLAS's column-major terms `outᵀ = op(W) · xᵀ` with W transposed.
#[allow(clippy::too_many_arguments)]
fn gemm<A, B>(
    be: &CudaBackend,
    w: &CudaSlice<A>,
    ty: cudaDataType,
    x: &CudaSlice<B>,
    t: usize,
    n: usize,
    k: usize,
    out: &mut CudaBuf,
) {
    let (alpha, beta) = (1.0f32, 0.0f32);
    // cuBLAS queues on the stream itself: what is queued before it runs first. (It also works
    // in the calling thread's current context, which flushing binds.)
    be.flush();
    let stream = &be.stream;
    let (a, _a_sync) = w.device_ptr(stream);
    let (b, _b_sync) = x.device_ptr(stream);
    let (c, _c_sync) = out.slice_mut().device_ptr_mut(stream);
    let blas = be.blas.as_ref().expect("the dense path is off without cuBLAS");
    // SAFETY: the handle is bound to this backend's stream; A holds n × k
    // values of `ty`, B at least t × k of `ty`, C at least t × n f32 values;
    // alpha and beta are f32 host scalars as CUBLAS_COMPUTE_32F requires.
    let r = unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            n as i32,
            t as i32,
            k as i32,
            (&alpha as *const f32).cast::<c_void>(),
            a as *const c_void,
            ty,
            k as i32,
            b as *const c_void,
            ty,
            k as i32,
            (&beta as *const f32).cast::<c_void>(),
            c as *mut c_void,
            cudaDataType::CUDA_R_32F,
            n as i32,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    };
    r.unwrap_or_else(|e| panic!("cuBLAS GEMM {t}×{k} by {n}×{k}: {e}"));
}
