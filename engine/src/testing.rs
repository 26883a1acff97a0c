//! Tiny random-weight models for tests and examples: any architecture, every
//! GGUF format, or a Hugging Face safetensors directory, with a byte-level BPE
//! vocabulary and a ChatML template, small enough to write in milliseconds.

use crate::gguf::{GgufWriter, Value, ValueType};
use crate::weights::TensorName;
use cachet_kernels::quant::{quantize_row, DType};
pub use cachet_kernels::testing::Lcg;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinyArch {
    Qwen2,
    Llama,
    Qwen3,
    /// Qwen2's attention, 4 routed experts (2 active, weights not renormalised) and a shared one.
    Qwen2Moe,
    /// Qwen3's attention, 4 routed experts (2 active, weights renormalised).
    Qwen3Moe,
}

impl TinyArch {
    /// Every architecture.
    pub const ALL: [TinyArch; 5] =
        [TinyArch::Qwen2, TinyArch::Llama, TinyArch::Qwen3, TinyArch::Qwen2Moe, TinyArch::Qwen3Moe];

    pub fn name(self) -> &'static str {
        match self {
            TinyArch::Qwen2 => "qwen2",
            TinyArch::Llama => "llama",
            TinyArch::Qwen3 => "qwen3",
            TinyArch::Qwen2Moe => "qwen2moe",
            TinyArch::Qwen3Moe => "qwen3moe",
        }
    }

    /// The architecture of the tiny model the engine loop's and the API's tests serve:
    /// `$CACHET_TINY_ARCH` (`qwen2`, `llama`, `qwen3`, `qwen2moe`, `qwen3moe`), else Qwen2.
    /// `scripts/test.sh` runs those tests a second time with `qwen3moe`.
    pub fn from_env() -> TinyArch {
        match std::env::var("CACHET_TINY_ARCH") {
            Ok(n) if !n.is_empty() => TinyArch::ALL
                .into_iter()
                .find(|a| a.name() == n)
                .unwrap_or_else(|| panic!("unknown CACHET_TINY_ARCH {n:?}")),
            _ => TinyArch::Qwen2,
        }
    }

    fn hf_name(self) -> &'static str {
        match self {
            TinyArch::Qwen2 => "Qwen2ForCausalLM",
            TinyArch::Llama => "LlamaForCausalLM",
            TinyArch::Qwen3 => "Qwen3ForCausalLM",
            TinyArch::Qwen2Moe => "Qwen2MoeForCausalLM",
            TinyArch::Qwen3Moe => "Qwen3MoeForCausalLM",
        }
    }

    fn qkv_bias(self) -> bool {
        matches!(self, TinyArch::Qwen2 | TinyArch::Qwen2Moe)
    }

    fn qk_norm(self) -> bool {
        matches!(self, TinyArch::Qwen3 | TinyArch::Qwen3Moe)
    }
}

/// The experts of a tiny mixture-of-experts model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TinyMoe {
    pub experts: usize,
    pub active: usize,
    pub expert_ff: usize,
    pub norm_topk: bool,
    pub shared_ff: Option<usize>,
}

/// A YaRN context extension for a tiny model's files.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TinyYarn {
    pub factor: f32,
    pub original_context: usize,
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
    /// Routed experts in place of the dense FFN (whose tensors are then absent).
    pub moe: Option<TinyMoe>,
    /// YaRN, written as Qwen's model cards have users add it (`factor` and
    /// `original_max_position_embeddings`; the rest at their defaults).
    pub yarn: Option<TinyYarn>,
    /// (name, shape outermost first, values); experts stacked (`GateExps`: `[experts, ff, hidden]`).
    pub tensors: Vec<(TensorName, Vec<usize>, Vec<f32>)>,
}

impl Tiny {
    pub fn random(arch: TinyArch, seed: u64, tied: bool) -> Tiny {
        let (vocab, hidden, inter, layers, heads, kv_heads, head_dim) = (320, 256, 512, 2, 4, 2, 64);
        let moe = match arch {
            TinyArch::Qwen2Moe => {
                Some(TinyMoe { experts: 4, active: 2, expert_ff: 256, norm_topk: false, shared_ff: Some(256) })
            }
            TinyArch::Qwen3Moe => {
                Some(TinyMoe { experts: 4, active: 2, expert_ff: 256, norm_topk: true, shared_ff: None })
            }
            _ => None,
        };
        let mut rng = Lcg(seed);
        let mut tensors = Vec::new();
        let mut add = |name: TensorName, shape: Vec<usize>, scale: f32, offset: f32| {
            let n = shape.iter().product();
            let v = (0..n).map(|_| offset + scale * rng.f()).collect();
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
            if arch.qkv_bias() {
                add(QBias(l), vec![q], 0.3, 0.0);
                add(KBias(l), vec![kv], 0.3, 0.0);
                add(VBias(l), vec![kv], 0.3, 0.0);
            }
            if arch.qk_norm() {
                add(QNorm(l), vec![head_dim], 0.2, 1.0);
                add(KNorm(l), vec![head_dim], 0.2, 1.0);
            }
            add(AttnOut(l), vec![hidden, q], 0.08, 0.0);
            add(FfnNorm(l), vec![hidden], 0.2, 1.0);
            match moe {
                None => {
                    add(Gate(l), vec![inter, hidden], 0.1, 0.0);
                    add(Up(l), vec![inter, hidden], 0.1, 0.0);
                    add(Down(l), vec![hidden, inter], 0.06, 0.0);
                }
                Some(m) => {
                    // A wide router: its choices are far from ties, so 8-bit activations make
                    // the same ones as the f64 reference.
                    add(Router(l), vec![m.experts, hidden], 1.0, 0.0);
                    add(GateExps(l), vec![m.experts, m.expert_ff, hidden], 0.1, 0.0);
                    add(UpExps(l), vec![m.experts, m.expert_ff, hidden], 0.1, 0.0);
                    add(DownExps(l), vec![m.experts, hidden, m.expert_ff], 0.08, 0.0);
                    if let Some(sf) = m.shared_ff {
                        add(SharedGate(l), vec![sf, hidden], 0.1, 0.0);
                        add(SharedUp(l), vec![sf, hidden], 0.1, 0.0);
                        add(SharedDown(l), vec![hidden, sf], 0.06, 0.0);
                        add(SharedRouter(l), vec![1, hidden], 0.1, 0.0);
                    }
                }
            }
        }
        add(OutputNorm, vec![hidden], 0.2, 1.0);
        if !tied {
            add(Output, vec![vocab, hidden], 0.15, 0.0);
        }
        Tiny {
            arch,
            vocab,
            hidden,
            inter,
            layers,
            heads,
            kv_heads,
            head_dim,
            theta: 10000.0,
            eps: 1e-6,
            tied,
            moe,
            yarn: None,
            tensors,
        }
    }

    /// The context the files state: 4096, or with YaRN the original window (as Qwen's
    /// configs keep `max_position_embeddings` at the trained length beside the scaling).
    fn context(&self) -> usize {
        self.yarn.map_or(4096, |y| y.original_context)
    }

    pub fn get(&self, name: TensorName) -> Option<&[f32]> {
        self.tensors.iter().find(|(n, _, _)| *n == name).map(|(_, _, v)| v.as_slice())
    }

    /// Matrices (and stacks of them) take the file's format; vectors, the router and the shared
    /// expert's gate stay F32, as llama.cpp's converter leaves them.
    fn takes_format(name: TensorName, shape: &[usize]) -> bool {
        shape.len() >= 2 && !matches!(name, TensorName::Router(_) | TensorName::SharedRouter(_))
    }

    /// Writes a GGUF with every matrix in `dtype` (vectors stay F32). Llama's
    /// Q/K rows are permuted the way llama.cpp's converter does, so the file
    /// means the same model as the Hugging Face layout.
    pub fn write_gguf(&self, dtype: DType, path: &Path) -> std::io::Result<()> {
        let a = self.arch.name();
        let mut w = GgufWriter::new();
        w.metadata("general.architecture", Value::String(a.into()))
            .metadata(&format!("{a}.block_count"), Value::U32(self.layers as u32))
            .metadata(&format!("{a}.context_length"), Value::U32(self.context() as u32))
            .metadata(&format!("{a}.embedding_length"), Value::U32(self.hidden as u32))
            .metadata(&format!("{a}.feed_forward_length"), Value::U32(self.inter as u32))
            .metadata(&format!("{a}.attention.head_count"), Value::U32(self.heads as u32))
            .metadata(&format!("{a}.attention.head_count_kv"), Value::U32(self.kv_heads as u32))
            .metadata(&format!("{a}.rope.freq_base"), Value::F32(self.theta))
            .metadata(&format!("{a}.attention.layer_norm_rms_epsilon"), Value::F32(self.eps));
        if self.arch.qk_norm() {
            w.metadata(&format!("{a}.attention.key_length"), Value::U32(self.head_dim as u32));
        }
        if let Some(y) = self.yarn {
            // The keys llama.cpp's converter writes for `rope_scaling` of type yarn.
            w.metadata(&format!("{a}.rope.scaling.type"), Value::String("yarn".into()))
                .metadata(&format!("{a}.rope.scaling.factor"), Value::F32(y.factor))
                .metadata(&format!("{a}.rope.scaling.original_context_length"), Value::U32(y.original_context as u32));
        }
        if let Some(m) = self.moe {
            w.metadata(&format!("{a}.expert_count"), Value::U32(m.experts as u32))
                .metadata(&format!("{a}.expert_used_count"), Value::U32(m.active as u32))
                .metadata(&format!("{a}.expert_feed_forward_length"), Value::U32(m.expert_ff as u32));
            if let Some(sf) = m.shared_ff {
                w.metadata(&format!("{a}.expert_shared_feed_forward_length"), Value::U32(sf as u32));
            }
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
            let dt = if Self::takes_format(*name, shape) || !dtype.is_quantized() { dtype } else { DType::F32 };
            let mut bytes = vec![0u8; dt.bytes_for(values.len()).map_err(std::io::Error::other)?];
            quantize_row(dt, &values, &mut bytes).map_err(std::io::Error::other)?;
            w.tensor(&name.gguf(), dt, shape, bytes);
        }
        w.write(path)
    }

    /// Writes a Hugging Face directory: `config.json` and `model.safetensors`
    /// with every tensor in `dtype` (F32, F16 or BF16).
    pub fn write_hf(&self, dtype: DType, dir: &Path) -> std::io::Result<()> {
        let mut config = serde_json::json!({
            "architectures": [self.arch.hf_name()],
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
            "max_position_embeddings": self.context(),
            "tie_word_embeddings": self.tied,
            "rope_scaling": null,
        });
        if let Some(y) = self.yarn {
            config["rope_scaling"] = serde_json::json!({
                "type": "yarn",
                "factor": y.factor,
                "original_max_position_embeddings": y.original_context,
            });
        }
        if let Some(m) = self.moe {
            config["num_experts"] = m.experts.into();
            config["num_experts_per_tok"] = m.active.into();
            config["moe_intermediate_size"] = m.expert_ff.into();
            config["norm_topk_prob"] = m.norm_topk.into();
            if let Some(sf) = m.shared_ff {
                config["shared_expert_intermediate_size"] = sf.into();
            }
        }
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config)?)?;
        let st_dtype = match dtype {
            DType::F32 => safetensors::Dtype::F32,
            DType::F16 => safetensors::Dtype::F16,
            DType::BF16 => safetensors::Dtype::BF16,
            other => return Err(std::io::Error::other(format!("safetensors cannot hold {other}"))),
        };
        let mut data: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
        for (name, shape, values) in &self.tensors {
            // Hugging Face checkpoints store each expert apart.
            let parts: Vec<(String, &[f32], Vec<usize>)> = match *name {
                TensorName::GateExps(l) | TensorName::UpExps(l) | TensorName::DownExps(l) => {
                    let each = values.len() / shape[0];
                    (0..shape[0])
                        .map(|e| {
                            let one = match name {
                                TensorName::GateExps(_) => TensorName::ExpertGate(l, e),
                                TensorName::UpExps(_) => TensorName::ExpertUp(l, e),
                                _ => TensorName::ExpertDown(l, e),
                            };
                            (one.hf(), &values[e * each..(e + 1) * each], shape[1..].to_vec())
                        })
                        .collect()
                }
                _ => vec![(name.hf(), values.as_slice(), shape.clone())],
            };
            for (n, v, s) in parts {
                let mut bytes = vec![0u8; dtype.bytes_for(v.len()).map_err(std::io::Error::other)?];
                quantize_row(dtype, v, &mut bytes).map_err(std::io::Error::other)?;
                data.push((n, bytes, s));
            }
        }
        let views = data
            .iter()
            .map(|(n, b, s)| Ok((n.clone(), safetensors::tensor::TensorView::new(st_dtype, s.clone(), b)?)))
            .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
            .map_err(std::io::Error::other)?;
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).map_err(std::io::Error::other)
    }
}

/// The row permutation llama.cpp's converter applies to Llama's Q/K weights.
pub fn permute_rows(w: &[f32], heads: usize, head_dim: usize, cols: usize) -> Vec<f32> {
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
        .metadata("tokenizer.chat_template", Value::String(TINY_CHAT_TEMPLATE.into()));
}

/// ChatML, with tools in the Hermes format (as Qwen2.5's template, smaller):
/// without tools it renders plain ChatML.
pub const TINY_CHAT_TEMPLATE: &str = concat!(
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}",
    "# Tools\n<tools>{% for t in tools %}{{ '\\n' }}{{ t | tojson }}{% endfor %}\n</tools>\n",
    "Call a function with <tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    "<|im_end|>\n{% endif %}",
    "{% for m in messages %}{% if tools and loop.first and m.role == 'system' %}",
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n",
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>\n",
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>",
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}",
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
);

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

/// The default model's file name (what `cachet models pull` fetches by default).
pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The default model, for the tests that run the real one: `$CACHET_MODELS_DIR/<file>`, else
/// `~/.cache/cachet/models/<file>`. Absent, the test is skipped (`None`, with a line saying so)
/// unless `REQUIRE_MODEL=1` (as `scripts/test.sh` sets), where absence is a failure.
pub fn default_model() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let dir = std::env::var_os("CACHET_MODELS_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/cachet/models"));
    let path = dir.join(DEFAULT_MODEL_FILE);
    if path.is_file() {
        return Some(path);
    }
    assert!(std::env::var("REQUIRE_MODEL").as_deref() != Ok("1"), "REQUIRE_MODEL=1 but {} is missing", path.display());
    eprintln!("skipping: {} not found (run `cachet models pull`, or set CACHET_MODELS_DIR)", path.display());
    None
}
