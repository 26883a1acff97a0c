//! The private Postgres cluster: first start, attach, stop while a pool is open, restart on the
//! same port, and stop on drop.

use cachet_tenants::cluster::PrivateCluster;
use cachet_tenants::{Plan, Store};

#[tokio::test]
async fn start_stop_restart_attach_and_drop() {
    let dir = tempfile::Builder::new().prefix("cachet-pg-").tempdir().unwrap();
    let mut cluster = PrivateCluster::start(dir.path(), 0, false).unwrap();
    assert!(cluster.owned());
    assert!(cluster.is_running().unwrap());
    let port = cluster.port();
    assert_ne!(port, 0);
    let password = std::fs::read_to_string(dir.path().join("password")).unwrap();
    assert_eq!(password.len(), 48, "24 random bytes as hex");
    assert_eq!(cluster.url("app"), format!("postgres://postgres:{password}@127.0.0.1:{port}/app"));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("password")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "only this user reads the password");
    assert!(!dir.path().join("pwfile.init").exists(), "initdb's copy is gone");
    cluster.create_database("app").unwrap();
    cluster.create_database("app").expect("creating an existing database is fine");
    assert!(cluster.create_database("no-dashes").is_err());

    let store = Store::connect(&cluster.url("app")).await.unwrap();
    store.migrate().await.unwrap();
    // Another user of the machine, without the password, cannot connect (it could as superuser
    // when the cluster trusted local connections).
    let no_password = format!("postgres://postgres@127.0.0.1:{port}/app");
    assert!(Store::connect(&no_password).await.is_err(), "connected without the password");
    let wrong = format!("postgres://postgres:guess@127.0.0.1:{port}/app");
    assert!(Store::connect(&wrong).await.is_err(), "connected with a wrong password");
    let tenant = store.create_tenant("acme", &Plan::default()).await.unwrap();

    // A second start on the same folder attaches without taking ownership.
    let attached = PrivateCluster::start(dir.path(), 0, false).unwrap();
    assert!(!attached.owned());
    assert_eq!(attached.port(), port);
    drop(attached);
    store.ping().await.expect("dropping an attached handle leaves the server running");

    // Stopped: the open pool reports the database as unavailable, quickly.
    cluster.stop().unwrap();
    assert!(!cluster.is_running().unwrap());
    let err = store.ping().await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(Store::connect(&cluster.url("app")).await.unwrap_err().is_unavailable());

    // Restarted on the same port: the same pool works again and the data is there.
    cluster.restart().unwrap();
    assert_eq!(cluster.port(), port);
    assert!(cluster.owned());
    store.ping().await.unwrap();
    assert_eq!(store.get_tenant(tenant.id).await.unwrap().unwrap().name, "acme");
    store.pool().close().await;

    // Dropping the owning handle stops the server; the next start finds the remembered port.
    drop(cluster);
    assert!(!dir.path().join("data/postmaster.pid").exists(), "stopped on drop");
    let again = PrivateCluster::start(dir.path(), 0, false).unwrap();
    assert!(again.owned());
    assert_eq!(again.port(), port, "the port is remembered in the folder");
    drop(again);
}

#[tokio::test]
async fn a_cluster_made_with_trust_authentication_gets_a_password_at_its_next_start() {
    // What an earlier version left: pg_hba.conf trusting everything, no password file.
    let dir = tempfile::Builder::new().prefix("cachet-pg-").tempdir().unwrap();
    let cluster = PrivateCluster::start(dir.path(), 0, false).unwrap();
    let port = cluster.port();
    drop(cluster);
    let hba = dir.path().join("data/pg_hba.conf");
    let text = std::fs::read_to_string(&hba).unwrap().replace("scram-sha-256", "trust");
    std::fs::write(&hba, text).unwrap();
    std::fs::remove_file(dir.path().join("password")).unwrap();

    let cluster = PrivateCluster::start(dir.path(), 0, false).unwrap();
    assert_eq!(cluster.port(), port);
    assert!(!std::fs::read_to_string(&hba).unwrap().lines().any(|l| !l.starts_with('#') && l.ends_with("trust")));
    cluster.create_database("app").unwrap();
    let store = Store::connect(&cluster.url("app")).await.unwrap();
    store.ping().await.unwrap();
    store.pool().close().await;
    assert!(Store::connect(&format!("postgres://postgres@127.0.0.1:{port}/app")).await.is_err());
}

#[test]
fn the_binaries_are_found() {
    let bin = PrivateCluster::bin_dir().unwrap();
    assert!(bin.join("pg_ctl").is_file() && bin.join("initdb").is_file(), "{}", bin.display());
}

#[test]
fn a_folder_the_server_user_cannot_reach_is_a_clear_error() {
    if std::fs::read_to_string("/proc/self/status").map_or(true, |s| !s.lines().any(|l| l.starts_with("Uid:\t0\t0"))) {
        return; // Only root hands the folder to the `postgres` user.
    }
    use std::os::unix::fs::PermissionsExt;
    let outer = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let err = PrivateCluster::start(&outer.path().join("pg"), 0, false).unwrap_err();
    assert!(err.to_string().contains("not searchable"), "{err}");
}
