//! Model hyper-parameters, read from GGUF metadata or a Hugging Face
//! `config.json`, and checked for consistency before any weight is loaded.

use crate::gguf::GgufFile;
use crate::LoadError;
use cachet_kernels::backend::{RopeConfig, RopeStyle, Yarn};

/// The decoder architectures the generic model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: biases on Q/K/V.
    Qwen2,
    /// Llama 2/3 style (no biases).
    Llama,
    /// Qwen3: RMSNorm on each head of Q and K, no biases.
    Qwen3,
    /// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention; routed experts plus a shared
    /// expert behind a sigmoid gate.
    Qwen2Moe,
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention; routed experts.
    Qwen3Moe,
}

impl Arch {
    fn parse(name: &str) -> Result<Arch, LoadError> {
        match name {
            "qwen2" | "Qwen2ForCausalLM" => Ok(Arch::Qwen2),
            "llama" | "LlamaForCausalLM" => Ok(Arch::Llama),
            "qwen3" | "Qwen3ForCausalLM" => Ok(Arch::Qwen3),
            "qwen2moe" | "Qwen2MoeForCausalLM" => Ok(Arch::Qwen2Moe),
            "qwen3moe" | "Qwen3MoeForCausalLM" => Ok(Arch::Qwen3Moe),
            other => Err(LoadError::Unsupported(format!(
                "architecture {other:?} (supported: qwen2, llama, qwen3, qwen2moe, qwen3moe)"
            ))),
        }
    }

    /// The GGUF / llama.cpp name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }

    /// Whether the feed-forward blocks are mixtures of experts.
    pub fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen2Moe | Arch::Qwen3Moe)
    }

    /// Whether the attention is Qwen3's (Q/K norms, no biases by default).
    fn qwen3_attention(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe)
    }
}

/// The mixture-of-experts part of a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per layer.
    pub experts: usize,
    /// Experts each token is routed to (top-k of the router's softmax).
    pub active: usize,
    /// Hidden width of one expert's FFN.
    pub expert_ff: usize,
    /// Whether the top-k weights are renormalised to sum to 1 (Qwen3-MoE's `norm_topk_prob`).
    pub norm_topk: bool,
    /// Hidden width of the shared expert (Qwen2-MoE), which every token goes through, scaled by
    /// the sigmoid of its own gate.
    pub shared_ff: Option<usize>,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rms_eps: f32,
    /// The context served: the one the model was trained for, or with YaRN the extended one
    /// (`original_context × factor` when that is longer).
    pub max_context: usize,
    /// YaRN context extension, when the model's files ask for it.
    pub yarn: Option<Yarn>,
    /// Q/K/V projections have biases (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K (Qwen3).
    pub qk_norm: bool,
    /// Routed experts in every layer's FFN (in place of the dense one).
    pub moe: Option<MoeConfig>,
}

impl ModelConfig {
    /// From GGUF metadata (`general.architecture` and `<arch>.*` keys).
    pub fn from_gguf(f: &GgufFile) -> Result<ModelConfig, LoadError> {
        let arch_name = f.get_str("general.architecture")?.ok_or_else(|| missing("general.architecture"))?;
        let arch = Arch::parse(arch_name)?;
        let a = arch.name();
        let req = |k: &str| -> Result<usize, LoadError> {
            let key = format!("{a}.{k}");
            Ok(f.get_u64(&key)?.ok_or_else(|| missing(&key))? as usize)
        };
        let hidden = req("embedding_length")?;
        let n_heads = req("attention.head_count")?;
        let n_kv_heads = f.get_u64(&format!("{a}.attention.head_count_kv"))?.map_or(n_heads, |v| v as usize);
        let head_dim = f.get_u64(&format!("{a}.attention.key_length"))?.map(|v| v as usize);
        let embed =
            f.tensor_info("token_embd.weight").ok_or_else(|| LoadError::MissingTensor("token_embd.weight".into()))?;
        let vocab_size = embed.shape[0];
        let context = f.get_u64(&format!("{a}.context_length"))?.map_or(2048, |v| v as usize);
        let yarn = yarn_from_gguf(f, a, context)?;
        let moe = if arch.is_moe() {
            let expert_ff = req("expert_feed_forward_length")?;
            Some(MoeConfig {
                experts: req("expert_count")?,
                active: req("expert_used_count")?,
                expert_ff,
                // llama.cpp renormalises Qwen3-MoE's top-k weights and not Qwen2-MoE's; a file may say.
                norm_topk: f.get_bool(&format!("{a}.expert_weights_norm"))?.unwrap_or(arch == Arch::Qwen3Moe),
                shared_ff: f
                    .get_u64(&format!("{a}.expert_shared_feed_forward_length"))?
                    .map(|v| v as usize)
                    .filter(|_| f.tensor_info("blk.0.ffn_gate_shexp.weight").is_some()),
            })
        } else {
            None
        };
        let intermediate = match &moe {
            Some(m) => f.get_u64(&format!("{a}.feed_forward_length"))?.map_or(m.expert_ff, |v| v as usize),
            None => req("feed_forward_length")?,
        };
        let config = ModelConfig {
            arch,
            vocab_size,
            hidden,
            intermediate,
            n_layers: req("block_count")?,
            n_heads,
            n_kv_heads,
            head_dim: head_dim.unwrap_or(hidden.checked_div(n_heads).unwrap_or(0)),
            rope_theta: f.get_f64(&format!("{a}.rope.freq_base"))?.unwrap_or(10_000.0) as f32,
            // llama.cpp's converter permutes Llama's Q/K rows for interleaved
            // rotation; Qwen files keep the NeoX layout.
            rope_style: if arch == Arch::Llama { RopeStyle::Interleaved } else { RopeStyle::Neox },
            rms_eps: f.get_f64(&format!("{a}.attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6) as f32,
            max_context: served_context(context, yarn),
            yarn,
            qkv_bias: f.tensor_info("blk.0.attn_q.bias").is_some(),
            qk_norm: f.tensor_info("blk.0.attn_q_norm.weight").is_some(),
            moe,
        };
        config.validate()?;
        Ok(config)
    }

    /// From a Hugging Face `config.json`.
    pub fn from_hf(json: &serde_json::Value) -> Result<ModelConfig, LoadError> {
        let arch_name = json["architectures"][0]
            .as_str()
            .or_else(|| json["model_type"].as_str())
            .ok_or_else(|| missing("architectures"))?;
        let arch = Arch::parse(arch_name)?;
        let int = |k: &str| json[k].as_u64().map(|v| v as usize);
        let req = |k: &str| int(k).ok_or_else(|| missing(k));
        let hidden = req("hidden_size")?;
        let n_heads = req("num_attention_heads")?;
        // transformers 5 writes `rope_parameters` in place of `rope_theta` / `rope_scaling`.
        let rope = &json["rope_parameters"];
        let rope_theta = json["rope_theta"].as_f64().or_else(|| rope["rope_theta"].as_f64()).unwrap_or(10_000.0);
        let context = int("max_position_embeddings").unwrap_or(2048);
        let scaling = if json["rope_scaling"].is_null() { rope } else { &json["rope_scaling"] };
        let yarn = yarn_from_hf(scaling, json["original_max_position_embeddings"].as_u64(), context)?;
        let moe = if arch.is_moe() {
            if json["decoder_sparse_step"].as_u64().is_some_and(|s| s != 1)
                || json["mlp_only_layers"].as_array().is_some_and(|l| !l.is_empty())
            {
                return Err(LoadError::Unsupported(
                    "mixture-of-experts models with dense layers (decoder_sparse_step, mlp_only_layers)".into(),
                ));
            }
            Some(MoeConfig {
                experts: int("num_experts")
                    .or_else(|| int("num_local_experts"))
                    .ok_or_else(|| missing("num_experts"))?,
                active: req("num_experts_per_tok")?,
                expert_ff: req("moe_intermediate_size")?,
                norm_topk: json["norm_topk_prob"].as_bool().unwrap_or(false),
                shared_ff: int("shared_expert_intermediate_size").filter(|&n| n > 0 && arch == Arch::Qwen2Moe),
            })
        } else {
            None
        };
        let config = ModelConfig {
            arch,
            vocab_size: req("vocab_size")?,
            hidden,
            intermediate: req("intermediate_size")?,
            n_layers: req("num_hidden_layers")?,
            n_heads,
            n_kv_heads: int("num_key_value_heads").unwrap_or(n_heads),
            head_dim: int("head_dim").unwrap_or(hidden.checked_div(n_heads).unwrap_or(0)),
            rope_theta: rope_theta as f32,
            rope_style: RopeStyle::Neox,
            rms_eps: json["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32,
            max_context: served_context(context, yarn),
            yarn,
            qkv_bias: match arch {
                Arch::Qwen2 => true,
                Arch::Qwen2Moe => json["qkv_bias"].as_bool().unwrap_or(true),
                _ => json["attention_bias"].as_bool() == Some(true),
            },
            qk_norm: arch.qwen3_attention(),
            moe,
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), LoadError> {
        let bad = |m: String| Err(LoadError::BadConfig(m));
        if [
            self.vocab_size,
            self.hidden,
            self.intermediate,
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
        ]
        .contains(&0)
        {
            return bad(format!("a zero dimension in {self:?}"));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!("{} heads is not a multiple of {} KV heads", self.n_heads, self.n_kv_heads));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head dimension {} is odd", self.head_dim));
        }
        if self.n_layers > 1024 || self.hidden > 1 << 16 || self.head_dim > 1024 || self.vocab_size > 1 << 24 {
            return bad(format!("implausible shape {self:?}"));
        }
        if let Some(m) = &self.moe {
            if m.experts == 0 || m.expert_ff == 0 || m.active == 0 || m.active > m.experts || m.experts > 1 << 12 {
                return bad(format!("implausible experts {m:?}"));
            }
            if m.shared_ff == Some(0) {
                return bad("a shared expert of width 0".into());
            }
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0 && self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rms_eps {} / rope_theta {} out of range", self.rms_eps, self.rope_theta));
        }
        if let Some(y) = &self.yarn {
            let finite = [y.factor, y.beta_fast, y.beta_slow, y.attention_factor].iter().all(|v| v.is_finite());
            if !finite || !(1.0..=1024.0).contains(&y.factor) || y.attention_factor <= 0.0 || y.beta_slow <= 0.0 {
                return bad(format!("YaRN parameters out of range: {y:?}"));
            }
            if y.original_context == 0 || y.original_context > 1 << 24 {
                return bad(format!("YaRN original context {} out of range", y.original_context));
            }
        }
        if self.max_context > 1 << 24 {
            return bad(format!("a context of {} tokens", self.max_context));
        }
        Ok(())
    }

    /// Rotary embedding parameters.
    pub fn rope(&self) -> RopeConfig {
        RopeConfig { head_dim: self.head_dim, theta: self.rope_theta, style: self.rope_style, yarn: self.yarn }
    }

    /// Width of the Q projection.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the K and V projections.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The context served: with YaRN, the trained window times the factor where that is longer than
/// the model's stated context (vLLM's rule; a config that already states the extended context
/// keeps it).
fn served_context(context: usize, yarn: Option<Yarn>) -> usize {
    yarn.map_or(context, |y| context.max((y.original_context as f64 * y.factor as f64) as usize))
}

/// YaRN from a config.json's `rope_scaling` (or transformers 5's `rope_parameters`), as
/// transformers 5 reads it: `original_max_position_embeddings` (the config's own top-level one
/// first, as Phi-3 keeps it, else the scaling's, else the stated context), `factor` (else the
/// stated context over the original), `beta_fast` (32), `beta_slow` (1), `attention_factor` (else
/// from `mscale` and `mscale_all_dim`, else `0.1 · ln(factor) + 1`), `truncate` (true). Other
/// scaling types are a clear error.
fn yarn_from_hf(
    scaling: &serde_json::Value,
    top_original: Option<u64>,
    context: usize,
) -> Result<Option<Yarn>, LoadError> {
    if scaling.is_null() {
        return Ok(None);
    }
    let kind = scaling["rope_type"].as_str().or_else(|| scaling["type"].as_str()).unwrap_or("default");
    match kind {
        "default" => return Ok(None),
        "yarn" => {}
        other => {
            return Err(LoadError::Unsupported(format!(
                "RoPE scaling {other:?} (cachet applies YaRN, rope_type \"yarn\", and no other)"
            )));
        }
    }
    // transformers takes a missing or zero beta as its default (`get("beta_fast") or 32`).
    let float = |k: &str| scaling[k].as_f64().map(|v| v as f32).filter(|&v| v != 0.0);
    let original = top_original.or_else(|| scaling["original_max_position_embeddings"].as_u64());
    let original_context = original.map_or(context, |v| v as usize);
    let factor = match (float("factor"), original) {
        (Some(f), _) => f,
        (None, Some(o)) if o > 0 => (context as f64 / o as f64) as f32,
        _ => return Err(missing("rope_scaling.factor")),
    };
    let attention_factor = match (float("attention_factor"), float("mscale"), float("mscale_all_dim")) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) => {
            Yarn::default_attention_factor(factor, m) / Yarn::default_attention_factor(factor, all)
        }
        _ => Yarn::default_attention_factor(factor, 1.0),
    };
    Ok(Some(Yarn {
        factor,
        original_context,
        beta_fast: float("beta_fast").unwrap_or(32.0),
        beta_slow: float("beta_slow").unwrap_or(1.0),
        attention_factor,
        truncate: scaling["truncate"].as_bool().unwrap_or(true),
    }))
}

/// YaRN from a GGUF's `<arch>.rope.scaling.*` keys, which llama.cpp's converter writes from
/// config.json: `type` "yarn", `factor`, `original_context_length`, and where the config had
/// them `yarn_attn_factor` (its `attention_factor`), `yarn_beta_fast` and `yarn_beta_slow`;
/// `attn_factor` multiplies the attention factor, as llama.cpp applies it. What cachet cannot
/// apply as stated (another scaling type, per-dimension `rope_freqs`, an extrapolation factor
/// other than 1, DeepSeek's `yarn_log_multiplier`) is a clear error.
fn yarn_from_gguf(f: &GgufFile, a: &str, context: usize) -> Result<Option<Yarn>, LoadError> {
    if f.tensor_info("rope_freqs.weight").is_some() {
        return Err(LoadError::Unsupported("per-dimension RoPE frequency factors (rope_freqs.weight)".into()));
    }
    let key = |k: &str| format!("{a}.rope.scaling.{k}");
    match f.get_str(&key("type"))? {
        None | Some("none") => return Ok(None),
        Some("yarn") => {}
        Some(other) => {
            return Err(LoadError::Unsupported(format!(
                "RoPE scaling {other:?} (cachet applies YaRN, rope.scaling.type \"yarn\", and no other)"
            )));
        }
    }
    let float = |k: &str| -> Result<Option<f32>, LoadError> { Ok(f.get_f64(&key(k))?.map(|v| v as f32)) };
    let factor = float("factor")?.ok_or_else(|| missing(&key("factor")))?;
    if let Some(e) = float("yarn_ext_factor")?.filter(|&e| e != 1.0) {
        return Err(LoadError::Unsupported(format!("a YaRN extrapolation factor of {e} (only 1)")));
    }
    if let Some(m) = float("yarn_log_multiplier")?.filter(|&m| m != 0.0) {
        return Err(LoadError::Unsupported(format!("a YaRN log multiplier of {m} (DeepSeek's attention scale)")));
    }
    let attention_factor = float("yarn_attn_factor")?.unwrap_or(Yarn::default_attention_factor(factor, 1.0))
        * float("attn_factor")?.unwrap_or(1.0);
    Ok(Some(Yarn {
        factor,
        original_context: f.get_u64(&key("original_context_length"))?.map_or(context, |v| v as usize),
        beta_fast: float("yarn_beta_fast")?.unwrap_or(32.0),
        beta_slow: float("yarn_beta_slow")?.unwrap_or(1.0),
        attention_factor,
        truncate: true,
    }))
}

fn missing(key: &str) -> LoadError {
    LoadError::BadConfig(format!("missing {key:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn qwen3_moe() -> serde_json::Value {
        json!({
            "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
            "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
            "num_key_value_heads": 4, "head_dim": 128, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 262144, "rope_theta": 10000000.0, "num_experts": 128,
            "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": true,
            "decoder_sparse_step": 1, "mlp_only_layers": []
        })
    }

    /// Qwen3-Coder-30B-A3B's config.json: a mixture of experts with Qwen3's attention.
    #[test]
    fn a_qwen3_moe_config_reads_its_experts() {
        let c = ModelConfig::from_hf(&qwen3_moe()).unwrap();
        assert_eq!((c.arch, c.qk_norm, c.qkv_bias, c.rope_theta), (Arch::Qwen3Moe, true, false, 1e7));
        let m = c.moe.unwrap();
        assert_eq!((m.experts, m.active, m.expert_ff, m.norm_topk, m.shared_ff), (128, 8, 768, true, None));
    }

    /// transformers 5 writes `rope_parameters` and `num_local_experts`; dense layers among the
    /// sparse ones and RoPE scaling other than YaRN are refused, not run wrongly.
    #[test]
    fn transformers_5_configs_and_unsupported_shapes() {
        let mut j = qwen3_moe();
        let o = j.as_object_mut().unwrap();
        o.remove("rope_theta");
        o.remove("num_experts");
        o.insert("rope_parameters".into(), json!({"rope_theta": 1000000.0, "rope_type": "default"}));
        o.insert("num_local_experts".into(), json!(64));
        let c = ModelConfig::from_hf(&j).unwrap();
        assert_eq!((c.rope_theta, c.moe.unwrap().experts), (1e6, 64));

        // YaRN without its factor, and a scaling type cachet does not apply (YaRN itself:
        // tests/yarn_reference.rs).
        j["rope_parameters"]["rope_type"] = json!("yarn");
        let err = ModelConfig::from_hf(&j).unwrap_err().to_string();
        assert!(err.contains("factor"), "{err}");
        j["rope_parameters"]["rope_type"] = json!("linear");
        let err = ModelConfig::from_hf(&j).unwrap_err().to_string();
        assert!(err.contains("\"linear\""), "{err}");

        let mut j = qwen3_moe();
        j["mlp_only_layers"] = json!([0, 1]);
        let err = ModelConfig::from_hf(&j).unwrap_err().to_string();
        assert!(err.contains("dense layers"), "{err}");

        let mut j = qwen3_moe();
        j["num_experts_per_tok"] = json!(200);
        assert!(ModelConfig::from_hf(&j).is_err(), "more active experts than experts");
    }
}
