//! Test support: one private Postgres cluster per test binary, a fresh database per test.

use std::sync::OnceLock;

use cachet_tenants::cluster::PrivateCluster;
use cachet_tenants::Store;

/// The test binary's cluster: started on first use in a temporary folder (fsync off), stopped
/// and removed when the binary exits (a `static` is never dropped, so a watcher does it).
pub fn cluster() -> &'static PrivateCluster {
    static CLUSTER: OnceLock<PrivateCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("cachet-pg-").tempdir().unwrap().keep();
        let mut cluster = PrivateCluster::start(&dir, 0, false).expect("start a private Postgres cluster");
        cluster.stop_at_exit(true).expect("arm the exit watcher");
        cluster
    })
}

/// A store on a new, migrated database of its own.
pub async fn fresh_store() -> Store {
    let name = format!("test_{}", uuid::Uuid::new_v4().simple());
    cluster().create_database(&name).unwrap();
    let store = Store::connect(&cluster().url(&name)).await.unwrap();
    store.migrate().await.unwrap();
    store
}
