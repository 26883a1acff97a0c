//! `spawn_app()`: a fresh migrated database on a real Postgres (one private
//! cluster per test binary, stopped when the process exits), a tiny
//! random-weight model written once, and the app on a random port.

use cachet_api::config::Settings;
use cachet_api::startup::Application;
use cachet_api::state::AppState;
use cachet_engine::testing::{Tiny, TinyArch};
use cachet_kernels::quant::DType;
use cachet_tenants::cluster::PrivateCluster;
use cachet_tenants::jwt::Jwt;
use cachet_tenants::{Secret, TenantId};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const SECRET: &str = "test-secret-0123456789abcdef0123456789abcdef";
pub const OPERATOR: &str = "operator-test-token";

/// The binary's Postgres cluster.
pub fn cluster() -> &'static Mutex<PrivateCluster> {
    static PG: OnceLock<Mutex<PrivateCluster>> = OnceLock::new();
    PG.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("cachet-test-pg").tempdir().unwrap().keep();
        let mut c = PrivateCluster::start(&dir, 0, false).expect("a private Postgres cluster for the tests");
        c.stop_at_exit(true).unwrap();
        Mutex::new(c)
    })
}

/// A fresh database on the shared cluster.
pub fn fresh_database() -> String {
    let c = cluster().lock().unwrap();
    let name = format!("test_{}", uuid::Uuid::new_v4().simple());
    c.create_database(&name).unwrap();
    c.url(&name)
}

/// The tiny model every test serves (written once).
pub fn tiny_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // The weights are the same in every run (seed 5): one file in the target
        // folder, written under a unique name and renamed into place, so runs in
        // parallel never see half a file and nothing is left in /tmp.
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let arch = TinyArch::from_env();
        let path = dir.join(format!("api-tiny-{}-seed5-q8_0.gguf", arch.name()));
        let part = tempfile::Builder::new().prefix("api-tiny").suffix(".part").tempfile_in(&dir).unwrap();
        Tiny::random(arch, 5, false).write_gguf(DType::Q8_0, part.path()).unwrap();
        part.persist(&path).unwrap();
        path
    })
    .clone()
}

#[allow(dead_code)] // `data_dir` lives as long as the app; `database_url` is for debugging.
pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub state: actix_web::web::Data<AppState>,
    pub jwt: Jwt,
    pub handle: actix_web::dev::ServerHandle,
    pub data_dir: tempfile::TempDir,
    pub database_url: String,
    /// The server's run: what `Application::run_until_stopped` returned, once it has.
    pub run: std::sync::Mutex<Option<tokio::task::JoinHandle<Result<(), String>>>>,
}

/// Settings for a test app; `tweak` may change them.
pub fn settings(database_url: &str, data_dir: &std::path::Path) -> Settings {
    let mut s = Settings::default();
    s.server.bind = "127.0.0.1:0".into();
    s.server.data_dir = data_dir.to_path_buf();
    s.server.max_body_bytes = 1 << 20;
    s.server.shutdown_timeout_secs = 2;
    s.database.url = database_url.into();
    s.model.path = tiny_model().display().to_string();
    s.model.threads = 1;
    s.engine.pool_tokens = 4096;
    s.engine.overload_factor = 0.0;
    s.auth.jwt.hs256_secret = Some(Secret::new(SECRET));
    s.auth.operator_token = OPERATOR.into();
    s.context.allowed_root = data_dir.join("sources");
    std::fs::create_dir_all(&s.context.allowed_root).unwrap();
    s.context.budget_tokens = 1200;
    s
}

pub async fn spawn_app() -> TestApp {
    spawn_with(|_| {}).await
}

pub async fn spawn_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let url = fresh_database();
    let data_dir = tempfile::tempdir().unwrap();
    let mut s = settings(&url, data_dir.path());
    tweak(&mut s);
    spawn_settings(s, data_dir, url).await
}

/// An app whose tenants' plan `tight` allows `per_minute` requests a minute, and a tenant `name`
/// on it (with its token).
pub async fn spawn_tight(name: &str, per_minute: u32) -> (TestApp, String) {
    let app = spawn_with(|s| {
        let mut plan = cachet_tenants::Plan::builtin().into_iter().find(|p| p.name == "standard").unwrap();
        plan.name = "tight".into();
        plan.limits.requests_per_minute = Some(per_minute);
        s.tenants.plans.push(plan);
    })
    .await;
    let (_, token) = app.tenant_on(name, Some("tight")).await;
    (app, token)
}

/// The folder of a Postgres cluster of its own, the cluster, and an app on it (a test that stops
/// the cluster must not stop the others'). Bound in this order, they are dropped app first,
/// folder last.
pub async fn spawn_on_own_cluster() -> (tempfile::TempDir, PrivateCluster, TestApp) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = PrivateCluster::start(dir.path(), 0, false).unwrap();
    cluster.create_database("app").unwrap();
    let url = cluster.url("app");
    let data_dir = tempfile::tempdir().unwrap();
    let app = spawn_settings(settings(&url, data_dir.path()), data_dir, url).await;
    (dir, cluster, app)
}

/// Another replica of `app`: the same database and repository sources, its own data folder
/// (engine, mirrors).
pub async fn spawn_replica(app: &TestApp) -> TestApp {
    let data = tempfile::tempdir().unwrap();
    let mut s = settings(&app.database_url, data.path());
    s.context.allowed_root = app.sources();
    spawn_settings(s, data, app.database_url.clone()).await
}

/// Everything the apps of this test binary log at `info` and above, from the first spawn on: the
/// suite checks that no credential reaches it (`reports::no_token_reaches_the_logs`).
pub fn logs() -> String {
    String::from_utf8_lossy(&log_buffer().lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

fn log_buffer() -> &'static std::sync::Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<std::sync::Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = std::sync::Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        // The `log` records of libraries (actix-web's) come through too.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || Capture(sink.clone()))
            .try_init();
        buf
    })
}

struct Capture(std::sync::Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every token the helpers issued in this test binary.
pub fn issued_tokens() -> Vec<String> {
    issued().lock().unwrap_or_else(|e| e.into_inner()).clone()
}

fn issued() -> &'static Mutex<Vec<String>> {
    static ISSUED: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    ISSUED.get_or_init(Default::default)
}

pub async fn spawn_settings(s: Settings, data_dir: tempfile::TempDir, database_url: String) -> TestApp {
    log_buffer();
    let jwt = Jwt::new(&s.auth.jwt).unwrap();
    let app = Application::build(s).await.expect("the app builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let state = app.state();
    let handle = app.handle();
    let run = tokio::spawn(async move { app.run_until_stopped().await.map_err(|e| format!("{e:#}")) });
    let run = std::sync::Mutex::new(Some(run));
    let test = TestApp { address, client: reqwest::Client::new(), state, jwt, handle, data_dir, database_url, run };
    test.wait_ready().await;
    test
}

impl TestApp {
    /// Waits (with a deadline) for the model to be loaded.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.state.model.served.get().is_none() {
            if let Some(e) = self.state.model.load_error.lock().unwrap().clone() {
                panic!("the model failed to load: {e}");
            }
            assert!(Instant::now() < deadline, "the model did not load in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Creates a tenant through the admin API; returns its id and a token.
    pub async fn tenant(&self, name: &str) -> (TenantId, String) {
        self.tenant_on(name, None).await
    }

    pub async fn tenant_on(&self, name: &str, plan: Option<&str>) -> (TenantId, String) {
        let r = self
            .client
            .post(format!("{}/admin/tenants", self.address))
            .bearer_auth(OPERATOR)
            .json(&json!({ "name": name, "plan": plan }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        let t: Value = r.json().await.unwrap();
        let id: TenantId = t["id"].as_str().unwrap().parse().unwrap();
        let token = self.jwt.issue(id, Duration::from_secs(3600)).unwrap();
        issued().lock().unwrap_or_else(|e| e.into_inner()).push(token.clone());
        (id, token)
    }

    pub fn model(&self) -> String {
        self.state.model.served.get().unwrap().id.clone()
    }

    pub async fn chat(&self, token: &str, body: Value) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/chat/completions", self.address))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// A chat body for the served model with one user message.
    pub fn chat_body(&self, content: &str, max_tokens: u32) -> Value {
        json!({ "model": self.model(), "messages": [{ "role": "user", "content": content }],
                "max_tokens": max_tokens, "temperature": 0 })
    }

    /// The ledger rows of a tenant once everything recorded so far is written.
    pub async fn ledger(&self, tenant: TenantId) -> Vec<cachet_tenants::UsageRecord> {
        let waiting = self.state.accounting.ledger.flush().await;
        assert_eq!(waiting, 0, "rows still waiting for the database");
        self.state.store.usage(tenant, 1000).await.unwrap()
    }
}

/// Streams a chat request; returns the milliseconds until its first token arrived and its usage
/// (the timing probe an attacker would use: what a cache hit saves shows in the first token).
pub async fn first_token(app: &TestApp, token: &str, mut body: Value) -> (f64, Value) {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let start = Instant::now();
    let mut r = app.chat(token, body).await;
    assert_eq!(r.status(), 200);
    let (mut first, mut text) = (None, String::new());
    while let Some(chunk) = r.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if first.is_none() && text.contains("\"content\"") {
            first = Some(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let usage = sse_events(&text)
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
        .expect("a usage chunk");
    (first.expect("a token"), json!({ "usage": usage }))
}

/// The cache-timing probe of a prefix-sharing attack, side by side and alternating five times: the
/// victim's warm turn of `body` (a `prompt`-token prompt the victim already sent), then a fresh
/// attacker tenant's exact copy of it, which must reuse only the `shared` public tokens and
/// compute the rest. Returns the median TTFTs (victim's warm turn, attacker's probe) in ms.
pub async fn timing_probe(app: &TestApp, victim: &str, body: &Value, prompt: u64, shared: u64) -> (f64, f64) {
    let (mut warm, mut probe) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let (ms, u) = first_token(app, victim, body.clone()).await;
        assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), prompt - 1);
        warm.push(ms);
        let (attacker, token) = app.tenant(&format!("attacker-{round}")).await;
        let (ms, u) = first_token(app, &token, body.clone()).await;
        assert_eq!(u["usage"]["prompt_tokens_details"]["cached_tokens"], shared, "only the public prefix is shared");
        probe.push(ms);
        let rows = app.ledger(attacker).await;
        assert_eq!(rows[0].computed_tokens as u64, prompt - shared, "the probe computed the whole private part");
    }
    (median(warm), median(probe))
}

/// The median of some milliseconds.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Parses a server-sent-events body into its `data:` payloads.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
}

/// Asserts an OpenAI-shaped error with `status`; returns its `error` object.
pub async fn error(r: reqwest::Response, status: u16) -> Value {
    assert_eq!(r.status().as_u16(), status, "unexpected status");
    let v: Value = r.json().await.expect("an error body is JSON");
    assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v["error"].clone()
}

/// `sha256=<hex>` of the HMAC-SHA256 of `body` under `secret`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    format!("sha256={}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// A registered repository.
#[allow(dead_code)]
pub struct Registered {
    pub id: String,
    pub secret: String,
    pub source: cachet_context::testing::TestRepo,
    pub head: String,
}

impl TestApp {
    /// The folder local repositories may be registered from.
    pub fn sources(&self) -> PathBuf {
        self.state.settings.context.allowed_root.clone()
    }

    /// A git repository under the allowed root with a first commit of `files`.
    pub fn source_repo(&self, name: &str, files: &[(&str, Option<&str>)]) -> cachet_context::testing::TestRepo {
        let repo = cachet_context::testing::TestRepo::init(self.sources().join(name)).unwrap();
        repo.commit(files, "first").unwrap();
        repo
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> reqwest::Response {
        self.client.post(format!("{}{path}", self.address)).bearer_auth(token).json(&body).send().await.unwrap()
    }

    pub async fn delete(&self, token: &str, path: &str) -> reqwest::Response {
        self.client.delete(format!("{}{path}", self.address)).bearer_auth(token).send().await.unwrap()
    }

    pub async fn get(&self, token: &str, path: &str) -> reqwest::Response {
        self.client.get(format!("{}{path}", self.address)).bearer_auth(token).send().await.unwrap()
    }

    /// Registers `source` (by path) for the tenant of `token`.
    pub async fn register(&self, token: &str, source: cachet_context::testing::TestRepo) -> Registered {
        self.register_with(token, source, json!({})).await
    }

    /// Registers a repository with registration fields (`{"after_push": "rebuild"}`).
    pub async fn register_with(
        &self,
        token: &str,
        source: cachet_context::testing::TestRepo,
        fields: Value,
    ) -> Registered {
        let mut body = fields;
        body["url"] = json!(source.path().display().to_string());
        let r = self.post(token, "/v1/repos", body).await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        let v: Value = r.json().await.unwrap();
        Registered {
            id: v["id"].as_str().unwrap().into(),
            secret: v["webhook"]["secret"].as_str().unwrap().into(),
            head: v["head"].as_str().unwrap().into(),
            source,
        }
    }

    /// Opens a session on the repository's default branch.
    pub async fn session(&self, token: &str, repo: &Registered) -> String {
        let r = self.post(token, "/v1/sessions", json!({ "repo": repo.id })).await;
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
        let v: Value = r.json().await.unwrap();
        v["id"].as_str().unwrap().into()
    }

    /// Sends a message; returns the response.
    pub async fn message(&self, token: &str, session: &str, body: Value) -> reqwest::Response {
        self.post(token, &format!("/v1/sessions/{session}/messages"), body).await
    }

    /// The assembled prompt of a message (a dry run).
    pub async fn dry_run(&self, token: &str, session: &str, content: &str) -> Value {
        let r = self.message(token, session, json!({ "content": content, "dry_run": true })).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        r.json().await.unwrap()
    }

    /// Sends a signed push webhook (plain form) with an optional delivery id.
    pub async fn push_hook(
        &self,
        repo: &Registered,
        before: &str,
        after: &str,
        delivery: Option<&str>,
    ) -> reqwest::Response {
        let body = serde_json::to_vec(&json!({ "ref": "refs/heads/main", "before": before, "after": after })).unwrap();
        let mut req = self
            .client
            .post(format!("{}/v1/webhooks/git/{}", self.address, repo.id))
            .header("content-type", "application/json")
            .header("x-hub-signature-256", sign(&repo.secret, &body));
        if let Some(d) = delivery {
            req = req.header("x-github-delivery", d).header("x-github-event", "push");
        }
        req.body(body).send().await.unwrap()
    }

    /// Waits until the engine has nothing running or waiting (pre-warm done).
    pub async fn engine_idle(&self) {
        let engine = self.state.model.served.get().unwrap().engine.clone();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = engine.snapshot().await.unwrap();
            if s.running == 0 && s.waiting == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "the engine did not go idle");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A one-time sign-in link of the report page for `token` (absolute URL).
pub async fn sign_in_link(app: &TestApp, token: &str) -> String {
    let r =
        app.client.post(format!("{}/v1/reports/sign-in-links", app.address)).bearer_auth(token).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    format!("{}{}", app.address, v["url"].as_str().unwrap())
}
