//! What the server leaves on disk is private to its user, whatever the umask.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use kubevirt_apiserver::Config;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn the_data_directory_is_0700_and_the_store_file_0600() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let server = kubevirt_apiserver::start(Config {
        data_dir: data.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        initial_objects: Vec::new(),
    })
    .await
    .unwrap();
    assert_eq!(mode(&data), 0o700, "data directory");
    assert_eq!(mode(&data.join("store.sqlite")), 0o600, "store");
    let wal = data.join("store.sqlite-wal");
    assert!(wal.exists(), "the initial namespaces were written");
    assert_eq!(mode(&wal), 0o600, "write-ahead log");
    server.stop().await;
}
