//! The PV controller and the local provisioner against a real API server: pre-created
//! volumes bound as kube's binder binds them, `Immediate` local claims provisioned at once,
//! reclaim policies, and a volume the provisioner did not make never deleted from disk.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const DEADLINE: Duration = Duration::from_secs(30);

struct Harness {
    cluster: testkit::InProcessCluster,
    cancel: CancellationToken,
    storage: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Harness {
    async fn start() -> Harness {
        let cluster = testkit::InProcessCluster::start_without_crds()
            .await
            .expect("API server");
        let storage = tempfile::tempdir().expect("tempdir");
        let client = cluster.client.clone();
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}}),
        )
        .expect("node");
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
        let cancel = CancellationToken::new();
        let config = kubevirt_controller_manager::Config {
            local_storage: kubevirt_controller_manager::volume::LocalStorage {
                node_path: PathBuf::from("/opt/local-path-provisioner"),
                nodes: [("n1".to_owned(), storage.path().join("n1"))].into(),
            },
            ..kubevirt_controller_manager::Config::default()
        };
        tokio::spawn(kubevirt_controller_manager::run(
            client,
            config,
            cancel.clone(),
        ));
        Harness {
            cluster,
            cancel,
            storage,
        }
    }

    fn client(&self) -> kube::Client {
        self.cluster.client.clone()
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client(), NS)
    }

    fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client())
    }

    async fn create<K>(&self, api: &Api<K>, object: serde_json::Value)
    where
        K: kube::Resource
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let object: K = serde_json::from_value(object).expect("object");
        api.create(&PostParams::default(), &object)
            .await
            .expect("create");
    }
}

/// Polls `check` until it gives `Some`, or panics after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn claim(name: &str, class: &str, size: &str) -> serde_json::Value {
    json!({"metadata": {"name": name, "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "resources": {"requests": {"storage": size}}}})
}

fn host_volume(name: &str, size: &str, path: &Path, policy: &str) -> serde_json::Value {
    json!({"metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
            "capacity": {"storage": size}, "hostPath": {"path": path},
            "persistentVolumeReclaimPolicy": policy}})
}

/// (claim phase, volumeName) and (volume phase, claimRef name) once the claim is bound.
async fn bound(h: &Harness, claim: &str) -> (PersistentVolumeClaim, PersistentVolume) {
    eventually(&format!("claim {claim} to be bound"), || async {
        let c = h.claims().get(claim).await.ok()?;
        let phase = c.status.as_ref()?.phase.as_deref()?;
        let name = c.spec.as_ref()?.volume_name.clone()?;
        let v = h.volumes().get(&name).await.ok()?;
        let v_phase = v.status.as_ref()?.phase.as_deref()?;
        (phase == "Bound" && v_phase == "Bound").then_some((c, v))
    })
    .await
}

fn phase_of(v: &PersistentVolume) -> Option<&str> {
    v.status.as_ref()?.phase.as_deref()
}

#[tokio::test]
async fn a_claim_binds_the_smallest_matching_volume_and_releases_it_when_deleted() {
    let h = Harness::start().await;
    let dir = h.storage.path().join("manual");
    for (name, size) in [("big", "10Gi"), ("small", "2Gi"), ("tiny", "100Mi")] {
        h.create(
            &h.volumes(),
            host_volume(name, size, &dir.join(name), "Retain"),
        )
        .await;
    }
    h.create(&h.claims(), claim("data", "manual", "1Gi")).await;
    let (c, v) = bound(&h, "data").await;
    assert_eq!(v.metadata.name.as_deref(), Some("small"));
    let annotations = c.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("pv.kubernetes.io/bind-completed")
            .map(String::as_str),
        Some("yes")
    );
    assert_eq!(
        annotations
            .get("pv.kubernetes.io/bound-by-controller")
            .map(String::as_str),
        Some("yes")
    );
    let status = c.status.clone().unwrap_or_default();
    assert_eq!(
        status
            .capacity
            .and_then(|c| c.get("storage").cloned())
            .map(|q| q.0),
        Some("2Gi".to_owned())
    );
    let reference = v
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.clone())
        .unwrap_or_default();
    assert_eq!(reference.uid, c.metadata.uid);
    for other in ["big", "tiny"] {
        let o = h.volumes().get(other).await.expect("volume");
        assert_eq!(phase_of(&o), Some("Available"), "{other}");
    }
    h.claims()
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    eventually("the volume to be released", || async {
        let v = h.volumes().get("small").await.ok()?;
        (phase_of(&v) == Some("Released")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_immediate_local_claim_is_provisioned_at_once_and_deleted_with_its_directory() {
    let h = Harness::start().await;
    h.create(
        &Api::<StorageClass>::all(h.client()),
        json!({"metadata": {"name": "now"}, "provisioner": "kubevirt-rs.io/local",
            "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}),
    )
    .await;
    h.create(&h.claims(), claim("fast", "now", "64Mi")).await;
    let (c, v) = bound(&h, "fast").await;
    let uid = c.metadata.uid.clone().unwrap_or_default();
    assert_eq!(v.metadata.name, Some(format!("pvc-{uid}")));
    let dir = h.storage.path().join("n1").join(format!("pvc-{uid}"));
    assert!(dir.is_dir());
    std::fs::write(dir.join("data"), b"x").expect("write");
    let annotations = c.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("volume.kubernetes.io/storage-provisioner")
            .map(String::as_str),
        Some("kubevirt-rs.io/local")
    );
    h.claims()
        .delete("fast", &DeleteParams::default())
        .await
        .expect("delete claim");
    let name = format!("pvc-{uid}");
    eventually("the volume and its directory to be deleted", || async {
        let gone = h.volumes().get_opt(&name).await.ok()?.is_none();
        (gone && !dir.exists()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_deleted_claim_never_deletes_a_directory_the_provisioner_did_not_make() {
    let h = Harness::start().await;
    let precious = h.storage.path().join("precious");
    std::fs::create_dir_all(&precious).expect("dir");
    std::fs::write(precious.join("keep"), b"x").expect("write");
    h.create(
        &h.volumes(),
        host_volume("mine", "1Gi", &precious, "Delete"),
    )
    .await;
    h.create(&h.claims(), claim("data", "manual", "1Gi")).await;
    bound(&h, "data").await;
    h.claims()
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    let message = eventually("the volume to fail", || async {
        let v = h.volumes().get("mine").await.ok()?;
        let status = v.status?;
        (status.phase.as_deref() == Some("Failed")).then_some(status.message.unwrap_or_default())
    })
    .await;
    assert_eq!(
        message,
        "error getting deleter volume plugin for volume \"mine\": no deletable volume plugin matched"
    );
    assert!(precious.join("keep").exists());
    // A forged annotation does not help: the path is not the provisioner's.
    let patch = json!({"metadata": {"annotations": {"pv.kubernetes.io/provisioned-by": "kubevirt-rs.io/local"}}});
    h.volumes()
        .patch("mine", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
    let message = eventually("the deletion to be refused", || async {
        let v = h.volumes().get("mine").await.ok()?;
        let message = v.status?.message.unwrap_or_default();
        message.starts_with("Delete of volume").then_some(message)
    })
    .await;
    assert!(
        message.contains("not one the local provisioner gives"),
        "{message}"
    );
    assert!(precious.join("keep").exists());
}

#[tokio::test]
async fn a_claim_used_by_a_pod_is_deleted_only_once_the_pod_is_gone() {
    let h = Harness::start().await;
    h.create(&h.claims(), claim("data", "manual", "1Gi")).await;
    eventually("the claim to be protected", || async {
        let c = h.claims().get("data").await.ok()?;
        c.metadata
            .finalizers?
            .contains(&"kubernetes.io/pvc-protection".to_owned())
            .then_some(())
    })
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(h.client(), NS);
    h.create(
        &pods,
        json!({"metadata": {"name": "user", "namespace": NS},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}),
    )
    .await;
    h.claims()
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete claim");
    // Still there while the pod is: being deleted, its finalizer kept.
    let kept = eventually("the claim to be marked deleted", || async {
        let c = h.claims().get("data").await.ok()?;
        c.metadata.deletion_timestamp.is_some().then_some(c)
    })
    .await;
    assert!(kept.metadata.finalizers.is_some_and(|f| !f.is_empty()));
    pods.delete("user", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    eventually("the claim to be gone", || async {
        h.claims()
            .get_opt("data")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_claim_naming_its_volume_binds_it_and_one_naming_a_taken_volume_waits() {
    let h = Harness::start().await;
    let dir = h.storage.path().join("manual");
    h.create(
        &h.volumes(),
        host_volume("wanted", "5Gi", &dir.join("w"), "Retain"),
    )
    .await;
    let mut named = claim("first", "manual", "1Gi");
    named["spec"]["volumeName"] = json!("wanted");
    h.create(&h.claims(), named).await;
    let (c, v) = bound(&h, "first").await;
    assert_eq!(v.metadata.name.as_deref(), Some("wanted"));
    assert_eq!(
        c.metadata
            .annotations
            .unwrap_or_default()
            .get("pv.kubernetes.io/bound-by-controller"),
        None,
        "the user bound it"
    );
    let mut late = claim("second", "manual", "1Gi");
    late["spec"]["volumeName"] = json!("wanted");
    h.create(&h.claims(), late).await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(h.client(), NS);
    let message = eventually("the second claim to be refused", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.involved_object.name.as_deref() == Some("second")
                    && e.reason.as_deref() == Some("FailedBinding")
            })
            .and_then(|e| e.message)
    })
    .await;
    assert_eq!(
        message,
        "volume \"wanted\" already bound to a different claim."
    );
    let second = h.claims().get("second").await.expect("claim");
    assert_eq!(
        second.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
}
