//! The tensor formats of GGUF files: block layouts, sizes, dequantization to
//! f32, and quantization from f32 (used to write test models and to quantize
//! activations for the integer dot products).

mod blocks;
mod dequant;
mod quantize;

pub use blocks::*;
pub use dequant::dequantize_row;
#[cfg(target_arch = "x86_64")]
pub(crate) use quantize::simd;
pub use quantize::{quantize_q8a, quantize_q8k, quantize_row};

/// Errors of the format helpers.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuantError {
    /// The element count is not a whole number of blocks of the format.
    #[error("{dtype:?}: {len} values is not a multiple of the block length {block}")]
    PartialBlock { dtype: DType, len: usize, block: usize },
    /// The byte slice does not hold exactly the expected number of bytes.
    #[error("{dtype:?}: expected {expected} bytes, got {got}")]
    ByteLength { dtype: DType, expected: usize, got: usize },
    /// The bytes are not aligned for the format's blocks.
    #[error("{dtype:?}: data is not aligned to {align} bytes")]
    Misaligned { dtype: DType, align: usize },
    /// More values than any memory could hold (their size overflows).
    #[error("{dtype:?}: {len} values are more than memory can hold")]
    TooLarge { dtype: DType, len: usize },
}

/// A tensor element format.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q5_0,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl DType {
    /// Every supported format.
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// Values per block (1 for the float formats).
    pub const fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
            DType::Q5_0 => std::mem::size_of::<BlockQ5_0>(),
            DType::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            DType::Q4_K => std::mem::size_of::<BlockQ4K>(),
            DType::Q5_K => std::mem::size_of::<BlockQ5K>(),
            DType::Q6_K => std::mem::size_of::<BlockQ6K>(),
        }
    }

    /// Alignment the data must have to be viewed as blocks.
    pub const fn align(self) -> usize {
        match self {
            DType::F32 => 4,
            _ => 2,
        }
    }

    /// The `ggml_type` id used in GGUF files.
    pub const fn ggml_type(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q5_0 => 6,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::BF16 => 30,
        }
    }

    /// The format of a `ggml_type` id, if supported.
    pub fn from_ggml_type(id: u32) -> Option<DType> {
        Self::ALL.into_iter().find(|d| d.ggml_type() == id)
    }

    /// Name as GGML spells it (`"Q4_K"`, `"F32"`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q4_0 => "Q4_0",
            DType::Q5_0 => "Q5_0",
            DType::Q8_0 => "Q8_0",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
        }
    }

    /// Whether values are stored in quantized blocks.
    pub const fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Bytes taken by `n` values, or an error when `n` is not a whole number
    /// of blocks or the size overflows.
    pub fn bytes_for(self, n: usize) -> Result<usize, QuantError> {
        let block = self.block_len();
        if !n.is_multiple_of(block) {
            return Err(QuantError::PartialBlock { dtype: self, len: n, block });
        }
        (n / block).checked_mul(self.block_bytes()).ok_or(QuantError::TooLarge { dtype: self, len: n })
    }

    /// Checks that `bytes` holds exactly `n` values, aligned for this format.
    pub fn check(self, bytes: &[u8], n: usize) -> Result<(), QuantError> {
        let expected = self.bytes_for(n)?;
        if bytes.len() != expected {
            return Err(QuantError::ByteLength { dtype: self, expected, got: bytes.len() });
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(self.align()) {
            return Err(QuantError::Misaligned { dtype: self, align: self.align() });
        }
        Ok(())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
