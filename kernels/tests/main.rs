//! The integration tests of `cachet-kernels`, in one binary (one link instead of one per file).

mod cuda_parity;
mod dequant_fixture;
mod kv_rows;
mod nvrtc_compile;
mod simd_paths;
