//! A minimal GGUF writer (version 3). Tests use it to write tiny random
//! models in every format; it is also handy for converting weights.

use super::{Value, ValueType};
use cachet_kernels::quant::DType;
use std::io::Write;
use std::path::Path;

/// Collects metadata and tensors, then writes a GGUF file.
#[derive(Debug, Default)]
pub struct GgufWriter {
    pub(super) metadata: Vec<(String, Value)>,
    tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
    alignment: usize,
}

impl GgufWriter {
    /// An empty file with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter { alignment: 32, ..Default::default() }
    }

    /// Adds a metadata entry.
    pub fn metadata(&mut self, key: &str, value: Value) -> &mut Self {
        if key == "general.alignment" {
            if let Some(a) = value.as_u64() {
                self.alignment = a as usize;
            }
        }
        self.metadata.push((key.to_string(), value));
        self
    }

    /// Adds a tensor; `shape` is outermost first, `data` its encoded bytes.
    pub fn tensor(&mut self, name: &str, dtype: DType, shape: &[usize], data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dtype, shape.to_vec(), data));
        self
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_string(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            write_value(&mut out, v);
        }
        let align = self.alignment.max(1);
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, dtype, shape, data) in &self.tensors {
            write_string(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&dtype.ggml_type().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        let data_start = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(data);
        }
        out
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut f = std::fs::File::create(path)?;
        f.write_all(&self.to_bytes())?;
        f.sync_all()
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => write_string(out, s),
        Value::Array(ty, items) => {
            out.extend_from_slice(&(*ty as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for i in items {
                debug_assert_eq!(i.value_type(), *ty);
                write_value(out, i);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl Value {
    /// An array of strings.
    pub fn strings<S: AsRef<str>>(items: &[S]) -> Value {
        Value::Array(ValueType::String, items.iter().map(|s| Value::String(s.as_ref().to_string())).collect())
    }
}
