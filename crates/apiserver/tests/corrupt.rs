//! A stored object that no longer decodes (a corrupt row in SQLite) is skipped by lists
//! and watches of its kind, which keep serving the other objects.

mod common;

use common::TestServer;
use serde_json::{Value, json};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

/// Every namespace has this ConfigMap (the root CA publisher's); the test ignores it.
const ROOT_CA: &str = "kube-root-ca.crt";

fn names(list: &Value) -> Vec<&str> {
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str())
                .filter(|n| *n != ROOT_CA)
                .collect()
        })
        .unwrap_or_default()
}

/// Overwrites the stored value of `key` in the SQLite file with bytes that are not JSON,
/// below the API server (through the store alone, as a disk or a bug could).
async fn corrupt(dir: &std::path::Path, key: &str) {
    let store = kubevirt_store::Store::open_sqlite(&dir.join("store.sqlite")).unwrap();
    let current = store.get(key).unwrap();
    store
        .update(
            key,
            current.revision,
            Box::new(|_| b"{\"metadata\": {\"na".to_vec()),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_corrupt_row_is_skipped_by_lists_and_watches_of_its_kind() {
    let s = TestServer::start().await;
    for name in ["a", "b", "c"] {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}});
        assert_eq!(s.request("POST", CMS, Some(&cm)).await.status, 201);
    }
    let dir = s.stop().await;
    corrupt(dir.path(), "/registry/core/configmaps/default/b").await;
    let s = TestServer::start_in(dir).await;

    let list = s.request("GET", CMS, None).await;
    assert_eq!(list.status, 200, "{}", String::from_utf8_lossy(&list.body));
    assert_eq!(names(&list.json()), ["a", "c"]);
    let all = s.request("GET", "/api/v1/configmaps", None).await;
    assert_eq!(all.status, 200);
    assert!(!names(&all.json()).contains(&"b"));
    let paged = s.request("GET", &format!("{CMS}?limit=1"), None).await;
    // `a` sorts before the root CA map, so the first page is `a` alone.
    assert_eq!(paged.status, 200);
    assert_eq!(names(&paged.json()), ["a"]);

    // The object itself cannot be served.
    let one = s.request("GET", &format!("{CMS}/b"), None).await;
    assert_eq!(one.status, 500);
    assert_eq!(one.json()["kind"], "Status");

    // A watch starting with the current objects leaves the corrupt one out; one
    // replaying history sees it created, then gone when its value stopped decoding.
    let watch = |rv: &'static str| {
        let s = &s;
        async move {
            let path = format!("{CMS}?watch=true&resourceVersion={rv}&timeoutSeconds=1");
            let watch = s.request("GET", &path, None).await;
            assert_eq!(watch.status, 200);
            String::from_utf8_lossy(&watch.body)
                .lines()
                .filter(|l| !l.contains(ROOT_CA))
                .map(|l| {
                    let e: Value = serde_json::from_str(l).unwrap();
                    let name = e["object"]["metadata"]["name"].as_str().unwrap_or("");
                    format!("{} {name}", e["type"].as_str().unwrap_or(""))
                })
                .collect::<Vec<String>>()
        }
    };
    assert_eq!(watch("0").await, ["ADDED a", "ADDED c"]);
    assert_eq!(
        watch("1").await,
        ["ADDED a", "ADDED b", "ADDED c", "DELETED b"]
    );

    // Each skip is reported as kube reports undecodable objects.
    let metrics = s.request("GET", "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8_lossy(&metrics.body);
    let count = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("apiserver_storage_decode_errors_total{resource=\"configmaps\"} ")
        })
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(count.is_some_and(|n| n >= 1), "{text}");
}
