//! Webhooks and APIServices named by a Service reference reach a ready endpoint of the
//! Service's EndpointSlices, and the backend's certificate is checked for
//! `<name>.<namespace>.svc` (the test backends' certificates name nothing else, not even
//! the loopback address they are reached at).

mod common;

use axum::Json;
use axum::Router;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::{Backend, TestServer};
use serde_json::{Value, json};

const NS: &str = "kubevirt";
const GV: &str = "/apis/subresources.kubevirt.io/v1";

async fn mutate(headers: HeaderMap, Json(review): Json<Value>) -> Json<Value> {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let patch = json!([
        {"op": "add", "path": "/metadata/labels/mutated", "value": "yes"},
        {"op": "add", "path": "/metadata/annotations", "value": {"seen-host": host}},
    ]);
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": true,
                     "patchType": "JSONPatch", "patch": STANDARD.encode(patch.to_string())}}),
    )
}

async fn resources() -> Json<Value> {
    Json(json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": "subresources.kubevirt.io/v1",
                "resources": [{"name": "virtualmachineinstances/console", "namespaced": true,
                               "kind": "VirtualMachineInstance", "verbs": ["get"]}]}))
}

/// A backend for Service `kubevirt/<service>` serving the webhook and the aggregated group.
async fn backend(service: &str) -> Backend {
    Backend::start_for(
        Router::new()
            .route("/mutate", post(mutate))
            .route(GV, get(resources)),
        &[&format!("{service}.{NS}.svc")],
    )
    .await
}

async fn create(s: &TestServer, path: &str, obj: Value) {
    let r = s.request("POST", path, Some(&obj)).await;
    assert_eq!(
        r.status,
        201,
        "{path}: {}",
        String::from_utf8_lossy(&r.body)
    );
}

/// Namespace `kubevirt` (the server may have made it already).
async fn namespace(s: &TestServer) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    let r = s.request("POST", "/api/v1/namespaces", Some(&ns)).await;
    assert!(
        [201, 409].contains(&r.status),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
}

async fn service(s: &TestServer, name: &str, target_port: Value) {
    create(
        s,
        &format!("/api/v1/namespaces/{NS}/services"),
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": name, "namespace": NS},
               "spec": {"selector": {"app": name},
                        "ports": [{"name": "https", "port": 443, "targetPort": target_port}]}}),
    )
    .await;
}

/// An EndpointSlice of Service `service` with `endpoints` (address, ready) on `port`.
async fn slice(s: &TestServer, service: &str, name: &str, port: u16, endpoints: &[(&str, bool)]) {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(a, ready)| json!({"addresses": [a], "conditions": {"ready": ready}}))
        .collect();
    create(
        s,
        &format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": name, "namespace": NS,
                            "labels": {"kubernetes.io/service-name": service}},
               "addressType": "IPv4", "endpoints": endpoints,
               "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}),
    )
    .await;
}

async fn mutating_webhook(s: &TestServer, hook: &str, service: &str, ca: &str) {
    create(
        s,
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "MutatingWebhookConfiguration", "metadata": {"name": hook},
               "webhooks": [{"name": hook, "admissionReviewVersions": ["v1"],
                   "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
                   "clientConfig": {"service": {"namespace": NS, "name": service, "path": "/mutate"},
                                    "caBundle": STANDARD.encode(ca)},
                   "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                              "operations": ["CREATE"], "resources": ["configmaps"]}]}]}),
    )
    .await;
}

async fn create_cm(s: &TestServer, name: &str) -> common::Reply {
    s.request(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": name, "labels": {"app": "t"}}})),
    )
    .await
}

#[tokio::test]
async fn a_webhook_by_service_reference_reaches_the_endpoint_of_a_named_target_port() {
    let b = backend("virt-api").await;
    let s = TestServer::start().await;
    namespace(&s).await;
    service(&s, "virt-api", json!("webhooks")).await;
    slice(
        &s,
        "virt-api",
        "virt-api-x1",
        b.addr.port(),
        &[("127.0.0.1", true)],
    )
    .await;
    mutating_webhook(&s, "m.kubevirt.io", "virt-api", &b.ca_pem).await;

    let r = create_cm(&s, "c").await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let cm = r.json();
    assert_eq!(cm["metadata"]["labels"]["mutated"], "yes");
    // The request names the Service's host, as kube's does.
    assert_eq!(
        cm["metadata"]["annotations"]["seen-host"],
        "virt-api.kubevirt.svc:443"
    );
}

#[tokio::test]
async fn not_ready_endpoints_are_skipped() {
    let b = backend("virt-api").await;
    let s = TestServer::start().await;
    namespace(&s).await;
    service(&s, "virt-api", json!(b.addr.port())).await;
    // Nothing listens on 127.0.0.2: a call routed there would fail the write.
    slice(
        &s,
        "virt-api",
        "virt-api-x1",
        b.addr.port(),
        &[("127.0.0.2", false), ("127.0.0.1", true)],
    )
    .await;
    mutating_webhook(&s, "m.kubevirt.io", "virt-api", &b.ca_pem).await;
    for i in 0..16 {
        let r = create_cm(&s, &format!("c{i}")).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["metadata"]["labels"]["mutated"], "yes");
    }
}

#[tokio::test]
async fn a_service_without_endpoints_or_without_existence_refuses_the_write_in_kubes_words() {
    let b = backend("virt-api").await;
    let s = TestServer::start().await;
    namespace(&s).await;
    service(&s, "virt-api", json!(8443)).await;
    // Only a not-ready endpoint: none available.
    slice(&s, "virt-api", "virt-api-x1", 8443, &[("127.0.0.1", false)]).await;
    mutating_webhook(&s, "m.kubevirt.io", "virt-api", &b.ca_pem).await;
    let r = create_cm(&s, "c").await;
    assert_eq!(r.status, 500, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["message"],
        "Internal error occurred: failed calling webhook \"m.kubevirt.io\": failed to call webhook: Post \"https://virt-api.kubevirt.svc:443/mutate?timeout=5s\": no endpoints available for service \"virt-api\""
    );

    let s = TestServer::start().await;
    namespace(&s).await;
    mutating_webhook(&s, "m.kubevirt.io", "virt-api", &b.ca_pem).await;
    let r = create_cm(&s, "c").await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.json()["message"],
        "Internal error occurred: failed calling webhook \"m.kubevirt.io\": failed to call webhook: Post \"https://virt-api.kubevirt.svc:443/mutate?timeout=5s\": service \"virt-api\" not found"
    );
}

#[tokio::test]
async fn a_certificate_for_another_service_is_refused() {
    let b = backend("other").await;
    let s = TestServer::start().await;
    namespace(&s).await;
    service(&s, "virt-api", json!(b.addr.port())).await;
    slice(
        &s,
        "virt-api",
        "virt-api-x1",
        b.addr.port(),
        &[("127.0.0.1", true)],
    )
    .await;
    mutating_webhook(&s, "m.kubevirt.io", "virt-api", &b.ca_pem).await;
    let r = create_cm(&s, "c").await;
    assert_eq!(r.status, 500);
    let message = r.json()["message"].as_str().unwrap().to_owned();
    assert!(message.contains("tls: handshake"), "{message}");
}

#[tokio::test]
async fn an_apiservice_by_service_reference_is_proxied_to_a_ready_endpoint() {
    let b = backend("virt-api").await;
    let s = TestServer::start().await;
    namespace(&s).await;
    service(&s, "virt-api", json!(8443)).await;
    create(
        &s,
        "/apis/apiregistration.k8s.io/v1/apiservices",
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
               "metadata": {"name": "v1.subresources.kubevirt.io"},
               "spec": {"group": "subresources.kubevirt.io", "version": "v1",
                        "groupPriorityMinimum": 1000, "versionPriority": 15,
                        "service": {"namespace": NS, "name": "virt-api", "port": 443},
                        "caBundle": STANDARD.encode(&b.ca_pem)}}),
    )
    .await;
    let r = s.request("GET", GV, None).await;
    assert_eq!(r.status, 503, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        String::from_utf8_lossy(&r.body)
            .contains("no endpoints available for service \\\"virt-api\\\""),
        "{}",
        String::from_utf8_lossy(&r.body)
    );

    slice(
        &s,
        "virt-api",
        "virt-api-x1",
        b.addr.port(),
        &[("127.0.0.2", false), ("127.0.0.1", true)],
    )
    .await;
    for _ in 0..8 {
        let r = s.request("GET", GV, None).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(
            r.json()["resources"][0]["name"],
            "virtualmachineinstances/console"
        );
    }
}
