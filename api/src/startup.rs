//! Building and running the service: database (a private Postgres cluster
//! unless `DATABASE_URL` is given), migrations, secrets, the ledger writer,
//! the HTTP server, and the model, loaded in the background (`/readyz` says
//! when it is ready).

use crate::config::Settings;
use crate::error::{error_body, ApiError};
use crate::ledger::Ledger;
use crate::state::{AppState, Served};
use actix_web::dev::Server;
use actix_web::{error::JsonPayloadError, web, App, HttpRequest, HttpServer};
use anyhow::Context;
use cachet_engine::chat_template::ChatMessage;
use cachet_tenants::cluster::PrivateCluster;
use cachet_tenants::jwt::{Jwt, JwtConfig};
use cachet_tenants::store::Store;
use cachet_tenants::Secret;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::net::TcpListener;
use std::path::Path;

/// The database the service (or a CLI command) talks to; owns the private
/// cluster when it started one.
pub struct Database {
    pub store: Store,
    pub url: String,
    pub cluster: Option<PrivateCluster>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("private", &self.cluster.is_some()).finish()
    }
}

/// Where the private cluster of a data folder lives: `<data_dir>/postgres`,
/// unless the process runs as root and the `postgres` system user (which
/// Postgres must run as) cannot reach that folder — the default data folder
/// under `/root` — in which case it lives in `/var/lib/cachet/`, and the data
/// folder records where (`postgres.location`), so every later start and CLI
/// command finds the same cluster.
pub fn cluster_dir(data_dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    let pointer = data_dir.join("postgres.location");
    if let Ok(p) = std::fs::read_to_string(&pointer) {
        return Ok(std::path::PathBuf::from(p.trim()));
    }
    let preferred = data_dir.join("postgres");
    if !running_as_root() || reachable_by_others(data_dir) {
        return Ok(preferred);
    }
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let hash = canonical
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let dir = std::path::PathBuf::from(format!("/var/lib/cachet/postgres-{hash:016x}"));
    std::fs::create_dir_all("/var/lib/cachet")?;
    std::fs::write(&pointer, dir.display().to_string())?;
    tracing::info!(
        "the postgres user cannot reach {}; the private cluster lives in {}",
        data_dir.display(),
        dir.display()
    );
    Ok(dir)
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// Whether every folder from `/` down to `dir` can be searched by anyone.
fn reachable_by_others(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let canonical = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    canonical.ancestors().all(|a| std::fs::metadata(a).map(|m| m.permissions().mode() & 0o001 != 0).unwrap_or(true))
}

/// Connects to `database.url`, or starts (or attaches to) the data folder's
/// private cluster (see [`cluster_dir`]); then migrates.
pub async fn database(settings: &Settings) -> anyhow::Result<Database> {
    let (url, cluster) = if settings.database.url.is_empty() {
        std::fs::create_dir_all(&settings.server.data_dir)?;
        let dir = cluster_dir(&settings.server.data_dir)?;
        let port = settings.database.private_port;
        let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<PrivateCluster> {
            let c = PrivateCluster::start(&dir, port, true)
                .with_context(|| format!("starting the private Postgres cluster in {}", dir.display()))?;
            c.create_database("cachet").context("creating the cachet database")?;
            Ok(c)
        })
        .await??;
        (cluster.url("cachet"), Some(cluster))
    } else {
        (settings.database.url.expose().to_string(), None)
    };
    let store = Store::connect(&url).await.context("connecting to Postgres")?;
    store.migrate().await.context("applying migrations")?;
    Ok(Database { store, url, cluster })
}

/// Reads a secret file, creating it (0600, 32 random bytes as hex) on first use.
pub fn secret_file(path: &Path) -> anyhow::Result<Secret> {
    if let Ok(s) = std::fs::read_to_string(path) {
        if !s.trim().is_empty() {
            return Ok(Secret::new(s.trim().to_string()));
        }
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    }
    let hex = cachet_tenants::random_hex(32)?;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    use std::io::Write;
    f.write_all(hex.as_bytes())?;
    f.sync_all()?;
    Ok(Secret::new(hex))
}

/// The JWT settings, with the data folder's generated HS256 secret when no
/// key is configured.
pub fn jwt_config(settings: &Settings) -> anyhow::Result<JwtConfig> {
    let mut cfg = settings.auth.jwt.clone();
    let has_key = cfg.hs256_secret.is_some() || !cfg.rs256_public_keys.is_empty() || !cfg.eddsa_public_keys.is_empty();
    if !has_key {
        cfg.hs256_secret = Some(secret_file(&settings.server.data_dir.join("secrets/jwt-hs256"))?);
    }
    Ok(cfg)
}

/// The operator's bearer secret (configured, or generated in the data folder).
pub fn operator_token(settings: &Settings) -> anyhow::Result<Secret> {
    if !settings.auth.operator_token.is_empty() {
        return Ok(settings.auth.operator_token.clone());
    }
    secret_file(&settings.server.data_dir.join("secrets/operator-token"))
}

/// Resolves once the loaded model's engine thread has ended (never while no model is loaded).
async fn engine_stopped(state: &web::Data<AppState>) {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        if state.model.served.get().is_some_and(|s| !s.engine.is_running()) {
            return;
        }
    }
}

/// The process-wide Prometheus recorder (installed once, even when several
/// applications start at the same time, as the tests start them).
fn metrics_handle() -> anyhow::Result<PrometheusHandle> {
    static HANDLE: std::sync::Mutex<Option<PrometheusHandle>> = std::sync::Mutex::new(None);
    let mut handle = HANDLE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(h) = handle.as_ref() {
        return Ok(h.clone());
    }
    let h = PrometheusBuilder::new().install_recorder().context("installing the metrics recorder")?;
    Ok(handle.insert(h).clone())
}

/// A running service.
pub struct Application {
    port: u16,
    server: Server,
    state: web::Data<AppState>,
    db: Database,
    ledger_task: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    fanout: tokio::task::JoinHandle<()>,
    prefixes: tokio::task::JoinHandle<()>,
    announce: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Application {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Application").field("port", &self.port).finish()
    }
}

fn json_error(err: JsonPayloadError, _req: &HttpRequest) -> actix_web::Error {
    let api = match &err {
        JsonPayloadError::Overflow { limit } | JsonPayloadError::OverflowKnownLength { limit, .. } => {
            ApiError::PayloadTooLarge(*limit)
        }
        JsonPayloadError::ContentType => ApiError::bad("the body must be JSON (Content-Type: application/json)"),
        JsonPayloadError::Deserialize(e) => ApiError::bad(format!("invalid JSON body: {e}")),
        other => ApiError::bad(format!("invalid body: {other}")),
    };
    api.into()
}

/// A path segment that is not what the route takes (an id that is not a UUID): the resource
/// does not exist, said in JSON with the reason.
fn path_error(err: actix_web::error::PathError, _req: &HttpRequest) -> actix_web::Error {
    let actix_web::error::PathError::Deserialize(e) = &err else { return err.into() };
    ApiError::NotFound(e.to_string()).into()
}

impl Application {
    /// Connects everything and binds (`127.0.0.1:0` picks a free port); the
    /// model loads in the background.
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        std::fs::create_dir_all(&settings.server.data_dir)
            .with_context(|| format!("creating {}", settings.server.data_dir.display()))?;
        let db = database(&settings).await?;
        let jwt = Jwt::new(&jwt_config(&settings)?).context("JWT keys")?;
        let operator_token = operator_token(&settings)?;
        let metrics = metrics_handle()?;
        let (ledger, ledger_task) =
            Ledger::start(db.store.clone(), settings.server.data_dir.join("ledger-spool.jsonl"))?;
        let listener =
            TcpListener::bind(&settings.server.bind).with_context(|| format!("binding {}", settings.server.bind))?;
        let metrics_listener = match settings.server.metrics_bind.as_str() {
            "" => None,
            bind => Some(TcpListener::bind(bind).with_context(|| format!("binding {bind} (server.metrics_bind)"))?),
        };
        let metrics_addr = metrics_listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let (prefix_changes, prefix_changed) = tokio::sync::mpsc::unbounded_channel();
        let state = web::Data::new(AppState {
            settings: settings.clone(),
            model: Default::default(),
            store: db.store.clone(),
            auth: crate::state::Credentials {
                jwt,
                operator_token,
                tenants: Default::default(),
                known_tasks: Default::default(),
            },
            accounting: crate::state::Accounting { ledger, limiter: Default::default(), shares: Default::default() },
            repos: std::sync::Arc::new(
                crate::context::Repos::new(&settings.context, &settings.server.data_dir)
                    .context("the mirrors folder")?,
            ),
            replica: crate::state::Replica { id: uuid::Uuid::new_v4(), ..Default::default() },
            ops: crate::state::Ops { metrics, metrics_addr, prefix_changes },
        });
        let sweeper = tokio::spawn(crate::sweeper::run(state.clone()));
        let fanout = tokio::spawn(crate::fanout::run(state.clone()));
        let prefixes = tokio::spawn(crate::prefixes::keep_loaded(state.clone(), prefix_changed));
        let announce = crate::handoff::announce(state.clone());
        load_model_in_background(state.clone());

        let port = listener.local_addr()?.port();
        let limit = settings.server.max_body_bytes;
        let app_state = state.clone();
        // Names the replica that answered (behind a consistent-hash proxy: deploy/k8s/proxy.yaml).
        let replica = state.replica.id.to_string();
        let body_timeout = std::time::Duration::from_secs(settings.server.body_timeout_secs.max(1));
        let server = HttpServer::new(move || {
            App::new()
                .wrap_fn(move |req, srv| crate::body_deadline::call(req, srv, body_timeout))
                .wrap(actix_web::middleware::DefaultHeaders::new().add(("x-cachet-replica", replica.clone())))
                .wrap(tracing_actix_web::TracingLogger::<crate::telemetry::RequestSpan>::new())
                .app_data(app_state.clone())
                .app_data(web::JsonConfig::default().limit(limit).error_handler(json_error))
                .app_data(web::PayloadConfig::new(limit))
                .app_data(web::PathConfig::default().error_handler(path_error))
                .configure(crate::routes::configure)
                .default_service(web::to(|| async {
                    actix_web::HttpResponse::NotFound().json(error_body(
                        "no such endpoint",
                        "invalid_request_error",
                        None,
                        "not_found",
                    ))
                }))
        })
        .listen(listener)?;
        let server = match metrics_listener {
            Some(l) => server.listen(l)?,
            None => server,
        };
        let server = server
            .workers(settings.server.workers.max(1))
            // A client that goes away ends its request: the handler's future is dropped, and with
            // it the engine request (a non-streaming answer would otherwise run to its end for
            // nobody). HTTP clients do not half-close a connection to wait for an answer.
            .h1_allow_half_closed(false)
            .shutdown_timeout(settings.server.shutdown_timeout_secs)
            .run();
        Ok(Application { port, server, state, db, ledger_task, sweeper, fanout, prefixes, announce })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The shared state (tests use it to wait for the model, read the store).
    pub fn state(&self) -> web::Data<AppState> {
        self.state.clone()
    }

    /// The database connection string (for tests and tools).
    pub fn database_url(&self) -> &str {
        &self.db.url
    }

    /// A handle that stops the server gracefully.
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (SIGINT/SIGTERM, or a handle):
    /// in-flight requests get the shutdown timeout to finish (streams still
    /// open then are closed, which cancels their requests), the ledger is
    /// flushed, and a private Postgres cluster is stopped.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Application { server, state, mut db, ledger_task, sweeper, fanout, prefixes, announce, .. } = self;
        let handle = server.handle();
        let mut server = std::pin::pin!(server);
        // A server whose engine thread has ended can answer nothing: it stops (the ledger is
        // flushed) and exits non-zero, so that an orchestrator restarts it.
        let engine_gone = tokio::select! {
            r = &mut server => { r?; false }
            () = engine_stopped(&state) => true,
        };
        if engine_gone {
            tracing::error!("the engine thread has stopped; stopping the server");
            // /readyz says so meanwhile: a load balancer polling it stops sending requests here.
            // Nothing in flight can finish without the engine: no grace period.
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            // The stop command is sent at once; the server future, polled below, carries it out.
            let stopped = handle.stop(false);
            server.await?;
            stopped.await;
        }
        sweeper.abort();
        if let Some(a) = announce {
            a.abort();
        }
        fanout.abort();
        prefixes.abort();
        // Turn leases whose release may not have reached the database yet: a process started
        // next on the same database must not wait out their expiry.
        let releasing = state.replica.turns.lock().unwrap_or_else(|e| e.into_inner()).releasing();
        for (session, holder) in releasing {
            if let Err(e) = state.store.end_turn(session, holder).await {
                tracing::warn!(session = %session.id(), "releasing a turn lease at shutdown (it expires by itself): {e}");
            }
        }
        // What the engine handed its disk tier is written before the process ends: the next
        // start serves those prefixes from disk.
        if let Some(served) = state.model.served.get() {
            let flush = served.engine.flush_kv_tier();
            if tokio::time::timeout(std::time::Duration::from_secs(30), flush).await.is_err() {
                tracing::warn!("the KV disk tier was still writing after 30 s; the chunks not written are recomputed");
            }
        }
        let waiting = state.accounting.ledger.flush().await;
        if waiting > 0 {
            tracing::warn!(
                waiting,
                "usage rows wait in the spool for the database; they are written at the next start"
            );
        }
        drop(state);
        ledger_task.abort();
        if let Some(cluster) = db.cluster.as_mut() {
            if cluster.owned() {
                cluster.stop().context("stopping the private Postgres cluster")?;
            }
        }
        if engine_gone {
            anyhow::bail!("the engine thread stopped");
        }
        Ok(())
    }
}

/// Loads the model and starts the engine on a thread of its own; the
/// service answers 503 until then.
fn load_model_in_background(state: web::Data<AppState>) {
    std::thread::Builder::new()
        .name("cachet-load".into())
        .spawn(move || match load(&state.settings) {
            Ok(served) => {
                tracing::info!(model = %served.id, "model loaded; ready");
                let _ = state.model.served.set(served);
            }
            Err(e) => {
                tracing::error!("the model failed to load: {e:#}");
                *state.model.load_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{e:#}"));
            }
        })
        .expect("spawning the model loader");
}

/// Loads the model onto `backend` and starts the engine loop on it.
fn start_engine<B: cachet_kernels::backend::Backend + 'static>(
    backend: B,
    path: &std::path::Path,
    config: cachet_engine::runtime::EngineConfig,
) -> anyhow::Result<cachet_engine::runtime::EngineHandle> {
    let loaded = cachet_engine::loader::load(path, &backend).with_context(|| format!("loading {}", path.display()))?;
    tracing::info!(backend = %backend.name(), "model loaded");
    let model = loaded.model.config();
    if let Some(y) = model.yarn {
        tracing::info!(
            factor = y.factor,
            trained_context = y.original_context,
            served_context = model.max_context,
            attention_factor = y.attention_factor,
            "RoPE extended with YaRN: serving {} tokens of context (trained for {})",
            model.max_context,
            y.original_context
        );
    }
    Ok(cachet_engine::runtime::start(backend, loaded, config)?)
}

fn load(settings: &Settings) -> anyhow::Result<Served> {
    let path = if settings.model.path.is_empty() {
        crate::cli::pull_default(None)?
    } else {
        crate::cli::model_path(Some(std::path::Path::new(&settings.model.path)))?
    };
    let id = if settings.model.id.is_empty() {
        path.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    } else {
        settings.model.id.clone()
    };
    let choice = settings.model.device;
    let config = settings.engine_config().map_err(anyhow::Error::msg)?;
    let engine = match crate::device::select(choice)? {
        crate::device::Device::Cpu => {
            start_engine(cachet_kernels::cpu::CpuBackend::new(settings.model.threads)?, &path, config)?
        }
        crate::device::Device::Cuda(info) => {
            start_engine(crate::device::cuda_backend(&info, settings.model.cublas_prefill)?, &path, config)?
        }
    };
    // llguidance's view of the tokenizer takes a second or so to build for a 150k vocabulary:
    // build it now, beside serving, rather than in the first request with tools.
    let grammars = engine.clone();
    let _ =
        std::thread::Builder::new().name("cachet-grammars".into()).spawn(move || match grammars.grammars().warm_up() {
            Ok(took) => tracing::debug!(?took, "constrained decoding ready"),
            Err(e) => tracing::info!("{e}"),
        });
    let public = match (settings.model.public_system_prompt.as_str(), engine.chat_template()) {
        ("", _) | (_, None) => None,
        (prompt, Some(template)) => {
            let text = template.render(&[ChatMessage::system(prompt)], false, None)?;
            let ids = engine.tokenizer().encode(&text, true)?;
            Some((prompt.to_string(), ids))
        }
    };
    Ok(Served {
        engine,
        id,
        public,
        prefixes: Default::default(),
        created: chrono::Utc::now().timestamp(),
        sampling: settings.model.sampling.clone(),
    })
}
