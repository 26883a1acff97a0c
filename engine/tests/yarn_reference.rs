//! YaRN against Hugging Face transformers: a tiny random-weight Qwen2 (the tests' own `Tiny`,
//! seed 54) whose files ask for YaRN as Qwen's model cards tell users to (`rope_scaling`
//! `{"type": "yarn", "factor": 4, "original_max_position_embeddings": 32}`), written as a
//! Hugging Face directory and as a GGUF with the keys llama.cpp's converter writes. transformers'
//! logits on the directory's weights, at positions up to four times the original window, are
//! committed in `tests/fixtures/yarn/reference.json` (`scripts/fixtures/make_yarn_fixture.py`,
//! run by `scripts/yarn-fixture.sh`); the fixture holds the safetensors file's sha256, which this
//! test checks first, so it compares the very weights transformers ran.

use crate::common::Runner;
use cachet_engine::config::ModelConfig;
use cachet_engine::testing::{Tiny, TinyArch, TinyYarn};
use cachet_engine::weights::SafetensorsDir;
use cachet_kernels::backend::Backend;
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::quant::DType;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::path::Path;

#[derive(Deserialize)]
struct Reference {
    safetensors_sha256: String,
    original_context: usize,
    ids: Vec<u32>,
    /// Positions whose logits (and rotary cosines and sines) transformers recorded.
    positions: Vec<usize>,
    logits: Vec<Vec<f32>>,
    /// transformers' rotary table at those positions: `head_dim / 2` cosines then as many sines
    /// (the attention factor included).
    rope: Vec<Vec<f32>>,
}

/// The same relative tolerance as the other transformers comparisons of F32 files
/// (`moe_reference`): summation order and cachet's f16 KV cache.
const TOLERANCE: f32 = 0.01;

/// The tiny model with YaRN (or without, to show the comparison notices).
fn model(yarn: bool) -> Tiny {
    let mut t = Tiny::random(TinyArch::Qwen2, 54, false);
    t.yarn = yarn.then_some(TinyYarn { factor: 4.0, original_context: 32 });
    t
}

fn reference() -> Reference {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/yarn/reference.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn hf_runner<B: Backend>(b: B, dir: &Path) -> Runner<B> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let config = ModelConfig::from_hf(&json).unwrap();
    Runner::new(b, &SafetensorsDir::open(dir).unwrap(), config)
}

/// The largest difference from the reference at each recorded position, as a share of the
/// position's largest reference logit.
fn errors(ours: &[Vec<f32>], r: &Reference) -> Vec<f32> {
    r.positions
        .iter()
        .zip(&r.logits)
        .map(|(&p, theirs)| {
            let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
            ours[p].iter().zip(theirs).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
        })
        .collect()
}

#[test]
fn a_yarn_model_matches_transformers_beyond_its_original_window() {
    let dir = tempfile::tempdir().unwrap();
    let (hf, gguf) = (dir.path().join("hf"), dir.path().join("tiny.gguf"));
    std::fs::create_dir_all(&hf).unwrap();
    model(true).write_hf(DType::F32, &hf).unwrap();
    model(true).write_gguf(DType::F32, &gguf).unwrap();
    // The fixture script runs transformers on this very directory.
    if let Some(out) = std::env::var_os("CACHET_YARN_MODEL_OUT") {
        std::fs::create_dir_all(&out).unwrap();
        model(true).write_hf(DType::F32, Path::new(&out)).unwrap();
    }
    let r = reference();
    let sha = format!("{:x}", Sha256::digest(std::fs::read(hf.join("model.safetensors")).unwrap()));
    assert_eq!(
        sha, r.safetensors_sha256,
        "the tiny model's weights changed since the fixture was made: run scripts/yarn-fixture.sh"
    );
    assert!(r.positions.iter().any(|&p| p >= 3 * r.original_context), "positions well past the window");

    for (what, mut runner) in [
        ("safetensors", hf_runner(CpuBackend::new(2).unwrap(), &hf)),
        ("gguf", { Runner::gguf(CpuBackend::new(2).unwrap(), &gguf) }),
    ] {
        let config = runner.model.config().clone();
        let yarn = config.yarn.unwrap_or_else(|| panic!("{what}: YaRN not read"));
        assert_eq!((yarn.factor, yarn.original_context), (4.0, r.original_context), "{what}");
        // The files state the trained window; served is four times it, the whole prompt.
        assert_eq!(config.max_context, 4 * r.original_context, "{what}");
        assert_eq!(r.ids.len(), config.max_context);
        // The rotary table, cosines and sines times the attention factor, as transformers has it.
        let b = CpuBackend::new(1).unwrap();
        let positions: Vec<u32> = r.positions.iter().map(|&p| p as u32).collect();
        let mut table = b.buf();
        b.rope_table(&positions, &config.rope(), &mut table);
        for (row, theirs) in table.data.chunks(config.head_dim).zip(&r.rope) {
            for (a, b) in row.iter().zip(theirs) {
                assert!((a - b).abs() <= 2e-6, "{what}: rotary table {a} vs transformers' {b}");
            }
        }
        let ours = runner.logits(&r.ids, 64);
        let errs = errors(&ours, &r);
        println!("{what}: relative logit error per position {:?}: {errs:.5?}", r.positions);
        for (&p, e) in r.positions.iter().zip(&errs) {
            assert!(*e < TOLERANCE, "{what}: position {p}: relative error {e}");
        }
    }

    // The comparison sees YaRN: the same weights with plain RoPE are far off past the window.
    let plain = dir.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    model(false).write_hf(DType::F32, &plain).unwrap();
    let errs = errors(&hf_runner(CpuBackend::new(2).unwrap(), &plain).logits(&r.ids, 64), &r);
    let beyond = r.positions.iter().zip(&errs).filter(|(&p, _)| p >= r.original_context);
    let worst = beyond.map(|(_, &e)| e).fold(0f32, f32::max);
    println!("plain RoPE: relative logit error per position {errs:.5?}");
    assert!(worst > 10.0 * TOLERANCE, "plain RoPE came within {worst} of YaRN's logits past the window");
}

/// Configurations cachet cannot apply as stated are clear load errors, not silently plain RoPE.
#[test]
fn other_rope_scaling_is_refused_and_yarn_serves_the_extended_context() {
    let base = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "vocab_size": 320, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    });
    let with = |scaling: serde_json::Value| {
        let mut c = base.clone();
        c["rope_scaling"] = scaling;
        ModelConfig::from_hf(&c)
    };
    for kind in ["linear", "dynamic", "longrope", "llama3"] {
        let err = with(serde_json::json!({"type": kind, "factor": 2.0})).unwrap_err().to_string();
        assert!(err.contains(kind) && err.contains("YaRN"), "{kind}: {err}");
    }
    // Qwen2.5's model card: 32k trained, factor 4 → 128k served.
    let c =
        with(serde_json::json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})).unwrap();
    assert_eq!(c.max_context, 131_072);
    let y = c.yarn.unwrap();
    assert!((y.attention_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    assert_eq!((y.beta_fast, y.beta_slow, y.truncate), (32.0, 1.0, true));
    // transformers 5's rope_parameters.
    let mut c = base.clone();
    c.as_object_mut().unwrap().remove("rope_theta");
    c["rope_parameters"] = serde_json::json!({"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0,
        "original_max_position_embeddings": 32768, "attention_factor": 1.5});
    let c = ModelConfig::from_hf(&c).unwrap();
    assert_eq!((c.max_context, c.yarn.unwrap().attention_factor), (65_536, 1.5));
    for bad in [serde_json::json!({"type": "yarn"}), serde_json::json!({"type": "yarn", "factor": -1.0})] {
        assert!(with(bad.clone()).is_err(), "{bad}");
    }
}
