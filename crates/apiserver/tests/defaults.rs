//! Built-in kinds are defaulted as kube-apiserver defaults them, on create and update,
//! before admission webhooks see them.

mod common;

use axum::Json;
use axum::Router;
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use common::{Backend, TestServer};
use serde_json::{Value, json};

const DS: &str = "/apis/apps/v1/namespaces/default/daemonsets";

fn daemon_set(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
           "metadata": {"name": name},
           "spec": {"selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}},
                                 "spec": {"containers": [{"name": "c", "image": "registry.example/agent:v1"}]}}}})
}

#[tokio::test]
async fn a_daemonset_without_an_update_strategy_reads_back_kubes_defaults() {
    let s = TestServer::start().await;
    let r = s.request("POST", DS, Some(&daemon_set("agent"))).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let got = s.request("GET", &format!("{DS}/agent"), None).await.json();
    let spec = &got["spec"];
    assert_eq!(
        spec["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
    );
    assert_eq!(spec["revisionHistoryLimit"], 10);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Always");
    assert_eq!(pod["dnsPolicy"], "ClusterFirst");
    assert_eq!(pod["schedulerName"], "default-scheduler");
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    assert_eq!(pod["securityContext"], json!({}));
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert_eq!(pod["containers"][0]["terminationMessagePolicy"], "File");

    // An update that leaves the strategy out is defaulted again, not stored without it.
    let mut put = got.clone();
    put["spec"]
        .as_object_mut()
        .unwrap()
        .remove("updateStrategy");
    put["spec"]
        .as_object_mut()
        .unwrap()
        .remove("revisionHistoryLimit");
    let r = s.request("PUT", &format!("{DS}/agent"), Some(&put)).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(r.json()["spec"]["revisionHistoryLimit"], 10);
}

#[tokio::test]
async fn deployments_and_replicasets_get_replicas_and_a_rolling_update() {
    let s = TestServer::start().await;
    let template = json!({"metadata": {"labels": {"app": "w"}},
                          "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"},
                   "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": template}});
    let r = s
        .request(
            "POST",
            "/apis/apps/v1/namespaces/default/deployments",
            Some(&d),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let spec = &r.json()["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(
        spec["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
    );
    assert_eq!(spec["revisionHistoryLimit"], 10);
    assert_eq!(spec["progressDeadlineSeconds"], 600);
    assert_eq!(
        spec["template"]["spec"]["containers"][0]["imagePullPolicy"],
        "Always"
    );
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "w"},
                    "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": template}});
    let r = s
        .request(
            "POST",
            "/apis/apps/v1/namespaces/default/replicasets",
            Some(&rs),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["spec"]["replicas"], 1);
    assert_eq!(
        r.json()["spec"]["template"]["spec"]["restartPolicy"],
        "Always"
    );
}

/// Labels the object with the update strategy it was sent with.
async fn record_strategy(Json(review): Json<Value>) -> Json<Value> {
    let seen = review["request"]["object"]["spec"]["updateStrategy"]["type"]
        .as_str()
        .unwrap_or("none")
        .to_owned();
    let patch =
        json!([{"op": "add", "path": "/metadata/labels", "value": {"seen-strategy": seen}}]);
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": true,
                     "patchType": "JSONPatch", "patch": STANDARD.encode(patch.to_string())}}),
    )
}

#[tokio::test]
async fn mutating_webhooks_see_the_defaulted_object() {
    let b = Backend::start(Router::new().route("/mutate", post(record_strategy))).await;
    let s = TestServer::start().await;
    let cfg = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration", "metadata": {"name": "m"},
        "webhooks": [{"name": "m.test.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": b.url("/mutate"), "caBundle": STANDARD.encode(&b.ca_pem)},
            "rules": [{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["daemonsets"]}]}]});
    let r = s
        .request(
            "POST",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
            Some(&cfg),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let r = s.request("POST", DS, Some(&daemon_set("agent"))).await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json()["metadata"]["labels"]["seen-strategy"],
        "RollingUpdate"
    );
}

#[tokio::test]
async fn a_created_pod_reads_back_the_qos_class_of_its_defaulted_resources() {
    let s = TestServer::start().await;
    let pods = "/api/v1/namespaces/default/pods";
    let cases = [
        ("none", json!({}), "BestEffort"),
        (
            "requests",
            json!({"requests": {"memory": "64Mi"}}),
            "Burstable",
        ),
        // Requests default to the limits first, so limits alone are Guaranteed.
        (
            "limits",
            json!({"limits": {"cpu": "1", "memory": "64Mi"}}),
            "Guaranteed",
        ),
    ];
    for (name, resources, want) in cases {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                         "spec": {"containers": [{"name": "c", "image": "registry.example/app:v1",
                                                  "resources": resources}]}});
        let r = s.request("POST", pods, Some(&pod)).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        let got = s
            .request("GET", &format!("{pods}/{name}"), None)
            .await
            .json();
        assert_eq!(got["status"]["qosClass"], want, "{name}");
        assert_eq!(got["status"]["phase"], "Pending", "{name}");
    }
}
