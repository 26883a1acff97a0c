//! What the cluster needs to know about the machine: where the Postgres binaries are, whether
//! we run as root, and the `postgres` system user that runs the server when we do.

use std::env;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::ClusterError;

/// The environment variable that names the folder holding `initdb` and `pg_ctl`.
pub const PG_BIN_ENV: &str = "CACHET_PG_BIN";

/// The system user that runs the server when this process runs as root.
pub const SERVER_USER: &str = "postgres";

/// `$CACHET_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`, else the folder of the
/// `pg_ctl` found on `PATH`.
pub(super) fn find_bin_dir() -> Result<PathBuf, ClusterError> {
    let has_tools = |dir: &Path| dir.join("pg_ctl").is_file() && dir.join("initdb").is_file();
    if let Some(dir) = env::var_os(PG_BIN_ENV) {
        let dir = PathBuf::from(dir);
        return if has_tools(&dir) {
            Ok(dir)
        } else {
            Err(ClusterError::NoBinaries(format!("{PG_BIN_ENV}={} has no pg_ctl and initdb", dir.display())))
        };
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version = name.split('.').map(|part| part.parse().ok()).collect::<Option<Vec<u32>>>()?;
            let bin = entry.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    let on_path = env::var_os("PATH")
        .map(|path| env::split_paths(&path).filter(|dir| has_tools(dir)).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path.into_iter().next().ok_or_else(|| {
        ClusterError::NoBinaries(format!(
            "no Postgres server binaries (initdb, pg_ctl): set {PG_BIN_ENV}, install them under \
             /usr/lib/postgresql/<version>/bin, or put them on PATH"
        ))
    })
}

/// Whether this process's effective user is root (Linux: from `/proc/self/status`).
pub(super) fn running_as_root() -> bool {
    let Ok(status) = fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap_or(false)
}

/// The uid and gid of the `postgres` system user, from `/etc/passwd`.
fn server_user_ids() -> Result<(u32, u32), ClusterError> {
    let passwd = fs::read_to_string("/etc/passwd").map_err(|e| ClusterError::Io(format!("/etc/passwd: {e}")))?;
    passwd
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 4 && fields[0] == SERVER_USER)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
        })
        .flatten()
        .next()
        .ok_or_else(|| {
            ClusterError::Io(format!(
                "running as root, but there is no `{SERVER_USER}` system user to run Postgres as \
                 (Postgres refuses to run as root)"
            ))
        })
}

/// `runuser`, for running a program as the server user.
pub(super) fn runuser() -> PathBuf {
    ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser", "/bin/runuser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("runuser"))
}

/// Makes `dir` usable by the server user: gives it the folder and checks that every folder
/// above it is searchable by it.
pub(super) fn hand_to_server_user(dir: &Path) -> Result<(), ClusterError> {
    let (uid, gid) = server_user_ids()?;
    let meta = fs::metadata(dir).map_err(|e| io_error(dir, e))?;
    if meta.uid() != uid {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|e| io_error(dir, e))?;
    }
    for ancestor in dir.ancestors().skip(1) {
        let meta = fs::metadata(ancestor).map_err(|e| io_error(ancestor, e))?;
        let mode = meta.permissions().mode();
        let searchable =
            mode & 0o001 != 0 || (meta.uid() == uid && mode & 0o100 != 0) || (meta.gid() == gid && mode & 0o010 != 0);
        if !searchable {
            return Err(ClusterError::Io(format!(
                "the `{SERVER_USER}` system user cannot reach {}: {} is not searchable by it \
                 (run `chmod o+x {}` or choose a data folder elsewhere)",
                dir.display(),
                ancestor.display(),
                ancestor.display()
            )));
        }
    }
    Ok(())
}

/// Gives one file to the server user (root only).
pub(super) fn give_to_server_user(path: &Path) -> Result<(), ClusterError> {
    let (uid, gid) = server_user_ids()?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| io_error(path, e))
}

/// Whether a process with this id exists.
pub(super) fn process_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// Whether nothing listens on 127.0.0.1:`port`.
pub(super) fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A port on 127.0.0.1 that is free right now.
pub(super) fn pick_free_port() -> Result<u16, ClusterError> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| ClusterError::Io(format!("cannot find a free port: {e}")))?;
    listener.local_addr().map(|addr| addr.port()).map_err(|e| ClusterError::Io(format!("cannot find a free port: {e}")))
}

pub(super) fn io_error(path: &Path, err: std::io::Error) -> ClusterError {
    ClusterError::Io(format!("{}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_picked_port_is_free() {
        let port = pick_free_port().unwrap();
        assert!(port != 0);
        assert!(port_free(port));
    }

    #[test]
    fn this_process_is_alive() {
        assert!(process_alive(std::process::id()));
    }
}
