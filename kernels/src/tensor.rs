//! Host-side tensors: bytes in any supported format, borrowed from a memory
//! map (zero copy) or owned, with the shape they describe.

use crate::quant::{DType, QuantError};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// Anything that owns a byte buffer (a memory map, a `Vec`).
pub trait ByteOwner: AsRef<[u8]> + Send + Sync + 'static {}
impl<T: AsRef<[u8]> + Send + Sync + 'static> ByteOwner for T {}

/// A cheap-to-clone window into shared bytes.
#[derive(Clone)]
pub struct Bytes {
    owner: Arc<dyn ByteOwner>,
    range: Range<usize>,
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bytes").field("range", &self.range).finish()
    }
}

/// 64-byte aligned owned storage.
struct Aligned {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the words are initialised and at least `len` bytes long.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

impl Bytes {
    /// A window `range` of `owner`; `None` if it does not fit.
    pub fn window(owner: Arc<dyn ByteOwner>, range: Range<usize>) -> Option<Bytes> {
        let len = owner.as_ref().as_ref().len();
        (range.start <= range.end && range.end <= len).then_some(Bytes { owner, range })
    }

    /// The part `range` of these bytes (offsets relative to them); `None` if it does not fit.
    pub fn slice(&self, range: Range<usize>) -> Option<Bytes> {
        (range.start <= range.end && range.end <= self.len()).then(|| Bytes {
            owner: self.owner.clone(),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }

    /// A copy of `data` in 64-byte aligned storage.
    pub fn copy_from(data: &[u8]) -> Bytes {
        let mut words = vec![[0u64; 8]; data.len().div_ceil(64)];
        // SAFETY: `words` has at least `data.len()` bytes; u64 arrays accept any bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), words.as_mut_ptr().cast::<u8>(), data.len()) };
        let len = data.len();
        Bytes { owner: Arc::new(Aligned { words, len }), range: 0..len }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.owner.as_ref().as_ref()[self.range.clone()]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// These bytes if aligned to `align`, else an aligned copy.
    pub fn aligned(self, align: usize) -> Bytes {
        if (self.as_slice().as_ptr() as usize).is_multiple_of(align) {
            self
        } else {
            Bytes::copy_from(self.as_slice())
        }
    }
}

/// A tensor in host memory. `shape` is outermost first: a weight matrix is
/// `[rows, cols]` = `[out_features, in_features]`, each row contiguous.
#[derive(Clone, Debug)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Bytes,
}

impl HostTensor {
    /// Checks that `bytes` matches `dtype` and `shape` and aligns the data.
    pub fn new(dtype: DType, shape: Vec<usize>, bytes: Bytes) -> Result<HostTensor, QuantError> {
        let cols = shape.last().copied().unwrap_or(1);
        let rows: usize = shape.iter().rev().skip(1).product();
        let expected = dtype.bytes_for(cols)? * rows;
        if bytes.len() != expected {
            return Err(QuantError::ByteLength { dtype, expected, got: bytes.len() });
        }
        Ok(HostTensor { dtype, shape, bytes: bytes.aligned(dtype.align()) })
    }

    /// An f32 tensor holding a copy of `values`.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> HostTensor {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        HostTensor { dtype: DType::F32, shape, bytes: Bytes::copy_from(&bytes) }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rows of the matrix view (all but the last dimension flattened).
    pub fn rows(&self) -> usize {
        self.shape.iter().rev().skip(1).product()
    }

    /// Columns (the last dimension).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// The tensor split along its outermost dimension: `[n, …]` into `n` tensors of shape `[…]`
    /// sharing these bytes (a stack of expert matrices into one matrix per expert).
    pub fn split_outer(&self) -> Result<Vec<HostTensor>, QuantError> {
        let (&n, inner) = self.shape.split_first().ok_or(QuantError::ByteLength {
            dtype: self.dtype,
            expected: 0,
            got: self.bytes.len(),
        })?;
        let cols = inner.last().copied().unwrap_or(1);
        let rows: usize = inner.iter().rev().skip(1).product();
        let each = self.dtype.bytes_for(cols)? * rows;
        if each.checked_mul(n) != Some(self.bytes.len()) {
            return Err(QuantError::ByteLength { dtype: self.dtype, expected: each * n, got: self.bytes.len() });
        }
        (0..n)
            .map(|i| {
                let part = self.bytes.slice(i * each..(i + 1) * each).expect("inside the checked length");
                HostTensor::new(self.dtype, inner.to_vec(), part)
            })
            .collect()
    }

    /// All values as f32.
    pub fn to_f32(&self) -> Result<Vec<f32>, QuantError> {
        let mut out = vec![0f32; self.numel()];
        crate::quant::dequantize_row(self.dtype, self.bytes.as_slice(), &mut out)?;
        Ok(out)
    }
}
