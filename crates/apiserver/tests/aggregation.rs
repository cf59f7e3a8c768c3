//! Requests for an aggregated group are proxied to the APIService's backend, websocket
//! upgrades included.

mod common;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;
use axum::routing::{any, get};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::{Backend, TestServer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const GV: &str = "/apis/subresources.kubevirt.io/v1";

async fn resources() -> Json<Value> {
    Json(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "subresources.kubevirt.io/v1",
                "resources": [{"name": "virtualmachineinstances/console", "namespaced": true,
                               "kind": "VirtualMachineInstance", "verbs": ["get"]}]}))
}

async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Json<Value> {
    let h = |n: &str| {
        headers
            .get_all(n)
            .iter()
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    };
    Json(json!({
        "method": method.as_str(), "uri": uri.to_string(),
        "user": h("x-remote-user"), "groups": h("x-remote-group"),
        "authorization": h("authorization"),
        "body": String::from_utf8_lossy(&body),
    }))
}

async fn console(ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(|mut socket: WebSocket| async move {
        while let Some(Ok(msg)) = socket.recv().await {
            if let Message::Text(t) = msg {
                let _ = socket
                    .send(Message::Text(format!("echo: {t}").into()))
                    .await;
            }
        }
    })
}

async fn setup() -> (TestServer, Backend) {
    let backend = Backend::start(
        Router::new()
            .route(GV, get(resources))
            .route(
                &format!("{GV}/namespaces/default/virtualmachineinstances/vm/console"),
                get(console),
            )
            .route(&format!("{GV}/{{*rest}}"), any(echo)),
    )
    .await;
    let s = TestServer::start().await;
    let apiservice = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.subresources.kubevirt.io",
                     "annotations": {"kubevirt-rs.io/url": backend.url("")}},
        "spec": {"group": "subresources.kubevirt.io", "version": "v1",
                 "groupPriorityMinimum": 1000, "versionPriority": 15,
                 "service": {"namespace": "kubevirt", "name": "virt-api", "port": 443},
                 "caBundle": STANDARD.encode(&backend.ca_pem)},
    });
    let r = s
        .request(
            "POST",
            "/apis/apiregistration.k8s.io/v1/apiservices",
            Some(&apiservice),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    (s, backend)
}

#[tokio::test]
async fn requests_under_an_aggregated_group_reach_the_backend_with_the_user() {
    let (s, _backend) = setup().await;
    let path = format!("{GV}/namespaces/default/virtualmachineinstances/vm/start?dryRun=All");
    let r = s
        .request("PUT", &path, Some(&json!({"gracePeriod": 5})))
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let echoed = r.json();
    assert_eq!(echoed["method"], "PUT");
    assert_eq!(echoed["uri"], path);
    assert_eq!(echoed["user"], json!(["kubernetes-admin"]));
    assert!(
        echoed["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:authenticated"))
    );
    assert_eq!(echoed["body"], "{\"gracePeriod\":5}");
    assert_eq!(echoed["authorization"], json!([]));

    // Discovery of the group comes from the backend, and the group is listed.
    let d = s.request("GET", GV, None).await.json();
    assert_eq!(d["resources"][0]["name"], "virtualmachineinstances/console");
    let groups = s.request("GET", "/apis", None).await.json();
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "subresources.kubevirt.io")
    );
    let agg = s
        .request_with(
            "GET",
            "/apis",
            None,
            "application/json",
            &[(
                "accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )],
        )
        .await
        .json();
    assert!(
        agg["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["metadata"]["name"] == "subresources.kubevirt.io")
    );
}

#[tokio::test]
async fn websocket_upgrades_are_proxied_both_ways() {
    let (s, _backend) = setup().await;
    let req = http::Request::get(s.url(&format!(
        "{GV}/namespaces/default/virtualmachineinstances/vm/console"
    )))
    .header("connection", "Upgrade")
    .header("upgrade", "websocket")
    .header("sec-websocket-version", "13")
    .header("sec-websocket-key", STANDARD.encode([7u8; 16]))
    .body(Body::empty())
    .unwrap();
    let mut resp = kubevirt_apiserver::client::send(s.tls.clone(), req)
        .await
        .unwrap();
    assert_eq!(resp.status(), 101);
    let upgraded = hyper::upgrade::on(&mut resp).await.unwrap();
    let mut io = hyper_util::rt::TokioIo::new(upgraded);
    // One masked text frame "hi" (client frames must be masked).
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | 2];
    frame.extend_from_slice(&mask);
    frame.extend(b"hi".iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    io.write_all(&frame).await.unwrap();
    let mut head = [0u8; 2];
    io.read_exact(&mut head).await.unwrap();
    assert_eq!(head[0], 0x81);
    let mut payload = vec![0u8; usize::from(head[1] & 0x7f)];
    io.read_exact(&mut payload).await.unwrap();
    assert_eq!(payload, b"echo: hi");
}

#[tokio::test]
async fn an_apiservice_whose_backend_is_down_answers_503() {
    let s = TestServer::start().await;
    let apiservice = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1.down.example.com"},
        "spec": {"group": "down.example.com", "version": "v1",
                 "service": {"namespace": "default", "name": "nope"}},
    });
    let r = s
        .request(
            "POST",
            "/apis/apiregistration.k8s.io/v1/apiservices",
            Some(&apiservice),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = s.request("GET", "/apis/down.example.com/v1", None).await;
    assert_eq!(r.status, 503);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("service \"nope\" not found")
    );
}
