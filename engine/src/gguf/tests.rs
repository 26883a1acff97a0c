//! Reader/writer round trips and crafted files: every malformed input must be
//! an `Err` naming the problem, never a panic.

use super::*;
use cachet_kernels::quant::{quantize_row, DType};
use std::sync::Arc;

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::parse(Arc::new(bytes))
}

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", Value::String("qwen2".into()))
        .metadata("u8", Value::U8(7))
        .metadata("i8", Value::I8(-7))
        .metadata("u16", Value::U16(700))
        .metadata("i16", Value::I16(-700))
        .metadata("u32", Value::U32(70_000))
        .metadata("i32", Value::I32(-70_000))
        .metadata("f32", Value::F32(1.5))
        .metadata("bool", Value::Bool(true))
        .metadata("u64", Value::U64(1 << 40))
        .metadata("i64", Value::I64(-(1 << 40)))
        .metadata("f64", Value::F64(-2.25))
        .metadata("strings", Value::strings(&["a", "βγ", ""]))
        .metadata("nested", Value::Array(ValueType::Array, vec![Value::Array(ValueType::I32, vec![Value::I32(1)])]));
    let x: Vec<f32> = (0..64).map(|i| i as f32 / 10.0).collect();
    let mut q = vec![0u8; DType::Q8_0.bytes_for(64).unwrap()];
    quantize_row(DType::Q8_0, &x, &mut q).unwrap();
    w.tensor("w", DType::Q8_0, &[2, 32], q);
    w.tensor("v", DType::F32, &[3], [1f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect());
    w
}

#[test]
fn round_trip_every_value_type() {
    let w = sample();
    let f = parse(w.to_bytes()).unwrap();
    assert_eq!(f.version, 3);
    for (k, v) in &w.metadata {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.get_u64("u16").unwrap(), Some(700));
    assert!(matches!(f.get_u64("i8"), Err(GgufError::WrongType { .. })));
    assert_eq!(f.get_strings("strings").unwrap().unwrap(), vec!["a", "βγ", ""]);
    let t = f.tensor("w").unwrap();
    assert_eq!((t.dtype, t.shape.clone()), (DType::Q8_0, vec![2, 32]));
    let v = f.tensor("v").unwrap().to_f32().unwrap();
    assert_eq!(v, vec![1.0, 2.0, 3.0]);
    assert!(matches!(f.tensor("nope"), Err(GgufError::MissingTensor(_))));
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample().to_bytes();
    for len in 0..bytes.len() - 1 {
        // The last tensor's data ends the file, so any cut is detectable.
        let r = parse(bytes[..len].to_vec());
        assert!(r.is_err(), "prefix of {len} bytes parsed");
    }
    let msg = parse(bytes[..40].to_vec()).unwrap_err().to_string();
    assert!(msg.contains("truncated"), "{msg}");
}

#[test]
fn wrong_magic() {
    let mut bytes = sample().to_bytes();
    bytes[..4].copy_from_slice(b"GGML");
    let e = parse(bytes).unwrap_err();
    assert!(matches!(e, GgufError::BadMagic { .. }), "{e}");
    assert!(e.to_string().contains("magic"));
}

#[test]
fn unsupported_version() {
    let mut bytes = sample().to_bytes();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(parse(bytes).unwrap_err(), GgufError::UnsupportedVersion(1)));
}

fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn key(b: &mut Vec<u8>, k: &str, ty: u32) {
    b.extend_from_slice(&(k.len() as u64).to_le_bytes());
    b.extend_from_slice(k.as_bytes());
    b.extend_from_slice(&ty.to_le_bytes());
}

#[test]
fn huge_string_length() {
    let mut b = header(0, 1);
    key(&mut b, "general.name", ValueType::String as u32);
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("general.name"), "{e}");

    // Under the cap but longer than the file: truncated, not an allocation.
    let mut b = header(0, 1);
    key(&mut b, "general.name", ValueType::String as u32);
    b.extend_from_slice(&(1u64 << 20).to_le_bytes());
    assert!(matches!(parse(b).unwrap_err(), GgufError::Truncated { .. }));
}

#[test]
fn huge_arrays_and_counts() {
    let mut b = header(0, 1);
    key(&mut b, "tokens", ValueType::Array as u32);
    b.extend_from_slice(&(ValueType::String as u32).to_le_bytes());
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(parse(b).unwrap_err(), GgufError::TooLarge { .. }));

    // Within the cap, but the file cannot hold that many elements.
    let mut b = header(0, 1);
    key(&mut b, "tokens", ValueType::Array as u32);
    b.extend_from_slice(&(ValueType::U64 as u32).to_le_bytes());
    b.extend_from_slice(&(1u64 << 23).to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e}");

    assert!(matches!(parse(header(u64::MAX, 0)).unwrap_err(), GgufError::TooLarge { .. }));
    assert!(matches!(parse(header(0, u64::MAX)).unwrap_err(), GgufError::TooLarge { .. }));
}

#[test]
fn deep_nesting_is_capped() {
    let mut b = header(0, 1);
    key(&mut b, "deep", ValueType::Array as u32);
    for _ in 0..10 {
        b.extend_from_slice(&(ValueType::Array as u32).to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    b.extend_from_slice(&[0u8; 64]);
    assert!(matches!(parse(b).unwrap_err(), GgufError::TooLarge { .. }));
}

#[test]
fn unknown_value_type() {
    let mut b = header(0, 1);
    key(&mut b, "x", 99);
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::UnknownValueType { ty: 99, .. }), "{e}");
}

/// Hands `f` the bytes right after tensor `name`'s (length-prefixed) name.
fn patch_tensor(bytes: &mut [u8], name: &str, f: impl FnOnce(&mut [u8])) {
    let mut pattern = (name.len() as u64).to_le_bytes().to_vec();
    pattern.extend_from_slice(name.as_bytes());
    let pos = bytes.windows(pattern.len()).position(|w| w == pattern).unwrap() + pattern.len();
    f(&mut bytes[pos..]);
}

#[test]
fn bad_offsets() {
    // Offset past the end of the file.
    let mut bytes = sample().to_bytes();
    // Layout after the name: n_dims u32, dims u64 × n, type u32, offset u64.
    patch_tensor(&mut bytes, "w", |b| b[4 + 16 + 4..4 + 16 + 12].copy_from_slice(&(1u64 << 40).to_le_bytes()));
    let e = parse(bytes).unwrap_err();
    assert!(matches!(e, GgufError::BadTensor { .. }), "{e}");
    assert!(e.to_string().contains("beyond the end"), "{e}");

    // Offset that overflows.
    let mut bytes = sample().to_bytes();
    patch_tensor(&mut bytes, "w", |b| b[4 + 16 + 4..4 + 16 + 12].copy_from_slice(&(u64::MAX - 31).to_le_bytes()));
    assert!(matches!(parse(bytes).unwrap_err(), GgufError::BadTensor { .. }));

    // Misaligned offset.
    let mut bytes = sample().to_bytes();
    patch_tensor(&mut bytes, "w", |b| b[4 + 16 + 4..4 + 16 + 12].copy_from_slice(&3u64.to_le_bytes()));
    let e = parse(bytes).unwrap_err();
    assert!(e.to_string().contains("alignment"), "{e}");
}

#[test]
fn bad_shapes_and_types() {
    // A dimension so large the size overflows.
    let mut bytes = sample().to_bytes();
    patch_tensor(&mut bytes, "w", |b| b[12..20].copy_from_slice(&u64::MAX.to_le_bytes()));
    assert!(matches!(parse(bytes).unwrap_err(), GgufError::BadTensor { .. }));

    // A row that is not a whole number of blocks.
    let mut bytes = sample().to_bytes();
    patch_tensor(&mut bytes, "w", |b| b[4..12].copy_from_slice(&33u64.to_le_bytes()));
    assert!(matches!(parse(bytes).unwrap_err(), GgufError::BadTensor { .. }));

    // Too many dimensions.
    let mut bytes = sample().to_bytes();
    patch_tensor(&mut bytes, "w", |b| b[..4].copy_from_slice(&9u32.to_le_bytes()));
    assert!(matches!(parse(bytes).unwrap_err(), GgufError::BadTensor { .. }));

    // A type this engine does not read (Q2_K), named in the error.
    let mut bytes = sample().to_bytes();
    patch_tensor(&mut bytes, "w", |b| b[20..24].copy_from_slice(&10u32.to_le_bytes()));
    let e = parse(bytes).unwrap_err();
    assert!(e.to_string().contains("Q2_K"), "{e}");
}

#[test]
fn duplicates_are_rejected() {
    let mut w = GgufWriter::new();
    w.metadata("a", Value::U8(1)).metadata("a", Value::U8(2));
    assert!(matches!(parse(w.to_bytes()).unwrap_err(), GgufError::Duplicate { .. }));
    let mut w = GgufWriter::new();
    w.tensor("t", DType::F32, &[1], vec![0; 4]).tensor("t", DType::F32, &[1], vec![0; 4]);
    assert!(matches!(parse(w.to_bytes()).unwrap_err(), GgufError::Duplicate { .. }));
}

/// Flipping bytes anywhere gives `Ok` or `Err`, never a panic.
#[test]
fn corrupted_bytes_never_panic() {
    let bytes = sample().to_bytes();
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..3 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = (state as usize) % b.len();
            b[i] = (state >> 32) as u8;
        }
        if let Ok(f) = parse(b) {
            for t in f.tensors() {
                let _ = f.tensor(&t.name).map(|t| t.to_f32());
            }
        }
    }
}
