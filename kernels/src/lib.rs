//! cachet-kernels: the tensor formats of GGUF files and the compute backends
//! of cachet's engine.
//!
//! - [`quant`]: block layouts, dequantization and quantization of F32, F16,
//!   BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K.
//! - [`backend::Backend`]: the narrow set of ops the model runner needs.
//! - [`cpu::CpuBackend`]: that trait on the CPU — weights stay quantized,
//!   activations are quantized per row block and multiplied with integer dot
//!   products at the best SIMD level the CPU has (AVX-512 VNNI, AVX2, or the
//!   portable scalar path), on a rayon pool.
//! - [`cuda::CudaBackend`]: the same ops on an NVIDIA GPU (kernels compiled by
//!   NVRTC at run time, cuBLAS for prefill); always built, and
//!   [`cuda::probe`] says whether a device is there.
//! - [`testing`]: the deterministic generator every crate's tests draw random inputs from.
//!
//! ```
//! use cachet_kernels::backend::Backend;
//! use cachet_kernels::cpu::CpuBackend;
//! use cachet_kernels::quant::{quantize_row, DType};
//! use cachet_kernels::tensor::{Bytes, HostTensor};
//!
//! // A 2×64 Q8_0 weight matrix times one activation row.
//! let w: Vec<f32> = (0..128).map(|i| (i as f32 * 0.1).sin()).collect();
//! let mut bytes = vec![0u8; DType::Q8_0.bytes_for(128).unwrap()];
//! quantize_row(DType::Q8_0, &w, &mut bytes).unwrap();
//! let cpu = CpuBackend::new(1).unwrap();
//! let w = cpu.load(HostTensor::new(DType::Q8_0, vec![2, 64], Bytes::copy_from(&bytes)).unwrap()).unwrap();
//! let mut x = cpu.buf();
//! cpu.upload(&mut x, 1, 64, &[0.5; 64]);
//! let mut y = cpu.buf();
//! cpu.matmul(&x, &mut [(&w, &mut y)]);
//! assert_eq!(cpu.buf_shape(&y), (1, 2));
//! ```

// Each unsafe block states, in a `// SAFETY:` comment, the invariant it relies on.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod quant;
pub mod tensor;
pub mod testing;
