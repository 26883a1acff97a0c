//! Model hyper-parameters, read from GGUF metadata or a Hugging Face
//! `config.json`, and checked for consistency before any weight is loaded.

use crate::gguf::GgufFile;
use crate::LoadError;
use cachet_kernels::backend::{RopeConfig, RopeStyle};

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
    /// The context length the model was trained for.
    pub max_context: usize,
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
        if f.get(&format!("{a}.rope.scaling.type")).is_some() || f.tensor_info("rope_freqs.weight").is_some() {
            return Err(LoadError::Unsupported("RoPE scaling (rope.scaling / rope_freqs) is not supported yet".into()));
        }
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
            max_context: f.get_u64(&format!("{a}.context_length"))?.map_or(2048, |v| v as usize),
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
        if !json["rope_scaling"].is_null() {
            return Err(LoadError::Unsupported("config.json rope_scaling is not supported yet".into()));
        }
        // transformers 5 writes `rope_parameters` in place of `rope_theta` / `rope_scaling`.
        let rope = &json["rope_parameters"];
        if rope["rope_type"].as_str().is_some_and(|t| t != "default") {
            return Err(LoadError::Unsupported(format!(
                "config.json rope_type {} is not supported yet",
                rope["rope_type"]
            )));
        }
        let rope_theta = json["rope_theta"].as_f64().or_else(|| rope["rope_theta"].as_f64()).unwrap_or(10_000.0);
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
            max_context: int("max_position_embeddings").unwrap_or(2048),
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
        Ok(())
    }

    /// Rotary embedding parameters.
    pub fn rope(&self) -> RopeConfig {
        RopeConfig { head_dim: self.head_dim, theta: self.rope_theta, style: self.rope_style }
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
    /// sparse ones and RoPE scaling are refused, not run wrongly.
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

        j["rope_parameters"]["rope_type"] = json!("yarn");
        let err = ModelConfig::from_hf(&j).unwrap_err().to_string();
        assert!(err.contains("rope_type"), "{err}");

        let mut j = qwen3_moe();
        j["mlp_only_layers"] = json!([0, 1]);
        let err = ModelConfig::from_hf(&j).unwrap_err().to_string();
        assert!(err.contains("dense layers"), "{err}");

        let mut j = qwen3_moe();
        j["num_experts_per_tok"] = json!(200);
        assert!(ModelConfig::from_hf(&j).is_err(), "more active experts than experts");
    }
}
