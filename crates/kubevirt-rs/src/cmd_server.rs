//! `kubevirt-rs server`: the whole stack on one machine.
//!
//! Wiring only. First the embedded Kubernetes, in this process: the API server (with the
//! default StorageClass `local`), the scheduler and the workload and volume controllers (the
//! local provisioner making volumes in each node's `storage/` directory), and per node its node agent (kubelet's role, with an image
//! store holding this binary as the project's images) and service proxy. Then KubeVirt onto it
//! exactly as a user installs it on any cluster: `deploy/kubevirt-operator.yaml` and
//! `deploy/kubevirt-cr.yaml` through the API (the CR carrying the server's KubeVirt flags);
//! virt-operator, a Deployment, installs the rest from its install strategy
//! ([`virt_operator::installer`]): the CRDs, virt-api and virt-controller as Deployments and
//! virt-handler as a DaemonSet, each pod a process of its own with its own service account, run
//! by the node agents. The NetworkAttachmentDefinition API comes with the embedded Kubernetes
//! (its node agents play Multus). Before KubeVirt, a minimal CDI (`deploy/embedded/cdi.yaml`, crate
//! `kubevirt-cdi`) as a user would install CDI: the DataVolume CRD and its controller. The two
//! halves meet only at the Kubernetes API. The server is ready once
//! the CR is Available and KubeVirt's components pass the readiness checks (`--no-kubevirt`:
//! once the embedded Kubernetes is). Embedded components that stop with an error are restarted
//! after a second; KubeVirt's pods are restarted by their node agent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[derive(Args)]
pub struct ServerArgs {
    /// Directory for the database, certificates, kubeconfig files, images and VM state.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Address of the API server (port 0 picks a free port; see DATA_DIR/kubeconfig).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Label keys (or `prefix/*`) synced from VM templates to VMIs and launcher pods.
    #[arg(long = "additional-launcher-labels-sync", default_value = "")]
    pub labels_sync: String,
    /// Annotation keys (or `prefix/*`) synced from VM templates to VMIs and launcher pods.
    #[arg(long = "additional-launcher-annotations-sync", default_value = "")]
    pub annotations_sync: String,
    /// This machine's node name (default: the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Resources every node reports instead of the host's, as `cpu=64,memory=256Gi,pods=2000`
    /// (a simulated node, as KWOK's: for control-plane benchmarks with `--fake-qemu`).
    #[arg(long, value_parser = parse_capacity, default_value = "")]
    pub node_capacity: std::collections::BTreeMap<String, String>,
    /// How many nodes the embedded Kubernetes runs on this machine, each with its own node
    /// agent, pod network and virt-handler (named NODE_NAME, NODE_NAME-2, …).
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    /// Run guests under software emulation (TCG) even where KVM works.
    #[arg(long)]
    pub use_emulation: bool,
    /// Start launchers with a fake QEMU that reports a running domain (control-plane
    /// benchmarks).
    #[arg(long)]
    pub fake_qemu: bool,
    /// The embedded Kubernetes only: no KubeVirt CRDs, CR or components.
    #[arg(long)]
    pub no_kubevirt: bool,
}

/// `key=quantity,…` as `--node-capacity` takes it (an empty string: no overrides).
fn parse_capacity(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    s.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?} is not RESOURCE=QUANTITY"))?;
            let quantity: kubevirt_api::quantity::Quantity = value
                .trim()
                .parse()
                .map_err(|e| format!("{value:?} is not a quantity: {e}"))?;
            Ok((key.trim().to_owned(), quantity.to_string()))
        })
        .collect()
}

/// The initial `KubeVirt` CR: `deploy/kubevirt-cr.yaml`'s, with software emulation where KVM
/// is not really usable and the server's virt-controller flags as
/// `customizeComponents.flags.controller` (which the operator renders into virt-controller's
/// arguments).
fn default_kubevirt_cr(
    install: &kubevirt_install::InstallConfig,
    use_emulation: bool,
    args: &ServerArgs,
) -> anyhow::Result<serde_json::Value> {
    let mut controller_flags = serde_json::Map::new();
    for (flag, value) in [
        ("additional-launcher-labels-sync", &args.labels_sync),
        (
            "additional-launcher-annotations-sync",
            &args.annotations_sync,
        ),
    ] {
        if !value.is_empty() {
            controller_flags.insert(flag.into(), value.as_str().into());
        }
    }
    let mut cr = kubevirt_install::kubevirt_cr::objects(install)
        .context("rendering the KubeVirt CR")?
        .remove(0);
    let spec = &mut cr["spec"];
    spec["configuration"]["developerConfiguration"]["useEmulation"] = json!(use_emulation);
    if !controller_flags.is_empty() {
        spec["customizeComponents"]["flags"] = json!({"controller": controller_flags});
    }
    Ok(cr)
}

/// Installs the embedded CDI (`deploy/embedded/cdi.yaml`: the DataVolume CRD and its
/// controller's Deployment) as a user installs CDI on a cluster, before KubeVirt, so that
/// virt-controller finds the DataVolume API when it starts.
async fn install_cdi(admin: &kube::Client) -> anyhow::Result<()> {
    for object in kubevirt_cdi::manifests::objects().context("rendering the CDI manifests")? {
        virt_operator::apply::create_or_replace_dynamic(admin.clone(), object)
            .await
            .context("applying deploy/embedded/cdi.yaml")?;
    }
    Ok(())
}

/// Installs what the node agents' secondary networks need (the NetworkAttachmentDefinition
/// CRD and the nodes' rights on it, [`kubevirt_node::network_attachments`]), as a user installs
/// Multus on a cluster.
async fn install_network_attachments(admin: &kube::Client) -> anyhow::Result<()> {
    for object in kubevirt_node::network_attachments::objects() {
        virt_operator::apply::create_or_replace_dynamic(admin.clone(), object)
            .await
            .context("installing the NetworkAttachmentDefinition API")?;
    }
    Ok(())
}

/// Installs KubeVirt as a user does (`kubectl apply -f deploy/kubevirt-operator.yaml`, then
/// `-f deploy/kubevirt-cr.yaml`): the operator's manifest, then, once the `KubeVirt` kind is
/// served, the CR (created only when missing, so a restart keeps the user's changes).
async fn install_kubevirt(
    admin: &kube::Client,
    install: &kubevirt_install::InstallConfig,
    cr: serde_json::Value,
) -> anyhow::Result<()> {
    for object in kubevirt_install::virt_operator::objects(install)
        .context("rendering the operator's manifest")?
    {
        virt_operator::apply::create_or_replace_dynamic(admin.clone(), object)
            .await
            .context("applying kubevirt-operator.yaml")?;
    }
    let crs: kube::Api<kubevirt_api::v1::KubeVirt> =
        kube::Api::namespaced(admin.clone(), &install.namespace);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let existing = loop {
        match crs.list(&kube::api::ListParams::default()).await {
            Ok(list) => break list.items,
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(e).context("the KubeVirt kind is not served");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    if existing.is_empty() {
        virt_operator::apply::create_or_replace_dynamic(admin.clone(), cr)
            .await
            .context("applying kubevirt-cr.yaml")?;
    }
    Ok(())
}

/// Waits until the KubeVirt CR is `Available=True` and the components pass the readiness
/// checks ([`virt_operator::installer::not_ready`]), logging what is missing every few seconds.
async fn wait_kubevirt_ready(admin: &kube::Client, namespace: &str, nodes: usize) {
    let crs: kube::Api<kubevirt_api::v1::KubeVirt> =
        kube::Api::namespaced(admin.clone(), namespace);
    let started = tokio::time::Instant::now();
    let mut reported = started;
    loop {
        let available = crs
            .list(&kube::api::ListParams::default())
            .await
            .is_ok_and(|list| {
                list.items.iter().any(|kv| {
                    kv.status.as_ref().is_some_and(|s| {
                        s.conditions.iter().any(|c| {
                            c.type_ == kubevirt_api::v1::KubeVirtConditionType::Available
                                && c.status == kubevirt_api::v1::ConditionStatus::True
                        })
                    })
                })
            });
        let missing = virt_operator::installer::not_ready(admin, namespace, nodes).await;
        if available && missing.is_empty() {
            info!(
                seconds = started.elapsed().as_secs_f32(),
                "KubeVirt is Available"
            );
            return;
        }
        if reported.elapsed() >= Duration::from_secs(5) {
            info!(available, ?missing, "waiting for KubeVirt");
            reported = tokio::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client from a kubeconfig file, sending [`crate::kube_config::user_agent`]`(component)`.
pub(crate) async fn client_from(
    kubeconfig: &Path,
    component: &str,
) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("client configuration")?;
    crate::kube_config::build(crate::kube_config::with_user_agent(config, component))
}

/// A client of an embedded-wing component: a client certificate for user `user` in group
/// `org`, issued by the cluster CA, for the server the admin kubeconfig names, so the API
/// server authorizes the component by kube's role for that identity (see the API server's
/// bootstrap policy), not as an administrator. The kubeconfig is written beside the admin's
/// (`DATA/kubeconfig-<file>`) for an operator to inspect the component's rights with.
async fn component_client(
    data_dir: &Path,
    file: &str,
    (user, org): (&str, Option<&str>),
    agent: &str,
) -> anyhow::Result<kube::Client> {
    let (cert_pem, key_pem) = kubevirt_apiserver::pki::issue_client_cert(data_dir, user, org)
        .with_context(|| format!("issuing the client certificate of {user}"))?;
    let admin = kube::config::Kubeconfig::read_from(data_dir.join("kubeconfig"))
        .context("reading the admin kubeconfig")?;
    let server = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .context("the admin kubeconfig names no server")?;
    let ca_pem =
        std::fs::read_to_string(data_dir.join("pki").join("ca.crt")).context("reading the CA")?;
    let yaml = kubevirt_apiserver::pki::kubeconfig_yaml(
        &server,
        &ca_pem,
        user,
        kubevirt_apiserver::pki::KubeAuth::ClientCert {
            cert_pem: &cert_pem,
            key_pem: &key_pem,
        },
    );
    let path = data_dir.join(format!("kubeconfig-{file}"));
    kubevirt_apiserver::pki::write_atomic(&path, yaml.as_bytes(), true)
        .with_context(|| format!("writing {}", path.display()))?;
    client_from(&path, agent).await
}

/// Host and port of the API server a kubeconfig names (what pods get as the `kubernetes`
/// Service address).
async fn api_server_address(kubeconfig: &Path) -> anyhow::Result<Option<(String, u16)>> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("client configuration")?;
    let url = &config.cluster_url;
    Ok(url
        .host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
        .zip(url.port_u16().or(Some(443))))
}

/// Runs `component` until `cancel`, restarting it a second after it stops early.
fn supervise<F, Fut>(
    name: &'static str,
    cancel: CancellationToken,
    mut component: F,
) -> tokio::task::JoinHandle<()>
where
    F: FnMut(CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    tokio::spawn(async move {
        while !cancel.is_cancelled() {
            match component(cancel.child_token()).await {
                Ok(()) if cancel.is_cancelled() => break,
                Ok(()) => warn!(component = name, "stopped; restarting"),
                Err(e) => warn!(
                    component = name,
                    error = format!("{e:#}"),
                    "failed; restarting"
                ),
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    })
}

/// The embedded server's default StorageClass: local volumes of the node a pod is scheduled
/// to, made by the controller-manager's local provisioner.
fn default_storage_class() -> serde_json::Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": "local",
            "annotations": {kubevirt_apiserver::admission::DEFAULT_CLASS_ANNOTATION: "true"},
        },
        "provisioner": kubevirt_controller_manager::volume::PROVISIONER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    })
}

/// Where the local provisioner makes each node's volumes: the directory the node's
/// `hostPath` [`kubevirt_node::host_paths::LOCAL_VOLUMES_PATH`] resolves to.
fn local_storage(nodes: &[(String, PathBuf)]) -> kubevirt_controller_manager::volume::LocalStorage {
    kubevirt_controller_manager::volume::LocalStorage {
        node_path: PathBuf::from(kubevirt_node::host_paths::LOCAL_VOLUMES_PATH),
        nodes: nodes
            .iter()
            .map(|(name, dir)| {
                (
                    name.clone(),
                    kubevirt_node::host_paths::local_volumes_dir(dir),
                )
            })
            .collect(),
    }
}

/// Starts the embedded Kubernetes' cluster-wide parts: the scheduler (kube-scheduler's
/// role) and the workload and volume controllers (kube-controller-manager's) with the local
/// provisioner for `nodes` (name, state directory).
async fn start_embedded_control_plane(
    data_dir: &Path,
    nodes: &[(String, PathBuf)],
    cancel: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let manager_config = kubevirt_controller_manager::Config {
        local_storage: local_storage(nodes),
        ..kubevirt_controller_manager::Config::default()
    };
    let scheduler_client = component_client(
        data_dir,
        "scheduler",
        ("system:kube-scheduler", None),
        "kube-scheduler",
    )
    .await?;
    let scheduler = supervise("scheduler", cancel.clone(), move |token| {
        let client = scheduler_client.clone();
        async move {
            tokio::select! {
                () = token.cancelled() => {}
                () = kubevirt_scheduler::run(client) => {}
            }
            Ok(())
        }
    });
    let manager_client = component_client(
        data_dir,
        "controller-manager",
        ("system:kube-controller-manager", None),
        "kube-controller-manager",
    )
    .await?;
    let controller_manager = supervise("controller-manager", cancel.clone(), move |token| {
        let (client, config) = (manager_client.clone(), manager_config.clone());
        async move {
            kubevirt_controller_manager::run(client, config, token).await;
            Ok(())
        }
    });
    Ok(vec![scheduler, controller_manager])
}

/// The name and state directory of node `index` (0-based) of `count`: one node is
/// `base` in `DATA/node`; of several, the first is `base` and the others `base-2`, `base-3`, …
/// in `DATA/nodes/<name>`.
fn embedded_node(data_dir: &Path, base: &str, index: usize) -> (String, PathBuf) {
    if index == 0 {
        (base.to_owned(), data_dir.join("node"))
    } else {
        let name = format!("{base}-{}", index + 1);
        let dir = data_dir.join("nodes").join(&name);
        (name, dir)
    }
}

/// Starts one node of the embedded Kubernetes: its node agent (kubelet's role) and, when its
/// pods have their own network, its service proxy (kube-proxy's).
async fn start_embedded_node(
    data_dir: &Path,
    (node_name, node_dir): (&str, &Path),
    images: &kubevirt_node::images::ImageStore,
    capacity_overrides: &std::collections::BTreeMap<String, String>,
    ca_pem: &[u8],
    cancel: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let node_client = component_client(
        data_dir,
        &format!("node-{node_name}"),
        (&format!("system:node:{node_name}"), Some("system:nodes")),
        "kubelet",
    )
    .await?;
    // Pods in their own network namespaces when this process can make them, on a bridge and
    // CIDR no other node on this machine uses (the same slot again after a restart, so the
    // running pods keep their bridge); otherwise in the host's network.
    // The owner name must be the same at every start: the data directory exists by now (the
    // API server made it), the node's own directory may not yet on the first start.
    let owner = std::fs::canonicalize(data_dir)
        .map(|d| d.join("nodes").join(node_name))
        .unwrap_or_else(|_| node_dir.to_path_buf());
    let (pod_network, slot) = match kubevirt_node::PodNetworkConfig::acquire_for(
        &owner.display().to_string(),
    ) {
        Ok((network, slot)) => {
            info!(node = node_name, bridge = %network.bridge, pod_cidr = %network.pod_cidr, "pod network");
            (Some(network), Some(slot))
        }
        Err(reason) => {
            info!(node = node_name, reason = %reason, "pods share the host's network");
            (None, None)
        }
    };
    let mut tasks = vec![];
    // Pods with their own network reach the API server as in-cluster clients do, through
    // the `kubernetes` Service, which this node's service proxy routes; pods in the host's
    // network reach it where it listens.
    let kubernetes_service = match &pod_network {
        Some(network) => {
            let proxy_client = component_client(
                data_dir,
                &format!("proxy-{node_name}"),
                ("system:kube-proxy", None),
                "kube-proxy",
            )
            .await?;
            let config = kubevirt_service_proxy::ProxyConfig {
                table: kubevirt_service_proxy::table_name(&network.bridge),
                interfaces: vec![network.bridge.clone()],
            };
            tasks.push(supervise("service-proxy", cancel.clone(), move |token| {
                let (client, config) = (proxy_client.clone(), config.clone());
                async move {
                    kubevirt_service_proxy::run(client, config, token).await;
                    Ok(())
                }
            }));
            Some((
                kubevirt_apiserver::services::kubernetes_service_ip().to_string(),
                443,
            ))
        }
        None => api_server_address(&data_dir.join("kubeconfig")).await?,
    };
    let node_config = kubevirt_node::NodeConfig {
        node_name: node_name.to_owned(),
        data_dir: node_dir.to_path_buf(),
        images: images.clone(),
        host_ip: "127.0.0.1".into(),
        cluster_ca_pem: Some(ca_pem.to_vec()),
        serving_cert: Some(
            kubevirt_apiserver::pki::issue_serving_cert(
                data_dir,
                vec!["127.0.0.1".into(), "localhost".into()],
            )
            .context("issuing the node's serving certificate")?,
        ),
        kubernetes_service,
        pod_network,
        capacity_overrides: capacity_overrides.clone(),
        // Each node has its own kubelet and KubeVirt state directories, as a kind node's
        // container has; virt-handler's state directory is the server's, whose image store
        // (`kubevirt-rs images import`) every node serves containerDisks from.
        host_paths: host_paths(node_dir, data_dir),
    };
    tasks.push(supervise("node", cancel.clone(), move |token| {
        // The slot is held for as long as the node task lives.
        let _held = &slot;
        let (client, config) = (node_client.clone(), node_config.clone());
        async move {
            let result = kubevirt_node::run_node(client, config.clone(), token.clone()).await;
            // A clean shutdown removes the bridge, unless pods (running VMs) still use it.
            if token.is_cancelled()
                && let Some(network) = &config.pod_network
                && let Err(e) = network.delete_bridge_if_unused(&config.data_dir)
            {
                warn!(error = %e, "cannot delete the pod bridge");
            }
            Ok(result?)
        }
    }));
    Ok(tasks)
}

/// Where the node's hostPath volumes resolve: kubelet's and KubeVirt's directories per node
/// ([`kubevirt_node::HostPathMap::for_node`]), except virt-handler's state directory
/// (`/var/lib/kubevirt-rs`), which is the server's data directory on every node.
fn host_paths(node_dir: &Path, data_dir: &Path) -> kubevirt_node::HostPathMap {
    let mut prefixes: Vec<(PathBuf, PathBuf)> = kubevirt_node::HostPathMap::for_node(node_dir)
        .prefixes()
        .iter()
        .filter(|(prefix, _)| prefix != Path::new(HANDLER_STATE_DIR))
        .cloned()
        .collect();
    prefixes.push((PathBuf::from(HANDLER_STATE_DIR), data_dir.to_path_buf()));
    kubevirt_node::HostPathMap::new(prefixes)
}

/// virt-handler's state directory on a node (its DaemonSet's hostPath volume).
const HANDLER_STATE_DIR: &str = "/var/lib/kubevirt-rs";

/// Where `kubevirt-rs images import-release` puts other releases of the project's images
/// (a name starting with `.` is never an image directory of the image store beside it).
pub fn releases_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("images").join(".releases")
}

/// The images of KubeVirt's components (and the project's launcher), all this binary.
const PROJECT_IMAGES: [&str; 5] = [
    "virt-operator",
    "virt-api",
    "virt-controller",
    "virt-handler",
    "virt-launcher",
];

/// The node's image store: this binary under each of the project's image names that `install`
/// renders into the manifests (and virt-controller's default launcher image), with the
/// environment its image would carry (the launcher's a fake QEMU under `--fake-qemu`); every
/// other tag of those images is the release imported under it into [`releases_dir`].
fn project_images(
    data_dir: &Path,
    fake_qemu: bool,
    install: &kubevirt_install::InstallConfig,
) -> anyhow::Result<kubevirt_node::images::ImageStore> {
    let binary = std::env::current_exe().context("locating the kubevirt-rs binary")?;
    let mut env = vec![];
    for key in ["PATH", "RUST_LOG"] {
        if let Some(value) = std::env::var_os(key) {
            env.push((key.to_owned(), value.to_string_lossy().into_owned()));
        }
    }
    let image = |env: Vec<(String, String)>| kubevirt_node::images::Image {
        programs: std::collections::BTreeMap::from([(
            kubevirt_install::BINARY.to_owned(),
            binary.clone(),
        )]),
        entrypoint: vec![kubevirt_install::BINARY.to_owned()],
        env,
    };
    let mut images = kubevirt_node::images::ImageStore::new();
    let mut releases = std::collections::BTreeMap::new();
    let mut add = |reference: &str, image: kubevirt_node::images::Image| {
        releases.insert(
            kubevirt_node::images::ReleaseFamily::repository_of(reference),
            image.clone(),
        );
        images.insert(reference, image);
    };
    for name in PROJECT_IMAGES {
        add(&install.image(name), image(env.clone()));
    }
    // The embedded CDI's controller and importer (`kubevirt-rs cdi-controller`/`cdi-importer`).
    for reference in [
        kubevirt_cdi::controller_image(),
        kubevirt_cdi::importer_image(),
    ] {
        add(&reference, image(env.clone()));
    }
    let mut launcher_env = env;
    if fake_qemu {
        launcher_env.push(("KUBEVIRT_RS_FAKE_QEMU".to_owned(), "true".to_owned()));
    }
    // The launcher image: the small `virt-launcher` built beside this binary under each of its
    // program names, and this binary (attachment pods run `kubevirt-rs hotplug-disk` from it).
    let launcher_binary = binary.with_file_name(kubevirt_api::constants::LAUNCHER_PROGRAM);
    anyhow::ensure!(
        launcher_binary.is_file(),
        "{} is missing: it is built with kubevirt-rs (cargo build -p kubevirt-rs --bins)",
        launcher_binary.display()
    );
    let mut launcher_image = image(launcher_env);
    launcher_image.entrypoint = vec![kubevirt_api::constants::LAUNCHER_PROGRAM.to_owned()];
    for program in kubevirt_api::constants::LAUNCHER_PROGRAMS {
        launcher_image
            .programs
            .insert(program.to_owned(), launcher_binary.clone());
    }
    for launcher in [
        install.launcher_image(),
        virt_controller::vmi::template::LauncherPodConfig::default().launcher_image,
    ] {
        add(&launcher, launcher_image.clone());
    }
    images.set_releases(kubevirt_node::images::ReleaseFamily {
        dir: releases_dir(data_dir),
        repositories: releases,
    });
    Ok(images)
}

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServerArgs) -> anyhow::Result<()> {
    let accel = virt_launcher::accel::detect_accel(virt_launcher::accel::AccelMode::Auto);
    let use_emulation = args.use_emulation || accel.accel == virt_launcher::spec::Accel::Tcg;
    // KubeVirt's namespace (and so its CR's) is the one its manifests are rendered for.
    let install = kubevirt_install::InstallConfig::default();
    if !args.no_kubevirt {
        info!(use_emulation, reason = %accel.reason, "acceleration");
    }
    let server = kubevirt_apiserver::start(kubevirt_apiserver::Config {
        data_dir: args.data_dir.clone(),
        listen: args.listen,
        // Created when missing: a user's changes to the class are kept (a deleted one comes
        // back at the next start).
        initial_objects: vec![default_storage_class()],
    })
    .await
    .context("starting the API server")?;
    let cancel = CancellationToken::new();
    let data_dir = args.data_dir.clone();

    let node_name = args
        .node_name
        .clone()
        .unwrap_or_else(virt_handler::default_node_name);
    let ca_pem =
        std::fs::read(data_dir.join("pki").join("ca.crt")).context("reading the cluster CA")?;
    let images = project_images(&data_dir, args.fake_qemu, &install)?;
    let nodes = args.nodes.max(1);
    let node_dirs: Vec<(String, PathBuf)> = (0..nodes)
        .map(|index| embedded_node(&data_dir, &node_name, index))
        .collect();
    let mut tasks = start_embedded_control_plane(&data_dir, &node_dirs, &cancel).await?;
    for (name, dir) in node_dirs {
        tasks.extend(
            start_embedded_node(
                &data_dir,
                (&name, &dir),
                &images,
                &args.node_capacity,
                &ca_pem,
                &cancel,
            )
            .await?,
        );
    }

    let admin = client_from(&data_dir.join("kubeconfig"), "kubevirt-rs-server").await?;
    install_network_attachments(&admin).await?;
    if !args.no_kubevirt {
        let cr = default_kubevirt_cr(&install, use_emulation, &args)?;
        install_cdi(&admin).await?;
        install_kubevirt(&admin, &install, cr).await?;
        tokio::select! {
            () = wait_kubevirt_ready(&admin, &install.namespace, nodes) => {}
            () = crate::shutdown_signal() => {
                cancel.cancel();
                server.stop().await;
                return Ok(());
            }
        }
    }

    info!(kubeconfig = %server.kubeconfig.display(), "kubevirt-rs server ready");
    crate::shutdown_signal().await;
    info!("shutting down (running pods, and so VMs and KubeVirt's components, keep running)");
    cancel.cancel();
    // Let the components finish their last API calls before the API server goes away.
    let _ = tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(tasks)).await;
    server.stop().await;
    Ok(())
}
