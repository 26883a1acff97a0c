//! The GGUF reader. Every read is bounds-checked against the file, every count
//! is capped (see `limits`) and checked against the bytes that remain before
//! anything is allocated for it.

use super::limits::*;
use super::{ggml_type_name, GgufError, TensorInfo, Value, ValueType};
use crate::host_weights::{self, HostWeights};
use cachet_kernels::quant::DType;
use cachet_kernels::tensor::{ByteOwner, Bytes, HostTensor};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// A parsed GGUF file. Tensor data stays in the (memory-mapped) bytes until a
/// tensor is asked for, and even then it is not copied.
pub struct GgufFile {
    bytes: Arc<dyn ByteOwner>,
    /// The container version (2 or 3).
    pub version: u32,
    metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                need: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        if len > MAX_STRING {
            return Err(GgufError::TooLarge { what: format!("length of {}", what()), value: len, limit: MAX_STRING });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { what: what() })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, GgufError> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(self.u32(&what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::WrongType {
                        key: key.to_string(),
                        expected: "bool (0 or 1)",
                        found: if b > 1 { "another byte" } else { "?" },
                    })
                }
            },
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::U64 => Value::U64(self.u64(&what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Array => {
                if depth >= MAX_DEPTH {
                    return Err(GgufError::TooLarge {
                        what: format!("array nesting of {key:?}"),
                        value: depth as u64 + 1,
                        limit: MAX_DEPTH as u64,
                    });
                }
                let raw = self.u32(&what)?;
                let elem = ValueType::from_u32(raw)
                    .ok_or_else(|| GgufError::UnknownValueType { key: key.to_string(), ty: raw })?;
                let n = self.u64(&what)?;
                if n > MAX_ARRAY {
                    return Err(GgufError::TooLarge { what: format!("array {key:?}"), value: n, limit: MAX_ARRAY });
                }
                // Every element takes at least this many bytes: check before allocating.
                let min = elem.fixed_size().unwrap_or(if elem == ValueType::String { 8 } else { 12 });
                if n.saturating_mul(min) > self.remaining() {
                    return Err(GgufError::Truncated {
                        what: format!("array {key:?} of {n} elements"),
                        offset: self.pos as u64,
                        need: n.saturating_mul(min),
                        len: self.buf.len() as u64,
                    });
                }
                let mut values = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    values.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(elem, values)
            }
        })
    }
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
        GgufFile::open_as(path, HostWeights::Mapped)
    }

    /// Parses `path`, its bytes held as `how` says.
    pub fn open_as(path: &Path, how: HostWeights) -> Result<GgufFile, GgufError> {
        let bytes = host_weights::open(path, how)
            .map_err(|source| GgufError::Io { path: path.display().to_string(), source })?;
        GgufFile::parse(bytes)
    }

    /// Parses GGUF bytes held by `bytes`.
    pub fn parse(bytes: Arc<dyn ByteOwner>) -> Result<GgufFile, GgufError> {
        let buf: &[u8] = bytes.as_ref().as_ref();
        let mut c = Cursor { buf, pos: 0 };
        let magic = c.take(4, || "magic".into()).map_err(|_| GgufError::BadMagic { found: buf.to_vec() })?;
        if magic != b"GGUF" {
            return Err(GgufError::BadMagic { found: magic.to_vec() });
        }
        let version = c.u32(&|| "version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64(&|| "tensor count".into())?;
        if n_tensors > MAX_TENSORS {
            return Err(GgufError::TooLarge { what: "tensor count".into(), value: n_tensors, limit: MAX_TENSORS });
        }
        let n_kv = c.u64(&|| "metadata count".into())?;
        if n_kv > MAX_KV {
            return Err(GgufError::TooLarge { what: "metadata count".into(), value: n_kv, limit: MAX_KV });
        }

        let mut metadata = Vec::new();
        let mut index = HashMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("key of metadata entry {i}"))?;
            let raw = c.u32(&|| format!("type of {key:?}"))?;
            let ty =
                ValueType::from_u32(raw).ok_or_else(|| GgufError::UnknownValueType { key: key.clone(), ty: raw })?;
            let value = c.value(ty, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::Duplicate { what: "metadata key", name: key });
            }
            metadata.push((key, value));
        }

        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 16 => a,
                _ => {
                    return Err(GgufError::WrongType {
                        key: "general.alignment".into(),
                        expected: "a power of two up to 65536",
                        found: v.type_name(),
                    })
                }
            },
        };

        let mut raw_tensors = Vec::new();
        for i in 0..n_tensors {
            let name = c.string(&|| format!("name of tensor {i}"))?;
            let n_dims = c.u32(&|| format!("dimension count of {name:?}"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadTensor {
                    name,
                    reason: format!("{n_dims} dimensions (supported: 1 to {MAX_DIMS})"),
                });
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                ne.push(c.u64(&|| format!("dimension {d} of {name:?}"))?);
            }
            let ty = c.u32(&|| format!("type of {name:?}"))?;
            let offset = c.u64(&|| format!("offset of {name:?}"))?;
            raw_tensors.push((name, ne, ty, offset));
        }
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;

        let mut tensors = Vec::with_capacity(raw_tensors.len());
        let mut tensor_index = HashMap::new();
        for (name, ne, ty, offset) in raw_tensors {
            let bad = |reason: String| GgufError::BadTensor { name: name.clone(), reason };
            let dtype = DType::from_ggml_type(ty).ok_or_else(|| GgufError::UnsupportedTensorType {
                name: name.clone(),
                ty,
                type_name: ggml_type_name(ty),
            })?;
            if ne.contains(&0) {
                return Err(bad(format!("zero-sized dimension in {ne:?}")));
            }
            let numel =
                ne.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or_else(|| bad("size overflows".into()))?;
            let cols = ne[0];
            let row_bytes = usize::try_from(cols)
                .ok()
                .map(|cols| dtype.bytes_for(cols))
                .ok_or_else(|| bad("row too long".into()))?
                .map_err(|e| bad(e.to_string()))? as u64;
            let size = (numel / cols).checked_mul(row_bytes).ok_or_else(|| bad("size overflows".into()))?;
            if offset % alignment != 0 {
                return Err(bad(format!("offset {offset} is not a multiple of the alignment {alignment}")));
            }
            let start = data_start.checked_add(offset).ok_or_else(|| bad("offset overflows".into()))?;
            let end = start.checked_add(size).ok_or_else(|| bad("offset overflows".into()))?;
            if end > file_len {
                return Err(bad(format!(
                    "data {start}..{end} ({size} bytes of {dtype} {ne:?}) lies beyond the end of the file ({file_len} bytes)"
                )));
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::Duplicate { what: "tensor", name });
            }
            tensors.push(TensorInfo {
                name,
                dtype,
                shape: ne.iter().rev().map(|&d| d as usize).collect(),
                offset: start as usize,
                size: size as usize,
            });
        }
        Ok(GgufFile { bytes, version, metadata, index, tensors, tensor_index })
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A string value; `Ok(None)` when absent, an error when of another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_str().ok_or(GgufError::WrongType { key: key.into(), expected: "string", found: v.type_name() })
            })
            .transpose()
    }

    /// An unsigned integer value (any integer type that fits).
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_u64().ok_or(GgufError::WrongType {
                    key: key.into(),
                    expected: "a non-negative integer",
                    found: v.type_name(),
                })
            })
            .transpose()
    }

    /// A float value (integers convert).
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_f64().ok_or(GgufError::WrongType { key: key.into(), expected: "number", found: v.type_name() })
            })
            .transpose()
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get(key)
            .map(|v| {
                v.as_bool().ok_or(GgufError::WrongType { key: key.into(), expected: "bool", found: v.type_name() })
            })
            .transpose()
    }

    /// An array of strings.
    pub fn get_strings(&self, key: &str) -> Result<Option<Vec<String>>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let wrong = || GgufError::WrongType { key: key.into(), expected: "array of strings", found: v.type_name() };
        let items = v.as_array().ok_or_else(wrong)?;
        items.iter().map(|i| i.as_str().map(str::to_owned).ok_or_else(wrong)).collect::<Result<_, _>>().map(Some)
    }

    /// An array of integers.
    pub fn get_ints(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let wrong = || GgufError::WrongType { key: key.into(), expected: "array of integers", found: v.type_name() };
        let items = v.as_array().ok_or_else(wrong)?;
        items.iter().map(|i| i.as_i64().ok_or_else(wrong)).collect::<Result<_, _>>().map(Some)
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// One tensor's info.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor, viewing the file's bytes (no copy unless misaligned).
    pub fn tensor(&self, name: &str) -> Result<HostTensor, GgufError> {
        let info = self.tensor_info(name).ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let bad = |reason: String| GgufError::BadTensor { name: name.to_string(), reason };
        let bytes = Bytes::window(self.bytes.clone(), info.offset..info.offset + info.size)
            .ok_or_else(|| bad("data outside the file".into()))?;
        HostTensor::new(info.dtype, info.shape.clone(), bytes).map_err(|e| bad(e.to_string()))
    }

    /// Total bytes of the file.
    pub fn file_size(&self) -> usize {
        self.bytes.as_ref().as_ref().len()
    }
}
