//! The f64 reference forward pass, written independently of the engine's,
//! and helpers to compare against it; the tiny engine the loop tests run.

#![allow(dead_code)]

use cachet_engine::config::ModelConfig;
use cachet_engine::gguf::GgufFile;
use cachet_engine::kv_pool::{KvPool, PoolSize, SlotId};
use cachet_engine::model::{ForwardScratch, LogitsFor, Model, SeqChunk};
pub use cachet_engine::testing::*;
use cachet_engine::weights::TensorName;
use cachet_engine::weights::WeightSource;
use cachet_kernels::backend::Backend;

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
    reference_forward(m, tokens).0
}

/// [`reference_logits`], and for a mixture of experts each position's router margin: the
/// smallest gap, over layers, between the router scores of the last expert chosen and the best
/// one not chosen (infinite for a dense model).
pub fn reference_forward(m: &Tiny, tokens: &[u32]) -> (Vec<Vec<f32>>, Vec<f64>) {
    use TensorName::*;
    let mut margins = vec![f64::INFINITY; tokens.len()];
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
            let ffn = |gate: &[f32], up: &[f32], down: &[f32], ff: usize| -> Vec<f64> {
                let gate = matvec(gate, &h, ff);
                let up = matvec(up, &h, ff);
                let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                matvec(down, &act, m.hidden)
            };
            let d = match m.moe {
                None => ffn(g(Gate(l)), g(Up(l)), g(Down(l)), m.inter),
                Some(moe) => {
                    // Softmax over the router's scores, the `active` best, their weights
                    // renormalised or not; a shared expert scaled by the sigmoid of its gate.
                    let scores = matvec(g(Router(l)), &h, moe.experts);
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    let mut order: Vec<usize> = (0..moe.experts).collect();
                    order.sort_by(|&a, &b| e[b].total_cmp(&e[a]).then(a.cmp(&b)));
                    let chosen = &order[..moe.active];
                    if let Some(&next) = order.get(moe.active) {
                        margins[pos] = margins[pos].min(scores[order[moe.active - 1]] - scores[next]);
                    }
                    let total: f64 = chosen.iter().map(|&i| e[i] / sum).sum();
                    let mut out = vec![0f64; m.hidden];
                    let (gate, up, down) = (g(GateExps(l)), g(UpExps(l)), g(DownExps(l)));
                    let each = moe.expert_ff * m.hidden;
                    for &i in chosen {
                        let w = e[i] / sum / if moe.norm_topk { total } else { 1.0 };
                        let at = i * each..(i + 1) * each;
                        let y = ffn(&gate[at.clone()], &up[at.clone()], &down[at], moe.expert_ff);
                        out.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
                    }
                    if let Some(sf) = moe.shared_ff {
                        let y = ffn(g(SharedGate(l)), g(SharedUp(l)), g(SharedDown(l)), sf);
                        let gate = matvec(g(SharedRouter(l)), &h, 1)[0];
                        let s = 1.0 / (1.0 + (-gate).exp());
                        out.iter_mut().zip(&y).for_each(|(o, y)| *o += s * y);
                    }
                    out
                }
            };
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
    }
    let out = m.get(Output).unwrap_or_else(|| g(Embed));
    let logits = xs
        .iter()
        .map(|x| matvec(out, &rms(x, g(OutputNorm), m.eps), m.vocab).into_iter().map(|v| v as f32).collect())
        .collect();
    (logits, margins)
}

/// max |a - b| / max |b|.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// A model on a backend, with its KV pool, for all-position logits.
pub struct Runner<B: Backend> {
    pub b: B,
    pub model: Model<B>,
    pub pool: KvPool<B>,
    pub scratch: ForwardScratch<B>,
}

impl<B: Backend> Runner<B> {
    pub fn gguf(b: B, path: &std::path::Path) -> Runner<B> {
        let file = GgufFile::open(path).unwrap();
        let config = ModelConfig::from_gguf(&file).unwrap();
        Runner::new(b, &file, config)
    }

    pub fn new(b: B, src: &dyn WeightSource, config: ModelConfig) -> Runner<B> {
        let pool = KvPool::new(&b, &config, PoolSize::Tokens(256)).unwrap();
        let model = Model::load(&b, src, config).unwrap();
        let scratch = ForwardScratch::new(&b);
        Runner { b, model, pool, scratch }
    }

    /// All-position logits of one sequence, run in chunks of `chunk` tokens.
    pub fn logits(&mut self, tokens: &[u32], chunk: usize) -> Vec<Vec<f32>> {
        let slots = self.pool.allocate(tokens.len()).unwrap();
        let vocab = self.model.config().vocab_size;
        let mut rows = Vec::new();
        let mut out = Vec::new();
        for start in (0..tokens.len()).step_by(chunk) {
            let end = (start + chunk).min(tokens.len());
            let batch = [SeqChunk {
                tokens: &tokens[start..end],
                start_pos: start,
                slots: SlotId::raw(&slots[..end]),
                logits: LogitsFor::All,
            }];
            self.model.forward(&self.b, self.pool.storage_mut(), &batch, &mut self.scratch, &mut out).unwrap();
            rows.extend(out.chunks(vocab).map(<[f32]>::to_vec));
        }
        self.pool.free(&slots).unwrap();
        self.pool.check_integrity().unwrap();
        rows
    }

    /// All positions' logits of several prompts run together in one forward pass (their slots
    /// interleaved in the pool), split back per prompt; with the slots, which stay allocated.
    #[allow(dead_code)] // not every test binary that shares this module uses it
    pub fn batched(&mut self, seqs: &[&[u32]]) -> (Vec<Vec<Vec<f32>>>, Vec<Vec<SlotId>>) {
        let vocab = self.model.config().vocab_size;
        let slots: Vec<Vec<SlotId>> = seqs.iter().map(|s| self.pool.allocate(s.len()).unwrap()).collect();
        let batch: Vec<SeqChunk<'_>> = seqs
            .iter()
            .zip(&slots)
            .map(|(s, sl)| SeqChunk { tokens: s, start_pos: 0, slots: SlotId::raw(sl), logits: LogitsFor::All })
            .collect();
        let mut out = Vec::new();
        self.model.forward(&self.b, self.pool.storage_mut(), &batch, &mut self.scratch, &mut out).unwrap();
        let mut rows = out.chunks(vocab).map(<[f32]>::to_vec);
        let per_seq = seqs.iter().map(|s| rows.by_ref().take(s.len()).collect()).collect();
        (per_seq, slots)
    }
}

pub const PROMPT: [u32; 12] = [3, 200, 17, 45, 45, 99, 260, 1, 0, 318, 77, 150];

/// Worst relative error over all positions.
pub fn worst(ours: &[Vec<f32>], reference: &[Vec<f32>]) -> f32 {
    ours.iter().zip(reference).map(|(a, b)| rel_err(a, b)).fold(0.0, f32::max)
}

/// A running engine loop (2 threads) serving `Tiny::random(TinyArch::from_env(), 77)` in Q8_0.
pub fn tiny_engine(cfg: cachet_engine::runtime::EngineConfig) -> cachet_engine::runtime::EngineHandle {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    Tiny::random(TinyArch::from_env(), 77, false).write_gguf(cachet_kernels::quant::DType::Q8_0, &path).unwrap();
    let backend = cachet_kernels::cpu::CpuBackend::new(2).unwrap();
    let loaded = cachet_engine::loader::load(&path, &backend).unwrap();
    cachet_engine::runtime::start(backend, loaded, cfg).unwrap()
}

/// An engine config with a pool of `tokens` and no admission control.
pub fn pool(tokens: usize) -> cachet_engine::runtime::EngineConfig {
    cachet_engine::runtime::EngineConfig { pool: PoolSize::Tokens(tokens), overload_factor: 0.0, ..Default::default() }
}

/// Deterministic pseudo-random prompt tokens (the tiny vocabulary has 320).
pub fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 300) as u32
        })
        .collect()
}
