//! `cachet serve`, `cachet tenants …`, `cachet token issue`. Results go to
//! stdout (an id, a token, or with `--json` full records); messages to
//! stderr, so scripts can capture exactly what they asked for.

use crate::config::{Overrides, Settings};
use crate::startup::{database, jwt_config, operator_token, Application};
use anyhow::{bail, Context};
use cachet_tenants::jwt::Jwt;
use cachet_tenants::TenantId;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8080).
    #[arg(long)]
    pub bind: Option<String>,
    /// Data folder (Postgres, secrets, ledger spool; default ~/.local/share/cachet).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Model: a name from `cachet models list`, hf:OWNER/REPO/FILE.gguf[@REVISION] (downloaded and
    /// SHA-256 checked), a .gguf file or a Hugging Face directory (default: the default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// auto (a CUDA GPU when usable, else the CPU), cpu, cuda or cuda:N.
    #[arg(long)]
    pub device: Option<String>,
    /// Configuration file (default <data_dir>/cachet.toml if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// unified (default), prefill or decode: prefill/decode disaggregation (`[disagg]`).
    #[arg(long)]
    pub role: Option<crate::config::Role>,
    /// Create (or reuse) a `demo` tenant and print how to call the server with its token.
    #[arg(long)]
    pub demo: bool,
}

/// Options shared by the commands that only need the data folder.
#[derive(Debug, Clone, clap::Args)]
pub struct DataArgs {
    /// Data folder of the server (default ~/.local/share/cachet).
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Configuration file.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Print full JSON records instead of bare ids.
    #[arg(long, global = true)]
    pub json: bool,
}

impl DataArgs {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        Settings::load(&Overrides {
            config: self.config.clone(),
            data_dir: self.data_dir.clone(),
            ..Default::default()
        })
        .map_err(anyhow::Error::msg)
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum TenantsCommand {
    /// Create a tenant; prints its id.
    Create {
        name: String,
        /// Plan name (default: the configured default plan).
        #[arg(long)]
        plan: Option<String>,
    },
    /// List live tenants.
    List,
    /// Delete a tenant (its tokens stop working).
    Delete { id: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Issue a bearer token for a tenant (or the operator); prints it.
    Issue {
        #[arg(long, required_unless_present = "operator")]
        tenant: Option<String>,
        /// Lifetime: 90s, 30m, 12h, 30d (default 30d).
        #[arg(long, default_value = "30d")]
        ttl: String,
        /// An operator token instead (for /admin).
        #[arg(long, conflicts_with = "tenant")]
        operator: bool,
    },
}

/// `90s`, `30m`, `12h`, `30d`, or plain seconds.
pub fn parse_ttl(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().with_context(|| format!("bad duration {s:?} (e.g. 90s, 30m, 12h, 30d)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => bail!("bad duration unit in {s:?} (s, m, h, d)"),
    };
    if secs == 0 {
        bail!("the duration must be positive");
    }
    Ok(Duration::from_secs(secs))
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        config: args.config,
        bind: args.bind,
        data_dir: args.data_dir,
        model: args.model,
        device: args.device,
        role: args.role,
    };
    let settings = Settings::load(&overrides).map_err(anyhow::Error::msg)?;
    actix_web::rt::System::new().block_on(async move {
        let app = Application::build(settings.clone()).await?;
        let host = settings.server.bind.rsplit_once(':').map_or("127.0.0.1", |(h, _)| h).to_string();
        let base = format!("http://{}:{}", if host == "0.0.0.0" { "127.0.0.1" } else { &host }, app.port());
        eprintln!("cachet is listening on {base} (the model is loading; GET {base}/readyz says when it is ready)");
        if args.demo {
            let state = app.state();
            actix_web::rt::spawn(async move {
                if let Err(e) = demo(state, base).await {
                    eprintln!("demo setup failed: {e:#}");
                }
            });
        }
        app.run_until_stopped().await
    })
}

/// Creates (or reuses) the `demo` tenant and prints ready-to-paste calls.
async fn demo(state: actix_web::web::Data<crate::state::AppState>, base: String) -> anyhow::Result<()> {
    let plan = state.settings.plan(&state.settings.tenants.default_plan).context("the default plan")?;
    let tenants = state.store.list_tenants().await?;
    let tenant = match tenants.into_iter().find(|t| t.name == "demo") {
        Some(t) => t,
        None => state.store.create_tenant("demo", &plan).await?,
    };
    let token = state.auth.jwt.issue(tenant.id, Duration::from_secs(7 * 86_400))?;
    while state.model.served.get().is_none() {
        if let Some(e) = state.model.load_error.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            bail!("the model failed to load: {e}");
        }
        actix_web::rt::time::sleep(Duration::from_millis(200)).await;
    }
    let model = state.model.served.get().map(|s| s.id.clone()).unwrap_or_default();
    println!(
        "\nReady. Demo tenant {id} (token valid 7 days):\n\n\
         export CACHET_TOKEN={token}\n\n\
         curl -s {base}/v1/chat/completions \\\n  -H \"Authorization: Bearer $CACHET_TOKEN\" -H 'Content-Type: application/json' \\\n  \
         -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Write a Rust function that reverses a string.\"}}]}}'\n\n\
         python3 - <<'EOF'\nimport os\nfrom openai import OpenAI   # pip install openai\n\
         client = OpenAI(base_url=\"{base}/v1\", api_key=os.environ[\"CACHET_TOKEN\"])\n\
         stream = client.chat.completions.create(model=\"{model}\", stream=True,\n    \
         messages=[{{\"role\": \"user\", \"content\": \"Explain Rust lifetimes in two sentences.\"}}])\n\
         for chunk in stream:\n    print(chunk.choices[0].delta.content or \"\", end=\"\", flush=True)\nprint()\nEOF\n",
        id = tenant.id,
    );
    Ok(())
}

pub fn tenants(data: DataArgs, cmd: TenantsCommand) -> anyhow::Result<()> {
    let settings = data.settings()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let db = database(&settings).await?;
        match cmd {
            TenantsCommand::Create { name, plan } => {
                let plan_name = plan.unwrap_or_else(|| settings.tenants.default_plan.clone());
                let plan = settings.plan(&plan_name).with_context(|| format!("no plan {plan_name:?}"))?;
                let t = db.store.create_tenant(name.trim(), &plan).await?;
                if data.json {
                    println!("{}", serde_json::to_string(&t)?);
                } else {
                    println!("{}", t.id);
                }
                eprintln!("created tenant {:?} ({}) on plan {}", t.name, t.id, t.plan.name);
            }
            TenantsCommand::List => {
                for t in db.store.list_tenants().await? {
                    if data.json {
                        println!("{}", serde_json::to_string(&t)?);
                    } else {
                        println!("{}\t{}\t{}", t.id, t.name, t.plan.name);
                    }
                }
            }
            TenantsCommand::Delete { id } => {
                let id: TenantId = id.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
                if !db.store.delete_tenant(id).await? {
                    bail!("no tenant {id}");
                }
                eprintln!("deleted tenant {id}");
            }
        }
        Ok(())
    })
}

pub fn token(data: DataArgs, cmd: TokenCommand) -> anyhow::Result<()> {
    let settings = data.settings()?;
    let TokenCommand::Issue { tenant, ttl, operator } = cmd;
    let ttl = parse_ttl(&ttl)?;
    let jwt = Jwt::new(&jwt_config(&settings)?)?;
    let _ = operator_token(&settings)?;
    let (token, who) = if operator {
        (jwt.issue_operator(ttl)?, "the operator".to_string())
    } else {
        let id: TenantId = tenant.unwrap_or_default().parse().map_err(|e| anyhow::anyhow!("{e}"))?;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let exists = rt.block_on(async {
            let db = database(&settings).await?;
            anyhow::Ok(db.store.get_tenant(id).await?.is_some_and(|t| t.deleted_at.is_none()))
        })?;
        if !exists {
            bail!("no tenant {id}");
        }
        (jwt.issue(id, ttl)?, format!("tenant {id}"))
    };
    if data.json {
        println!("{}", serde_json::json!({ "token": token, "expires_in": ttl.as_secs() }));
    } else {
        println!("{token}");
    }
    eprintln!("issued a token for {who}, valid {}s", ttl.as_secs());
    Ok(())
}
