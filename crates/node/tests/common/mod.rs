//! The test node: a real API server on a temporary directory and the node agent on it, with
//! an image store of a few host programs. Dropping it stops the agent and kills every container
//! it started.
#![allow(dead_code)] // not every test file uses every helper

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kubevirt_node::PodNetworkConfig;
use kubevirt_node::images::{Image, ImageStore};
use pod_network::PodNetworkSlot;
use tokio_util::sync::CancellationToken;

pub const NODE: &str = "n1";
pub const TOOLS: &str = "example.com/tools:v1";

pub struct Node {
    pub tmp: tempfile::TempDir,
    _server: kubevirt_apiserver::RunningServer,
    pub client: kube::Client,
    pub config: kubevirt_node::NodeConfig,
    cancel: CancellationToken,
    /// The pod network slot this node holds, if it has a pod network.
    slot: Option<PodNetworkSlot>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cancel.cancel();
        // Nothing a test starts outlives it: kill every recorded container group, release the
        // pods' networks (CNI DEL, namespaces) and delete the slot's bridge.
        testkit::kill_launchers(self.tmp.path());
        if let Some(network) = &self.config.pod_network {
            kubevirt_node::release_pod_networks(&self.config.data_dir);
            let _ = pod_network::delete_bridge(&network.bridge);
        }
        self.slot.take();
    }
}

/// Whether this host can run pods in their own network: root, `ip`, `iptables` and the CNI
/// plugins. Skips (or fails under `KUBEVIRT_RS_REQUIRE_PREREQUISITES`) otherwise.
pub fn network_prerequisites() -> Option<()> {
    test_prerequisites::available(check_network_prerequisites())
}

fn check_network_prerequisites() -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("pod networks need root (network namespaces, bridges, iptables)".into());
    }
    test_prerequisites::command("ip", "iproute2")?;
    test_prerequisites::command("iptables", "iptables")?;
    for plugin in ["bridge", "host-local", "portmap"] {
        let path = std::path::Path::new(pod_network::DEFAULT_PLUGIN_DIR).join(plugin);
        if !path.is_file() {
            return Err(format!(
                "the CNI plugin {} is not installed (apt-get install containernetworking-plugins)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// A node whose pods share the host's network.
pub async fn start() -> Node {
    start_with(None).await
}

/// A node whose pods get their own network namespaces, on the bridge and CIDR of a slot of the
/// machine-wide allocator.
pub async fn start_networked() -> Node {
    let slot = PodNetworkSlot::acquire(std::path::Path::new(pod_network::DEFAULT_LOCK_DIR))
        .expect("a pod network slot");
    start_with(Some(slot)).await
}

async fn start_with(slot: Option<PodNetworkSlot>) -> Node {
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
            programs: BTreeMap::from([
                ("sh".to_owned(), PathBuf::from("/bin/sh")),
                ("bash".to_owned(), PathBuf::from("/bin/bash")),
            ]),
            entrypoint: vec!["sh".to_owned()],
            env: vec![(
                "PATH".to_owned(),
                "/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            )],
        },
    );
    let cancel = CancellationToken::new();
    let config = kubevirt_node::NodeConfig {
        node_name: NODE.into(),
        data_dir: tmp.path().join("node"),
        host_paths: kubevirt_node::HostPathMap::for_node(&tmp.path().join("node")),
        images,
        host_ip: "127.0.0.1".into(),
        cluster_ca_pem: None,
        serving_cert: None,
        pod_network: slot.as_ref().map(PodNetworkConfig::from_slot),
        kubernetes_service: None,
        capacity_overrides: Default::default(),
    };
    tokio::spawn(kubevirt_node::run_node(
        client.clone(),
        config.clone(),
        cancel.clone(),
    ));
    Node {
        tmp,
        _server: server,
        client,
        config,
        cancel,
        slot,
    }
}

impl Node {
    /// Stops the node agent; its pods keep running.
    pub fn stop_agent(&mut self) {
        self.cancel.cancel();
        self.cancel = CancellationToken::new();
    }

    /// Stops the node agent and starts a new one on the same state, as a restart of the server
    /// does; the pods keep running.
    pub fn restart_agent(&mut self) {
        self.stop_agent();
        tokio::spawn(kubevirt_node::run_node(
            self.client.clone(),
            self.config.clone(),
            self.cancel.clone(),
        ));
    }
}

pub async fn create(node: &Node, pod: serde_json::Value) -> Pod {
    let pod: Pod = serde_json::from_value(pod).expect("pod");
    Api::<Pod>::namespaced(node.client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod")
}

/// Polls the pod until `done` holds (or fails after a minute).
pub async fn wait_for(node: &Node, name: &str, what: &str, done: impl Fn(&Pod) -> bool) -> Pod {
    let api = Api::<Pod>::namespaced(node.client.clone(), "default");
    testkit::wait_until_async(Duration::from_secs(60), what, || {
        let (api, done) = (&api, &done);
        async move { api.get(name).await.ok().filter(|p| done(p)) }
    })
    .await
    .expect("the pod state")
}

pub fn waiting_reason(pod: &Pod) -> Option<String> {
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
