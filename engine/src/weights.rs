//! Where a model's tensors come from: a GGUF file or a Hugging Face directory
//! of safetensors. Both are memory-mapped or copied into huge pages
//! (`crate::host_weights`) and hand out tensors lazily under one canonical naming.

use crate::gguf::GgufFile;
use crate::host_weights::{self, HostWeights};
use crate::LoadError;
use cachet_kernels::quant::DType;
use cachet_kernels::tensor::{Bytes, HostTensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A model tensor, independent of the file format's naming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorName {
    Embed,
    OutputNorm,
    Output,
    AttnNorm(usize),
    Q(usize),
    K(usize),
    V(usize),
    QBias(usize),
    KBias(usize),
    VBias(usize),
    QNorm(usize),
    KNorm(usize),
    AttnOut(usize),
    FfnNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
    /// The router of a mixture-of-experts layer: `[experts, hidden]`.
    Router(usize),
    /// Every expert's gate (or up) projection of a layer in one tensor, `[experts, ff, hidden]`
    /// (llama.cpp's merged `ffn_*_exps`).
    GateExps(usize),
    UpExps(usize),
    /// Every expert's down projection, `[experts, hidden, ff]`.
    DownExps(usize),
    /// One expert's projections (Hugging Face checkpoints store each expert apart).
    ExpertGate(usize, usize),
    ExpertUp(usize, usize),
    ExpertDown(usize, usize),
    /// The shared expert of a Qwen2-MoE layer and its gate (`[1, hidden]`).
    SharedGate(usize),
    SharedUp(usize),
    SharedDown(usize),
    SharedRouter(usize),
}

impl TensorName {
    /// The llama.cpp name.
    pub fn gguf(self) -> String {
        use TensorName::*;
        let blk = |l: usize, s: &str| format!("blk.{l}.{s}");
        match self {
            Embed => "token_embd.weight".into(),
            OutputNorm => "output_norm.weight".into(),
            Output => "output.weight".into(),
            AttnNorm(l) => blk(l, "attn_norm.weight"),
            Q(l) => blk(l, "attn_q.weight"),
            K(l) => blk(l, "attn_k.weight"),
            V(l) => blk(l, "attn_v.weight"),
            QBias(l) => blk(l, "attn_q.bias"),
            KBias(l) => blk(l, "attn_k.bias"),
            VBias(l) => blk(l, "attn_v.bias"),
            QNorm(l) => blk(l, "attn_q_norm.weight"),
            KNorm(l) => blk(l, "attn_k_norm.weight"),
            AttnOut(l) => blk(l, "attn_output.weight"),
            FfnNorm(l) => blk(l, "ffn_norm.weight"),
            Gate(l) => blk(l, "ffn_gate.weight"),
            Up(l) => blk(l, "ffn_up.weight"),
            Down(l) => blk(l, "ffn_down.weight"),
            Router(l) => blk(l, "ffn_gate_inp.weight"),
            GateExps(l) => blk(l, "ffn_gate_exps.weight"),
            UpExps(l) => blk(l, "ffn_up_exps.weight"),
            DownExps(l) => blk(l, "ffn_down_exps.weight"),
            // GGUF files hold experts merged; these names are only for messages.
            ExpertGate(l, e) => blk(l, &format!("ffn_gate_exps.weight[{e}]")),
            ExpertUp(l, e) => blk(l, &format!("ffn_up_exps.weight[{e}]")),
            ExpertDown(l, e) => blk(l, &format!("ffn_down_exps.weight[{e}]")),
            SharedGate(l) => blk(l, "ffn_gate_shexp.weight"),
            SharedUp(l) => blk(l, "ffn_up_shexp.weight"),
            SharedDown(l) => blk(l, "ffn_down_shexp.weight"),
            SharedRouter(l) => blk(l, "ffn_gate_inp_shexp.weight"),
        }
    }

    /// The Hugging Face transformers name.
    pub fn hf(self) -> String {
        use TensorName::*;
        let layer = |l: usize, s: &str| format!("model.layers.{l}.{s}");
        match self {
            Embed => "model.embed_tokens.weight".into(),
            OutputNorm => "model.norm.weight".into(),
            Output => "lm_head.weight".into(),
            AttnNorm(l) => layer(l, "input_layernorm.weight"),
            Q(l) => layer(l, "self_attn.q_proj.weight"),
            K(l) => layer(l, "self_attn.k_proj.weight"),
            V(l) => layer(l, "self_attn.v_proj.weight"),
            QBias(l) => layer(l, "self_attn.q_proj.bias"),
            KBias(l) => layer(l, "self_attn.k_proj.bias"),
            VBias(l) => layer(l, "self_attn.v_proj.bias"),
            QNorm(l) => layer(l, "self_attn.q_norm.weight"),
            KNorm(l) => layer(l, "self_attn.k_norm.weight"),
            AttnOut(l) => layer(l, "self_attn.o_proj.weight"),
            FfnNorm(l) => layer(l, "post_attention_layernorm.weight"),
            Gate(l) => layer(l, "mlp.gate_proj.weight"),
            Up(l) => layer(l, "mlp.up_proj.weight"),
            Down(l) => layer(l, "mlp.down_proj.weight"),
            Router(l) => layer(l, "mlp.gate.weight"),
            // Experts stacked in one 3-D tensor each (released checkpoints, and transformers'
            // `save_pretrained`, store them apart: the names below).
            GateExps(l) => layer(l, "mlp.experts.gate_proj"),
            UpExps(l) => layer(l, "mlp.experts.up_proj"),
            DownExps(l) => layer(l, "mlp.experts.down_proj"),
            ExpertGate(l, e) => layer(l, &format!("mlp.experts.{e}.gate_proj.weight")),
            ExpertUp(l, e) => layer(l, &format!("mlp.experts.{e}.up_proj.weight")),
            ExpertDown(l, e) => layer(l, &format!("mlp.experts.{e}.down_proj.weight")),
            SharedGate(l) => layer(l, "mlp.shared_expert.gate_proj.weight"),
            SharedUp(l) => layer(l, "mlp.shared_expert.up_proj.weight"),
            SharedDown(l) => layer(l, "mlp.shared_expert.down_proj.weight"),
            SharedRouter(l) => layer(l, "mlp.shared_expert_gate.weight"),
        }
    }
}

/// A source of model tensors.
pub trait WeightSource {
    /// The tensor, or `None` when the file does not have it.
    fn get(&self, name: TensorName) -> Result<Option<HostTensor>, LoadError>;
    /// Total bytes of the underlying files.
    fn file_bytes(&self) -> u64;
    /// The name a tensor has in this source's files (for error messages).
    fn file_name(&self, name: TensorName) -> String;
}

impl WeightSource for GgufFile {
    fn get(&self, name: TensorName) -> Result<Option<HostTensor>, LoadError> {
        let n = name.gguf();
        if self.tensor_info(&n).is_none() {
            return Ok(None);
        }
        Ok(Some(self.tensor(&n)?))
    }

    fn file_bytes(&self) -> u64 {
        self.file_size() as u64
    }

    fn file_name(&self, name: TensorName) -> String {
        name.gguf()
    }
}

/// The `*.safetensors` files of a Hugging Face model directory.
pub struct SafetensorsDir {
    tensors: HashMap<String, (DType, Vec<usize>, Bytes)>,
    bytes: u64,
}

impl std::fmt::Debug for SafetensorsDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsDir").field("tensors", &self.tensors.len()).finish()
    }
}

impl SafetensorsDir {
    /// Maps every `*.safetensors` file in `dir` (sorted by name).
    pub fn open(dir: &Path) -> Result<SafetensorsDir, LoadError> {
        SafetensorsDir::open_as(dir, HostWeights::Mapped)
    }

    /// Every `*.safetensors` file in `dir` (sorted by name), their bytes held as `how` says.
    pub fn open_as(dir: &Path, how: HostWeights) -> Result<SafetensorsDir, LoadError> {
        let io = |p: &Path, e| LoadError::Io { path: p.display().to_string(), source: e };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(LoadError::BadConfig(format!("no *.safetensors files in {}", dir.display())));
        }
        let mut tensors = HashMap::new();
        let mut bytes = 0;
        for path in files {
            let owner = host_weights::open(&path, how).map_err(|e| io(&path, e))?;
            let map: &[u8] = (*owner).as_ref();
            bytes += map.len() as u64;
            let bad = |m: String| LoadError::BadFile { path: path.display().to_string(), reason: m };
            let (header_len, meta) = safetensors::SafeTensors::read_metadata(map).map_err(|e| bad(format!("{e:?}")))?;
            let data_start = 8 + header_len;
            for (name, info) in meta.tensors() {
                let dtype = match info.dtype {
                    safetensors::Dtype::F32 => DType::F32,
                    safetensors::Dtype::F16 => DType::F16,
                    safetensors::Dtype::BF16 => DType::BF16,
                    other => return Err(bad(format!("tensor {name:?} has unsupported dtype {other:?}"))),
                };
                let (s, e) = info.data_offsets;
                let window = Bytes::window(owner.clone(), data_start + s..data_start + e)
                    .ok_or_else(|| bad(format!("tensor {name:?} lies outside the file")))?;
                if tensors.insert(name.clone(), (dtype, info.shape.clone(), window)).is_some() {
                    return Err(bad(format!("tensor {name:?} appears in two files")));
                }
            }
        }
        Ok(SafetensorsDir { tensors, bytes })
    }
}

impl WeightSource for SafetensorsDir {
    fn get(&self, name: TensorName) -> Result<Option<HostTensor>, LoadError> {
        let n = name.hf();
        let Some((dtype, shape, bytes)) = self.tensors.get(&n) else { return Ok(None) };
        let t = HostTensor::new(*dtype, shape.clone(), bytes.clone())
            .map_err(|e| LoadError::BadFile { path: n.clone(), reason: e.to_string() })?;
        Ok(Some(t))
    }

    fn file_bytes(&self) -> u64 {
        self.bytes
    }

    fn file_name(&self, name: TensorName) -> String {
        name.hf()
    }
}
