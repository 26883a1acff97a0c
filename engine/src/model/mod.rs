//! The generic decoder: one set of weights and one forward pass for Qwen2,
//! Llama and Qwen3 (they differ only in Q/K/V biases, Q/K norms and RoPE
//! pairing), and their mixture-of-experts forms (Qwen2-MoE, Qwen3-MoE). The model holds no KV cache: K/V live in a pool owned by the
//! caller and are addressed by slot.

mod forward;
mod moe;

pub use forward::{ForwardScratch, LogitsFor, SeqChunk};

use crate::config::ModelConfig;
use crate::weights::{TensorName, WeightSource};
use crate::LoadError;
use cachet_kernels::backend::Backend;
use cachet_kernels::tensor::HostTensor;

struct Layer<B: Backend> {
    attn_norm: B::Weight,
    wq: B::Weight,
    wk: B::Weight,
    wv: B::Weight,
    bias: Option<[B::Weight; 3]>,
    qk_norm: Option<[B::Weight; 2]>,
    wo: B::Weight,
    ffn_norm: B::Weight,
    ffn: Ffn<B>,
}

/// A layer's feed-forward block.
enum Ffn<B: Backend> {
    /// `down(silu(gate(x)) · up(x))`.
    Dense { gate: B::Weight, up: B::Weight, down: B::Weight },
    /// Routed experts (and a shared one): `moe.rs`.
    Moe(moe::MoeFfn<B>),
}

/// A model on backend `B`.
pub struct Model<B: Backend> {
    config: ModelConfig,
    embed: B::Weight,
    layers: Vec<Layer<B>>,
    norm: B::Weight,
    /// `None` when the output projection is tied to the embeddings.
    output: Option<B::Weight>,
    /// Weight bytes one decode step reads (all but the embedding table, whose
    /// rows are gathered; the output projection even when tied; of a
    /// mixture of experts, the router, the shared expert and the active share
    /// of the routed ones).
    step_bytes: usize,
    /// Bytes of all routed experts' weights, and the share a decode step reads.
    expert_bytes: (usize, usize),
}

impl<B: Backend> std::fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("config", &self.config).finish()
    }
}

/// Takes tensors from a source, checks their shapes and hands them to the
/// backend, counting the bytes a decode step reads.
struct Loader<'a, B: Backend> {
    backend: &'a B,
    src: &'a dyn WeightSource,
    step_bytes: usize,
    /// Routed experts: all their bytes, and the active share (counted in `step_bytes` too).
    expert_bytes: (usize, usize),
}

impl<B: Backend> Loader<'_, B> {
    /// The tensor `name` as the file holds it.
    fn host(&self, name: TensorName) -> Result<HostTensor, LoadError> {
        self.src.get(name)?.ok_or_else(|| LoadError::MissingTensor(self.src.file_name(name)))
    }

    /// `t` (named `name` in messages) on the backend, if its shape is `shape`.
    fn upload(&self, name: TensorName, t: HostTensor, shape: &[usize]) -> Result<B::Weight, LoadError> {
        // Vectors may be stored as [n] or [1, n].
        let found: Vec<usize> =
            t.shape.iter().copied().skip_while(|&d| d == 1 && t.shape.len() > shape.len()).collect();
        if found != shape {
            return Err(LoadError::Shape { name: self.src.file_name(name), expected: shape.to_vec(), found: t.shape });
        }
        Ok(self.backend.load(t)?)
    }

    /// A tensor every decode step reads (the embedding table excepted).
    fn get(&mut self, name: TensorName, shape: &[usize]) -> Result<B::Weight, LoadError> {
        let t = self.host(name)?;
        if name != TensorName::Embed {
            self.step_bytes += t.bytes.len();
        }
        self.upload(name, t, shape)
    }

    fn opt(&mut self, name: TensorName, shape: &[usize]) -> Result<Option<B::Weight>, LoadError> {
        match self.src.get(name)? {
            Some(_) => self.get(name, shape).map(Some),
            None => Ok(None),
        }
    }
}

impl<B: Backend> Model<B> {
    /// Loads every tensor the architecture needs from `src`, checking shapes
    /// against `config`.
    pub fn load(backend: &B, src: &dyn WeightSource, config: ModelConfig) -> Result<Model<B>, LoadError> {
        let c = &config;
        let mut ld = Loader { backend, src, step_bytes: 0, expert_bytes: (0, 0) };
        let (h, q, kv, ff) = (c.hidden, c.q_dim(), c.kv_dim(), c.intermediate);
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            use TensorName::*;
            let bias = if c.qkv_bias {
                Some([ld.get(QBias(l), &[q])?, ld.get(KBias(l), &[kv])?, ld.get(VBias(l), &[kv])?])
            } else {
                None
            };
            let qk_norm = if c.qk_norm {
                Some([ld.get(QNorm(l), &[c.head_dim])?, ld.get(KNorm(l), &[c.head_dim])?])
            } else {
                None
            };
            let attn_norm = ld.get(AttnNorm(l), &[h])?;
            let (wq, wk, wv) = (ld.get(Q(l), &[q, h])?, ld.get(K(l), &[kv, h])?, ld.get(V(l), &[kv, h])?);
            let wo = ld.get(AttnOut(l), &[h, q])?;
            let ffn_norm = ld.get(FfnNorm(l), &[h])?;
            let ffn = match &c.moe {
                Some(m) => Ffn::Moe(moe::MoeFfn::load(&mut ld, l, h, m)?),
                None => Ffn::Dense {
                    gate: ld.get(Gate(l), &[ff, h])?,
                    up: ld.get(Up(l), &[ff, h])?,
                    down: ld.get(Down(l), &[h, ff])?,
                },
            };
            layers.push(Layer { attn_norm, wq, wk, wv, bias, qk_norm, wo, ffn_norm, ffn });
        }
        let embed = ld.get(TensorName::Embed, &[c.vocab_size, h])?;
        let norm = ld.get(TensorName::OutputNorm, &[h])?;
        let output = ld.opt(TensorName::Output, &[c.vocab_size, h])?;
        if output.is_none() {
            ld.step_bytes += ld.host(TensorName::Embed)?.bytes.len();
        }
        Ok(Model { embed, norm, output, layers, config, step_bytes: ld.step_bytes, expert_bytes: ld.expert_bytes })
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

    /// Of a mixture of experts: `(all, read)`, the bytes of every routed expert's weights and
    /// the share a one-token decode step reads (its active experts, on average; part of
    /// [`Model::step_bytes`]). A batch reads the union of its tokens' experts.
    pub fn expert_bytes(&self) -> Option<(usize, usize)> {
        self.config.moe.as_ref().map(|_| self.expert_bytes)
    }

    fn output(&self) -> &B::Weight {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}
