//! A private Postgres cluster run from the machine's Postgres binaries, for `cachet serve`
//! without a `DATABASE_URL` and for tests.
//!
//! Layout of the cluster folder: `data/` (the cluster, created by `initdb` on first use),
//! `port` (the port it listens on, so later starts and attaches find it), `password` (the
//! superuser's password, generated at initdb, mode 0600), `server.log`, and `owner.pid` (the
//! process that started it). The server listens on 127.0.0.1 only and has no Unix socket; every
//! connection must give the password (SCRAM-SHA-256): other users of the machine cannot connect.
//! A cluster made by an earlier version with trust authentication is given a password and
//! switched to SCRAM the next time it is started.
//!
//! Postgres refuses to run as root. When this process is root, `initdb`, `pg_ctl` and the
//! server run as the `postgres` system user (`runuser -u postgres`), and the cluster folder is
//! handed to that user; every folder above it must be searchable by it.

mod system;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use system::io_error;
pub use system::{PG_BIN_ENV, SERVER_USER};

/// How long `pg_ctl` waits for the server to start or stop, in seconds.
const PG_CTL_WAIT_SECONDS: &str = "60";
/// How long attaching waits for a cluster that another process is starting.
const ATTACH_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How much command output an error keeps (its end).
const OUTPUT_TAIL: usize = 4000;

/// What went wrong running the cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The Postgres server binaries (`initdb`, `pg_ctl`) were not found.
    #[error("{0}")]
    NoBinaries(String),
    /// A file-system or system-user problem.
    #[error("{0}")]
    Io(String),
    /// A Postgres tool failed; `output` is the end of what it printed (and of `server.log`).
    #[error("`{cmd}` failed ({status}):\n{output}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its exit status.
        status: String,
        /// The end of its output.
        output: String,
    },
    /// A database name that is not `[A-Za-z_][A-Za-z0-9_]*` of at most 63 characters.
    #[error("invalid database name {0:?}: use letters, digits and underscores (at most 63)")]
    InvalidName(String),
}

/// The file holding the superuser's password, in the cluster folder.
const PASSWORD_FILE: &str = "password";

/// A handle on a private Postgres cluster. Stops the server on drop if this handle started it.
#[derive(Debug)]
pub struct PrivateCluster {
    dir: PathBuf,
    /// The superuser's password (empty until read or made).
    password: crate::Secret,
    bin: PathBuf,
    port: u16,
    fsync: bool,
    /// Run server tools as the `postgres` system user (this process is root).
    as_server_user: bool,
    /// This handle started the server (or adopted it from a dead owner) and stops it.
    owned: bool,
    /// The server this handle started is running.
    running: bool,
    /// Write end of the exit watcher's stdin (see [`PrivateCluster::stop_at_exit`]).
    exit_watcher: Option<ChildStdin>,
}

/// Ports tried when the one chosen free is taken before the server binds it.
const START_TRIES: u32 = 3;

impl PrivateCluster {
    /// Starts the cluster whose data lives in `dir` (running initdb on first use), listening on
    /// 127.0.0.1:`port` (0 = the port remembered in the folder if it is still free, else a free
    /// one). If a cluster is already running on that folder (e.g. `cachet serve` while the CLI
    /// runs), attaches to it instead and does not stop it on drop, unless the process that
    /// started it has died, in which case this handle adopts it. When the process runs as root,
    /// initdb/pg_ctl run as the `postgres` system user and `dir` is chowned to it.
    /// `fsync: false` (no fsync, no synchronous commit) is for tests only.
    pub fn start(dir: &Path, port: u16, fsync: bool) -> Result<PrivateCluster, ClusterError> {
        let bin = Self::bin_dir()?;
        fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        let dir = dir.canonicalize().map_err(|e| io_error(dir, e))?;
        let as_server_user = system::running_as_root();
        if as_server_user {
            system::hand_to_server_user(&dir)?;
        }
        let password = crate::Secret::new(String::new());
        let mut cluster = PrivateCluster {
            dir,
            password,
            bin,
            port,
            fsync,
            as_server_user,
            owned: false,
            running: false,
            exit_watcher: None,
        };
        if cluster.attach_if_running()? {
            cluster.read_password()?;
            return Ok(cluster);
        }
        if !cluster.data_dir().join("PG_VERSION").is_file() {
            cluster.initdb()?;
        }
        // A port chosen free can be taken by another process before the server binds it (tests
        // start many clusters at once): with no port asked for, another free one is tried.
        let mut tries = 0;
        loop {
            cluster.port = cluster.choose_port(port)?;
            cluster.write_file("port", &cluster.port.to_string())?;
            let Err(err) = cluster.start_server() else { break };
            // Another process may have started it between our check and our start.
            if cluster.attach_if_running()? {
                cluster.read_password()?;
                return Ok(cluster);
            }
            tries += 1;
            let taken =
                matches!(&err, ClusterError::Command { output, .. } if output.contains("Address already in use"));
            if port != 0 || !taken || tries == START_TRIES {
                return Err(err);
            }
            tracing::warn!(
                port = cluster.port,
                "the port chosen for the private Postgres was taken meanwhile; another"
            );
        }
        if cluster.dir.join(PASSWORD_FILE).is_file() {
            cluster.read_password()?;
        } else {
            cluster.require_password()?;
        }
        Ok(cluster)
    }

    /// The folder with the Postgres server binaries: `$CACHET_PG_BIN`, else the newest
    /// `/usr/lib/postgresql/*/bin`, else the folder of a `pg_ctl` on `PATH`.
    pub fn bin_dir() -> Result<PathBuf, ClusterError> {
        system::find_bin_dir()
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection string of `database`: `postgres://postgres:PASSWORD@127.0.0.1:PORT/DATABASE`
    /// (the password is hex: nothing to escape). It holds the password: never log it.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SERVER_USER}:{}@127.0.0.1:{}/{database}", self.password.expose(), self.port)
    }

    /// The cluster folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// Whether this handle started the server (and so stops it).
    pub fn owned(&self) -> bool {
        self.owned
    }

    /// Creates a database; one that already exists is fine.
    pub fn create_database(&self, name: &str) -> Result<(), ClusterError> {
        check_database_name(name)?;
        let port = self.port.to_string();
        let args = ["-h", "127.0.0.1", "-p", &port, "-U", SERVER_USER, name];
        match self.run("createdb", false, args) {
            Err(ClusterError::Command { output, .. }) if output.contains("already exists") => Ok(()),
            other => other.map(drop),
        }
    }

    /// Stops the server (`pg_ctl stop -m fast`) if this handle started it; otherwise does nothing.
    pub fn stop(&mut self) -> Result<(), ClusterError> {
        if !(self.owned && self.running) {
            return Ok(());
        }
        let data = self.data_dir();
        let result = self.run(
            "pg_ctl",
            true,
            [os("-D"), data.into(), os("-m"), os("fast"), os("-w"), os("-t"), os(PG_CTL_WAIT_SECONDS), os("stop")],
        );
        if result.is_err() && self.running_port()?.is_some() {
            return result.map(drop);
        }
        self.running = false;
        let _ = fs::remove_file(self.dir.join("owner.pid"));
        tracing::info!(dir = %self.dir.display(), "stopped private Postgres");
        Ok(())
    }

    /// Starts the server again on the same port after [`stop`](Self::stop) (a running server
    /// this handle owns is stopped first). If another process has started it meanwhile, this
    /// handle attaches to it instead.
    pub fn restart(&mut self) -> Result<(), ClusterError> {
        self.stop()?;
        if self.attach_if_running()? {
            return Ok(());
        }
        self.start_server()
    }

    /// Whether a server is running on the cluster folder (whoever started it).
    pub fn is_running(&self) -> Result<bool, ClusterError> {
        Ok(self.running_port()?.is_some())
    }

    /// Makes sure an owned server stops when this process exits, even if `Drop` never runs (a
    /// handle kept in a `static`, a killed test binary): a watcher process waits for this
    /// process's end (its stdin closes), then runs `pg_ctl stop`, and with `remove_dir` deletes
    /// the cluster folder. Does nothing for a handle that does not own the server.
    pub fn stop_at_exit(&mut self, remove_dir: bool) -> Result<(), ClusterError> {
        if !self.owned || self.exit_watcher.is_some() {
            return Ok(());
        }
        let script = r#"cat >/dev/null; dir="$1"; remove="$2"; shift 2; "$@" >/dev/null 2>&1; if [ "$remove" = 1 ]; then rm -rf -- "$dir"; fi"#;
        let (program, args) = self.command_line("pg_ctl", true, {
            let data = self.data_dir();
            vec![os("-D"), data.into(), os("-m"), os("fast"), os("-w"), os("stop")]
        });
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(&self.dir)
            .arg(if remove_dir { "1" } else { "0" })
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| ClusterError::Io(format!("cannot start the exit watcher: {e}")))?;
        self.exit_watcher = child.stdin.take();
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// If a server runs on the folder, points this handle at it (adopting it if its owner died).
    fn attach_if_running(&mut self) -> Result<bool, ClusterError> {
        let Some(port) = self.running_port()? else { return Ok(false) };
        self.port = port;
        self.wait_ready()?;
        let owner = fs::read_to_string(self.dir.join("owner.pid")).ok().and_then(|pid| pid.trim().parse::<u32>().ok());
        if let Some(owner) = owner {
            if owner != std::process::id() && !system::process_alive(owner) {
                tracing::info!(dir = %self.dir.display(), owner, "adopting private Postgres of a process that died");
                self.owned = true;
                self.running = true;
                self.write_file("owner.pid", &std::process::id().to_string())?;
                return Ok(true);
            }
        }
        tracing::info!(dir = %self.dir.display(), port, "attached to running private Postgres");
        Ok(true)
    }

    /// The port of the server running on the folder, if one runs.
    fn running_port(&self) -> Result<Option<u16>, ClusterError> {
        let pid_file = self.data_dir().join("postmaster.pid");
        if !pid_file.is_file() {
            return Ok(None);
        }
        let data = self.data_dir();
        if self.run("pg_ctl", true, [os("-D"), data.into(), os("status")]).is_err() {
            return Ok(None);
        }
        // postmaster.pid: pid, data dir, start time, port, socket dir, listen address, …
        let text = fs::read_to_string(&pid_file).map_err(|e| io_error(&pid_file, e))?;
        Ok(text.lines().nth(3).and_then(|port| port.trim().parse().ok()))
    }

    /// Waits until a server another process started accepts connections.
    fn wait_ready(&self) -> Result<(), ClusterError> {
        let deadline = Instant::now() + ATTACH_READY_TIMEOUT;
        let port = self.port.to_string();
        loop {
            let ready = self.run("pg_isready", false, ["-q", "-h", "127.0.0.1", "-p", &port, "-t", "2"]);
            match ready {
                Ok(_) => return Ok(()),
                Err(err) if Instant::now() >= deadline => return Err(err),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn initdb(&mut self) -> Result<(), ClusterError> {
        let fresh = self.dir.join("data.init");
        if fresh.exists() {
            fs::remove_dir_all(&fresh).map_err(|e| io_error(&fresh, e))?;
        }
        // The password: kept in `password` (ours, 0600) and handed to initdb in a file the server
        // user can read, removed right after.
        let password = random_password()?;
        self.write_private(PASSWORD_FILE, &password)?;
        self.password = crate::Secret::new(password.clone());
        let pwfile = self.dir.join("pwfile.init");
        self.write_private("pwfile.init", &password)?;
        if self.as_server_user {
            system::give_to_server_user(&pwfile)?;
        }
        let mut args = vec![os("-D"), fresh.clone().into(), os("-U"), os(SERVER_USER), os("--auth=scram-sha-256")];
        let mut pw_arg = OsString::from("--pwfile=");
        pw_arg.push(&pwfile);
        args.push(pw_arg);
        args.extend([os("-E"), os("UTF8"), os("--no-locale")]);
        if !self.fsync {
            args.push(os("-N"));
        }
        let made = self.run("initdb", true, args);
        let _ = fs::remove_file(&pwfile);
        made?;
        let data = self.data_dir();
        fs::rename(&fresh, &data).map_err(|e| io_error(&data, e))?;
        tracing::info!(dir = %self.dir.display(), "initialised private Postgres cluster");
        Ok(())
    }

    fn choose_port(&self, requested: u16) -> Result<u16, ClusterError> {
        if requested != 0 {
            return Ok(requested);
        }
        let remembered = fs::read_to_string(self.dir.join("port")).ok().and_then(|p| p.trim().parse::<u16>().ok());
        match remembered {
            Some(port) if port != 0 && system::port_free(port) => Ok(port),
            _ => system::pick_free_port(),
        }
    }

    fn start_server(&mut self) -> Result<(), ClusterError> {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c max_connections=200",
            self.port
        );
        if !self.fsync {
            options.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        let (data, log) = (self.data_dir(), self.log_path());
        let args = [os("-D"), data.into(), os("-l"), log.clone().into(), os("-w"), os("-t"), os(PG_CTL_WAIT_SECONDS)];
        let args = args.into_iter().chain([os("-o"), OsString::from(options), os("start")]);
        if let Err(err) = self.run("pg_ctl", true, args) {
            return Err(match err {
                ClusterError::Command { cmd, status, output } => {
                    let log_text = fs::read_to_string(&log).unwrap_or_default();
                    let output = tail(&format!("{output}\n--- {} ---\n{log_text}", log.display()));
                    ClusterError::Command { cmd, status, output }
                }
                other => other,
            });
        }
        self.owned = true;
        self.running = true;
        self.write_file("owner.pid", &std::process::id().to_string())?;
        tracing::info!(dir = %self.dir.display(), port = self.port, "started private Postgres");
        Ok(())
    }

    /// Reads the superuser's password from the folder.
    fn read_password(&mut self) -> Result<(), ClusterError> {
        let path = self.dir.join(PASSWORD_FILE);
        let text = fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
        self.password = crate::Secret::new(text.trim().to_string());
        Ok(())
    }

    /// A cluster an earlier version made trusts every local connection: give the superuser a
    /// password (sent on psql's standard input, never on a command line), switch every rule of
    /// `pg_hba.conf` from `trust` to `scram-sha-256`, and reload.
    fn require_password(&mut self) -> Result<(), ClusterError> {
        let password = random_password()?;
        let port = self.port.to_string();
        let sql = format!("ALTER USER {SERVER_USER} PASSWORD '{password}';\n");
        let args = ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &port, "-U", SERVER_USER, "-d"];
        self.run_with_input("psql", args.into_iter().chain(["postgres", "-f", "-"]), &sql)?;
        let hba = self.data_dir().join("pg_hba.conf");
        let text = fs::read_to_string(&hba).map_err(|e| io_error(&hba, e))?;
        let secured: String = text
            .lines()
            .map(|line| {
                let rule = !line.trim_start().starts_with('#') && line.split_whitespace().last() == Some("trust");
                if rule {
                    format!("{}scram-sha-256\n", &line[..line.rfind("trust").unwrap_or(line.len())])
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        // Rewritten in place: the file keeps its owner (the server user) and mode.
        fs::write(&hba, secured).map_err(|e| io_error(&hba, e))?;
        self.write_private(PASSWORD_FILE, &password)?;
        self.password = crate::Secret::new(password);
        let data = self.data_dir();
        self.run("pg_ctl", true, [os("-D"), data.into(), os("reload")])?;
        tracing::info!(dir = %self.dir.display(), "private Postgres now requires a password (was trust)");
        Ok(())
    }

    /// Writes a file only this process's user can read (0600), replacing any.
    fn write_private(&self, name: &str, contents: &str) -> Result<(), ClusterError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.dir.join(name);
        let _ = fs::remove_file(&path);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_error(&path, e))?;
        f.write_all(contents.as_bytes()).map_err(|e| io_error(&path, e))
    }

    fn write_file(&self, name: &str, contents: &str) -> Result<(), ClusterError> {
        let path = self.dir.join(name);
        fs::write(&path, contents).map_err(|e| io_error(&path, e))
    }

    /// The program and arguments that run `tool` from the bin folder, as the server user when
    /// `server_side` and this process is root.
    fn command_line(&self, tool: &str, server_side: bool, args: Vec<OsString>) -> (OsString, Vec<OsString>) {
        let program = self.bin.join(tool).into_os_string();
        if server_side && self.as_server_user {
            let mut full = vec![os("-u"), os(SERVER_USER), os("--"), program];
            full.extend(args);
            (system::runuser().into_os_string(), full)
        } else {
            (program, args)
        }
    }

    /// Runs a Postgres tool to completion; its stdout on success. Client tools get the
    /// password in their environment (`PGPASSWORD`, readable only by this user and root).
    fn run<I, S>(&self, tool: &str, server_side: bool, args: I) -> Result<String, ClusterError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.run_inner(tool, server_side, args.into_iter().map(Into::into).collect(), None)
    }

    /// [`Self::run`] of a client tool with `input` on its standard input.
    fn run_with_input<I, S>(&self, tool: &str, args: I, input: &str) -> Result<String, ClusterError>
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.run_inner(tool, false, args.into_iter().map(Into::into).collect(), Some(input))
    }

    fn run_inner(
        &self,
        tool: &str,
        server_side: bool,
        args: Vec<OsString>,
        input: Option<&str>,
    ) -> Result<String, ClusterError> {
        let (program, args) = self.command_line(tool, server_side, args);
        let cmd = std::iter::once(&program).chain(&args).map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
        let mut command = Command::new(&program);
        command
            .args(&args)
            .current_dir(&self.dir)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("PGCONNECT_TIMEOUT", "5");
        if !server_side && !self.password.is_empty() {
            command.env("PGPASSWORD", self.password.expose());
        }
        let mut child = command.spawn().map_err(|e| ClusterError::Io(format!("cannot run {cmd}: {e}")))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write;
            stdin.write_all(text.as_bytes()).map_err(|e| ClusterError::Io(format!("writing to {cmd}: {e}")))?;
        }
        let out = child.wait_with_output().map_err(|e| ClusterError::Io(format!("cannot run {cmd}: {e}")))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            return Ok(stdout);
        }
        let output = tail(&format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
        Err(ClusterError::Command { cmd, status: out.status.to_string(), output })
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            tracing::warn!(dir = %self.dir.display(), %err, "could not stop private Postgres");
        }
    }
}

/// A new superuser password: 24 random bytes as hex.
fn random_password() -> Result<String, ClusterError> {
    crate::random_hex(24).map_err(|e| ClusterError::Io(format!("/dev/urandom: {e}")))
}

fn os(text: &str) -> OsString {
    OsString::from(text)
}

fn tail(text: &str) -> String {
    let text = text.trim();
    let start = text.len().saturating_sub(OUTPUT_TAIL);
    let start = (start..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    text[start..].to_owned()
}

fn check_database_name(name: &str) -> Result<(), ClusterError> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63;
    if valid {
        Ok(())
    } else {
        Err(ClusterError::InvalidName(name.chars().take(80).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_names_are_checked() {
        assert!(check_database_name("cachet_test_01").is_ok());
        assert!(check_database_name("_x").is_ok());
        for bad in ["", "1abc", "a-b", "a b", "a;drop", &"x".repeat(64)] {
            assert!(check_database_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tail_keeps_the_end_on_a_char_boundary() {
        let text = format!("{}é{}", "a".repeat(10), "b".repeat(OUTPUT_TAIL - 1));
        let cut = tail(&text);
        assert!(cut.len() <= OUTPUT_TAIL);
        assert!(cut.ends_with('b'));
    }
}
