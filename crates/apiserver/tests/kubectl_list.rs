//! The real kubectl against the server: `kubectl create -f` of a `v1` `List` (what `kubectl
//! get -o json` prints for several objects) passes kubectl's client-side validation, as
//! against kube-apiserver; unknown fields of a built-in kind are refused or warned about as
//! kube-apiserver does. Skipped when kubectl is not installed.

mod common;

use common::{TestServer, kubectl};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_the_items_of_a_v1_list_with_client_side_validation() {
    if test_prerequisites::available(test_prerequisites::command("kubectl", "kubernetes-client"))
        .is_none()
    {
        return;
    }
    let s = TestServer::start().await;
    let cm = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "default"}, "data": {"k": name}})
    };
    let list = json!({
        "apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
        "items": [cm("first"), cm("second")]
    });
    let file = s.dir.path().join("list.json");
    std::fs::write(&file, serde_json::to_vec(&list).unwrap()).unwrap();
    let file = file.to_string_lossy().into_owned();
    // `kubectl create` validates by default (strict): a List has no PATCH operation in
    // `/openapi/v3/api/v1`, so kubectl checks it against `/openapi/v2` instead.
    let admin = s.server.kubeconfig.clone();
    let (code, out, err) = kubectl(admin.clone(), &["create", "-f", &file]).await;
    assert_eq!(code, 0, "kubectl create -f list: {err}");
    assert!(out.contains("configmap/first created"), "{out}");
    assert!(out.contains("configmap/second created"), "{out}");
    for name in ["first", "second"] {
        let got = s
            .request(
                "GET",
                &format!("/api/v1/namespaces/default/configmaps/{name}"),
                None,
            )
            .await;
        assert_eq!(got.status, 200);
        assert_eq!(got.json()["data"]["k"], name);
    }
    // `--validate=strict` (the default spelled out) and `apply` of the same List work too.
    let (code, out, err) = kubectl(admin, &["apply", "--validate=strict", "-f", &file]).await;
    assert_eq!(code, 0, "kubectl apply -f list: {err}");
    assert!(out.contains("configmap/first"), "{out}");
    s.stop().await;
}

/// `fieldValidation` for built-in kinds, as kube-apiserver answers it: `kubectl apply` (strict
/// by default) of a Deployment with a misspelt field is refused with the field's path and
/// nothing is stored; with `--validate=warn` kubectl prints the server's warning and the
/// object is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_of_a_built_in_kind_are_refused_or_warned_about() {
    if test_prerequisites::available(test_prerequisites::command("kubectl", "kubernetes-client"))
        .is_none()
    {
        return;
    }
    let s = TestServer::start().await;
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "replica": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolcy": "Always"}]}}
        }
    });
    let file = s.dir.path().join("deployment.json");
    std::fs::write(&file, serde_json::to_vec(&deployment).unwrap()).unwrap();
    let file = file.to_string_lossy().into_owned();
    let admin = s.server.kubeconfig.clone();
    let (code, _, err) = kubectl(admin.clone(), &["apply", "-f", &file]).await;
    assert_ne!(code, 0, "a strict apply of unknown fields succeeded");
    assert!(
        err.contains(r#"strict decoding error: unknown field "spec.replica""#)
            && err.contains(r#"unknown field "spec.template.spec.containers[0].imagePullPolcy""#),
        "{err}"
    );
    let path = "/apis/apps/v1/namespaces/default/deployments/web";
    assert_eq!(
        s.request("GET", path, None).await.status,
        404,
        "nothing stored"
    );
    let (code, out, err) = kubectl(admin, &["apply", "--validate=warn", "-f", &file]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("deployment.apps/web created"), "{out}");
    assert!(
        err.contains(r#"Warning: unknown field "spec.replica""#),
        "{err}"
    );
    s.stop().await;
}
