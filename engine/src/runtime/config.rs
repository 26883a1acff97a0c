//! Engine configuration: pool size, step budget, scheduling policy, SLO
//! classes and admission control.

use crate::kv_pool::PoolSize;
use cachet_kernels::backend::KvFormat;
use std::path::PathBuf;
use std::time::Duration;

/// How waiting requests are ordered for admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// First come, first served.
    Fcfs,
    /// Longest cached prefix first (most reuse).
    Lpm,
    /// What can still meet its TTFT target first, then fair share across
    /// tenants (the tenant that has used the fewest tokens goes next), then
    /// earliest SLO deadline, then longest cached prefix.
    #[default]
    Slo,
}

impl std::str::FromStr for Policy {
    type Err = cachet_words::UnknownWord;
    fn from_str(s: &str) -> Result<Policy, cachet_words::UnknownWord> {
        match s {
            "fcfs" => Ok(Policy::Fcfs),
            "lpm" => Ok(Policy::Lpm),
            "slo" => Ok(Policy::Slo),
            other => Err(cachet_words::UnknownWord {
                what: "scheduling policy",
                input: other.chars().take(64).collect(),
                expected: "fcfs lpm slo",
            }),
        }
    }
}

pub use cachet_words::SloClass;

/// A setting out of range; the message names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Targets of one SLO class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SloTargets {
    /// Time to first token.
    pub ttft: Duration,
    /// Time between tokens.
    pub itl: Duration,
}

/// Everything the engine loop is configured with.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// KV pool size.
    pub pool: PoolSize,
    /// How the pool stores K and V: f16, or 8-bit `Q8_0` blocks (1.88× the tokens in the same
    /// memory; the CPU backend). `None`: `Q8_0` where the backend stores it and a head is whole
    /// blocks, else f16 ([`resolve_kv_format`]).
    pub kv_format: Option<KvFormat>,
    /// Most tokens (decode tokens plus prefill chunks) in one forward pass.
    pub token_budget: usize,
    /// While requests decode, size each pass to fit the tightest inter-token
    /// target among them (prefill goes in smaller chunks) instead of always
    /// filling `token_budget`.
    pub pace_prefill: bool,
    /// The share of the tightest inter-token target a paced pass aims at
    /// (0 < margin ≤ 1), its slow passes included (the pass-time fit's 95th
    /// percentile error): below 1, gaps stay under the target, not at it.
    pub pace_margin: f64,
    /// Prefill tokens a paced pass carries when the decoders alone fill the
    /// inter-token target, so prompts keep moving; also the share of every
    /// pass an overdue prompt gets (see the `slo` policy).
    pub min_prefill_chunk: usize,
    /// A prompt that could wait for the decoders and still make its TTFT target is not kept
    /// waiting past this multiple of what it takes alone either (0: only the target counts):
    /// a target sized for long prompts would otherwise let short ones wait all of it.
    pub prompt_slowdown: f64,
    /// The express lane (under `slo`): a request with at most this many output tokens left
    /// runs its passes alone while every other running request is another tenant's with more
    /// to do and can wait (see `express`); only where a pass's cost grows with its tokens (a
    /// CPU). 0: off.
    pub express_tokens: usize,
    /// Speculative decoding: at most this many drafted tokens per decoding sequence and pass
    /// (drafts from the sequence's own prompt and output, `draft.rs`; how many, if any, is
    /// chosen per pass from the drafter's hit rate and the measured pass costs). 0: off.
    pub draft_tokens: usize,
    /// Most requests running (holding KV and decoding) at once.
    pub max_running: usize,
    pub policy: Policy,
    pub interactive: SloTargets,
    pub batch: SloTargets,
    /// Refuse a request at once when its predicted time to first token is
    /// more than this factor times its class's target (0 disables).
    pub overload_factor: f64,
    /// Share of the pool a tenant may fill with cache before its cache is
    /// the first to go (per-tenant overrides through the handle).
    pub default_share: f64,
    /// Label per-tenant metrics (time to first token, cache hits, refusals)
    /// with the tenant's id. Off: one series each for the whole server, so
    /// a metrics reader learns nothing about who is using it.
    pub tenant_labels: bool,
    /// The disk tier: prompts' K/V kept in a local directory, read back instead of recomputed
    /// (also after a restart). `None`: off.
    pub kv_tier: Option<KvTierConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            pool: PoolSize::Tokens(16_384),
            kv_format: Some(KvFormat::F16),
            token_budget: 512,
            pace_prefill: true,
            pace_margin: 0.85,
            min_prefill_chunk: 16,
            prompt_slowdown: 3.0,
            express_tokens: 64,
            draft_tokens: 16,
            max_running: 64,
            policy: Policy::Slo,
            interactive: SloTargets { ttft: Duration::from_secs(3), itl: Duration::from_millis(250) },
            batch: SloTargets { ttft: Duration::from_secs(120), itl: Duration::from_secs(2) },
            overload_factor: 2.0,
            default_share: 1.0,
            tenant_labels: false,
            kv_tier: None,
        }
    }
}

impl EngineConfig {
    /// The targets of a class.
    pub fn targets(&self, class: SloClass) -> SloTargets {
        match class {
            SloClass::Interactive => self.interactive,
            SloClass::Batch => self.batch,
        }
    }

    /// Checks ranges; the message names the bad setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.token_budget == 0 {
            return Err(ConfigError("token_budget must be at least 1".into()));
        }
        if !(self.pace_margin > 0.0 && self.pace_margin <= 1.0) {
            return Err(ConfigError("pace_margin must be in (0, 1]".into()));
        }
        if self.min_prefill_chunk == 0 {
            return Err(ConfigError("min_prefill_chunk must be at least 1".into()));
        }
        if !self.prompt_slowdown.is_finite() || self.prompt_slowdown < 0.0 {
            return Err(ConfigError("prompt_slowdown must be >= 0".into()));
        }
        if self.draft_tokens > 64 {
            return Err(ConfigError(format!("draft_tokens must be at most 64, not {}", self.draft_tokens)));
        }
        if self.max_running == 0 {
            return Err(ConfigError("max_running must be at least 1".into()));
        }
        if !(0.0..=1.0).contains(&self.default_share) {
            return Err(ConfigError("default_share must be in [0, 1]".into()));
        }
        if !self.overload_factor.is_finite() || self.overload_factor < 0.0 {
            return Err(ConfigError("overload_factor must be >= 0".into()));
        }
        if let Some(t) = &self.kv_tier {
            t.validate()?;
        }
        Ok(())
    }
}

/// The disk tier's settings ([`EngineConfig::kv_tier`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KvTierConfig {
    /// The directory (created 0700; one 0600 file per chunk).
    pub dir: PathBuf,
    /// The most bytes of chunks kept; beyond it the least recently used go.
    pub max_bytes: u64,
    /// Prompt tokens per chunk: a prompt's last partial chunk is not stored.
    pub chunk_tokens: usize,
}

impl KvTierConfig {
    /// The default chunk: 256 tokens (3 MiB of K/V for the default model).
    pub const DEFAULT_CHUNK_TOKENS: usize = 256;

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.chunk_tokens == 0 || self.chunk_tokens > 1 << 16 {
            return Err(ConfigError(format!("kv tier chunk_tokens must be 1..=65536, not {}", self.chunk_tokens)));
        }
        if self.max_bytes == 0 {
            return Err(ConfigError("kv tier max_bytes must be above 0".into()));
        }
        Ok(())
    }
}

/// The K/V format a pool for `config` on `backend` takes: `chosen`, or where that is `None`,
/// `Q8_0` when the backend stores it and a head is a whole number of its blocks, else f16.
pub fn resolve_kv_format<B: cachet_kernels::backend::Backend>(
    chosen: Option<KvFormat>,
    backend: &B,
    config: &crate::config::ModelConfig,
) -> KvFormat {
    chosen.unwrap_or_else(|| {
        let q8 = KvFormat::Q8_0;
        let fits = crate::kv_pool::kv_layout(config, 1, q8).check_format().is_ok();
        if fits && backend.kv_formats().contains(&q8) {
            q8
        } else {
            KvFormat::F16
        }
    })
}
