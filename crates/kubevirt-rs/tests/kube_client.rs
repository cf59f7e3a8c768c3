//! kube-rs conformance: the real `kube::Client` and `kube::runtime::watcher` against the
//! embedded API server started in-process, including a watch resumed across a forced
//! 410 Gone (history compacted while the server was down), and service-account tokens as
//! the node agent will request them.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testkit::InProcessCluster;
use tokio::sync::mpsc;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

/// The next watcher event naming `name` (Apply/InitApply), at most 30 s away.
async fn seen(rx: &mut mpsc::UnboundedReceiver<watcher::Event<ConfigMap>>, name: &str) -> bool {
    let wait = async {
        while let Some(ev) = rx.recv().await {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = ev
                && o.metadata.name.as_deref() == Some(name)
            {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_client_crud_and_watcher_survive_a_forced_410() {
    let mut cluster = InProcessCluster::start_without_crds().await.unwrap();
    let client = cluster.client.clone();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    // CRUD.
    let created = cms
        .create(&PostParams::default(), &cm("one"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    let got = cms.get("one").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
    let patched = cms
        .patch(
            "one",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["k"], "w");
    let mut stale = created.clone();
    stale.data = None;
    let err = cms
        .replace("one", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );
    cms.delete("one", &DeleteParams::default()).await.unwrap();
    let err = cms.get("one").await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err:?}"
    );

    // A watcher that follows the default namespace.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let w = cms.clone();
    let watch_task = tokio::spawn(async move {
        let mut stream = watcher(w, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(ev) = ev
                && tx.send(ev).is_err()
            {
                break;
            }
        }
    });
    cms.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    assert!(
        seen(&mut rx, "before").await,
        "watcher saw the first object"
    );

    // Writes the watcher does not see, then compaction: its resourceVersion is now too old.
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    other
        .create(&PostParams::default(), &cm("elsewhere"))
        .await
        .unwrap();
    let store = cluster.server().unwrap().state.store.clone();
    store
        .compact_storage(store.current_revision())
        .await
        .unwrap();
    drop(store);
    // Restart on the same address: the watcher reconnects with its old resourceVersion,
    // gets 410 Gone, re-lists and keeps delivering.
    cluster.restart().await.unwrap();
    assert!(seen(&mut rx, "before").await, "re-listed after the 410");
    cms.create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    assert!(
        seen(&mut rx, "after").await,
        "watcher delivers after the re-list"
    );

    watch_task.abort();
}

fn owned(name: &str, owner: &ConfigMap, block: bool) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
        "uid": owner.metadata.uid, "blockOwnerDeletion": block}]}}))
    .unwrap()
}

/// Waits (watch-driven, at most 30 s) until object `name` with `uid` is gone.
async fn gone(api: &Api<ConfigMap>, name: &str, uid: &str) {
    let cond = kube::runtime::wait::conditions::is_deleted(uid);
    tokio::time::timeout(
        Duration::from_secs(30),
        kube::runtime::wait::await_condition(api.clone(), name, cond),
    )
    .await
    .expect("deleted in time")
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_propagation_policies_behave_as_on_kube() {
    let cluster = InProcessCluster::start_without_crds().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), "default");
    let pp = PostParams::default();
    let uid = |c: &ConfigMap| c.metadata.uid.clone().unwrap();

    // Background: the owner goes at once, the dependent after it.
    let owner = cms.create(&pp, &cm("bg-owner")).await.unwrap();
    let dep = cms
        .create(&pp, &owned("bg-dep", &owner, false))
        .await
        .unwrap();
    cms.delete("bg-owner", &DeleteParams::background())
        .await
        .unwrap();
    gone(&cms, "bg-dep", &uid(&dep)).await;

    // Orphan: the dependent stays, without its owner reference.
    let owner = cms.create(&pp, &cm("or-owner")).await.unwrap();
    cms.create(&pp, &owned("or-dep", &owner, true))
        .await
        .unwrap();
    cms.delete("or-owner", &DeleteParams::orphan())
        .await
        .unwrap();
    gone(&cms, "or-owner", &uid(&owner)).await;
    let kept = cms.get("or-dep").await.unwrap();
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // Foreground: the owner is marked, its blocking dependent goes first, then the owner.
    let owner = cms.create(&pp, &cm("fg-owner")).await.unwrap();
    cms.create(&pp, &owned("fg-dep", &owner, true))
        .await
        .unwrap();
    let marked = cms
        .delete("fg-owner", &DeleteParams::foreground())
        .await
        .unwrap();
    if let Some(o) = marked.left() {
        assert!(o.metadata.deletion_timestamp.is_some());
        assert!(
            o.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&"foregroundDeletion".to_owned())
        );
    }
    gone(&cms, "fg-owner", &uid(&owner)).await;
    assert!(cms.get_opt("fg-dep").await.unwrap().is_none());
}

/// What the node agent does for a pod: kube-rs's `create_token_request` for the pod's
/// service account, bound to the pod; a client with only that token (as
/// `kube::Config::infer` builds in a pod) is the service account, until the pod goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_bound_token_from_kube_rs_authenticates_as_the_service_account() {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};

    let cluster = InProcessCluster::start_without_crds().await.unwrap();
    let client = cluster.client.clone();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sas.get_opt("default").await.unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no default account");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }))
    .unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3607),
            bound_object_ref: Some(BoundObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let issued = sas
        .create_token_request("default", &PostParams::default(), &request)
        .await
        .unwrap();
    let token = issued.status.unwrap().token;

    let server = cluster.server().unwrap();
    let ca = std::fs::read_to_string(cluster.data_dir().join("apiserver/pki/ca.crt")).unwrap();
    let path = cluster.data_dir().join("kubeconfig-pod");
    std::fs::write(
        &path,
        kubevirt_apiserver::pki::kubeconfig_yaml(
            &format!("https://{}", server.addr),
            &ca,
            "pod",
            kubevirt_apiserver::pki::KubeAuth::Token(&token),
        ),
    )
    .unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&path).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let as_pod = kube::Client::try_from(config).unwrap();
    let reviews: Api<SelfSubjectReview> = Api::all(as_pod.clone());
    let who = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let info = who.status.unwrap().user_info.unwrap();
    assert_eq!(
        info.username.as_deref(),
        Some("system:serviceaccount:default:default")
    );
    let extra = info.extra.unwrap();
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        ["p".to_owned()]
    );

    pods.delete("p", &DeleteParams::default()).await.unwrap();
    let err = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 401),
        "{err}"
    );
}
