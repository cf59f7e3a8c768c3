//! Fault injection below the API server: the disk under the store refuses to grow (the
//! process's file-size limit, so every write of SQLite past it fails with `EFBIG` as a full
//! disk fails with `ENOSPC`). Writes are answered with 500 and leave nothing behind, reads and
//! watches go on, and once the disk has room again the service resumes. nextest runs each
//! test in a process of its own, so the lowered limit is this test's alone.

mod common;

use common::TestServer;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use serde_json::json;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

fn config_map(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

#[tokio::test]
async fn a_full_disk_fails_writes_cleanly_and_the_service_resumes_when_it_has_room() {
    // A write past the limit raises SIGXFSZ, which would end the process: refused writes
    // must come back as errors instead, as they do on a full disk.
    // SAFETY: ignoring a signal installs no handler code.
    #[allow(unsafe_code)]
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGXFSZ,
            nix::sys::signal::SigHandler::SigIgn,
        )
        .expect("ignore SIGXFSZ");
    }
    let s = TestServer::start().await;
    let before = s.request("POST", CMS, Some(&config_map("before"))).await;
    assert_eq!(
        before.status,
        201,
        "{}",
        String::from_utf8_lossy(&before.body)
    );

    let (soft, hard) = getrlimit(Resource::RLIMIT_FSIZE).expect("getrlimit");
    // No file of the process may grow past one page: every SQLite write (a WAL frame is a
    // page and its header) fails.
    setrlimit(Resource::RLIMIT_FSIZE, 4096, hard).expect("setrlimit");
    let refused = s.request("POST", CMS, Some(&config_map("during"))).await;
    let update = s
        .request(
            "PUT",
            &format!("{CMS}/before"),
            Some(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "before"}, "data": {"k": "changed"}})),
        )
        .await;
    let read = s.request("GET", &format!("{CMS}/before"), None).await;
    setrlimit(Resource::RLIMIT_FSIZE, soft, hard).expect("setrlimit");

    assert_eq!(
        refused.status,
        500,
        "a create on a full disk: {}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(
        refused.json()["kind"],
        "Status",
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(
        update.status,
        500,
        "an update on a full disk: {}",
        String::from_utf8_lossy(&update.body)
    );
    assert_eq!(
        read.status,
        200,
        "reads go on: {}",
        String::from_utf8_lossy(&read.body)
    );
    assert_eq!(read.json()["data"]["k"], "v");

    // Nothing of the refused writes is there, and the service resumes.
    let missing = s.request("GET", &format!("{CMS}/during"), None).await;
    assert_eq!(
        missing.status,
        404,
        "{}",
        String::from_utf8_lossy(&missing.body)
    );
    let kept = s.request("GET", &format!("{CMS}/before"), None).await;
    assert_eq!(
        kept.json()["data"]["k"],
        "v",
        "the refused update left the object as it was"
    );
    let after = s.request("POST", CMS, Some(&config_map("during"))).await;
    assert_eq!(
        after.status,
        201,
        "{}",
        String::from_utf8_lossy(&after.body)
    );
    let listed = s.request("GET", CMS, None).await;
    let listed = listed.json();
    let names: Vec<&str> = listed["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .filter(|n| *n == "before" || *n == "during")
        .collect();
    assert_eq!(names, ["before", "during"]);

    // And after a restart on the same data, the store holds exactly the acknowledged writes.
    let dir = s.stop().await;
    let s = TestServer::start_in(dir).await;
    let kept = s.request("GET", &format!("{CMS}/before"), None).await;
    assert_eq!(kept.json()["data"]["k"], "v");
    let after = s.request("GET", &format!("{CMS}/during"), None).await;
    assert_eq!(after.status, 200);
}
