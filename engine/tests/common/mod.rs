//! Tiny random-weight models written by the tests themselves (GGUF in every
//! format, and Hugging Face safetensors directories), and a plain f32/f64
//! reference forward pass written independently of the engine's.

#![allow(dead_code)]

use cachet_engine::gguf::{GgufFile, GgufWriter, Value, ValueType};
use cachet_engine::weights::TensorName;
use cachet_kernels::quant::{quantize_row, DType};
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyArch {
    Qwen2,
    Llama,
    Qwen3,
}

impl TinyArch {
    pub fn name(self) -> &'static str {
        match self {
            TinyArch::Qwen2 => "qwen2",
            TinyArch::Llama => "llama",
            TinyArch::Qwen3 => "qwen3",
        }
    }
}

/// A tiny model: shapes chosen so every format (K formats need rows of 256)
/// can hold every matrix.
#[derive(Clone, Debug)]
pub struct Tiny {
    pub arch: TinyArch,
    pub vocab: usize,
    pub hidden: usize,
    pub inter: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub theta: f32,
    pub eps: f32,
    pub tied: bool,
    /// (name, shape outermost first, values)
    pub tensors: Vec<(TensorName, Vec<usize>, Vec<f32>)>,
}

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

impl Tiny {
    pub fn random(arch: TinyArch, seed: u64, tied: bool) -> Tiny {
        let (vocab, hidden, inter, layers, heads, kv_heads, head_dim) = (320, 256, 512, 2, 4, 2, 64);
        let mut rng = Lcg(seed);
        let mut tensors = Vec::new();
        let mut add = |name: TensorName, shape: Vec<usize>, scale: f32, offset: f32| {
            let n = shape.iter().product();
            let v = (0..n).map(|_| offset + scale * rng.next()).collect();
            tensors.push((name, shape, v));
        };
        use TensorName::*;
        let (q, kv) = (heads * head_dim, kv_heads * head_dim);
        add(Embed, vec![vocab, hidden], 1.0, 0.0);
        for l in 0..layers {
            add(AttnNorm(l), vec![hidden], 0.2, 1.0);
            add(Q(l), vec![q, hidden], 0.12, 0.0);
            add(K(l), vec![kv, hidden], 0.12, 0.0);
            add(V(l), vec![kv, hidden], 0.12, 0.0);
            if arch == TinyArch::Qwen2 {
                add(QBias(l), vec![q], 0.3, 0.0);
                add(KBias(l), vec![kv], 0.3, 0.0);
                add(VBias(l), vec![kv], 0.3, 0.0);
            }
            if arch == TinyArch::Qwen3 {
                add(QNorm(l), vec![head_dim], 0.2, 1.0);
                add(KNorm(l), vec![head_dim], 0.2, 1.0);
            }
            add(AttnOut(l), vec![hidden, q], 0.08, 0.0);
            add(FfnNorm(l), vec![hidden], 0.2, 1.0);
            add(Gate(l), vec![inter, hidden], 0.1, 0.0);
            add(Up(l), vec![inter, hidden], 0.1, 0.0);
            add(Down(l), vec![hidden, inter], 0.06, 0.0);
        }
        add(OutputNorm, vec![hidden], 0.2, 1.0);
        if !tied {
            add(Output, vec![vocab, hidden], 0.15, 0.0);
        }
        Tiny { arch, vocab, hidden, inter, layers, heads, kv_heads, head_dim, theta: 10000.0, eps: 1e-6, tied, tensors }
    }

    pub fn get(&self, name: TensorName) -> Option<&[f32]> {
        self.tensors.iter().find(|(n, _, _)| *n == name).map(|(_, _, v)| v.as_slice())
    }

    fn is_matrix(shape: &[usize]) -> bool {
        shape.len() == 2
    }

    /// Writes a GGUF with every matrix in `dtype` (vectors stay F32). Llama's
    /// Q/K rows are permuted the way llama.cpp's converter does, so the file
    /// means the same model as the Hugging Face layout.
    pub fn write_gguf(&self, dtype: DType, path: &Path) {
        let a = self.arch.name();
        let mut w = GgufWriter::new();
        w.metadata("general.architecture", Value::String(a.into()))
            .metadata(&format!("{a}.block_count"), Value::U32(self.layers as u32))
            .metadata(&format!("{a}.context_length"), Value::U32(4096))
            .metadata(&format!("{a}.embedding_length"), Value::U32(self.hidden as u32))
            .metadata(&format!("{a}.feed_forward_length"), Value::U32(self.inter as u32))
            .metadata(&format!("{a}.attention.head_count"), Value::U32(self.heads as u32))
            .metadata(&format!("{a}.attention.head_count_kv"), Value::U32(self.kv_heads as u32))
            .metadata(&format!("{a}.rope.freq_base"), Value::F32(self.theta))
            .metadata(&format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(self.eps));
        if self.arch == TinyArch::Qwen3 {
            w.metadata(&format!("{a}.attention.key_length"), Value::U32(self.head_dim as u32));
        }
        tiny_vocab(&mut w, self.vocab);
        for (name, shape, values) in &self.tensors {
            let mut values = values.clone();
            if self.arch == TinyArch::Llama {
                match name {
                    TensorName::Q(_) => values = permute_rows(&values, self.heads, self.head_dim, self.hidden),
                    TensorName::K(_) => values = permute_rows(&values, self.kv_heads, self.head_dim, self.hidden),
                    _ => {}
                }
            }
            // Vectors stay F32 next to quantized matrices (as in llama.cpp's files).
            let dt = if Self::is_matrix(shape) || !dtype.is_quantized() { dtype } else { DType::F32 };
            let mut bytes = vec![0u8; dt.bytes_for(values.len()).unwrap()];
            quantize_row(dt, &values, &mut bytes).unwrap();
            w.tensor(&name.gguf(), dt, shape, bytes);
        }
        w.write(path).unwrap();
    }

    /// Writes a Hugging Face directory: `config.json` and `model.safetensors`
    /// with every tensor in `dtype` (F32, F16 or BF16).
    pub fn write_hf(&self, dtype: DType, dir: &Path) {
        let arch = match self.arch {
            TinyArch::Qwen2 => "Qwen2ForCausalLM",
            TinyArch::Llama => "LlamaForCausalLM",
            TinyArch::Qwen3 => "Qwen3ForCausalLM",
        };
        let config = serde_json::json!({
            "architectures": [arch],
            "model_type": self.arch.name(),
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "rope_theta": self.theta,
            "rms_norm_eps": self.eps,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": self.tied,
            "rope_scaling": null,
        });
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
        let st_dtype = match dtype {
            DType::F32 => safetensors::Dtype::F32,
            DType::F16 => safetensors::Dtype::F16,
            DType::BF16 => safetensors::Dtype::BF16,
            other => panic!("safetensors cannot hold {other}"),
        };
        let data: Vec<(String, Vec<u8>, Vec<usize>)> = self
            .tensors
            .iter()
            .map(|(name, shape, values)| {
                let mut bytes = vec![0u8; dtype.bytes_for(values.len()).unwrap()];
                quantize_row(dtype, values, &mut bytes).unwrap();
                (name.hf(), bytes, shape.clone())
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
            .iter()
            .map(|(n, b, s)| (n.clone(), safetensors::tensor::TensorView::new(st_dtype, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }
}

/// The row permutation llama.cpp's converter applies to Llama's Q/K weights.
fn permute_rows(w: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                // HF row (h, j, i) goes to GGUF row (h, i, j).
                let src = h * head_dim + j * half + i;
                let dst = h * head_dim + i * 2 + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// A byte-level BPE vocabulary: 256 byte tokens, a few merges, then
/// `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` as control tokens, padded
/// with unused tokens to `vocab`.
pub fn tiny_vocab(w: &mut GgufWriter, vocab: usize) {
    let alphabet = byte_alphabet();
    let mut tokens: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
    let mut types = vec![1i32; 256];
    let merges = ["h e", "l l", "he ll", "Ġ t", "Ġt h"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(s.to_string());
        types.push(3);
    }
    while tokens.len() < vocab {
        tokens.push(format!("[PAD{}]", tokens.len()));
        types.push(5);
    }
    let eos = tokens.iter().position(|t| t == "<|im_end|>").unwrap() as u32;
    w.metadata("tokenizer.ggml.model", Value::String("gpt2".into()))
        .metadata("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .metadata("tokenizer.ggml.tokens", Value::strings(&tokens))
        .metadata(
            "tokenizer.ggml.token_type",
            Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
        )
        .metadata("tokenizer.ggml.merges", Value::strings(&merges))
        .metadata("tokenizer.ggml.eos_token_id", Value::U32(eos))
        .metadata("tokenizer.ggml.bos_token_id", Value::U32(eos - 2))
        .metadata("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .metadata(
            "tokenizer.chat_template",
            Value::String(
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                 {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
                    .into(),
            ),
        );
}

/// GPT-2's byte → printable character map.
pub fn byte_alphabet() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).unwrap();
    }
    out
}

/// The weights as the file stores them, dequantized (so a comparison with the
/// reference measures the kernels, not the weight quantization).
pub fn dequantized(tiny: &Tiny, file: &GgufFile) -> Tiny {
    let mut t = tiny.clone();
    for (name, _, values) in t.tensors.iter_mut() {
        let mut v = file.tensor(&name.gguf()).unwrap().to_f32().unwrap();
        if tiny.arch == TinyArch::Llama {
            // Undo the converter's permutation: the reference uses the HF layout.
            match name {
                TensorName::Q(_) => v = unpermute_rows(&v, tiny.heads, tiny.head_dim, tiny.hidden),
                TensorName::K(_) => v = unpermute_rows(&v, tiny.kv_heads, tiny.head_dim, tiny.hidden),
                _ => {}
            }
        }
        *values = v;
    }
    t
}

fn unpermute_rows(w: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let hf = h * head_dim + j * half + i;
                let gg = h * head_dim + i * 2 + j;
                out[hf * cols..(hf + 1) * cols].copy_from_slice(&w[gg * cols..(gg + 1) * cols]);
            }
        }
    }
    out
}

fn matvec(w: &[f32], x: &[f64], rows: usize) -> Vec<f64> {
    let cols = x.len();
    (0..rows).map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()).collect()
}

fn rms(x: &[f64], w: &[f32], eps: f32) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    x.iter().zip(w).map(|(v, &w)| v * inv * w as f64).collect()
}

/// Hugging Face style (NeoX) rotation of one head.
fn rope(x: &mut [f64], pos: usize, theta: f32) {
    let d = x.len();
    for i in 0..d / 2 {
        let freq = 1.0 / (theta as f64).powf(2.0 * i as f64 / d as f64);
        let (s, c) = (pos as f64 * freq).sin_cos();
        let (a, b) = (x[i], x[i + d / 2]);
        x[i] = a * c - b * s;
        x[i + d / 2] = b * c + a * s;
    }
}

/// Logits of every position of `tokens`, computed naively in f64 from the
/// Hugging Face layout of the weights.
pub fn reference_logits(m: &Tiny, tokens: &[u32]) -> Vec<Vec<f32>> {
    use TensorName::*;
    let (hd, nh, nkv) = (m.head_dim, m.heads, m.kv_heads);
    let g = |n| m.get(n).unwrap();
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| g(Embed)[t as usize * m.hidden..][..m.hidden].iter().map(|&v| v as f64).collect())
        .collect();
    for l in 0..m.layers {
        let mut ks: Vec<Vec<f64>> = Vec::new();
        let mut vs: Vec<Vec<f64>> = Vec::new();
        let mut qs: Vec<Vec<f64>> = Vec::new();
        for (pos, x) in xs.iter().enumerate() {
            let h = rms(x, g(AttnNorm(l)), m.eps);
            let mut q = matvec(g(Q(l)), &h, nh * hd);
            let mut k = matvec(g(K(l)), &h, nkv * hd);
            let mut v = matvec(g(V(l)), &h, nkv * hd);
            if let (Some(bq), Some(bk), Some(bv)) = (m.get(QBias(l)), m.get(KBias(l)), m.get(VBias(l))) {
                q.iter_mut().zip(bq).for_each(|(a, &b)| *a += b as f64);
                k.iter_mut().zip(bk).for_each(|(a, &b)| *a += b as f64);
                v.iter_mut().zip(bv).for_each(|(a, &b)| *a += b as f64);
            }
            if let (Some(nq), Some(nk)) = (m.get(QNorm(l)), m.get(KNorm(l))) {
                for head in q.chunks_mut(hd) {
                    let r = rms(head, nq, m.eps);
                    head.copy_from_slice(&r);
                }
                for head in k.chunks_mut(hd) {
                    let r = rms(head, nk, m.eps);
                    head.copy_from_slice(&r);
                }
            }
            q.chunks_mut(hd).for_each(|h| rope(h, pos, m.theta));
            k.chunks_mut(hd).for_each(|h| rope(h, pos, m.theta));
            qs.push(q);
            ks.push(k);
            vs.push(v);
        }
        for (pos, x) in xs.iter_mut().enumerate() {
            let mut attn = vec![0f64; nh * hd];
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let q = &qs[pos][h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (0..=pos)
                    .map(|s| {
                        q.iter().zip(&ks[s][kvh * hd..(kvh + 1) * hd]).map(|(a, b)| a * b).sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (s, w) in e.iter().enumerate() {
                    for d in 0..hd {
                        attn[h * hd + d] += w / sum * vs[s][kvh * hd + d];
                    }
                }
            }
            let o = matvec(g(AttnOut(l)), &attn, m.hidden);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = rms(x, g(FfnNorm(l)), m.eps);
            let gate = matvec(g(Gate(l)), &h, m.inter);
            let up = matvec(g(Up(l)), &h, m.inter);
            let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let d = matvec(g(Down(l)), &act, m.hidden);
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
    }
    let out = m.get(Output).unwrap_or_else(|| g(Embed));
    xs.iter()
        .map(|x| matvec(out, &rms(x, g(OutputNorm), m.eps), m.vocab).into_iter().map(|v| v as f32).collect())
        .collect()
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}
