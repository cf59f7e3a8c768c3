//! The node agent's API-backed volumes and in-cluster environment against a real API server:
//! configMap and secret items and modes, optional and missing sources, atomic updates,
//! refused item paths, downward-API files, and a container that reaches the API server with
//! its projected service-account token.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubevirt_node::images::{Image, ImageStore};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NODE: &str = "n1";
const TOOLS: &str = "example.com/tools:v1";
const KUBECTL: &str = "example.com/kubectl:v1";
const NS: &str = "default";

struct Node {
    tmp: tempfile::TempDir,
    _server: kubevirt_apiserver::RunningServer,
    client: kube::Client,
    cancel: CancellationToken,
    /// The pod network slot of a node whose pods have their own network.
    slot: Option<pod_network::PodNetworkSlot>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cancel.cancel();
        // Nothing a test starts outlives it: kill every recorded container group, release
        // the pods' networks, delete the bridge and the service proxy's table.
        testkit::kill_launchers(self.tmp.path());
        if let Some(slot) = self.slot.take() {
            let _ = pod_network::delete_bridge(&slot.bridge());
            let _ = kubevirt_service_proxy::remove_table(&kubevirt_service_proxy::table_name(
                &slot.bridge(),
            ));
        }
    }
}

/// Containers run in mount namespaces (every pod mounts its service-account volume).
fn root() -> Option<()> {
    test_prerequisites::available(if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err("mount namespaces need root".to_owned())
    })
}

/// A node whose pods share the host's network.
async fn start(kubectl: Option<PathBuf>) -> Node {
    start_with(kubectl, None).await
}

/// A node whose pods have their own network (a slot of the machine's allocator), with the
/// service proxy that routes the `kubernetes` Service on its bridge, as the server runs it.
async fn start_networked(kubectl: PathBuf) -> Node {
    let slot = pod_network::PodNetworkSlot::acquire(Path::new(pod_network::DEFAULT_LOCK_DIR))
        .expect("a pod network slot");
    start_with(Some(kubectl), Some(slot)).await
}

async fn start_with(kubectl: Option<PathBuf>, slot: Option<pod_network::PodNetworkSlot>) -> Node {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = kubevirt_apiserver::start(kubevirt_apiserver::Config {
        data_dir: tmp.path().join("apiserver"),
        listen: "127.0.0.1:0".parse().expect("addr"),
        initial_objects: vec![],
    })
    .await
    .expect("API server");
    let kubeconfig = kube::config::Kubeconfig::read_from(&server.kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let mut images = ImageStore::new();
    let path = vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())];
    images.insert(
        TOOLS,
        Image {
            programs: BTreeMap::from([("sh".to_owned(), PathBuf::from("/bin/sh"))]),
            entrypoint: vec!["sh".to_owned()],
            env: path.clone(),
        },
    );
    if let Some(kubectl) = kubectl {
        images.insert(
            KUBECTL,
            Image {
                programs: BTreeMap::from([("kubectl".to_owned(), kubectl)]),
                entrypoint: vec!["kubectl".to_owned()],
                env: path,
            },
        );
    }
    let cancel = CancellationToken::new();
    let pod_network = slot
        .as_ref()
        .map(kubevirt_node::PodNetworkConfig::from_slot);
    let kubernetes_service = match &pod_network {
        // Pods reach the API server where it listens.
        None => ("127.0.0.1".to_owned(), server.addr.port()),
        // Pods reach it through the kubernetes Service, routed by the proxy on their bridge.
        Some(network) => {
            tokio::spawn(kubevirt_service_proxy::run(
                client.clone(),
                kubevirt_service_proxy::ProxyConfig {
                    table: kubevirt_service_proxy::table_name(&network.bridge),
                    interfaces: vec![network.bridge.clone()],
                },
                cancel.clone(),
            ));
            (
                kubevirt_apiserver::services::kubernetes_service_ip().to_string(),
                443,
            )
        }
    };
    let config = kubevirt_node::NodeConfig {
        node_name: NODE.into(),
        data_dir: tmp.path().join("node"),
        images,
        host_ip: "127.0.0.1".into(),
        cluster_ca_pem: None,
        serving_cert: None,
        kubernetes_service: Some(kubernetes_service),
        pod_network,
        capacity_overrides: Default::default(),
        host_paths: Default::default(),
    };
    tokio::spawn(kubevirt_node::run_node(
        client.clone(),
        config,
        cancel.clone(),
    ));
    Node {
        tmp,
        _server: server,
        client,
        cancel,
        slot,
    }
}

impl Node {
    async fn create<K>(&self, object: serde_json::Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let object: K = serde_json::from_value(object).expect("object");
        Api::<K>::namespaced(self.client.clone(), NS)
            .create(&PostParams::default(), &object)
            .await
            .expect("create")
    }

    /// Polls the pod until `done` holds (or fails after a minute).
    async fn wait_for(&self, name: &str, what: &str, done: impl Fn(&Pod) -> bool) -> Pod {
        let api = Api::<Pod>::namespaced(self.client.clone(), NS);
        testkit::wait_until_async(Duration::from_secs(60), what, || {
            let (api, done) = (&api, &done);
            async move { api.get(name).await.ok().filter(|p| done(p)) }
        })
        .await
        .expect("the pod state")
    }

    fn pod_dir(&self, pod: &Pod) -> PathBuf {
        self.tmp
            .path()
            .join("node/pods")
            .join(pod.metadata.uid.as_deref().expect("uid"))
    }
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn waiting(pod: &Pod) -> Option<(String, String)> {
    let waiting = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .clone()?;
    Some((waiting.reason?, waiting.message.unwrap_or_default()))
}

/// A pod of one long-running container with `volumes`, without the service-account volume.
fn sleeper(
    name: &str,
    labels: &serde_json::Value,
    volumes: &serde_json::Value,
) -> serde_json::Value {
    json!({"metadata": {"name": name, "labels": labels, "annotations": {"note": "a\nb"}},
        "spec": {"nodeName": NODE, "restartPolicy": "Never", "automountServiceAccountToken": false,
        "volumes": volumes,
        "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "exec sleep 600"],
            "resources": {"limits": {"cpu": "250m", "memory": "64Mi"}}}]}})
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn config_map_and_secret_items_land_with_their_modes() {
    if root().is_none() {
        return;
    }
    let node = start(None).await;
    let _: ConfigMap = node
        .create(json!({"metadata": {"name": "app"}, "data": {"a": "1", "b": "2"}}))
        .await;
    let _: k8s_openapi::api::core::v1::Secret = node
        .create(json!({"metadata": {"name": "creds"}, "data": {"user": "YWRtaW4=", "pass": "czNjcjN0"}}))
        .await;
    let pod: Pod = node
        .create(sleeper(
            "items",
            &json!({}),
            &json!([
                {"name": "cfg", "configMap": {"name": "app", "defaultMode": 0o600,
                    "items": [{"key": "a", "path": "sub/first", "mode": 0o400}, {"key": "b", "path": "second"}]}},
                {"name": "sec", "secret": {"secretName": "creds"}},
            ]),
        ))
        .await;
    node.wait_for("items", "Running", |p| phase(p) == Some("Running"))
        .await;
    let volumes = node.pod_dir(&pod).join("volumes");
    let cfg = volumes.join("kubernetes.io~configmap/cfg");
    assert_eq!(read(&cfg.join("sub/first")), "1");
    assert_eq!(mode(&cfg.join("sub/first")), 0o400);
    assert_eq!(read(&cfg.join("second")), "2");
    assert_eq!(mode(&cfg.join("second")), 0o600);
    assert!(
        !cfg.join("a").exists(),
        "only the listed keys are projected"
    );
    assert_eq!(
        std::fs::read_link(cfg.join("sub")).expect("link"),
        Path::new("..data/sub")
    );
    let sec = volumes.join("kubernetes.io~secret/sec");
    assert_eq!(read(&sec.join("user")), "admin");
    assert_eq!(read(&sec.join("pass")), "s3cr3t");
    assert_eq!(mode(&sec.join("pass")), 0o644, "a secret's default mode");
}

#[tokio::test]
async fn a_container_sees_its_secret_read_only_and_takes_env_from_config_maps_and_secrets() {
    if root().is_none() {
        return;
    }
    let node = start(None).await;
    let _: ConfigMap = node
        .create(json!({"metadata": {"name": "app"}, "data": {"a": "1", "bad key": "x"}}))
        .await;
    let _: k8s_openapi::api::core::v1::Secret = node
        .create(json!({"metadata": {"name": "creds"}, "data": {"user": "YWRtaW4=", "pass": "czNjcjN0"}}))
        .await;
    // Mount paths of this test only: the container sees the volumes there, the host does not.
    let base = PathBuf::from(format!("/tmp/kvrs-node-vol-{}", std::process::id()));
    let script = r#"cat "$0/sec/user" > "$0/out/user"
if touch "$0/sec/x" 2>/dev/null; then echo rw; else echo ro; fi > "$0/out/mode"
echo "$APP_a $PASS ${APP_bad-unset} $KUBERNETES_SERVICE_HOST" > "$0/out/env""#;
    let pod: Pod = node
        .create(json!({"metadata": {"name": "reader"}, "spec": {"nodeName": NODE,
            "restartPolicy": "Never", "automountServiceAccountToken": false,
            "volumes": [{"name": "sec", "secret": {"secretName": "creds"}}, {"name": "out", "emptyDir": {}}],
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c"], "args": [script, base],
                "envFrom": [{"configMapRef": {"name": "app"}, "prefix": "APP_"}],
                "env": [{"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "pass"}}}],
                "volumeMounts": [{"name": "sec", "mountPath": base.join("sec")},
                                 {"name": "out", "mountPath": base.join("out")}]}]}}))
        .await;
    let done = node
        .wait_for("reader", "the container to end", |p| {
            matches!(phase(p), Some("Succeeded" | "Failed"))
        })
        .await;
    let out = node
        .pod_dir(&pod)
        .join("volumes/kubernetes.io~empty-dir/out");
    assert_eq!(phase(&done), Some("Succeeded"));
    assert_eq!(read(&out.join("user")), "admin");
    assert_eq!(
        read(&out.join("mode")),
        "ro\n",
        "secret volumes are read-only"
    );
    assert_eq!(read(&out.join("env")), "1 s3cr3t unset 127.0.0.1\n");
    let _ = std::fs::remove_dir(base.join("sec"));
    let _ = std::fs::remove_dir(base.join("out"));
    let _ = std::fs::remove_dir(&base);
}

#[tokio::test]
async fn env_from_a_missing_config_map_is_a_create_container_config_error() {
    let node = start(None).await;
    let pod: Pod = node
        .create(json!({"metadata": {"name": "noenv"}, "spec": {"nodeName": NODE,
            "restartPolicy": "Never", "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": TOOLS, "command": ["sh", "-c", "exit 0"],
                "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}},
                        {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": true}}}]}]}}))
        .await;
    let seen = node
        .wait_for("noenv", "CreateContainerConfigError", |p| {
            waiting(p).is_some()
        })
        .await;
    assert_eq!(
        waiting(&seen),
        Some((
            "CreateContainerConfigError".to_owned(),
            "configmap \"nope\" not found".to_owned()
        ))
    );
    assert!(
        !node.pod_dir(&pod).join("c.json").exists(),
        "nothing started"
    );
}

#[tokio::test]
async fn a_missing_source_keeps_the_pod_creating_until_it_exists_and_optional_ones_are_empty() {
    if root().is_none() {
        return;
    }
    let node = start(None).await;
    let pod: Pod = node
        .create(sleeper(
            "late",
            &json!({}),
            &json!([
                {"name": "cfg", "configMap": {"name": "later"}},
                {"name": "maybe", "secret": {"secretName": "never", "optional": true}},
            ]),
        ))
        .await;
    let expected = "MountVolume.SetUp failed for volume \"cfg\" : configmap \"later\" not found";
    let seen = node
        .wait_for("late", "ContainerCreating", |p| waiting(p).is_some())
        .await;
    assert_eq!(
        waiting(&seen),
        Some(("ContainerCreating".to_owned(), expected.to_owned()))
    );
    assert!(
        !node.pod_dir(&pod).join("c.json").exists(),
        "nothing started"
    );
    let _: ConfigMap = node
        .create(json!({"metadata": {"name": "later"}, "data": {"k": "v"}}))
        .await;
    node.wait_for("late", "Running once the configMap exists", |p| {
        phase(p) == Some("Running")
    })
    .await;
    let volumes = node.pod_dir(&pod).join("volumes");
    assert_eq!(read(&volumes.join("kubernetes.io~configmap/cfg/k")), "v");
    let maybe = volumes.join("kubernetes.io~secret/maybe");
    let names: Vec<String> = std::fs::read_dir(maybe.join("..data"))
        .expect("the optional volume's data")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.is_empty(),
        "an optional missing secret is an empty volume: {names:?}"
    );
}

#[tokio::test]
async fn an_updated_config_map_switches_the_data_link_atomically() {
    if root().is_none() {
        return;
    }
    let node = start(None).await;
    let _: ConfigMap = node
        .create(json!({"metadata": {"name": "live"}, "data": {"k": "one", "gone": "x"}}))
        .await;
    let pod: Pod = node
        .create(sleeper(
            "updated",
            &json!({}),
            &json!([{"name": "cfg", "configMap": {"name": "live"}}]),
        ))
        .await;
    node.wait_for("updated", "Running", |p| phase(p) == Some("Running"))
        .await;
    let dir = node
        .pod_dir(&pod)
        .join("volumes/kubernetes.io~configmap/cfg");
    assert_eq!(read(&dir.join("k")), "one");
    let first = std::fs::read_link(dir.join("..data")).expect("..data");
    assert!(first.to_string_lossy().starts_with(".."), "{first:?}");
    Api::<ConfigMap>::namespaced(node.client.clone(), NS)
        .patch(
            "live",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "two", "gone": null}})),
        )
        .await
        .expect("update the configMap");
    testkit::wait_until_async(Duration::from_secs(60), "the new content", || {
        let path = dir.join("k");
        async move { (std::fs::read_to_string(path).ok()? == "two").then_some(()) }
    })
    .await
    .expect("the volume follows its configMap");
    let second = std::fs::read_link(dir.join("..data")).expect("..data");
    assert_ne!(first, second, "a new version directory");
    assert!(!dir.join(&first).exists(), "the old version is removed");
    assert!(
        std::fs::symlink_metadata(dir.join("gone")).is_err(),
        "a removed key's link is removed"
    );
}

#[tokio::test]
async fn item_paths_that_leave_the_volume_are_refused() {
    if root().is_none() {
        return;
    }
    let node = start(None).await;
    let _: ConfigMap = node
        .create(json!({"metadata": {"name": "evil"}, "data": {"k": "v"}}))
        .await;
    let pod: Pod = node
        .create(sleeper(
            "escape",
            &json!({}),
            &json!([{"name": "cfg", "configMap": {"name": "evil",
                "items": [{"key": "k", "path": "../../escaped"}]}}]),
        ))
        .await;
    let seen = node
        .wait_for("escape", "ContainerCreating", |p| waiting(p).is_some())
        .await;
    let (reason, message) = waiting(&seen).expect("waiting");
    assert_eq!(reason, "ContainerCreating");
    assert!(
        message.starts_with("MountVolume.SetUp failed for volume \"cfg\" : ")
            && message.contains("must not"),
        "{message}"
    );
    let volumes = node.pod_dir(&pod).join("volumes");
    assert!(!volumes.join("escaped").exists());
    assert!(!volumes.join("kubernetes.io~configmap/escaped").exists());
    assert!(
        !node.pod_dir(&pod).join("c.json").exists(),
        "nothing started"
    );
}

#[tokio::test]
async fn downward_api_files_hold_labels_annotations_and_resources_and_follow_label_changes() {
    if root().is_none() {
        return;
    }
    let node = start(None).await;
    let pod: Pod = node
        .create(sleeper(
            "downward",
            &json!({"app": "web", "tier": "front"}),
            &json!([{"name": "info", "downwardAPI": {"items": [
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}},
                {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}, "mode": 0o400},
            ]}}]),
        ))
        .await;
    node.wait_for("downward", "Running", |p| phase(p) == Some("Running"))
        .await;
    let dir = node
        .pod_dir(&pod)
        .join("volumes/kubernetes.io~downward-api/info");
    assert_eq!(read(&dir.join("labels")), "app=\"web\"\ntier=\"front\"");
    assert_eq!(read(&dir.join("annotations")), "note=\"a\\nb\"");
    assert_eq!(read(&dir.join("name")), "downward");
    assert_eq!(read(&dir.join("cpu")), "250");
    assert_eq!(read(&dir.join("mem")), "64");
    assert_eq!(mode(&dir.join("mem")), 0o400);
    Api::<Pod>::namespaced(node.client.clone(), NS)
        .patch(
            "downward",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "back"}}})),
        )
        .await
        .expect("relabel");
    testkit::wait_until_async(Duration::from_secs(60), "the new labels", || {
        let path = dir.join("labels");
        async move {
            (std::fs::read_to_string(path).ok()? == "app=\"web\"\ntier=\"back\"").then_some(())
        }
    })
    .await
    .expect("the labels file follows the pod");
}

#[tokio::test]
async fn in_cluster_kubectl_authenticates_as_the_pods_service_account() {
    if root().is_none() {
        return;
    }
    let Some(kubectl) =
        test_prerequisites::available(test_prerequisites::command("kubectl", "kubectl"))
    else {
        return;
    };
    whoami(start(Some(kubectl)).await).await;
}

/// The same from a pod with its own network namespace: kubectl's in-cluster configuration
/// reaches the API server through the `kubernetes` Service (10.96.0.1:443, the service
/// proxy's nftables rule on the node's bridge) and verifies its certificate for that address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_kubectl_reaches_the_api_server_through_the_kubernetes_service() {
    let Some(()) = test_prerequisites::available(networked_prerequisites()) else {
        return;
    };
    let Some(kubectl) =
        test_prerequisites::available(test_prerequisites::command("kubectl", "kubectl"))
    else {
        return;
    };
    whoami(start_networked(kubectl).await).await;
}

fn networked_prerequisites() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("pod networks need root".to_owned());
    }
    test_prerequisites::command("nft", "nftables")?;
    for plugin in ["bridge", "host-local", "portmap"] {
        let path = Path::new(pod_network::DEFAULT_PLUGIN_DIR).join(plugin);
        if !path.is_file() {
            return Err(format!(
                "the CNI plugin {} is not installed",
                path.display()
            ));
        }
    }
    Ok(())
}

/// A pod running `kubectl auth whoami` with only its projected token and environment names
/// its service account.
async fn whoami(node: Node) {
    let home = PathBuf::from(format!("/tmp/kvrs-node-home-{}", std::process::id()));
    let pod: Pod = node
        .create(json!({"metadata": {"name": "whoami"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "volumes": [{"name": "home", "emptyDir": {}}],
            "containers": [{"name": "c", "image": KUBECTL,
                "command": ["kubectl", "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
                "env": [{"name": "HOME", "value": home}],
                "volumeMounts": [{"name": "home", "mountPath": home}]}]}}))
        .await;
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    let access = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .expect("the admission added the service-account volume");
    assert_eq!(access.name.len(), "kube-api-access-".len() + 5);
    let done = node
        .wait_for("whoami", "the container to end", |p| {
            matches!(phase(p), Some("Succeeded" | "Failed"))
        })
        .await;
    let log = read(&node.pod_dir(&pod).join("c.log"));
    assert_eq!(phase(&done), Some("Succeeded"), "kubectl failed: {log}");
    assert_eq!(log.trim(), format!("system:serviceaccount:{NS}:default"));
    let dir = node
        .pod_dir(&pod)
        .join("volumes/kubernetes.io~projected")
        .join(&access.name);
    assert_eq!(read(&dir.join("namespace")), NS);
    assert!(read(&dir.join("ca.crt")).contains("BEGIN CERTIFICATE"));
    assert_eq!(read(&dir.join("token")).split('.').count(), 3, "a JWT");
    let _ = std::fs::remove_dir(&home);
}
