//! Tiny random-weight models, written by the test in every GGUF format and as
//! safetensors, run through the real loader and forward pass and compared with
//! an independent f64 reference; and the batch/chunk invariance of the
//! forward pass, demanded exactly.

use crate::common;

use cachet_engine::config::ModelConfig;
use cachet_engine::gguf::GgufFile;
use cachet_engine::kv_pool::{PoolSize, SlotId};
use cachet_engine::model::{LogitsFor, SeqChunk};
use cachet_engine::weights::SafetensorsDir;
use cachet_kernels::cpu::CpuBackend;
use cachet_kernels::quant::DType;
use common::*;

/// Every GGUF format, every architecture, tied and untied output: the engine
/// matches the f64 reference on the same (dequantized) weights. Tolerances:
/// F32/F16/BF16 weights keep f32 activations, so only the f16 KV cache and
/// summation order differ (≤ 1%); quantized formats also quantize activations
/// to 8 bits per block (≤ 4% of the largest logit), and a mixture of experts is compared up to
/// the first position whose routing nearly tied in the reference.
#[test]
fn gguf_every_format_matches_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    for arch in TinyArch::ALL {
        let (mut compared, mut positions) = (0, 0);
        for dtype in DType::ALL {
            let tied = matches!(dtype, DType::Q4_0 | DType::Q6_K | DType::BF16);
            let tiny = Tiny::random(arch, 11, tied);
            let path = dir.path().join(format!("{}-{dtype}.gguf", arch.name()));
            tiny.write_gguf(dtype, &path).unwrap();
            let file = GgufFile::open(&path).unwrap();
            let (reference, margins) = reference_forward(&dequantized(&tiny, &file), &PROMPT);
            let mut r = Runner::gguf(CpuBackend::new(2).unwrap(), &path);
            let ours = r.logits(&PROMPT, PROMPT.len());
            // A mixture of experts in a quantized format: from the first position where the
            // reference's router nearly tied, 8-bit activations may choose another expert.
            let upto = match dtype.is_quantized() {
                true => margins.iter().position(|&m| m < 0.05).unwrap_or(PROMPT.len()),
                false => PROMPT.len(),
            };
            let err = worst(&ours[..upto], &reference[..upto]);
            let tol = if dtype.is_quantized() { 0.04 } else { 0.01 };
            println!("{:8} {dtype:5} tied={tied:5} rel err {err:.5} (positions {upto})", arch.name());
            assert!(err < tol, "{} {dtype}: relative error {err} ≥ {tol}", arch.name());
            (compared, positions) = (compared + upto, positions + PROMPT.len());
        }
        // Near-ties are rare: two thirds of the positions or more are compared in every architecture.
        assert!(compared * 3 >= positions * 2, "{}: only {compared} of {positions} positions compared", arch.name());
    }
}

/// Safetensors directories (F32, F16, BF16) load through the same path and
/// agree with the reference, and a Llama in Hugging Face layout (NeoX RoPE)
/// equals the same Llama converted to GGUF (permuted Q/K, interleaved RoPE).
#[test]
fn safetensors_match_the_reference_and_the_gguf() {
    for arch in TinyArch::ALL {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let dir = tempfile::tempdir().unwrap();
            let tiny = Tiny::random(arch, 5, arch == TinyArch::Qwen2);
            tiny.write_hf(dtype, dir.path()).unwrap();
            let json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
            let config = ModelConfig::from_hf(&json).unwrap();
            let src = SafetensorsDir::open(dir.path()).unwrap();
            let mut r = Runner::new(CpuBackend::new(2).unwrap(), &src, config);
            let ours = r.logits(&PROMPT, PROMPT.len());
            // The reference reads back what the file holds (rounded to dtype).
            let gguf = dir.path().join("same.gguf");
            tiny.write_gguf(dtype, &gguf).unwrap();
            let stored = dequantized(&tiny, &GgufFile::open(&gguf).unwrap());
            let err = worst(&ours, &reference_logits(&stored, &PROMPT));
            println!("{:6} {dtype:5} safetensors rel err {err:.5}", arch.name());
            assert!(err < 0.01, "{} {dtype}: {err}", arch.name());
            let via_gguf = Runner::gguf(CpuBackend::new(2).unwrap(), &gguf).logits(&PROMPT, PROMPT.len());
            let err = worst(&ours, &via_gguf);
            assert!(err < 1e-3, "{} {dtype}: HF layout vs GGUF layout differ by {err}", arch.name());
        }
    }
}

/// Three sequences of different lengths in one batch give exactly the logits
/// each gives alone, and a prompt run in chunks gives exactly the logits of
/// running it at once: every kernel computes a row the same way whatever else
/// is in the batch.
#[test]
fn batching_and_chunking_do_not_change_results() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (TinyArch::Qwen2, DType::Q5_0),
        (TinyArch::Qwen2, DType::Q4_K),
        (TinyArch::Qwen2, DType::F16),
        // Mixtures of experts: a row's experts and their sum do not depend on the batch either.
        (TinyArch::Qwen3Moe, DType::Q4_K),
        (TinyArch::Qwen2Moe, DType::Q8_0),
    ];
    for (arch, dtype) in cases {
        let path = dir.path().join(format!("m-{}-{dtype}.gguf", arch.name()));
        Tiny::random(arch, 23, false).write_gguf(dtype, &path).unwrap();
        let mut r = Runner::gguf(CpuBackend::new(2).unwrap(), &path);
        let vocab = r.model.config().vocab_size;
        let seqs: [&[u32]; 3] = [&PROMPT[..5], &PROMPT[..], &[7, 8, 9]];
        let alone: Vec<Vec<Vec<f32>>> = seqs.iter().map(|s| r.logits(s, s.len())).collect();

        // Chunked prefill of the long prompt: 4 + 4 + 4 tokens.
        assert_eq!(r.logits(seqs[1], 4), alone[1], "{arch:?} {dtype}: chunking changed the logits");
        if matches!(arch, TinyArch::Qwen3Moe | TinyArch::Qwen2Moe) {
            // 150 tokens × 2 active experts route more rows than the fused path takes (256): at
            // once, expert by expert; in 8-token chunks, all experts in one grouped call each.
            let long: Vec<u32> = (0..150).map(|i| (i * 37 + 11) % vocab as u32).collect();
            assert_eq!(r.logits(&long, 150), r.logits(&long, 8), "{arch:?} {dtype}: the experts' two paths differ");
        }

        // The last layer's feed-forward block runs only for the rows that want logits: a chunk
        // wanting none, then the rest of that prompt wanting its last token beside a prompt
        // wanting every row, give the bits of every row computed.
        let long = r.pool.allocate(seqs[1].len()).unwrap();
        let short = r.pool.allocate(seqs[2].len()).unwrap();
        let mut out = Vec::new();
        let first =
            [SeqChunk { tokens: &seqs[1][..8], start_pos: 0, slots: SlotId::raw(&long[..8]), logits: LogitsFor::None }];
        r.model.forward(&r.b, r.pool.storage_mut(), &first, &mut r.scratch, &mut out).unwrap();
        assert!(out.is_empty());
        let rest = [
            SeqChunk { tokens: &seqs[1][8..], start_pos: 8, slots: SlotId::raw(&long), logits: LogitsFor::Last },
            SeqChunk { tokens: seqs[2], start_pos: 0, slots: SlotId::raw(&short), logits: LogitsFor::All },
        ];
        r.model.forward(&r.b, r.pool.storage_mut(), &rest, &mut r.scratch, &mut out).unwrap();
        let got: Vec<&[f32]> = out.chunks(vocab).collect();
        let expected: Vec<&[f32]> =
            std::iter::once(alone[1].last().unwrap().as_slice()).chain(alone[2].iter().map(Vec::as_slice)).collect();
        assert_eq!(got, expected, "{arch:?} {dtype}: logits of some rows only");
        r.pool.free(&long).unwrap();
        r.pool.free(&short).unwrap();

        // All three at once, with slots interleaved in the pool.
        let (rows, slots) = r.batched(&seqs);
        for (got, expected) in rows.iter().zip(&alone) {
            assert_eq!(got, expected, "{arch:?} {dtype}: batching changed the logits");
        }

        // Decode one more token for each sequence in one batch vs alone.
        let extra: Vec<SlotId> = r.pool.allocate(3).unwrap();
        let all_slots: Vec<Vec<SlotId>> =
            slots.iter().zip(&extra).map(|(s, e)| s.iter().copied().chain([*e]).collect()).collect();
        let step: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(&all_slots)
            .map(|(s, sl)| SeqChunk {
                tokens: &[42],
                start_pos: s.len(),
                slots: SlotId::raw(sl),
                logits: LogitsFor::Last,
            })
            .collect();
        r.model.forward(&r.b, r.pool.storage_mut(), &step, &mut r.scratch, &mut out).unwrap();
        for (k, s) in seqs.iter().enumerate() {
            let mut with = s.to_vec();
            with.push(42);
            let single = r.logits(&with, with.len());
            assert_eq!(
                &out[k * vocab..(k + 1) * vocab],
                single.last().unwrap().as_slice(),
                "{arch:?} {dtype}: decode batch"
            );
        }
    }
}

/// Bad batches are errors, not panics, and leave the pool intact.
#[test]
fn bad_batches_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    Tiny::random(TinyArch::Qwen2, 1, false).write_gguf(DType::Q8_0, &path).unwrap();
    let mut r = Runner::gguf(CpuBackend::new(2).unwrap(), &path);
    let slots = r.pool.allocate(3).unwrap();
    let mut out = Vec::new();
    let mut run = |tokens: &[u32], start: usize, n_slots: usize| {
        let batch: Vec<SeqChunk<'_>> =
            vec![SeqChunk { tokens, start_pos: start, slots: SlotId::raw(&slots[..n_slots]), logits: LogitsFor::Last }];
        r.model.forward(&r.b, r.pool.storage_mut(), &batch, &mut r.scratch, &mut out).map_err(|e| e.to_string())
    };
    assert!(run(&[1, 2, 999], 0, 3).unwrap_err().contains("999"));
    assert!(run(&[1, 2], 0, 3).unwrap_err().contains("slots"));
    assert!(run(&[], 0, 0).unwrap_err().contains("no tokens"));
    run(&[1, 2, 3], 0, 3).unwrap();
    r.pool.check_integrity().unwrap();
}

/// A Hugging Face directory (config.json, model.safetensors, tokenizer.json,
/// tokenizer_config.json with the chat template) loads through the same
/// loader as a GGUF and generates exactly what the same weights in an F32
/// GGUF generate.
#[test]
fn hugging_face_directory_end_to_end() {
    use cachet_engine::chat_template::ChatMessage;
    use cachet_engine::generate::{GenerateParams, Generator};
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::random(TinyArch::Qwen2, 31, true);
    let gguf = dir.path().join("m.gguf");
    tiny.write_gguf(DType::F32, &gguf).unwrap();
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    tiny.write_hf(DType::F32, &hf).unwrap();

    let b = CpuBackend::new(1).unwrap();
    let from_gguf = cachet_engine::loader::load(&gguf, &b).unwrap();
    from_gguf.tokenizer.inner().save(hf.join("tokenizer.json"), false).unwrap();
    let file = GgufFile::open(&gguf).unwrap();
    let template = file.get_str("tokenizer.chat_template").unwrap().unwrap();
    let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(hf.join("tokenizer_config.json"), config.to_string()).unwrap();

    let from_hf = cachet_engine::loader::load(&hf, &b).unwrap();
    let mut gens =
        [from_gguf, from_hf].map(|m| Generator::new(CpuBackend::new(1).unwrap(), m, PoolSize::Tokens(64)).unwrap());
    let messages = [ChatMessage::user("hello there")];
    let params = GenerateParams { max_tokens: 10, ignore_eos: true, ..Default::default() };
    let outs: Vec<_> = gens
        .iter_mut()
        .map(|g| {
            let prompt = g.chat_prompt(&messages).unwrap();
            (prompt.clone(), g.generate(&prompt, &params, &mut |_| {}).unwrap().tokens)
        })
        .collect();
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0].1.len(), 10);
}
