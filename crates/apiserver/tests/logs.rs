//! `pods/log` is proxied to the pod's node log server with the server's client
//! certificate and streamed back.

mod common;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::routing::get;
use common::{Backend, TestServer, read};
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::sync::mpsc;

type Feed = Arc<Mutex<Option<mpsc::Receiver<String>>>>;

async fn container_logs(
    State(feed): State<Feed>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    RawQuery(q): RawQuery,
) -> Body {
    let q = q.unwrap_or_default();
    if q.contains("follow=true") {
        let rx = feed.lock().unwrap().take().unwrap();
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
            .map(|s| Ok::<_, std::convert::Infallible>(s.into_bytes()));
        return Body::from_stream(stream);
    }
    Body::from(format!("{ns}/{pod}/{container}?{q}\n"))
}

#[tokio::test]
async fn pod_logs_come_from_the_node_log_server_and_stream() {
    let s = TestServer::start().await;
    let (cert, key) =
        kubevirt_apiserver::pki::issue_serving_cert(s.dir.path(), vec!["127.0.0.1".into()])
            .unwrap();
    let ca = read(&s.dir.path().join("pki/ca.crt"));
    let (tx, rx) = mpsc::channel(4);
    let feed: Feed = Arc::new(Mutex::new(Some(rx)));
    let app = Router::new()
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .with_state(feed);
    // The log server only accepts clients with a certificate of the cluster CA.
    let node_server = Backend::start_with(app, &cert, &key, Some(&ca), ca.clone()).await;
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": node_server.addr.port()}}}});
    assert_eq!(
        s.request("POST", "/api/v1/nodes", Some(&node)).await.status,
        201
    );
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "virt-launcher-vm"},
        "spec": {"nodeName": "node1", "containers": [{"name": "compute", "image": "i"},
                                                       {"name": "guest-console-log", "image": "i"}]}});
    let pods = "/api/v1/namespaces/default/pods";
    assert_eq!(s.request("POST", pods, Some(&pod)).await.status, 201);

    let r = s
        .request("GET", &format!("{pods}/virt-launcher-vm/log"), None)
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "a container name must be specified for pod virt-launcher-vm, choose one of: [compute guest-console-log]"
    );

    let r = s
        .request(
            "GET",
            &format!("{pods}/virt-launcher-vm/log?container=compute&tailLines=2&timestamps=true"),
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "text/plain");
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        "default/virt-launcher-vm/compute?tailLines=2&timestamps=true\n"
    );

    // follow=true streams: the first line arrives before the second is written.
    let req = http::Request::get(s.url(&format!(
        "{pods}/virt-launcher-vm/log?container=compute&follow=true"
    )))
    .body(Body::empty())
    .unwrap();
    let resp = kubevirt_apiserver::client::send(s.tls.clone(), req)
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    tx.send("first\n".into()).await.unwrap();
    let chunk = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&chunk[..], b"first\n");
    tx.send("second\n".into()).await.unwrap();
    drop(tx);
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"second\n");
}
