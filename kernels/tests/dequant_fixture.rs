//! Dequantization of every format against the `gguf` Python package, on real
//! tensors of the default model (and gguf-quantized rows for the formats the
//! model lacks). Fixture and generator: `tests/fixtures/dequant.json`,
//! `scripts/fixtures/make_dequant_fixture.py`.

use cachet_kernels::quant::{dequantize_row, DType};
use cachet_kernels::tensor::Bytes;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    dtype: String,
    source: String,
    data_hex: String,
    values: Vec<f64>,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn dequantization_matches_the_gguf_package_exactly() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dequant.json");
    let fixture: Fixture = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut per_type = std::collections::HashMap::new();
    for case in &fixture.cases {
        let dtype = DType::ALL.into_iter().find(|d| d.name() == case.dtype).unwrap();
        // Aligned copy, as the loader makes when a file's data is misaligned.
        let bytes = Bytes::copy_from(&hex(&case.data_hex));
        let mut out = vec![0f32; case.values.len()];
        dequantize_row(dtype, bytes.as_slice(), &mut out).unwrap();
        for (i, (&got, &want)) in out.iter().zip(&case.values).enumerate() {
            // The fixture's values are f32 printed exactly; compare bit patterns
            // (NaN never appears; -0.0 must stay -0.0).
            assert_eq!(
                got.to_bits(),
                (want as f32).to_bits(),
                "{} value {i} ({}): {got} vs {want}",
                case.dtype,
                case.source
            );
        }
        *per_type.entry(dtype).or_insert(0) += out.len();
    }
    for dtype in DType::ALL {
        let n = per_type.get(&dtype).copied().unwrap_or(0);
        assert!(n >= 256, "{dtype}: only {n} reference values");
    }
}
