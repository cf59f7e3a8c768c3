//! virt-handler: the node agent.
//!
//! Data flow: [`run_handler`] registers this machine's Node and keeps its heartbeat
//! ([`node`]), follows the VMIs scheduled here through their launchers ([`vmi_sync`], with the
//! VMI → launcher spec conversion in [`launcher_spec`] and images from the local store in
//! [`images`]), and in embedded mode also runs the [`scheduler`] and the [`podrunner`] that
//! play kube-scheduler and kubelet for launcher pods.
//!
//! Directory layout below `data_dir`: `pods/<pod uid>/` (one per launcher pod: the launcher
//! socket, QMP and serial sockets, disks, logs), `images/<name>/` (the image store) and
//! `hostdisks/` (the only place `hostDisk` volumes may point to). Directories there are `0700`
//! and files `0600` whatever the umask ([`virt_launcher::private_fs`]).

pub mod images;
pub mod launcher_spec;
pub mod node;
pub mod podrunner;
pub mod scheduler;
pub mod vmi_sync;

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

/// How the handler runs.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// This node's name (the hostname unless configured).
    pub node_name: String,
    /// Root of the handler's state: `pods/`, `images/`, `hostdisks/`.
    pub data_dir: PathBuf,
    /// Pod images starting with this are launcher images the pod runner can run.
    pub launcher_image: String,
    /// The program that runs launcher containers (the `kubevirt-rs` binary).
    pub launcher_program: PathBuf,
    /// The node's address (Node `InternalIP`, pod and host IP of launcher pods).
    pub host_ip: String,
    /// Also run the scheduler and the pod runner, and act as the node's kubelet.
    pub embedded: bool,
    /// Force (`Some(true)`) or forbid (`Some(false)`) software emulation; `None` follows
    /// the KubeVirt CR's `developerConfiguration.useEmulation`, then host detection.
    pub use_emulation: Option<bool>,
    /// Start every launcher with `--fake-qemu` (a running domain without QEMU): control-plane
    /// benchmarks and tests.
    pub fake_qemu: bool,
    /// The cluster CA (PEM). In embedded mode the node serves kubelet's `/containerLogs`
    /// to clients with certificates from this CA (the API server's `pods/log`) and publishes
    /// the port in the Node's `daemonEndpoints`; without it no log endpoint is served.
    pub cluster_ca_pem: Option<Vec<u8>>,
    /// Certificate and key (PEM) the log endpoint presents (self-signed when `None`).
    pub node_serving_cert: Option<(String, String)>,
}

impl HandlerConfig {
    /// `data_dir/pods`: launcher pod directories.
    pub fn pods_dir(&self) -> PathBuf {
        self.data_dir.join("pods")
    }

    /// `data_dir/hostdisks`: where `hostDisk` volumes may live.
    pub fn host_disk_dir(&self) -> PathBuf {
        self.data_dir.join("hostdisks")
    }
}

/// The current time as Kubernetes writes `metav1.Time`: RFC 3339 in UTC, whole seconds.
///
/// Every status this crate writes uses it, so what is stored equals what typed clients
/// re-encode — a JSON Patch `test` built from a typed cache then matches the stored value.
pub fn now_rfc3339() -> String {
    jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", jiff::Timestamp::now()).unwrap_or_default()
}

/// The machine's hostname, as the default node name.
pub fn default_node_name() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.to_lowercase())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Errors starting the handler.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// A state directory could not be created.
    #[error("creating {0:?}")]
    StateDir(PathBuf, #[source] std::io::Error),
    /// The node's log endpoint could not be started.
    #[error("starting the node log endpoint")]
    LogEndpoint(#[source] podrunner::logs::LogServerError),
}

/// Serves the node's container logs (see [`podrunner::logs`]) on the node address and a free
/// port, answering from a cache of the pods bound to this node; returns the port.
async fn start_log_endpoint(
    client: &kube::Client,
    config: &HandlerConfig,
    ca_pem: &[u8],
) -> Result<u16, HandlerError> {
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
    let lookup: podrunner::logs::PodLookup =
        std::sync::Arc::new(move |namespace: &str, name: &str| {
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
    let (addr, _task) = podrunner::logs::serve_logs(
        std::net::SocketAddr::new(ip, 0),
        ca_pem,
        config.pods_dir(),
        lookup,
        config.node_serving_cert.as_ref(),
    )
    .await
    .map_err(HandlerError::LogEndpoint)?;
    Ok(addr.port())
}

/// Creates the data directory and its `pods/`, `hostdisks/` and `images/` owner-only (`0700`),
/// whatever the umask.
fn create_state_dirs(config: &HandlerConfig) -> Result<(), HandlerError> {
    for dir in [
        config.data_dir.clone(),
        config.pods_dir(),
        config.host_disk_dir(),
        config.data_dir.join("images"),
    ] {
        virt_launcher::private_fs::create_dir_all(&dir)
            .map_err(|e| HandlerError::StateDir(dir.clone(), e))?;
    }
    Ok(())
}

/// Runs the node agent until `cancel` fires. Launchers and their guests keep running when
/// it returns: they live in their own process groups.
///
/// # Errors
/// [`HandlerError`] when the state directories cannot be created.
pub async fn run_handler(
    client: kube::Client,
    config: HandlerConfig,
    cancel: CancellationToken,
) -> Result<(), HandlerError> {
    create_state_dirs(&config)?;
    let sync = vmi_sync::SyncConfig {
        node_name: config.node_name.clone(),
        pods_dir: config.pods_dir(),
        images: images::ImageStore::new(&config.data_dir),
        host_disk_dir: config.host_disk_dir(),
        use_emulation: config.use_emulation,
    };
    let kubelet_port = match (&config.cluster_ca_pem, config.embedded) {
        (Some(ca), true) => Some(start_log_endpoint(&client, &config, ca).await?),
        _ => None,
    };
    let node = node::run_node_agent(
        client.clone(),
        config.node_name.clone(),
        config.host_ip.clone(),
        config.embedded,
        kubelet_port,
        cancel.clone(),
    );
    let vmis = vmi_sync::run(client.clone(), sync, cancel.clone());
    if config.embedded {
        let runner = podrunner::PodRunnerConfig {
            node_name: config.node_name.clone(),
            state_dir: config.pods_dir(),
            launcher_image: config.launcher_image.clone(),
            launcher_program: config.launcher_program.clone(),
            host_ip: config.host_ip.clone(),
            fake_qemu: config.fake_qemu,
        };
        let embedded = async {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = scheduler::run(client.clone()) => {}
                () = podrunner::run(client.clone(), runner) => {}
            }
        };
        tokio::join!(node, vmis, embedded);
    } else {
        tokio::join!(node, vmis);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn state_directories_are_owner_only_under_a_permissive_umask() {
        nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let tmp = tempfile::tempdir().expect("tempdir");
        let config = HandlerConfig {
            node_name: "node01".into(),
            data_dir: tmp.path().join("data"),
            launcher_image: String::new(),
            launcher_program: PathBuf::new(),
            host_ip: "127.0.0.1".into(),
            embedded: true,
            use_emulation: None,
            fake_qemu: true,
            cluster_ca_pem: None,
            node_serving_cert: None,
        };
        create_state_dirs(&config).expect("create");
        for dir in [
            config.data_dir.clone(),
            config.pods_dir(),
            config.host_disk_dir(),
            config.data_dir.join("images"),
        ] {
            let mode = std::fs::metadata(&dir)
                .expect("metadata")
                .permissions()
                .mode()
                & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
        }
    }
}
