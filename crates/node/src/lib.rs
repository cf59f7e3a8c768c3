//! kubelet's role in the embedded Kubernetes: one node agent per node.
//!
//! Data flow: [`run_node`] registers the Node ([`registration`]: capacity, addresses,
//! `nodeInfo`, the `Ready` condition and its heartbeat, the kubelet endpoint), runs the pods
//! bound to the node ([`pods`]) and serves their container logs ([`pods::logs`]). It knows
//! nothing of KubeVirt: what runs in a pod is decided by the pod spec and the image store
//! ([`images`]), and no other crate reads the node agent's files. On a real cluster kubelet
//! does all of this and this crate is not run.
//!
//! Networking: with a [`PodNetworkConfig`] every pod but `hostNetwork` ones gets its own network
//! namespace on the node's bridge through the CNI plugins ([`pods::network`]), and the Node's
//! `spec.podCIDR` says which addresses its pods get; without one (unit tests, non-root) pods
//! share the host's network and their `podIP` is the node's address.
//!
//! Secondary networks: the node agent plays Multus ([`pods::multus`]): a pod's
//! `k8s.v1.cni.cncf.io/networks` annotation gets it extra interfaces from the
//! NetworkAttachmentDefinitions it names (the CRD and rights in [`network_attachments`]),
//! also while it runs, and its `network-status` annotation says what it has.
//!
//! Containers: `command` and `args` (and plain `env` values) have their `$(VAR)` references
//! expanded as kubelet does ([`pods::expansion`]) against the container's environment (values,
//! downward-API fields and resources, configMap and secret keys, the `kubernetes` Service
//! variables). Their `startupProbe`, `readinessProbe` and `livenessProbe` (`httpGet`,
//! `tcpSocket`) run from the node agent in the host's network against the pod IP
//! ([`pods::probes`]): container `ready`/`started` and the pod's `Ready`/`ContainersReady`
//! follow them, and a failed liveness or startup probe restarts the container through the
//! restart policy and back-off.
//!
//! Host paths: every node is like a kind node, a container with its own file system for
//! node-local state. [`NodeConfig::host_paths`] ([`HostPathMap`]) resolves `hostPath` volumes
//! under listed prefixes below the node's directory; [`HostPathMap::for_node`] is the standard
//! layout: `/var/lib/kubelet/pods` → `data_dir/pods`; `/var/lib/kubelet`,
//! `/var/run/kubevirt` (also spelt `/run/kubevirt`), `/var/run/kubevirt-private` (also
//! `/run/kubevirt-private`), `/var/lib/kubevirt` and `/var/lib/kubevirt-rs` →
//! `data_dir/root/<the /var/… path>`. Other paths (`/dev`, `/proc`, …) are the machine's;
//! `..` components are refused and no mapped path may lead out of its directory.
//!
//! Directory layout below `data_dir`: `pods/<pod uid>/` as kubelet's
//! `/var/lib/kubelet/pods/<uid>/` (`volumes/kubernetes.io~<plugin>/<name>/`, container
//! records and logs, `network.json`); `netns/<pod uid>` the pods' network namespaces (not
//! `/run/netns`, so node agents sharing a machine cannot collide and a killed one leaves no
//! global names); `cni/networks/` (`host-local`'s reservations) and `cni/results/` (ADD
//! results); `root/` the node's own file system for mapped host paths (`root/var/lib/kubelet`,
//! `root/var/run/kubevirt`, …); `storage/` the node's local PersistentVolumes
//! (`/opt/local-path-provisioner`, one `pvc-<claim uid>/` each, made and deleted by the
//! embedded local provisioner). Directories there are `0700` and files `0600` whatever the umask.

pub mod host_paths;
pub mod images;
pub mod network_attachments;
pub mod pods;
pub mod registration;

use std::path::PathBuf;

pub use host_paths::HostPathMap;
pub use pod_network::Ipv4Cidr;

use tokio_util::sync::CancellationToken;

/// How the node agent runs.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The Node's name.
    pub node_name: String,
    /// Root of the node agent's state (`pods/`).
    pub data_dir: PathBuf,
    /// The images this node can run.
    pub images: images::ImageStore,
    /// The node's address (Node `InternalIP`, `hostIP` of its pods).
    pub host_ip: String,
    /// The cluster CA (PEM): the container-log endpoint serves clients with certificates it
    /// signed (the API server's `pods/log`). Without it no log endpoint is served.
    pub cluster_ca_pem: Option<Vec<u8>>,
    /// Certificate and key (PEM) the log endpoint presents (self-signed when `None`).
    pub serving_cert: Option<(String, String)>,
    /// Where pods reach the API server: host and port of the `kubernetes` Service, given to
    /// every container as `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` (and the
    /// `KUBERNETES_PORT…` variables) so in-cluster clients work. `None`: no such variables.
    pub kubernetes_service: Option<(String, u16)>,
    /// The node's pod network; `None`: pods share the host's network namespace.
    pub pod_network: Option<PodNetworkConfig>,
    /// Resources the Node reports instead of the host's (`cpu`, `memory`, `pods`, … to
    /// quantities): a simulated node, as KWOK's, for control-plane benchmarks whose pods use
    /// nothing. Empty: what the host has, as kubelet reports it.
    pub capacity_overrides: std::collections::BTreeMap<String, String>,
    /// Where `hostPath` volumes are on this machine: [`HostPathMap::for_node`] of `data_dir`
    /// gives the node its own `/var/lib/kubelet`, `/var/run/kubevirt`, … as a kind node has;
    /// the default maps nothing (every `hostPath` is the machine's).
    pub host_paths: HostPathMap,
}

/// A node's pod network: pods get addresses of `pod_cidr` on the Linux bridge `bridge`
/// (created by the CNI `bridge` plugin on the first pod, its gateway the CIDR's first
/// address). Node agents sharing a machine need distinct bridges and CIDRs:
/// [`pod_network::PodNetworkSlot`] hands them out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetworkConfig {
    /// The Node's `spec.podCIDR`.
    pub pod_cidr: Ipv4Cidr,
    /// The bridge (at most 15 bytes).
    pub bridge: String,
    /// Where the CNI plugins are.
    pub plugin_dir: PathBuf,
}

impl PodNetworkConfig {
    /// `pod_cidr` on `bridge`, the plugins in [`pod_network::DEFAULT_PLUGIN_DIR`].
    pub fn new(pod_cidr: Ipv4Cidr, bridge: impl Into<String>) -> Self {
        Self {
            pod_cidr,
            bridge: bridge.into(),
            plugin_dir: pod_network::DEFAULT_PLUGIN_DIR.into(),
        }
    }

    /// The network of a held slot.
    pub fn from_slot(slot: &pod_network::PodNetworkSlot) -> Self {
        Self::new(slot.subnet(), slot.bridge())
    }

    /// A pod network for a node agent on a machine it may share with others: a slot of the
    /// machine-wide allocator ([`pod_network::DEFAULT_LOCK_DIR`]), the one `owner` (e.g. its
    /// data directory) held last when it is free. Keep the slot for as long as the node runs.
    ///
    /// # Errors
    /// [`PodNetworkUnavailable`] when this process cannot run pod networks (not root, no
    /// plugins) or no slot is free; the node then runs pods in the host's network.
    pub fn acquire_for(
        owner: &str,
    ) -> Result<(Self, pod_network::PodNetworkSlot), PodNetworkUnavailable> {
        if !nix::unistd::geteuid().is_root() {
            return Err(PodNetworkUnavailable::NotRoot);
        }
        let plugins = std::path::Path::new(pod_network::DEFAULT_PLUGIN_DIR);
        for plugin in ["bridge", "host-local", "portmap"] {
            if !plugins.join(plugin).is_file() {
                return Err(PodNetworkUnavailable::NoPlugin(plugins.join(plugin)));
            }
        }
        let slot = pod_network::PodNetworkSlot::acquire_for(
            std::path::Path::new(pod_network::DEFAULT_LOCK_DIR),
            owner,
        )
        .map_err(PodNetworkUnavailable::Slot)?;
        Ok((Self::from_slot(&slot), slot))
    }

    /// Deletes the bridge when no pod of the node under `data_dir` has a network namespace any
    /// more (pods outlive the node agent: their bridge stays while they run). Returns whether
    /// it was deleted.
    ///
    /// # Errors
    /// The bridge could not be deleted.
    pub fn delete_bridge_if_unused(
        &self,
        data_dir: &std::path::Path,
    ) -> Result<bool, pod_network::HostError> {
        let in_use = std::fs::read_dir(data_dir.join("netns"))
            .map(|mut entries| entries.next().is_some())
            .unwrap_or(false);
        if in_use {
            return Ok(false);
        }
        pod_network::delete_bridge(&self.bridge)
    }
}

/// The file under the node's data directory that keeps its pod network, so that its pods'
/// networks can be released without the node ([`release_pod_networks`]).
pub const POD_NETWORK_FILE: &str = "pod-network.json";

/// [`PodNetworkConfig`] as [`POD_NETWORK_FILE`] keeps it.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedPodNetwork {
    pod_cidr: String,
    bridge: String,
    plugin_dir: PathBuf,
}

impl PodNetworkConfig {
    fn to_saved(&self) -> SavedPodNetwork {
        SavedPodNetwork {
            pod_cidr: self.pod_cidr.to_string(),
            bridge: self.bridge.clone(),
            plugin_dir: self.plugin_dir.clone(),
        }
    }
}

/// The pod network the node whose data directory is `data_dir` ran with last, if any.
pub fn saved_pod_network(data_dir: &std::path::Path) -> Option<PodNetworkConfig> {
    let saved = pods::process::read_json::<SavedPodNetwork>(&data_dir.join(POD_NETWORK_FILE))?;
    Some(PodNetworkConfig {
        pod_cidr: saved.pod_cidr.parse().ok()?,
        bridge: saved.bridge,
        plugin_dir: saved.plugin_dir,
    })
}

/// Releases the network of every pod of the node whose data directory is `data_dir` (CNI DEL,
/// namespace deleted; a namespace DEL fails for is deleted anyway), e.g. after its node agent
/// and containers were killed in a test. Best effort; the bridge is left to the next holder of
/// its slot, which resets it. Returns how many pod networks were released.
pub fn release_pod_networks(data_dir: &std::path::Path) -> usize {
    let Some(config) = saved_pod_network(data_dir) else {
        return 0;
    };
    let networks = pods::network::PodNetworks::new(&config, data_dir);
    let mut released = 0;
    for entry in std::fs::read_dir(data_dir.join("netns"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let uid = entry.file_name().to_string_lossy().into_owned();
        let pod_dir = data_dir.join("pods").join(&uid);
        if let Err(e) = networks.tear_down(&uid, &pod_dir) {
            tracing::warn!(uid, error = %e, "cannot release a pod network; deleting its namespace");
            let _ = pod_network::delete_path(&entry.path());
        }
        released += 1;
    }
    released
}

/// Why a node runs without a pod network.
#[derive(Debug, thiserror::Error)]
pub enum PodNetworkUnavailable {
    /// Network namespaces and bridges need root.
    #[error("pod networks need root")]
    NotRoot,
    /// A CNI plugin is not installed.
    #[error("the CNI plugin {} is not installed", .0.display())]
    NoPlugin(PathBuf),
    /// No pod network slot could be taken.
    #[error("no pod network slot")]
    Slot(#[source] pod_network::SlotError),
}

impl NodeConfig {
    /// `data_dir/pods`: the pod directories, as kubelet's `/var/lib/kubelet/pods`.
    pub fn pods_dir(&self) -> PathBuf {
        self.data_dir.join("pods")
    }
}

/// Errors starting the node agent.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A state directory could not be created.
    #[error("creating {0:?}")]
    StateDir(PathBuf, #[source] std::io::Error),
    /// The container-log endpoint could not be started.
    #[error("starting the container-log endpoint")]
    LogEndpoint(#[source] pods::logs::LogServerError),
}

/// Serves the node's container logs on the node address and a free port, answering from a
/// cache of the pods bound to this node; returns the port.
async fn start_log_endpoint(
    client: &kube::Client,
    config: &NodeConfig,
    ca_pem: &[u8],
) -> Result<u16, NodeError> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::{WatchStreamExt, reflector, watcher};
    let (store, writer) = reflector::store::<Pod>();
    let selector = format!("spec.nodeName={}", config.node_name);
    let pods = watcher(
        kube::Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields(&selector),
    )
    .default_backoff()
    .reflect(writer)
    .for_each(|_| async {});
    tokio::spawn(pods);
    let lookup: pods::logs::PodLookup = std::sync::Arc::new(move |namespace: &str, name: &str| {
        let pod = store.get(&reflector::ObjectRef::new(name).within(namespace))?;
        let containers = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        Some((pod.metadata.uid.clone()?, containers))
    });
    let ip: std::net::IpAddr = config
        .host_ip
        .parse()
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    let (addr, _task) = pods::logs::serve_logs(
        std::net::SocketAddr::new(ip, 0),
        ca_pem,
        config.pods_dir(),
        lookup,
        config.serving_cert.as_ref(),
    )
    .await
    .map_err(NodeError::LogEndpoint)?;
    Ok(addr.port())
}

/// Runs the node agent until `cancel` fires. Pods keep running when it returns: their
/// processes live in their own process groups, and a restarted agent re-adopts them.
///
/// # Errors
/// [`NodeError`] when the state directories cannot be created or the log endpoint fails.
pub async fn run_node(
    client: kube::Client,
    config: NodeConfig,
    cancel: CancellationToken,
) -> Result<(), NodeError> {
    for dir in [config.data_dir.clone(), config.pods_dir()] {
        private_fs::create_dir_all(&dir).map_err(|e| NodeError::StateDir(dir.clone(), e))?;
    }
    if let Some(network) = &config.pod_network {
        if let Err(e) = pod_network::enable_ip_forwarding() {
            tracing::warn!(error = %e, "pods will not reach beyond this machine");
        }
        let path = config.data_dir.join(POD_NETWORK_FILE);
        pods::process::write_json(&path, &network.to_saved())
            .map_err(|e| NodeError::StateDir(path, e))?;
    }
    let kubelet_port = match &config.cluster_ca_pem {
        Some(ca) => Some(start_log_endpoint(&client, &config, ca).await?),
        None => None,
    };
    let registration = registration::run(
        client.clone(),
        config.node_name.clone(),
        config.host_ip.clone(),
        config.pod_network.as_ref().map(|n| n.pod_cidr.to_string()),
        kubelet_port,
        config.capacity_overrides.clone(),
        cancel.clone(),
    );
    let runner = pods::PodRunnerConfig {
        node_name: config.node_name.clone(),
        state_dir: config.pods_dir(),
        images: config.images.clone(),
        host_ip: config.host_ip.clone(),
        kubernetes_service: config.kubernetes_service.clone(),
        network: config
            .pod_network
            .as_ref()
            .map(|n| pods::network::PodNetworks::new(n, &config.data_dir)),
        host_paths: config.host_paths.clone(),
    };
    let pods = async {
        tokio::select! {
            () = cancel.cancelled() => {}
            () = pods::run(client.clone(), runner) => {}
        }
    };
    tokio::join!(registration, pods);
    Ok(())
}

/// The current time as Kubernetes writes `metav1.Time`: RFC 3339 in UTC, whole seconds.
pub(crate) fn now_rfc3339() -> String {
    jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", jiff::Timestamp::now()).unwrap_or_default()
}
