//! Configuration of `cachet serve`, in layers: built-in defaults, then a TOML
//! file (`--config FILE`, else `<data_dir>/cachet.toml` if it exists), then
//! `CACHET_*` environment variables (`CACHET_SERVER__BIND`, … with `__`
//! between levels; a few short forms like `CACHET_BIND`, `CACHET_MODEL`,
//! `CACHET_DATA_DIR` and plain `DATABASE_URL` are accepted too), then
//! command-line flags. Every key is documented in `docs/configuration.md`.

use crate::device::DeviceChoice;
use cachet_engine::runtime::Policy;
use cachet_tenants::jwt::JwtConfig;
use cachet_tenants::{Plan, Secret};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::Deserialize;
use std::path::{Path, PathBuf};

mod disagg;
pub use disagg::{DisaggSettings, Reserve, Role};

/// Everything `cachet serve` is configured with.
#[derive(Clone, Debug, Deserialize, Default)]
#[serde(default)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub model: ModelSettings,
    pub engine: EngineSettings,
    pub auth: AuthSettings,
    pub tenants: TenantSettings,
    pub context: ContextSettings,
    pub tasks: TaskSettings,
    pub disagg: DisaggSettings,
}

/// Tasks.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskSettings {
    /// An open task with no request for this long is marked abandoned.
    pub idle_secs: u64,
    /// Headers whose value is a client's own run id (Codex sends `session-id`): a request that
    /// names no task but carries one of these joins the tenant's task for that id, opened on its
    /// first request, so an agent run is one task with no change to the client. Empty: off.
    pub client_session_headers: Vec<String>,
}

impl Default for TaskSettings {
    fn default() -> Self {
        TaskSettings { idle_secs: 24 * 60 * 60, client_session_headers: vec!["session-id".into(), "session_id".into()] }
    }
}

/// Repositories, their context, and sessions.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextSettings {
    /// Where the bare mirrors live; empty: `<data_dir>/mirrors`.
    pub mirrors_dir: PathBuf,
    /// Local paths (and `file://` URLs) may be registered only under this
    /// folder; empty: local registration is refused.
    pub allowed_root: PathBuf,
    /// Whether remote clone URLs (https, ssh, git) may be registered.
    pub allow_remote: bool,
    /// Hosts remote URLs may name (`git.example.com`, `*.example.com`); empty: any public host.
    pub allowed_hosts: Vec<String>,
    /// Let remote URLs reach loopback, private, link-local and reserved addresses (this machine,
    /// its database, cloud metadata, the internal network). Off: a tenant's URL must not make
    /// the server a proxy into its own network.
    pub allow_private_hosts: bool,
    /// The longest one fetch of a remote repository may take (registration, push, session).
    pub fetch_timeout_secs: u64,
    /// The most bytes one fetch may download.
    pub max_fetch_bytes: u64,
    /// How long `POST /v1/repos` waits for the registration's fetch before answering `202`
    /// (the fetch goes on; `GET /v1/repos/{id}` says when it is done).
    pub registration_wait_secs: u64,
    /// Tokens of repository context per prompt (a repository may ask for
    /// less or more at registration, up to `max_budget_tokens`).
    pub budget_tokens: usize,
    /// The largest context budget a repository may ask for.
    pub max_budget_tokens: usize,
    /// Outlines kept in memory (one per file version).
    pub outline_cache_entries: u64,
    /// A session idle this long is closed and its cache stops being
    /// retained (the engine's retention of its prefix lasts as long).
    pub session_idle_secs: u64,
    /// What a session's next turn sees after a push changed files in its context.
    pub after_push: AfterPush,
    /// With overlays, a session's rebase starts this long after the push (or the turn) that left
    /// it behind: a burst of pushes rebases once, and the turns right after a push (which the
    /// overlay serves warm) do not share the machine with it.
    pub rebase_delay_ms: u64,
    /// With overlays, the push webhook answers once the sessions it left behind have their next
    /// turn's prefix (warm base, history, overlay) computed, or after this long (the pre-warms
    /// go on); 0: at once.
    pub overlay_prewarm_wait_ms: u64,
}

/// What a session's next turn sees after a push changed files of its repository context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AfterPush {
    /// The warm context as it was, with the changed files' new versions in an overlay after the
    /// history (the turn is as fast as a warm one); the context is rebased in the background and
    /// the session switches to it once it is warm.
    #[default]
    Overlay,
    /// The context at the new head at once (the turn recomputes from the first changed block).
    Rebuild,
}

impl Default for ContextSettings {
    fn default() -> Self {
        ContextSettings {
            mirrors_dir: PathBuf::new(),
            allowed_root: PathBuf::new(),
            allow_remote: true,
            allowed_hosts: Vec::new(),
            allow_private_hosts: false,
            fetch_timeout_secs: 300,
            max_fetch_bytes: 2 << 30,
            registration_wait_secs: 30,
            budget_tokens: cachet_context::ContextOptions::default().budget_tokens,
            max_budget_tokens: 16384,
            outline_cache_entries: 100_000,
            session_idle_secs: 30 * 60,
            after_push: AfterPush::default(),
            rebase_delay_ms: 5000,
            overlay_prewarm_wait_ms: 5000,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on.
    pub bind: String,
    /// Folder for the private Postgres cluster, secrets and the ledger spool.
    pub data_dir: PathBuf,
    /// Largest request body accepted (bytes); bigger bodies get 413.
    pub max_body_bytes: usize,
    /// Seconds a request's body has to arrive whole after its head (a slower one gets 408 and
    /// its connection is closed); the head itself has 5.
    pub body_timeout_secs: u64,
    /// Seconds in-flight requests get to finish at shutdown.
    pub shutdown_timeout_secs: u64,
    /// HTTP worker threads (the engine has its own).
    pub workers: usize,
    /// A second address where `/metrics` answers without a credential (for a Prometheus on a
    /// private network); empty: none. On `bind`, `/metrics` needs the operator credential.
    pub metrics_bind: String,
    /// Label per-tenant metrics with tenant ids (off: one series for the whole server).
    pub metrics_tenant_labels: bool,
    /// The URL other replicas reach this one at (`http://cachet-0.cachet:8080`): with the KV
    /// disk tier on, a session that moves here fetches its prefix from its last replica, and
    /// they from this one. Empty: no hand-off.
    pub advertise_url: String,
}

#[derive(Clone, Debug, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseSettings {
    /// Postgres URL (it may carry a password: never printed); empty: a private cluster in
    /// `<data_dir>/postgres`.
    pub url: Secret,
    /// Port of the private cluster (0: pick a free one and remember it).
    pub private_port: u16,
}

#[derive(Clone, Debug, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    /// A name from `cachet models list`, `hf:OWNER/REPO/FILE.gguf[@REVISION]`, a .gguf
    /// file or a Hugging Face directory; empty: the default model (catalogue models and hub
    /// files are pulled into the models folder if missing, every hash checked).
    pub path: String,
    /// The id clients send as `model`; empty: derived from the file name.
    pub id: String,
    /// Engine threads (0: one per core).
    pub threads: usize,
    /// `auto` (default: a CUDA GPU when one is usable, else the CPU), `cpu`, `cuda` or `cuda:N`.
    #[serde(deserialize_with = "from_str")]
    pub device: DeviceChoice,
    /// On CUDA, multiply long prefills with cuBLAS on bf16 weight copies (faster; gives up
    /// batch invariance).
    pub cublas_prefill: bool,
    /// The operator's system prompt, placed before every conversation and
    /// cached once for all tenants; empty: none.
    pub public_system_prompt: String,
    /// Prompt openings declared public (`[[model.public_prefixes]]`: an agent client's system
    /// prompt and tools, the same for all its users), besides those registered through
    /// `/admin/public-prefixes` (see `api/src/prefixes`).
    pub public_prefixes: Vec<ConfiguredPrefix>,
    /// Sampling for the fields a request leaves out (`[model.sampling]`).
    pub sampling: SamplingDefaults,
}

/// A public prefix from the configuration: a name and its source (`messages` and `tools`,
/// `text`, or `tokens`, as `POST /admin/public-prefixes` takes them).
#[derive(Clone, Debug, Deserialize)]
pub struct ConfiguredPrefix {
    pub name: String,
    /// Computed into the cache when the model is loaded (default true).
    #[serde(default = "yes")]
    pub prewarm: bool,
    #[serde(flatten)]
    pub source: serde_json::Map<String, serde_json::Value>,
}

fn yes() -> bool {
    true
}

/// The sampling a request gets for each field it does not set (its own values always win).
///
/// OpenAI's API defaults to temperature 1 with no truncation, which makes small models ramble
/// and miss their tool-call format; like vLLM (which takes a model's `generation_config.json`),
/// cachet defaults to what Qwen recommends for its instruct and coder models: temperature 0.7,
/// top-p 0.8, top-k 20, repetition penalty 1.05 (no min-p); and answers of at most 4,096 tokens.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    /// 0: no top-k.
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    /// The most tokens an answer may have when the request sets no `max_tokens` /
    /// `max_completion_tokens` / `max_output_tokens` (agent clients such as Codex send none, and a
    /// small model that loses its way would otherwise write until the context is full); 0: up to
    /// the end of the context.
    pub max_tokens: u32,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        SamplingDefaults {
            temperature: 0.7,
            top_p: 0.8,
            top_k: 20,
            min_p: 0.0,
            repetition_penalty: 1.05,
            max_tokens: DEFAULT_MAX_TOKENS,
        }
    }
}

/// A setting that cannot be used; the message names its key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<String> for ConfigError {
    fn from(m: String) -> ConfigError {
        ConfigError(m)
    }
}

impl From<&str> for ConfigError {
    fn from(m: &str) -> ConfigError {
        ConfigError(m.into())
    }
}

/// The default bound on an answer's tokens (`[model.sampling] max_tokens`): room for a whole
/// file rewritten (aider's whole-file edits) or a long patch, not for a runaway answer.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

impl SamplingDefaults {
    /// Checks the ranges a request's own values must be in; the error names the key.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad =
            |key: &str, range: &str| Err(ConfigError(format!("configuration: model.sampling.{key} must be {range}")));
        if !(self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature)) {
            return bad("temperature", "in [0, 2]");
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]");
        }
        if !(self.min_p.is_finite() && (0.0..=1.0).contains(&self.min_p)) {
            return bad("min_p", "in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty", "positive");
        }
        Ok(())
    }
}

/// `[engine] kv_format`: how the KV pool stores K and V (`None`: `auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvFormatSetting(pub Option<cachet_kernels::backend::KvFormat>);

impl std::str::FromStr for KvFormatSetting {
    type Err = cachet_tenants::UnknownWord;
    fn from_str(s: &str) -> Result<KvFormatSetting, cachet_tenants::UnknownWord> {
        if s == "auto" {
            return Ok(KvFormatSetting(None));
        }
        cachet_kernels::backend::KvFormat::parse(s).map(|f| KvFormatSetting(Some(f))).ok_or_else(|| {
            cachet_tenants::UnknownWord {
                what: "K/V format",
                input: s.chars().take(64).collect(),
                expected: "auto f16 q8_0",
            }
        })
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineSettings {
    /// KV pool size in tokens; 0: the model's whole context twice over, within half the
    /// free memory (logged at start).
    pub pool_tokens: usize,
    /// KV pool size as memory, in MiB (instead of `pool_tokens`): the tokens it holds follow from
    /// the model and `kv_format` (`q8_0` holds 1.88× what `f16` does); 0: `pool_tokens` decides.
    pub pool_mib: usize,
    /// Most tokens per forward pass.
    pub token_budget: usize,
    /// While requests decode, size passes to their inter-token target.
    pub pace_prefill: bool,
    /// The share of the tightest inter-token target a paced pass aims at (0 < x ≤ 1).
    pub pace_margin: f64,
    /// Prefill tokens a paced pass carries when the decoders alone fill the target (and an
    /// overdue prompt's share of a pass).
    pub min_prefill_chunk: usize,
    /// A prompt is not kept waiting behind decoders past this multiple of its time alone, even
    /// when its TTFT target would allow it (0: only the target counts).
    pub prompt_slowdown: f64,
    /// A request with at most this many output tokens left runs alone while other tenants'
    /// longer requests can wait within their targets, where passes cost about their tokens
    /// (a CPU); 0: off.
    pub express_tokens: usize,
    /// Speculative decoding: at most this many tokens drafted (from the request's own prompt
    /// and output) per decoding request and pass, where they pay; 0: off.
    pub draft_tokens: usize,
    /// Most requests running at once.
    pub max_running: usize,
    /// `slo` (fair share, deadlines, prefix), `fcfs` or `lpm`.
    #[serde(deserialize_with = "from_str")]
    pub policy: Policy,
    /// How the KV pool stores K and V: `f16`, or `q8_0` (8.5 bits a value: 1.88× the tokens in
    /// the same memory; the CPU backend).
    #[serde(deserialize_with = "from_str")]
    pub kv_format: KvFormatSetting,
    /// Refuse requests predicted to miss their TTFT target by more than this factor (0: never).
    pub overload_factor: f64,
    pub interactive_ttft_ms: u64,
    pub interactive_itl_ms: u64,
    pub batch_ttft_ms: u64,
    pub batch_itl_ms: u64,
    /// How long a session's prefix stays warm after its last request.
    pub session_retention_secs: u64,
    /// The disk tier: GiB of prompts' K/V kept on local disk and read back instead of recomputed
    /// (also after a restart); 0: off.
    pub kv_tier_gib: f64,
    /// Its directory; empty: `<data_dir>/kv-tier`.
    pub kv_tier_dir: PathBuf,
    /// Prompt tokens per stored chunk.
    pub kv_tier_chunk_tokens: usize,
}

#[derive(Clone, Debug, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// JWT verification (and issuing) keys, issuer, audience. Without any
    /// key, an HS256 secret is generated into `<data_dir>/secrets/` on
    /// first start and reused.
    pub jwt: JwtConfig,
    /// Bearer secret of the operator (`/admin/*`); empty: generated into
    /// `<data_dir>/secrets/operator-token` on first start.
    pub operator_token: Secret,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantSettings {
    /// Plan of new tenants when none is given.
    pub default_plan: String,
    /// Extra plans (added to, or replacing by name, the built-in ones).
    pub plans: Vec<Plan>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            bind: "127.0.0.1:8080".into(),
            data_dir: default_data_dir(),
            max_body_bytes: 4 << 20,
            body_timeout_secs: 15,
            shutdown_timeout_secs: 30,
            workers: 2,
            metrics_bind: String::new(),
            metrics_tenant_labels: false,
            advertise_url: String::new(),
        }
    }
}

impl Default for EngineSettings {
    fn default() -> Self {
        let d = cachet_engine::runtime::EngineConfig::default();
        EngineSettings {
            pool_tokens: 0,
            pool_mib: 0,
            token_budget: d.token_budget,
            pace_prefill: d.pace_prefill,
            pace_margin: d.pace_margin,
            min_prefill_chunk: d.min_prefill_chunk,
            prompt_slowdown: d.prompt_slowdown,
            express_tokens: d.express_tokens,
            draft_tokens: d.draft_tokens,
            max_running: d.max_running,
            policy: d.policy,
            kv_format: KvFormatSetting(d.kv_format),
            overload_factor: d.overload_factor,
            interactive_ttft_ms: d.interactive.ttft.as_millis() as u64,
            interactive_itl_ms: d.interactive.itl.as_millis() as u64,
            batch_ttft_ms: d.batch.ttft.as_millis() as u64,
            batch_itl_ms: d.batch.itl.as_millis() as u64,
            session_retention_secs: 15 * 60,
            kv_tier_gib: 0.0,
            kv_tier_dir: PathBuf::new(),
            kv_tier_chunk_tokens: cachet_engine::runtime::KvTierConfig::DEFAULT_CHUNK_TOKENS,
        }
    }
}

impl Default for TenantSettings {
    fn default() -> Self {
        TenantSettings { default_plan: "standard".into(), plans: Vec::new() }
    }
}

/// `$XDG_DATA_HOME/cachet`, else `~/.local/share/cachet`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("cachet");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/share/cachet")
}

/// Command-line overrides (the last layer).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub bind: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub model: Option<PathBuf>,
    pub device: Option<String>,
    pub role: Option<Role>,
}

impl Settings {
    /// Loads the layers; the error names the bad key.
    pub fn load(overrides: &Overrides) -> Result<Settings, ConfigError> {
        // The data folder decides where the default file is: find it first.
        let early: Settings =
            Figment::new().merge(Env::prefixed("CACHET_").split("__")).merge(short_env()).extract().unwrap_or_default();
        let data_dir = overrides.data_dir.clone().unwrap_or(early.server.data_dir);
        let file = overrides.config.clone().or_else(|| Some(data_dir.join("cachet.toml")).filter(|p| p.exists()));
        // Missing keys take the `#[serde(default)]`s.
        let mut fig = Figment::new();
        if let Some(file) = &file {
            if !file.exists() {
                return Err(ConfigError::from(format!("config file {} not found", file.display())));
            }
            fig = fig.merge(Toml::file(file));
        }
        fig = fig.merge(Env::prefixed("CACHET_").split("__")).merge(short_env());
        // figment names keys under its profile ("default.engine.policy"): the key is what follows.
        let mut s: Settings =
            fig.extract().map_err(|e| format!("configuration: {e}").replace("key \"default.", "key \""))?;
        if let Some(b) = &overrides.bind {
            s.server.bind = b.clone();
        }
        s.server.data_dir = data_dir;
        if let Some(m) = &overrides.model {
            s.model.path = m.display().to_string();
        }
        if let Some(d) = &overrides.device {
            s.model.device = d.parse().map_err(|m| format!("configuration: --device: {m}"))?;
        }
        if let Some(r) = overrides.role {
            s.disagg.role = r;
        }
        s.server.data_dir = expand_home(&s.server.data_dir);
        s.check()?;
        Ok(s)
    }

    /// Everything that can be checked without the model or the database, so that a mistake
    /// fails `cachet serve` at once with its key named (not a server that never becomes ready).
    pub fn check(&self) -> Result<(), ConfigError> {
        self.model.sampling.check()?;
        let engine = self.engine_config().map_err(|m| format!("configuration: {m}"))?;
        let d = &self.disagg;
        if d.role != Role::Unified && engine.kv_tier.is_none() {
            return Err(ConfigError::from(format!(
                "configuration: disagg.role = {:?} moves K/V through the disk tier: set engine.kv_tier_gib above 0",
                d.role
            )));
        }
        if d.role == Role::Decode && d.prefill_urls.is_empty() {
            return Err(ConfigError::from("configuration: disagg.role = \"decode\" needs disagg.prefill_urls"));
        }
        if let Some(u) = d.prefill_urls.iter().find(|u| !(u.starts_with("http://") || u.starts_with("https://"))) {
            return Err(ConfigError::from(format!("configuration: disagg.prefill_urls: {u:?} is not an http(s) URL")));
        }
        if d.timeout_secs == 0 {
            return Err(ConfigError::from("configuration: disagg.timeout_secs must be above 0"));
        }
        if let Some(h) = self.tasks.client_session_headers.iter().find(|h| {
            actix_web::http::header::HeaderName::from_bytes(h.as_bytes()).is_err()
                || ["authorization", "cookie", "x-cachet-task", "x-cachet-session"]
                    .contains(&h.to_ascii_lowercase().as_str())
        }) {
            return Err(ConfigError::from(format!(
                "configuration: tasks.client_session_headers: {h:?} cannot name a client session"
            )));
        }
        if self.plan(&self.tenants.default_plan).is_none() {
            let names: Vec<String> = self.plans().into_iter().map(|p| p.name).collect();
            return Err(ConfigError::from(format!(
                "configuration: tenants.default_plan: no plan named {:?} ({})",
                self.tenants.default_plan,
                names.join(", ")
            )));
        }
        Ok(())
    }

    /// The engine configuration these settings describe.
    pub fn engine_config(&self) -> Result<cachet_engine::runtime::EngineConfig, ConfigError> {
        use cachet_engine::runtime::{EngineConfig, SloTargets};
        use std::time::Duration;
        let e = &self.engine;
        let cfg = EngineConfig {
            pool: match (e.pool_tokens, e.pool_mib) {
                (0, 0) => cachet_engine::kv_pool::PoolSize::Contexts(2),
                (n, 0) => cachet_engine::kv_pool::PoolSize::Tokens(n),
                (0, mib) => cachet_engine::kv_pool::PoolSize::Bytes(mib.saturating_mul(1 << 20)),
                _ => return Err(ConfigError::from("engine.pool_tokens and engine.pool_mib both set: set one of them")),
            },
            token_budget: e.token_budget,
            pace_prefill: e.pace_prefill,
            pace_margin: e.pace_margin,
            min_prefill_chunk: e.min_prefill_chunk,
            prompt_slowdown: e.prompt_slowdown,
            express_tokens: e.express_tokens,
            draft_tokens: e.draft_tokens,
            max_running: e.max_running,
            policy: e.policy,
            kv_format: e.kv_format.0,
            interactive: SloTargets {
                ttft: Duration::from_millis(e.interactive_ttft_ms),
                itl: Duration::from_millis(e.interactive_itl_ms),
            },
            batch: SloTargets {
                ttft: Duration::from_millis(e.batch_ttft_ms),
                itl: Duration::from_millis(e.batch_itl_ms),
            },
            overload_factor: e.overload_factor,
            default_share: 1.0,
            tenant_labels: self.server.metrics_tenant_labels,
            kv_tier: self.kv_tier()?,
        };
        cfg.validate().map_err(|m| format!("engine: {m}"))?;
        Ok(cfg)
    }

    /// The disk tier's settings, `None` when it is off.
    fn kv_tier(&self) -> Result<Option<cachet_engine::runtime::KvTierConfig>, ConfigError> {
        let e = &self.engine;
        if !e.kv_tier_gib.is_finite() || e.kv_tier_gib < 0.0 {
            return Err(ConfigError::from(format!("engine: kv_tier_gib must be >= 0, not {}", e.kv_tier_gib)));
        }
        if e.kv_tier_gib == 0.0 {
            return Ok(None);
        }
        let dir = if e.kv_tier_dir.as_os_str().is_empty() {
            self.server.data_dir.join("kv-tier")
        } else {
            e.kv_tier_dir.clone()
        };
        let max_bytes = (e.kv_tier_gib * f64::from(1u32 << 30)) as u64;
        Ok(Some(cachet_engine::runtime::KvTierConfig { dir, max_bytes, chunk_tokens: e.kv_tier_chunk_tokens }))
    }

    /// Built-in plans, with configured ones added or replacing by name.
    pub fn plans(&self) -> Vec<Plan> {
        let mut plans = Plan::builtin();
        for p in &self.tenants.plans {
            plans.retain(|q| q.name != p.name);
            plans.push(p.clone());
        }
        plans
    }

    /// A plan by name.
    pub fn plan(&self, name: &str) -> Option<Plan> {
        self.plans().into_iter().find(|p| p.name == name)
    }
}

/// Deserializes a value through its `FromStr` (the message names the accepted values; figment
/// adds the key).
fn from_str<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// Short environment forms of the most used keys.
fn short_env() -> Figment {
    let mut f = Figment::new();
    for (var, key) in [
        ("CACHET_BIND", "server.bind"),
        ("CACHET_DATA_DIR", "server.data_dir"),
        ("CACHET_MODEL", "model.path"),
        ("DATABASE_URL", "database.url"),
    ] {
        if let Ok(v) = std::env::var(var) {
            if !v.is_empty() {
                f = f.merge(Serialized::default(key, v));
            }
        }
    }
    f
}

fn expand_home(p: &Path) -> PathBuf {
    match (p.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml: &str) -> Result<Settings, String> {
        let dir = tempfile::tempdir().expect("a temp dir");
        let file = dir.path().join("cachet.toml");
        std::fs::write(&file, toml).expect("written");
        Settings::load(&Overrides { config: Some(file), data_dir: Some(dir.path().into()), ..Overrides::default() })
            .map_err(|e| e.0)
    }

    #[test]
    fn sampling_defaults_load_and_are_checked() {
        let s = load("[model.sampling]\ntop_k = 0\n").expect("valid");
        assert_eq!(s.model.sampling, SamplingDefaults { top_k: 0, ..SamplingDefaults::default() });
        assert_eq!(load("").expect("valid").model.sampling.temperature, 0.7);
        assert_eq!(load("").expect("valid").model.sampling.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(load("[model.sampling]\nmax_tokens = 0\n").expect("valid").model.sampling.max_tokens, 0);
        let e = load("[model.sampling]\ntemperature = 5.0\n").unwrap_err();
        assert!(e.contains("model.sampling.temperature"), "{e}");
        let e = load("[model.sampling]\ntop_p = 0.0\n").unwrap_err();
        assert!(e.contains("model.sampling.top_p"), "{e}");
        let e = load("[model.sampling]\ntemprature = 0.5\n").unwrap_err();
        assert!(e.contains("temprature"), "{e}");
    }

    /// `docs/configuration.md`'s "every key" block loads (no key there is unknown here) and holds
    /// the defaults (the example public prefix aside).
    #[test]
    fn the_documented_keys_exist_and_hold_the_defaults() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md"))
            .expect("docs/configuration.md");
        let block = doc.split("## Every key, with its default\n\n```toml\n").nth(1).expect("the block");
        let block = &block[..block.find("```").expect("its end")];
        let mut s = load(block).expect("the documented keys load");
        let d = Settings::default();
        assert_eq!(s.model.public_prefixes.len(), 1);
        s.model.public_prefixes.clear();
        s.server.data_dir = d.server.data_dir.clone();
        let sections = |s: &Settings| {
            format!(
                "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                s.server, s.database, s.model, s.engine, s.context, s.tasks, s.tenants, s.disagg
            )
        };
        assert_eq!(sections(&s), sections(&d));
        assert_eq!(s.database.url, d.database.url, "Debug hides it: compared apart");
        assert_eq!(s.auth.operator_token, d.auth.operator_token);
    }

    #[test]
    fn client_session_headers_cannot_be_credentials_or_cachet_ids() {
        assert_eq!(load("").expect("valid").tasks.client_session_headers, ["session-id", "session_id"]);
        assert!(load("[tasks]\nclient_session_headers = []\n").expect("valid").tasks.client_session_headers.is_empty());
        for bad in ["Authorization", "x-cachet-task", "two words", ""] {
            let e = load(&format!("[tasks]\nclient_session_headers = [{bad:?}]\n")).unwrap_err();
            assert!(e.contains("tasks.client_session_headers"), "{bad}: {e}");
        }
    }

    /// Settings can be logged whole: the database URL (which may carry a password) and the
    /// operator's token print as `Secret(***)`.
    #[test]
    fn settings_debug_never_prints_a_secret() {
        let s =
            load("[database]\nurl = \"postgres://cachet:hunter22@db/cachet\"\n[auth]\noperator_token = \"op-3f9a\"\n")
                .expect("valid");
        assert_eq!(s.database.url.expose(), "postgres://cachet:hunter22@db/cachet");
        let printed = format!("{s:?}");
        assert!(!printed.contains("hunter22") && !printed.contains("op-3f9a"), "{printed}");
        assert!(printed.contains("Secret(***)"), "{printed}");
    }

    /// A mistake in a value with a fixed set of choices, or in a key's name, fails the load
    /// with the key named (before the model or the database are touched).
    #[test]
    fn enum_like_values_and_unknown_keys_fail_the_load_with_the_key_named() {
        let s = load("[engine]\npolicy = \"fcfs\"\n[model]\ndevice = \"cuda:1\"\n").expect("valid");
        assert_eq!(s.engine.policy, Policy::Fcfs);
        assert_eq!(s.model.device, DeviceChoice::Cuda(1));
        assert_eq!(load("").expect("valid").engine.policy, Policy::Slo);
        let q8 = load("[engine]\nkv_format = \"q8_0\"\n").expect("valid");
        assert_eq!(q8.engine_config().unwrap().kv_format, Some(cachet_kernels::backend::KvFormat::Q8_0));
        let auto = load("[engine]\nkv_format = \"auto\"\n").expect("valid");
        assert_eq!(auto.engine_config().unwrap().kv_format, None);
        let mib = load("[engine]\npool_mib = 96\n").expect("valid").engine_config().unwrap();
        assert!(matches!(mib.pool, cachet_engine::kv_pool::PoolSize::Bytes(b) if b == 96 << 20), "{:?}", mib.pool);
        let e = load("[engine]\npool_mib = 96\npool_tokens = 4096\n").unwrap_err();
        assert!(e.contains("pool_tokens") && e.contains("pool_mib"), "{e}");
        for (toml, key, value) in [
            ("[engine]\npolicy = \"fsfc\"\n", "policy", "fsfc"),
            ("[engine]\nkv_format = \"q4_0\"\n", "kv_format", "q4_0"),
            ("[model]\ndevice = \"gpu0\"\n", "device", "gpu0"),
            ("[context]\nafter_push = \"overlya\"\n", "after_push", "overlya"),
            ("[disagg]\nreserve = \"eraly\"\n", "reserve", "eraly"),
            ("[tenants]\ndefault_plan = \"standrd\"\n", "tenants.default_plan", "standrd"),
            ("[engine]\npolcy = \"fcfs\"\n", "polcy", ""),
            ("[server]\nbnd = \"0.0.0.0:80\"\n", "bnd", ""),
            ("[engine]\noverload_factor = -1.0\n", "overload_factor", ""),
        ] {
            let e = load(toml).expect_err(toml);
            assert!(e.contains(key) && e.contains(value), "{toml}: {e}");
        }
        let dir = tempfile::tempdir().expect("a temp dir");
        let e = Settings::load(&Overrides {
            data_dir: Some(dir.path().into()),
            device: Some("tpu".into()),
            ..Overrides::default()
        })
        .unwrap_err();
        assert!(e.0.contains("--device") && e.0.contains("tpu"), "{e}");
    }
}
