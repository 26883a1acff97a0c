//! The generic decoder: one set of weights and one forward pass for Qwen2,
//! Llama and Qwen3 (they differ only in Q/K/V biases, Q/K norms and RoPE
//! pairing). The model holds no KV cache: K/V live in a pool owned by the
//! caller and are addressed by slot.

mod forward;

pub use forward::{ForwardScratch, LogitsFor, SeqChunk};

use crate::config::ModelConfig;
use crate::weights::{TensorName, WeightSource};
use crate::LoadError;
use cachet_kernels::backend::Backend;

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    bias: Option<[B::Weight; 3]>,
    qk_norm: Option<[B::Weight; 2]>,
    wo: B::Weight,
    ffn_norm: B::Weight,
    gate: B::Weight,
    up: B::Weight,
    down: B::Weight,
}

/// A loaded model on backend `B`.
pub struct Model<B: Backend> {
    config: ModelConfig,
    embed: B::Weight,
    layers: Vec<Layer<B>>,
    norm: B::Weight,
    /// `None` when the output projection is tied to the embeddings.
    output: Option<B::Weight>,
    /// Weight bytes one decode step reads (all but the embedding table, whose
    /// rows are gathered; the output projection even when tied).
    step_bytes: usize,
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", &self.config).finish()
    }
}

impl<B: Backend> Model<B> {
    /// Loads every tensor the architecture needs from `src`, checking shapes
    /// against `config`.
    pub fn load(backend: &B, src: &dyn WeightSource, config: ModelConfig) -> Result<Model<B>, LoadError> {
        let c = &config;
        let step_bytes = std::cell::Cell::new(0usize);
        let get = |name: TensorName, shape: &[usize]| -> Result<B::Weight, LoadError> {
            let t = src.get(name)?.ok_or_else(|| LoadError::MissingTensor(src.file_name(name)))?;
            if name != TensorName::Embed {
                step_bytes.set(step_bytes.get() + t.bytes.len());
            }
            // Vectors may be stored as [n] or [1, n].
            let found: Vec<usize> =
                t.shape.iter().copied().skip_while(|&d| d == 1 && t.shape.len() > shape.len()).collect();
            if found != shape {
                return Err(LoadError::Shape { name: src.file_name(name), expected: shape.to_vec(), found: t.shape });
            }
            Ok(backend.load(t)?)
        };
        let opt = |name: TensorName, shape: &[usize]| -> Result<Option<B::Weight>, LoadError> {
            match src.get(name)? {
                Some(_) => get(name, shape).map(Some),
                None => Ok(None),
            }
        };
        let (h, q, kv, ff) = (c.hidden, c.q_dim(), c.kv_dim(), c.intermediate);
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            use TensorName::*;
            let bias = if c.qkv_bias {
                Some([get(QBias(l), &[q])?, get(KBias(l), &[kv])?, get(VBias(l), &[kv])?])
            } else {
                None
            };
            let qk_norm =
                if c.qk_norm { Some([get(QNorm(l), &[c.head_dim])?, get(KNorm(l), &[c.head_dim])?]) } else { None };
            layers.push(Layer {
                attn_norm: get(AttnNorm(l), &[h])?,
                wq: get(Q(l), &[q, h])?,
                wk: get(K(l), &[kv, h])?,
                wv: get(V(l), &[kv, h])?,
                bias,
                qk_norm,
                wo: get(AttnOut(l), &[h, q])?,
                ffn_norm: get(FfnNorm(l), &[h])?,
                gate: get(Gate(l), &[ff, h])?,
                up: get(Up(l), &[ff, h])?,
                down: get(Down(l), &[h, ff])?,
            });
        }
        let embed = get(TensorName::Embed, &[c.vocab_size, h])?;
        let norm = get(TensorName::OutputNorm, &[h])?;
        let output = opt(TensorName::Output, &[c.vocab_size, h])?;
        if output.is_none() {
            let t = src
                .get(TensorName::Embed)?
                .ok_or_else(|| LoadError::MissingTensor(src.file_name(TensorName::Embed)))?;
            step_bytes.set(step_bytes.get() + t.bytes.len());
        }
        Ok(Model { embed, norm, output, layers, config, step_bytes: step_bytes.get() })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Weight bytes a decode step streams from memory: what bounds decode
    /// speed (bytes ÷ memory bandwidth).
    pub fn step_bytes(&self) -> usize {
        self.step_bytes
    }

    fn output(&self) -> &B::Weight {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}
