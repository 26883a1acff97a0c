//! The narrow interface the model runner computes through. A backend owns
//! device memory for weights, activations and the KV pool; the runner only
//! sees the associated types and calls these ops, so the same model code runs
//! on every backend.

use crate::quant::QuantError;
use crate::tensor::HostTensor;
use std::ops::Range;

/// Errors of backend operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// A tensor's bytes do not match its format and shape.
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// The backend cannot use a tensor of this shape or format.
    #[error("unsupported tensor: {0}")]
    Unsupported(String),
    /// A token id outside the embedding table.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    /// An allocation did not fit.
    #[error("out of memory allocating {bytes} bytes for {what}")]
    OutOfMemory { what: &'static str, bytes: usize },
    /// The device, its driver or a library it needs (a GPU backend) failed.
    #[error("device: {0}")]
    Device(String),
    /// K/V rows that do not fit the pool (a slot or layer outside it, rows of another shape).
    #[error("K/V rows: {0}")]
    KvRows(String),
}

/// How rotary position embedding pairs the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimension `i` with `i + d/2` (GPT-NeoX; Qwen2, Qwen3, Hugging Face Llama).
    Neox,
    /// Dimension `2i` with `2i + 1` (GGUF Llama, whose Q/K rows are permuted).
    Interleaved,
}

/// Rotary position embedding of one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    pub head_dim: usize,
    pub theta: f32,
    pub style: RopeStyle,
    /// YaRN context extension (`None`: plain RoPE).
    pub yarn: Option<Yarn>,
}

impl RopeConfig {
    /// Plain RoPE (no context extension).
    pub fn plain(head_dim: usize, theta: f32, style: RopeStyle) -> RopeConfig {
        RopeConfig { head_dim, theta, style, yarn: None }
    }
}

/// YaRN ("Yet another RoPE extensioN", Peng et al. 2023) as Hugging Face transformers applies it
/// (`rope_type: "yarn"`, a static factor): the low frequencies (dimensions that turn less than
/// `beta_slow` times over the original window) are divided by `factor`, the high ones (more than
/// `beta_fast` turns) are kept, a linear ramp blends the dimensions between, and every cosine and
/// sine is multiplied by `attention_factor` (by default `0.1 · ln(factor) + 1`), which scales
/// the attention logits by its square.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    /// The context the model was trained for (`original_max_position_embeddings`).
    pub original_context: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub attention_factor: f32,
    /// Whether the ramp's ends are rounded to whole dimensions (transformers' `truncate`, true
    /// unless a config says otherwise; llama.cpp always rounds).
    pub truncate: bool,
}

impl Yarn {
    /// transformers' default attention factor for a scaling factor (`get_mscale`).
    pub fn default_attention_factor(factor: f32, mscale: f32) -> f32 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * mscale * factor.ln() + 1.0
        }
    }

    /// The dimension (of `dim`) that turns `rotations` times over the original window
    /// (transformers' `find_correction_dim`, in f64 as Python computes it).
    fn correction_dim(&self, rotations: f64, dim: usize, base: f64) -> f64 {
        dim as f64 * (self.original_context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    }

    /// The ramp's first and last dimension pair (transformers' `find_correction_range`).
    pub(crate) fn range(&self, dim: usize, base: f32) -> (f64, f64) {
        let low = self.correction_dim(self.beta_fast as f64, dim, base as f64);
        let high = self.correction_dim(self.beta_slow as f64, dim, base as f64);
        let (low, high) = if self.truncate { (low.floor(), high.ceil()) } else { (low, high) };
        (low.max(0.0), high.min(dim as f64 - 1.0))
    }
}

/// How the KV pool stores K and V.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvFormat {
    /// Half precision, 16 bits a value.
    #[default]
    F16,
    /// GGUF's `Q8_0` blocks along each row: per 32 values an f16 scale and 32 signed bytes
    /// (8.5 bits a value; `d = max|x| / 127`, `q = round(x / d)`), as llama.cpp's `-ctk/-ctv q8_0`,
    /// each head Walsh–Hadamard rotated before it is quantized (`cpu::hadamard`), as llama.cpp
    /// rotates its quantized K/V.
    Q8_0,
}

impl KvFormat {
    /// Every format.
    pub const ALL: [KvFormat; 2] = [KvFormat::F16, KvFormat::Q8_0];

    /// The setting's name (`f16`, `q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F16 => "f16",
            KvFormat::Q8_0 => "q8_0",
        }
    }

    pub fn parse(name: &str) -> Option<KvFormat> {
        KvFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Values per block (the row width must be a multiple of it).
    pub fn block(self) -> usize {
        match self {
            KvFormat::F16 => 1,
            KvFormat::Q8_0 => 32,
        }
    }

    /// 16-bit units a row of `cols` values takes (`cols` a multiple of [`KvFormat::block`]):
    /// what [`Backend::kv_export`] gives per row.
    pub fn row_units(self, cols: usize) -> usize {
        match self {
            KvFormat::F16 => cols,
            KvFormat::Q8_0 => cols / 32 * 17,
        }
    }
}

/// Shape of the KV pool: K and V of every layer for `slots` token slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub layers: usize,
    pub slots: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub format: KvFormat,
}

impl KvLayout {
    /// Values of one K (or V) row: `kv_heads · head_dim`.
    pub fn cols(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// 16-bit units of one stored row (see [`KvFormat::row_units`]).
    pub fn row_units(&self) -> usize {
        self.format.row_units(self.cols())
    }

    /// Checks that the format can hold rows of this shape (a block never spans two heads).
    pub fn check_format(&self) -> Result<(), BackendError> {
        if !self.head_dim.is_multiple_of(self.format.block()) {
            return Err(BackendError::Unsupported(format!(
                "a {} KV pool for heads of {} values (a multiple of {} is needed)",
                self.format.name(),
                self.head_dim,
                self.format.block()
            )));
        }
        Ok(())
    }

    /// Checks a K/V export or import of `slots` of `layer` (`rows`: the 16-bit units an import
    /// brings, `None` for an export); returns the units of one row ([`KvLayout::row_units`]).
    pub fn check_rows(&self, layer: usize, slots: &[u32], rows: Option<usize>) -> Result<usize, BackendError> {
        let units = self.row_units();
        if layer >= self.layers {
            return Err(BackendError::KvRows(format!("layer {layer} of a pool of {} layers", self.layers)));
        }
        if let Some(&s) = slots.iter().find(|&&s| s as usize >= self.slots) {
            return Err(BackendError::KvRows(format!("slot {s} outside a pool of {} slots", self.slots)));
        }
        match rows {
            Some(n) if n != 2 * slots.len() * units => Err(BackendError::KvRows(format!(
                "{n} units for {} slots of {units} units ({} rows), K and V ({} expected)",
                slots.len(),
                self.format.name(),
                2 * slots.len() * units
            ))),
            _ => Ok(units),
        }
    }

    /// Bytes of one slot across layers, K and V.
    pub fn bytes_per_slot(&self) -> usize {
        2 * self.layers * self.row_units() * 2
    }

    /// Bytes of the whole pool.
    pub fn bytes(&self) -> usize {
        self.bytes_per_slot() * self.slots
    }
}

/// Head shape of an attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// One sequence's part of a batched attention call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttnSeq {
    /// Rows of `q` (and of the output) holding this sequence's new tokens.
    pub rows: Range<usize>,
    /// Position of the first of those tokens.
    pub first_pos: usize,
    /// Where, in the call's slot table, the KV slots of positions
    /// `0..first_pos + rows.len()` are; the new tokens' K/V must already be
    /// stored in theirs.
    pub slots: Range<usize>,
}

/// Compute backend. Buffers are row-major f32 matrices; weights are
/// `[rows, cols]` matrices (or vectors, `rows == 1`) in their file format.
pub trait Backend: Send + Sync {
    type Weight: Send + Sync;
    type Buf: Send + Sync;
    type Kv: Send + Sync;

    /// A short description (`"cpu (avx512, 2 threads)"`).
    fn name(&self) -> String;
    /// Makes a host tensor usable by the kernels (upload, or keep the mapping).
    fn load(&self, t: HostTensor) -> Result<Self::Weight, BackendError>;
    /// `(rows, cols)` of a weight.
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);

    /// An empty buffer.
    fn buf(&self) -> Self::Buf;
    /// Gives `b` the shape `rows × cols`; its contents are unspecified after.
    fn resize(&self, b: &mut Self::Buf, rows: usize, cols: usize);
    /// `(rows, cols)` of a buffer.
    fn buf_shape(&self, b: &Self::Buf) -> (usize, usize);
    /// Copies host data into `b` (shape `rows × cols`).
    fn upload(&self, b: &mut Self::Buf, rows: usize, cols: usize, data: &[f32]);
    /// Copies `b` to the host.
    fn download(&self, b: &Self::Buf, out: &mut Vec<f32>);
    /// Allocates the KV pool.
    fn kv(&self, layout: KvLayout) -> Result<Self::Kv, BackendError>;
    /// The K/V formats [`Backend::kv`] can store (f16 everywhere).
    fn kv_formats(&self) -> &'static [KvFormat] {
        &[KvFormat::F16]
    }
    /// Memory available for more allocations (the KV pool), if known.
    fn memory_available(&self) -> Option<u64> {
        None
    }
    /// Whether the backend multiplies straight from the host bytes of the weights it loads (the
    /// CPU), so that where those bytes lie (2 MiB pages or a memory map) matters every step.
    fn reads_host_weights(&self) -> bool {
        false
    }

    /// Runs `f` in the backend's execution context (e.g. its thread pool), so
    /// that a whole forward pass does not hop threads per op.
    fn scope<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// `out[i] = table[tokens[i]]` as f32.
    fn embed(&self, table: &Self::Weight, tokens: &[u32], out: &mut Self::Buf) -> Result<(), BackendError>;
    /// For each job `(w, out)`: `out = x · wᵀ`. All jobs share `x`.
    fn matmul(&self, x: &Self::Buf, jobs: &mut [(&Self::Weight, &mut Self::Buf)]);
    /// A mixture of experts' grouped matmul: for each group `(ws, outs)` and each `i <
    /// pick.len()`, `outs[i] = xs[i] · ws[pick[i]]ᵀ`. Every output is, bit for bit, what
    /// [`Backend::matmul`] gives for it alone; a backend may run them all as one batch of work
    /// (the CPU: one parallel region, each input quantized once), which a decode step's many
    /// small expert matmuls need. Panics unless `xs` and every `outs` have `pick.len()` entries
    /// or more and every pick is inside its `ws`.
    fn matmul_picked(&self, xs: &[Self::Buf], pick: &[usize], groups: &mut [PickedGroup<'_, Self>]) {
        check_picked(xs.len(), pick, groups.iter().map(|(w, o)| (w.len(), o.len())));
        for (ws, outs) in groups.iter_mut() {
            for ((x, &p), out) in xs.iter().zip(pick).zip(outs.iter_mut()) {
                self.matmul(x, &mut [(&ws[p], out)]);
            }
        }
    }
    /// Adds the vector `bias` to every row of `x`.
    fn add_bias(&self, x: &mut Self::Buf, bias: &Self::Weight);
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf);
    /// Row-wise RMSNorm: `out = w * (x / sqrt(mean(x²) + eps))`.
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Weight, eps: f32, out: &mut Self::Buf);
    /// RMSNorm of every `head_dim` group of every row, in place, with one
    /// shared weight of length `head_dim` (Qwen3's Q/K norm).
    fn rms_norm_heads(&self, x: &mut Self::Buf, w: &Self::Weight, eps: f32, head_dim: usize);
    /// The cos/sin table of `positions`, for `rope`.
    fn rope_table(&self, positions: &[u32], rope: &RopeConfig, out: &mut Self::Buf);
    /// Rotates every head of every row of `x` by its row's entry in `table`.
    fn rope(&self, x: &mut Self::Buf, table: &Self::Buf, rope: &RopeConfig);
    /// `gate = silu(gate) * up`.
    fn silu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf);
    /// Stores row `i` of `k` and `v` into slot `slots[i]` of `layer`.
    fn kv_store(&self, kv: &mut Self::Kv, layer: usize, k: &Self::Buf, v: &Self::Buf, slots: &[u32]);
    /// Copies the K and V rows of `slots` of `layer` to the host as stored, in 16-bit units (f16
    /// bits, or a `Q8_0` row's bytes in little-endian pairs): `out` becomes K's rows then V's rows,
    /// `slots.len() × row_units` units each (what moves a cached prefix to disk or to another
    /// server; [`KvLayout::row_units`]). A slot outside the pool is an error.
    fn kv_export(&self, kv: &Self::Kv, layer: usize, slots: &[u32], out: &mut Vec<u16>) -> Result<(), BackendError>;
    /// Writes rows in [`Backend::kv_export`]'s layout into `slots` of `layer`.
    fn kv_import(&self, kv: &mut Self::Kv, layer: usize, slots: &[u32], rows: &[u16]) -> Result<(), BackendError>;
    /// Causal attention of each sequence's rows of `q` over its slots
    /// (`seqs[i].slots` indexes `slots`).
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf,
        kv: &Self::Kv,
        layer: usize,
        seqs: &[AttnSeq],
        slots: &[u32],
        shape: &AttnShape,
        out: &mut Self::Buf,
    );
    /// `out[i] = x[rows[i]]`.
    fn gather_rows(&self, x: &Self::Buf, rows: &[usize], out: &mut Self::Buf);
    /// `x[rows[i]] += scales[i] · y[i]` for every row `i` of `y` (the weighted sum of the
    /// experts a token was routed to). `rows` are distinct rows of `x`.
    fn add_rows_scaled(&self, x: &mut Self::Buf, y: &Self::Buf, rows: &[usize], scales: &[f32]);
}

/// One group of [`Backend::matmul_picked`]: every weight of the group (by expert), and one output
/// per input.
pub type PickedGroup<'a, B> = (&'a [<B as Backend>::Weight], &'a mut [<B as Backend>::Buf]);

/// The checks of [`Backend::matmul_picked`]: `groups` gives each group's `(weights, outputs)`
/// counts.
pub fn check_picked(inputs: usize, pick: &[usize], groups: impl Iterator<Item = (usize, usize)>) {
    assert!(inputs >= pick.len(), "matmul_picked: {} picks for {inputs} inputs", pick.len());
    for (weights, outs) in groups {
        assert!(outs >= pick.len(), "matmul_picked: {} picks for {outs} outputs", pick.len());
        assert!(pick.iter().all(|&p| p < weights), "matmul_picked: a pick beyond the group's {weights} weights");
    }
}

/// Panics unless [`Backend::add_rows_scaled`]'s arguments fit: a caller's bug, like a shape
/// mismatch in any other op.
pub fn check_add_rows(x_rows: usize, x_cols: usize, y_rows: usize, y_cols: usize, rows: &[usize], scales: &[f32]) {
    assert!(
        y_cols == x_cols && rows.len() == y_rows && scales.len() == y_rows,
        "add_rows_scaled of {y_rows}×{y_cols} into {x_rows}×{x_cols} with {} rows and {} scales",
        rows.len(),
        scales.len()
    );
    if let Some(&r) = rows.iter().find(|&&r| r >= x_rows) {
        panic!("add_rows_scaled into row {r} of {x_rows}");
    }
}
