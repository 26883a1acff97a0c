//! GGUF files: a memory-mapped reader that loads tensors lazily and rejects
//! malformed files with an error (never a panic or an out-of-bounds read), and
//! a small writer (tests write their own tiny models with it).
//!
//! Layout (version 2 and 3): magic `GGUF`, version, tensor count, metadata
//! count, metadata key/value pairs, tensor infos (name, dims innermost first,
//! type, offset), padding to `general.alignment`, tensor data.

mod reader;
mod value;
mod writer;

pub use reader::GgufFile;
pub use value::{Value, ValueType};
pub use writer::GgufWriter;

use cachet_kernels::quant::DType;

/// Limits that keep a crafted file from making the reader allocate or loop
/// without bound.
pub mod limits {
    /// Longest string (metadata values, keys, tensor names): 16 MiB.
    pub const MAX_STRING: u64 = 16 << 20;
    /// Most elements in one metadata array.
    pub const MAX_ARRAY: u64 = 1 << 24;
    /// Most metadata entries.
    pub const MAX_KV: u64 = 1 << 16;
    /// Most tensors.
    pub const MAX_TENSORS: u64 = 1 << 16;
    /// Most dimensions of a tensor.
    pub const MAX_DIMS: u32 = 4;
    /// Deepest nesting of arrays in arrays.
    pub const MAX_DEPTH: usize = 4;
}

/// Errors reading a GGUF file. Each names what was wrong and where.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: bad magic {found:02x?} (expected \"GGUF\")")]
    BadMagic { found: Vec<u8> },
    /// A GGUF version this reader does not handle.
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// The file ends in the middle of something.
    #[error("truncated file: {what} needs {need} bytes at offset {offset}, file has {len}")]
    Truncated { what: String, offset: u64, need: u64, len: u64 },
    /// A count or length above the reader's limits.
    #[error("{what} is {value}, above the limit of {limit}")]
    TooLarge { what: String, value: u64, limit: u64 },
    /// A string that is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: String },
    /// A metadata value type id that does not exist.
    #[error("metadata key {key:?} has unknown value type {ty}")]
    UnknownValueType { key: String, ty: u32 },
    /// A tensor type this engine cannot read.
    #[error("tensor {name:?} has unsupported type {ty} ({type_name})")]
    UnsupportedTensorType { name: String, ty: u32, type_name: &'static str },
    /// A tensor whose shape, offset or size is inconsistent with the file.
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    /// The same metadata key or tensor name twice.
    #[error("duplicate {what} {name:?}")]
    Duplicate { what: &'static str, name: String },
    /// A tensor the model needs is absent.
    #[error("tensor {0:?} not found")]
    MissingTensor(String),
    /// A metadata key the model needs is absent.
    #[error("metadata key {0:?} not found")]
    MissingKey(String),
    /// A metadata value of an unexpected type.
    #[error("metadata key {key:?} should be {expected}, found {found}")]
    WrongType { key: String, expected: &'static str, found: &'static str },
}

/// Where a tensor lives in the file and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Outermost first (`[rows, cols]`), the reverse of GGUF's `ne` order.
    pub shape: Vec<usize>,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Byte size of the data.
    pub size: usize,
}

/// The name GGML gives a type id, for error messages.
pub(crate) fn ggml_type_name(ty: u32) -> &'static str {
    match ty {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16..=23 => "IQ",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests;
