//! virt-handler: KubeVirt's agent on each node.
//!
//! Data flow: [`run_handler`] labels this node's Node from QEMU's answers and keeps its
//! heartbeat ([`node`]),
//! follows the VMIs scheduled here through their launchers ([`vmi_sync`], with the
//! VMI → launcher spec conversion in [`launcher_spec`] and images from the local store in
//! [`images`]), and serves its REST API ([`rest`]: console, VNC, pause, unpause,
//! softreboot) to virt-api. It runs the same way on the embedded node and on a real
//! cluster: it finds a launcher through the launcher pod's `public` emptyDir volume in the
//! kubelet's pod directory (`<kubelet pods dir>/<pod uid>/volumes/kubernetes.io~empty-dir/public/`,
//! upstream's `/var/run/kubevirt` of the pod), never through the node agent.
//!
//! Directory layout below `data_dir`: `images/<name>/` (the image store, with pulled layers
//! cached by digest in `images/.blobs/`) and `hostdisks/`
//! (the only place `hostDisk` volumes may point to). Directories there are `0700` and files
//! `0600` whatever the umask ([`virt_launcher::private_fs`]).

pub mod images;
pub mod launcher_spec;
pub mod metrics;
pub mod migration_proxy;
pub mod node;
pub mod rest;
pub mod vmi_sync;

use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

/// How the handler runs.
#[derive(Debug, Clone)]
pub struct HandlerConfig {
    /// This node's name (the hostname unless configured).
    pub node_name: String,
    /// Root of the handler's state: `images/`, `hostdisks/`.
    pub data_dir: PathBuf,
    /// The kubelet's pod directory (upstream mounts `/var/lib/kubelet/pods` into the handler).
    pub kubelet_pods_dir: PathBuf,
    /// Force (`Some(true)`) or forbid (`Some(false)`) software emulation; `None` follows
    /// the KubeVirt CR's `developerConfiguration.useEmulation`, then host detection.
    pub use_emulation: Option<bool>,
    /// The REST server (console, VNC, pause): where it listens, the cluster CA whose client
    /// certificates it accepts (virt-api's), and the certificate it presents. Without it no
    /// REST server runs.
    pub rest: Option<rest::RestConfig>,
    /// Where `/metrics` is served ([`metrics`]), with the REST server's certificate; not at
    /// all without a REST server or with `None`.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The heartbeat period ([`node::HEARTBEAT_INTERVAL`] unless `--heartbeat-interval`).
    pub heartbeat_interval: std::time::Duration,
    /// The handler's pod IP (`--pod-ip-address`): where migration targets listen.
    pub migration_ip: Option<std::net::IpAddr>,
    /// The TLS of the migration proxies; `None` without mounted certificates.
    pub migration_tls: Option<migration_proxy::MigrationTls>,
}

impl HandlerConfig {
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
    /// The REST server could not be started.
    #[error("starting virt-handler's REST server")]
    Rest(#[source] rest::RestError),
    /// The metrics port could not be served.
    #[error("serving virt-handler's metrics")]
    Metrics(#[source] kubevirt_tls::SpawnError),
}

/// Creates the data directory and its `hostdisks/` and `images/` owner-only (`0700`),
/// whatever the umask.
fn create_state_dirs(config: &HandlerConfig) -> Result<(), HandlerError> {
    for dir in [
        config.data_dir.clone(),
        config.host_disk_dir(),
        config.data_dir.join("images"),
    ] {
        virt_launcher::private_fs::create_dir_all(&dir)
            .map_err(|e| HandlerError::StateDir(dir.clone(), e))?;
    }
    Ok(())
}

/// The parent of `pid`, from `/proc/<pid>/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The node's network namespace when the handler runs in another one (a pod network):
/// pid 1's, seen through the host PID namespace virt-handler runs in; where that one cannot
/// be read (a sandboxed machine), the nearest ancestor's that differs from the handler's (the
/// node agent or container runtime that started it runs in the node's). `None` when the
/// handler already runs in the node's namespace or none can be read.
fn node_network_namespace() -> Option<std::path::PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let id = |path: &std::path::Path| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    let own = id(std::path::Path::new("/proc/self/ns/net"))?;
    let namespace_of = |pid: u32| std::path::PathBuf::from(format!("/proc/{pid}/ns/net"));
    if let Some(init) = id(&namespace_of(1)) {
        return (init != own).then(|| namespace_of(1));
    }
    let mut pid = std::process::id();
    for _ in 0..8 {
        pid = parent_of(pid).filter(|p| *p > 1)?;
        let path = namespace_of(pid);
        match id(&path) {
            Some(theirs) if theirs != own => return Some(path),
            _ => {}
        }
    }
    None
}

/// The image store; pulls run in the node's network namespace when the handler runs in
/// another, so a loopback registry is the node's loopback, as for kubelet's pulls.
fn image_store(data_dir: &std::path::Path) -> images::ImageStore {
    let store = images::ImageStore::new(data_dir);
    match node_network_namespace() {
        Some(namespace) => {
            tracing::info!(namespace = %namespace.display(), "images are pulled in the node's network namespace");
            store.pulling_in_network_namespace(&namespace)
        }
        None => store,
    }
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
    let sync = vmi_sync::VmiSyncConfig {
        node_name: config.node_name.clone(),
        kubelet_pods_dir: config.kubelet_pods_dir.clone(),
        launcher_dir_in_pod: Some(PathBuf::from(kubevirt_api::constants::LAUNCHER_DIR)),
        images: image_store(&config.data_dir),
        host_disk_dir: config.host_disk_dir(),
        use_emulation: config.use_emulation,
        cluster: kubevirt_api::cluster_config::subscribe(
            kube::Api::all(client.clone()),
            vmi_sync::ClusterSettings::from_kubevirt,
        ),
        migration_ip: config.migration_ip,
        migration_tls: config.migration_tls.clone(),
    };
    let (vmi_store, vmi_writer) = kube::runtime::reflector::store();
    let _metrics = match (&config.rest, config.metrics_listen) {
        (Some(rest), Some(listen)) => {
            let app = metrics::router(
                vmi_store.clone(),
                &config.node_name,
                &config.kubelet_pods_dir,
            );
            let (addr, task) = metrics::serve(listen, &rest.tls, app)
                .await
                .map_err(HandlerError::Metrics)?;
            tracing::info!(%addr, "serving metrics");
            Some(tokio_util::task::AbortOnDropHandle::new(task))
        }
        _ => None,
    };
    let _rest = match &config.rest {
        Some(rest) => Some(
            rest::serve(
                client.clone(),
                rest,
                vmi_store,
                &config.node_name,
                &config.kubelet_pods_dir,
            )
            .await
            .map_err(HandlerError::Rest)?,
        ),
        None => None,
    };
    let obsolete = kubevirt_api::cluster_config::subscribe(kube::Api::all(client.clone()), |kv| {
        node::cpu::obsolete_models(
            kv.and_then(|kv| kv.spec.configuration.as_ref())
                .map(|c| &c.obsolete_cpu_models),
        )
    });
    let node = node::run_node_agent(
        client.clone(),
        config.node_name.clone(),
        config.heartbeat_interval,
        obsolete,
        cancel.clone(),
    );
    let vmis = vmi_sync::run(client.clone(), sync, vmi_writer, cancel.clone());
    tokio::join!(node, vmis);
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
            kubelet_pods_dir: tmp.path().join("pods"),
            use_emulation: None,
            rest: None,
            metrics_listen: None,
            heartbeat_interval: node::HEARTBEAT_INTERVAL,
            migration_ip: None,
            migration_tls: None,
        };
        create_state_dirs(&config).expect("create");
        for dir in [
            config.data_dir.clone(),
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
