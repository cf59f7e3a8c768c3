//! Admission webhooks called by the API server over HTTPS (an in-test webhook server).

mod common;

use axum::Json;
use axum::Router;
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::{Backend, TestServer};
use serde_json::{Value, json};

fn allow(review: &Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
           "response": {"uid": review["request"]["uid"], "allowed": true}})
}

async fn mutate(Json(review): Json<Value>) -> Json<Value> {
    let mut out = allow(&review);
    let patch = json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]);
    out["response"]["patchType"] = json!("JSONPatch");
    out["response"]["patch"] = json!(STANDARD.encode(patch.to_string()));
    out["response"]["warnings"] = json!(["mutated by the test webhook"]);
    Json(out)
}

async fn deny(Json(review): Json<Value>) -> Json<Value> {
    let req = &review["request"];
    let name = req["name"].as_str().unwrap_or("");
    // The mutating webhook ran first: the object carries its label.
    let mutated = req["object"]["metadata"]["labels"]["mutated"] == "yes";
    if !name.starts_with("bad") && (mutated || req["operation"] == "DELETE") {
        return Json(allow(&review));
    }
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": req["uid"], "allowed": false, "status": {
            "code": 422, "reason": "Invalid", "status": "Failure",
            "message": "ConfigMap \"bad\" is invalid: data.x: Invalid value: \"1\": not allowed",
            "details": {"name": name, "kind": "ConfigMap", "causes": [
                {"reason": "FieldValueInvalid", "field": "data.x", "message": "Invalid value: \"1\": not allowed"}]}}}}),
    )
}

/// Answers with a patch that replaces the whole object with a string.
async fn replace_root(Json(review): Json<Value>) -> Json<Value> {
    let mut out = allow(&review);
    let patch = json!([{"op": "replace", "path": "", "value": "not an object"}]);
    out["response"]["patchType"] = json!("JSONPatch");
    out["response"]["patch"] = json!(STANDARD.encode(patch.to_string()));
    Json(out)
}

async fn never() -> Json<Value> {
    std::future::pending::<()>().await;
    Json(Value::Null)
}

fn hook(name: &str, url: &str, ca: &str, policy: &str, timeout: u64, resources: &[&str]) -> Value {
    json!({
        "name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
        "failurePolicy": policy, "timeoutSeconds": timeout,
        "clientConfig": {"url": url, "caBundle": STANDARD.encode(ca)},
        "objectSelector": {"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                   "resources": resources}],
    })
}

async fn configure(s: &TestServer, kind: &str, name: &str, hooks: Vec<Value>) {
    let plural = format!("{}s", kind.to_lowercase());
    let r = s
        .request(
            "POST",
            &format!("/apis/admissionregistration.k8s.io/v1/{plural}"),
            Some(
                &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                        "metadata": {"name": name}, "webhooks": hooks}),
            ),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
}

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "labels": {"app": "t"}}, "data": {"x": "1"}})
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn mutating_then_validating_webhooks_shape_and_refuse_writes() {
    let backend = Backend::start(
        Router::new()
            .route("/mutate", post(mutate))
            .route("/validate", post(deny)),
    )
    .await;
    let s = TestServer::start().await;
    let ca = backend.ca_pem.clone();
    configure(
        &s,
        "MutatingWebhookConfiguration",
        "m",
        vec![hook(
            "m.test.io",
            &backend.url("/mutate"),
            &ca,
            "Fail",
            5,
            &["configmaps"],
        )],
    )
    .await;
    configure(
        &s,
        "ValidatingWebhookConfiguration",
        "v",
        vec![hook(
            "v.test.io",
            &backend.url("/validate"),
            &ca,
            "Fail",
            5,
            &["configmaps"],
        )],
    )
    .await;

    let ok = s.request("POST", CMS, Some(&cm("good"))).await;
    assert_eq!(ok.status, 201, "{}", String::from_utf8_lossy(&ok.body));
    assert_eq!(ok.json()["metadata"]["labels"]["mutated"], "yes");
    let warning = ok.headers.get("warning").unwrap().to_str().unwrap();
    assert_eq!(warning, "299 - \"mutated by the test webhook\"");
    let stored = s.request("GET", &format!("{CMS}/good"), None).await.json();
    assert_eq!(stored["metadata"]["labels"]["mutated"], "yes");

    let bad = s.request("POST", CMS, Some(&cm("bad"))).await;
    assert_eq!(bad.status, 422);
    let st = bad.json();
    assert_eq!(st["reason"], "Invalid");
    assert_eq!(st["details"]["causes"][0]["field"], "data.x");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .starts_with("admission webhook \"v.test.io\" denied the request: ")
    );
    assert_eq!(
        s.request("GET", &format!("{CMS}/bad"), None).await.status,
        404
    );

    // Objects outside the objectSelector are not sent.
    let mut skipped = cm("bad-but-skipped");
    skipped["metadata"]["labels"]["skip"] = json!("1");
    assert_eq!(s.request("POST", CMS, Some(&skipped)).await.status, 201);
}

#[tokio::test]
async fn an_unreachable_webhook_fails_closed_or_is_ignored_by_its_failure_policy() {
    let s = TestServer::start().await;
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("https://127.0.0.1:{port}/validate");
    configure(
        &s,
        "ValidatingWebhookConfiguration",
        "ignored",
        vec![hook(
            "ignored.test.io",
            &url,
            "",
            "Ignore",
            2,
            &["configmaps"],
        )],
    )
    .await;
    configure(
        &s,
        "ValidatingWebhookConfiguration",
        "failing",
        vec![hook("failing.test.io", &url, "", "Fail", 2, &["secrets"])],
    )
    .await;
    assert_eq!(s.request("POST", CMS, Some(&cm("c"))).await.status, 201);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
    let r = s
        .request("POST", "/api/v1/namespaces/default/secrets", Some(&secret))
        .await;
    assert_eq!(r.status, 500);
    let msg = r.json()["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("failed calling webhook \"failing.test.io\""),
        "{msg}"
    );
}

#[tokio::test]
async fn a_webhook_that_does_not_answer_in_time_refuses_the_write() {
    let backend = Backend::start(Router::new().route("/slow", post(never))).await;
    let s = TestServer::start().await;
    configure(
        &s,
        "ValidatingWebhookConfiguration",
        "slow",
        vec![hook(
            "slow.test.io",
            &backend.url("/slow"),
            &backend.ca_pem,
            "Fail",
            1,
            &["configmaps"],
        )],
    )
    .await;
    let r = s.request("POST", CMS, Some(&cm("c"))).await;
    assert_eq!(r.status, 500);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("context deadline exceeded")
    );
}

#[tokio::test]
async fn status_updates_reach_only_webhooks_whose_rules_name_status() {
    let backend = Backend::start(Router::new().route("/validate", post(deny))).await;
    let s = TestServer::start().await;
    // Denies every update of pods (objects are not labelled by a mutating webhook here).
    configure(
        &s,
        "ValidatingWebhookConfiguration",
        "v",
        vec![hook(
            "v.test.io",
            &backend.url("/validate"),
            &backend.ca_pem,
            "Fail",
            5,
            &["pods/status"],
        )],
    )
    .await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let pods = "/api/v1/namespaces/default/pods";
    assert_eq!(s.request("POST", pods, Some(&pod)).await.status, 201);
    let mut got = s.request("GET", &format!("{pods}/p"), None).await.json();
    got["status"]["phase"] = json!("Running");
    let r = s
        .request("PUT", &format!("{pods}/p/status"), Some(&got))
        .await;
    assert_eq!(r.status, 422, "status updates go to pods/status webhooks");
    got["metadata"]["labels"] = json!({"a": "b"});
    let r = s.request("PUT", &format!("{pods}/p"), Some(&got)).await;
    assert_eq!(
        r.status, 200,
        "the main resource is not covered by pods/status"
    );
}

#[tokio::test]
async fn a_mutating_patch_that_replaces_the_object_with_a_string_fails_and_stores_nothing() {
    let backend = Backend::start(Router::new().route("/mutate", post(replace_root))).await;
    let s = TestServer::start().await;
    let mut existing = cm("existing");
    existing["metadata"]["labels"]["skip"] = json!("1");
    assert_eq!(s.request("POST", CMS, Some(&existing)).await.status, 201);
    configure(
        &s,
        "MutatingWebhookConfiguration",
        "m",
        vec![hook(
            "root.test.io",
            &backend.url("/mutate"),
            &backend.ca_pem,
            "Fail",
            5,
            &["configmaps"],
        )],
    )
    .await;
    let r = s.request("POST", CMS, Some(&cm("c"))).await;
    assert_eq!(r.status, 500, "{}", String::from_utf8_lossy(&r.body));
    let st = r.json();
    assert_eq!(st["kind"], "Status");
    assert_eq!(st["reason"], "InternalError");
    assert_eq!(
        st["message"],
        "Internal error occurred: failed calling webhook \"root.test.io\": the patched object is not a JSON object"
    );
    assert_eq!(
        s.request("GET", &format!("{CMS}/c"), None).await.status,
        404
    );

    // An update of an object the webhook now sees (the skip label removed) fails the same way.
    let mut got = s
        .request("GET", &format!("{CMS}/existing"), None)
        .await
        .json();
    got["metadata"]["labels"] = json!({"app": "t"});
    let r = s
        .request("PUT", &format!("{CMS}/existing"), Some(&got))
        .await;
    assert_eq!(r.status, 500, "{}", String::from_utf8_lossy(&r.body));
    let after = s
        .request("GET", &format!("{CMS}/existing"), None)
        .await
        .json();
    assert_eq!(after["metadata"]["labels"]["skip"], "1", "nothing stored");
}

#[tokio::test]
async fn repeated_writes_reuse_one_connection_to_the_webhook() {
    let backend = Backend::start(Router::new().route("/mutate", post(mutate))).await;
    let s = TestServer::start().await;
    let mut only_ours = hook(
        "m.test.io",
        &backend.url("/mutate"),
        &backend.ca_pem,
        "Fail",
        5,
        &["configmaps"],
    );
    // Not the server's own `kube-root-ca.crt` ConfigMaps, written meanwhile.
    only_ours["objectSelector"] = json!({"matchLabels": {"app": "t"}});
    configure(&s, "MutatingWebhookConfiguration", "m", vec![only_ours]).await;
    let connections = || {
        backend
            .connections
            .load(std::sync::atomic::Ordering::SeqCst)
    };
    let before = connections();
    for i in 0..5 {
        let name = format!("c{i}");
        let r = s
            .request(
                "POST",
                "/api/v1/namespaces/default/configmaps",
                Some(&cm(&name)),
            )
            .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        // The webhook saw and shaped every one of them.
        assert_eq!(r.json()["metadata"]["labels"]["mutated"], "yes", "{name}");
    }
    assert_eq!(
        connections() - before,
        1,
        "five calls, one kept-alive connection"
    );
}
