//! The `scale` subresource of built-in workloads and of CRDs that declare it.

mod common;

use common::TestServer;
use serde_json::json;

#[tokio::test]
async fn deployment_scale_reads_and_changes_spec_replicas() {
    let s = TestServer::start().await;
    let deployments = "/apis/apps/v1/namespaces/default/deployments";
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    assert_eq!(s.request("POST", deployments, Some(&d)).await.status, 201);
    let scale = s
        .request("GET", &format!("{deployments}/web/scale"), None)
        .await
        .json();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["selector"], "app=web");

    let mut put = scale.clone();
    put["spec"]["replicas"] = json!(5);
    let r = s
        .request("PUT", &format!("{deployments}/web/scale"), Some(&put))
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["spec"]["replicas"], 5);
    // The stale resourceVersion of the first Scale conflicts.
    let r = s
        .request("PUT", &format!("{deployments}/web/scale"), Some(&put))
        .await;
    assert_eq!(r.status, 409);

    let r = s
        .request_with(
            "PATCH",
            &format!("{deployments}/web/scale"),
            Some(&json!({"spec": {"replicas": 3}})),
            "application/merge-patch+json",
            &[],
        )
        .await;
    assert_eq!(r.status, 200);
    let dep = s
        .request("GET", &format!("{deployments}/web"), None)
        .await
        .json();
    assert_eq!(dep["spec"]["replicas"], 3);
    assert_eq!(dep["metadata"]["generation"], 3);
}

#[tokio::test]
async fn a_crd_with_a_scale_subresource_serves_and_advertises_it() {
    let s = TestServer::start().await;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "pools.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "pools", "singular": "pool", "kind": "Pool", "listKind": "PoolList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size",
                    "statusReplicasPath": ".status.ready", "labelSelectorPath": ".status.selector"}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                    "status": {"type": "object", "properties": {
                        "ready": {"type": "integer"}, "selector": {"type": "string"}}}}}}}]}});
    let r = s
        .request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            Some(&crd),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let pools = "/apis/example.com/v1/namespaces/default/pools";
    let p = json!({"apiVersion": "example.com/v1", "kind": "Pool", "metadata": {"name": "p"}, "spec": {"size": 1}});
    assert_eq!(s.request("POST", pools, Some(&p)).await.status, 201);
    let mut got = s.request("GET", &format!("{pools}/p"), None).await.json();
    got["status"] = json!({"ready": 1, "selector": "pool=p"});
    assert_eq!(
        s.request("PUT", &format!("{pools}/p/status"), Some(&got))
            .await
            .status,
        200
    );
    let scale = s
        .request("GET", &format!("{pools}/p/scale"), None)
        .await
        .json();
    assert_eq!(scale["spec"]["replicas"], 1);
    assert_eq!(scale["status"]["replicas"], 1);
    assert_eq!(scale["status"]["selector"], "pool=p");
    let r = s
        .request_with(
            "PATCH",
            &format!("{pools}/p/scale"),
            Some(&json!([{"op": "replace", "path": "/spec/replicas", "value": 4}])),
            "application/json-patch+json",
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let pool = s.request("GET", &format!("{pools}/p"), None).await.json();
    assert_eq!(pool["spec"]["size"], 4);
    let list = s.request("GET", "/apis/example.com/v1", None).await.json();
    assert!(
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "pools/scale" && r["kind"] == "Scale")
    );
}
