//! The node agent against a real API server: which images run, and what a container sees of
//! its volumes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kubevirt_node::images::{Image, ImageStore};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NODE: &str = "n1";
const TOOLS: &str = "example.com/tools:v1";

struct Node {
    tmp: tempfile::TempDir,
    _server: kubevirt_apiserver::RunningServer,
    client: kube::Client,
    cancel: CancellationToken,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cancel.cancel();
        // Nothing a test starts outlives it: kill every recorded container group.
        testkit::kill_launchers(self.tmp.path());
    }
}

async fn start() -> Node {
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
    images.insert(
        TOOLS,
        Image {
            programs: BTreeMap::from([("sh".to_owned(), PathBuf::from("/bin/sh"))]),
            entrypoint: vec!["sh".to_owned()],
            env: vec![("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
        },
    );
    let cancel = CancellationToken::new();
    let config = kubevirt_node::NodeConfig {
        node_name: NODE.into(),
        data_dir: tmp.path().join("node"),
        images,
        host_ip: "127.0.0.1".into(),
        cluster_ca_pem: None,
        serving_cert: None,
        kubernetes_service: None,
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
    }
}

async fn create(node: &Node, pod: serde_json::Value) -> Pod {
    let pod: Pod = serde_json::from_value(pod).expect("pod");
    Api::<Pod>::namespaced(node.client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod")
}

/// Polls the pod until `done` holds (or fails after a minute).
async fn wait_for(node: &Node, name: &str, what: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    let api = Api::<Pod>::namespaced(node.client.clone(), "default");
    testkit::wait_until_async(Duration::from_secs(60), what, || {
        let (api, done) = (&api, &done);
        async move { api.get(name).await.ok().filter(|p| done(p)) }
    })
    .await
    .expect("the pod state")
}

fn waiting_reason(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

#[tokio::test]
async fn an_image_the_store_does_not_know_never_starts_a_process() {
    let node = start().await;
    let pod = create(
        &node,
        json!({"metadata": {"name": "foreign"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox", "command": ["/bin/sh", "-c", "sleep 600"]}]}}),
    )
    .await;
    let seen = wait_for(&node, "foreign", "ErrImagePull", |p| {
        matches!(
            waiting_reason(p).as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        )
    })
    .await;
    assert_eq!(
        seen.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    let uid = pod.metadata.uid.expect("uid");
    let record = node.tmp.path().join("node/pods").join(uid).join("c.json");
    assert!(!record.exists(), "no process may have been started");
}

#[tokio::test]
async fn a_container_runs_its_command_and_sees_its_empty_dir_at_the_mount_path() {
    if test_prerequisites::available(if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err("mount namespaces need root".to_owned())
    })
    .is_none()
    {
        return;
    }
    let node = start().await;
    // A mount path of this test only: the container sees the volume there, the host does not.
    let mount = PathBuf::from(format!("/tmp/kvrs-node-test-{}", std::process::id()));
    let pod = create(
        &node,
        json!({"metadata": {"name": "writer"}, "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "c", "image": TOOLS,
                "command": ["sh", "-c"], "args": ["echo \"$GREETING from $POD\" > \"$0/out\"", mount],
                "env": [{"name": "GREETING", "value": "hello"},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                "volumeMounts": [{"name": "data", "mountPath": mount}]}]}}),
    )
    .await;
    let done = wait_for(&node, "writer", "Succeeded", |p| {
        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
    })
    .await;
    let exit = done
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| {
            c.first()?
                .state
                .as_ref()?
                .terminated
                .as_ref()
                .map(|t| t.exit_code)
        });
    assert_eq!(exit, Some(0));
    let uid = pod.metadata.uid.expect("uid");
    let volume = node
        .tmp
        .path()
        .join("node/pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir/data/out");
    assert_eq!(
        std::fs::read_to_string(&volume).expect("the volume's file"),
        "hello from writer\n"
    );
    assert!(
        !mount.join("out").exists(),
        "the bind mount was private to the container"
    );
    let _ = std::fs::remove_dir(&mount);
}
