//! `kubevirt-rs server`: the whole stack in one process on one machine.
//!
//! Wiring only. First the embedded Kubernetes: the API server (with the KubeVirt CRDs and a
//! default `KubeVirt` CR), the scheduler and this machine's node agent (kubelet's role, with an
//! image store holding this binary as the project's images). Then KubeVirt on it, each
//! component with its own client and credentials to the loopback API server, exactly as they
//! would run against a real cluster — virt-api (admission webhooks, registered through
//! webhook configuration objects), virt-controller (behind its Lease) and virt-handler for
//! this node. The two halves meet only at the Kubernetes API. Components that stop with an
//! error are restarted after a second.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, PostParams};
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
}

/// The namespace KubeVirt's components and CR live in.
const KUBEVIRT_NAMESPACE: &str = "kubevirt";

/// The default `KubeVirt` CR: software emulation where KVM is not really usable.
fn default_kubevirt_cr(use_emulation: bool) -> serde_json::Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": KUBEVIRT_NAMESPACE},
        "spec": {
            "configuration": {"developerConfiguration": {"useEmulation": use_emulation}},
            "customizeComponents": {}
        }
    })
}

pub fn kubevirt_crds() -> anyhow::Result<Vec<serde_json::Value>> {
    kubevirt_api::crd::all_crds()
        .context("generating the KubeVirt CRDs")?
        .iter()
        .map(|c| serde_json::to_value(c).context("serializing a CRD"))
        .collect()
}

pub(crate) async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("client configuration")?;
    kube::Client::try_from(config).context("client")
}

/// A client of an embedded-wing component: a client certificate for user `user` in group
/// `org`, issued by the cluster CA, for the server the admin kubeconfig names, so the API
/// server authorizes the component by kube's role for that identity (see the API server's
/// bootstrap policy), not as an administrator. The kubeconfig is written beside the admin's
/// (`DATA/kubeconfig-<file>`) for an operator to inspect the component's rights with.
async fn component_client(
    data_dir: &Path,
    file: &str,
    user: &str,
    org: Option<&str>,
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
    client_from(&path).await
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

/// Creates `object`, or replaces it when it exists (keeping nothing of the old one).
async fn create_or_replace<K>(api: &Api<K>, object: serde_json::Value) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut typed: K = serde_json::from_value(object).context("decoding the object")?;
    let name = typed.meta().name.clone().unwrap_or_default();
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &typed).await?;
        }
        Some(existing) => {
            typed.meta_mut().resource_version = existing.meta().resource_version.clone();
            api.replace(&name, &PostParams::default(), &typed).await?;
        }
    }
    Ok(())
}

/// Starts virt-api's admission webhooks and registers them.
/// What keeps virt-api's servers running.
struct VirtApi {
    _webhooks: virt_api::webhook::WebhookServer,
    _subresources: tokio::task::JoinHandle<()>,
}

/// Creates or replaces an object of a kind without a Rust type (such as an APIService).
async fn create_or_replace_dynamic(
    client: kube::Client,
    object: serde_json::Value,
) -> anyhow::Result<()> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let obj: DynamicObject = serde_json::from_value(object).context("decoding the object")?;
    let types = obj
        .types
        .clone()
        .context("object without apiVersion/kind")?;
    let (group, version) = types
        .api_version
        .split_once('/')
        .unwrap_or(("", &types.api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    let name = obj.metadata.name.clone().unwrap_or_default();
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &obj).await?;
        }
        Some(existing) => {
            let mut obj = obj;
            obj.metadata.resource_version = existing.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &obj).await?;
        }
    }
    Ok(())
}

async fn start_virt_api(
    data_dir: &Path,
    client: kube::Client,
    cancel: &CancellationToken,
) -> anyhow::Result<VirtApi> {
    let (cert, key) = kubevirt_apiserver::pki::issue_serving_cert(
        data_dir,
        vec!["127.0.0.1".into(), "localhost".into()],
    )
    .context("issuing virt-api's serving certificate")?;
    let ca_pem =
        std::fs::read(data_dir.join("pki").join("ca.crt")).context("reading the cluster CA")?;
    let config_rx = kubevirt_api::cluster_config::subscribe(
        Api::namespaced(client.clone(), KUBEVIRT_NAMESPACE),
        virt_api::ClusterConfig::from_kubevirt,
    )
    .receiver();
    let config_rx_sub = config_rx.clone();
    let server = virt_api::webhook::run_webhook_server(
        virt_api::webhook::WebhookServerConfig {
            listen: "127.0.0.1:0".parse().context("address")?,
            cert_pem: cert.into_bytes(),
            key_pem: key.into_bytes(),
            cluster_config: config_rx,
            service_accounts: virt_api::webhook::kubevirt_service_accounts(KUBEVIRT_NAMESPACE),
            client: Some(client.clone()),
        },
        cancel.clone().cancelled_owned(),
    )
    .await
    .context("starting virt-api's webhook server")?;
    let (mutating, validating) =
        virt_api::webhook::webhook_configurations(&ca_pem, &format!("https://{}", server.addr));
    create_or_replace(
        &Api::<MutatingWebhookConfiguration>::all(client.clone()),
        mutating,
    )
    .await
    .context("registering the mutating webhooks")?;
    create_or_replace(
        &Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        validating,
    )
    .await
    .context("registering the validating webhooks")?;
    info!(addr = %server.addr, "virt-api webhooks registered");

    // The subresource API, served to the API server's aggregation proxy.
    let pki = data_dir.join("pki");
    let read =
        |file: &str| std::fs::read(pki.join(file)).with_context(|| format!("reading pki/{file}"));
    let (cert, key) = kubevirt_apiserver::pki::issue_serving_cert(
        data_dir,
        vec!["127.0.0.1".into(), "localhost".into()],
    )
    .context("issuing virt-api's subresource serving certificate")?;
    let (sub_addr, sub_task) = virt_api::subresources::run_subresource_server(
        virt_api::subresources::SubresourceServerConfig {
            listen: "127.0.0.1:0".parse().context("address")?,
            cert_pem: cert.into_bytes(),
            key_pem: key.into_bytes(),
            client: client.clone(),
            node_endpoint: Some(virt_api::subresources::NodeClientConfig {
                client_cert_pem: read("apiserver-kubelet-client.crt")?,
                client_key_pem: read("apiserver-kubelet-client.key")?,
                server_ca_pem: Some(ca_pem.clone()),
            }),
            client_ca_pem: Some(ca_pem.clone()),
            cluster_config: config_rx_sub,
        },
        cancel.clone().cancelled_owned(),
    )
    .await
    .context("starting virt-api's subresource server")?;
    let api_service =
        virt_api::subresources::api_service(&ca_pem, Some(&format!("https://{sub_addr}")));
    create_or_replace_dynamic(client, api_service)
        .await
        .context("registering the subresource APIService")?;
    info!(addr = %sub_addr, "virt-api subresources registered");
    Ok(VirtApi {
        _webhooks: server,
        _subresources: sub_task,
    })
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

/// Starts the embedded Kubernetes' cluster-wide parts: the scheduler (kube-scheduler's
/// role) and the workload controllers (kube-controller-manager's).
async fn start_embedded_control_plane(
    data_dir: &Path,
    cancel: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let scheduler_client =
        component_client(data_dir, "scheduler", "system:kube-scheduler", None).await?;
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
        "system:kube-controller-manager",
        None,
    )
    .await?;
    let controller_manager = supervise("controller-manager", cancel.clone(), move |token| {
        let client = manager_client.clone();
        async move {
            kubevirt_controller_manager::run(
                client,
                kubevirt_controller_manager::Config::default(),
                token,
            )
            .await;
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
/// pods have their own network, its service proxy (kube-proxy's). Returns the tasks and the
/// node's pod directory.
async fn start_embedded_node(
    data_dir: &Path,
    (node_name, node_dir): (&str, &Path),
    fake_qemu: bool,
    ca_pem: &[u8],
    cancel: &CancellationToken,
) -> anyhow::Result<(Vec<tokio::task::JoinHandle<()>>, PathBuf)> {
    let node_client = component_client(
        data_dir,
        &format!("node-{node_name}"),
        &format!("system:node:{node_name}"),
        Some("system:nodes"),
    )
    .await?;
    // Pods in their own network namespaces when this process can make them, on a bridge and
    // CIDR no other node on this machine uses (the same slot again after a restart, so the
    // running pods keep their bridge); otherwise in the host's network.
    let owner = std::fs::canonicalize(node_dir)
        .or_else(|_| std::fs::canonicalize(data_dir).map(|d| d.join(node_name)))
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
                "system:kube-proxy",
                None,
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
        images: project_images(fake_qemu)?,
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
    };
    let kubelet_pods_dir = node_config.pods_dir();
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
    Ok((tasks, kubelet_pods_dir))
}

/// The node's image store: this binary under the project's images (the launcher image of
/// the default launcher pod configuration), with the environment its image would carry.
fn project_images(fake_qemu: bool) -> anyhow::Result<kubevirt_node::images::ImageStore> {
    let binary = std::env::current_exe().context("locating the kubevirt-rs binary")?;
    let mut env = vec![];
    for key in ["PATH", "RUST_LOG"] {
        if let Some(value) = std::env::var_os(key) {
            env.push((key.to_owned(), value.to_string_lossy().into_owned()));
        }
    }
    if fake_qemu {
        env.push(("KUBEVIRT_RS_FAKE_QEMU".to_owned(), "true".to_owned()));
    }
    let mut images = kubevirt_node::images::ImageStore::new();
    images.insert(
        &virt_controller::vmi::template::LauncherPodConfig::default().launcher_image,
        kubevirt_node::images::Image {
            programs: std::collections::BTreeMap::from([("kubevirt-rs".to_owned(), binary)]),
            entrypoint: vec!["kubevirt-rs".to_owned()],
            env,
        },
    );
    Ok(images)
}

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: ServerArgs) -> anyhow::Result<()> {
    let accel = virt_launcher::accel::detect_accel(virt_launcher::accel::AccelMode::Auto);
    let use_emulation = args.use_emulation || accel.accel == virt_launcher::spec::Accel::Tcg;
    info!(use_emulation, reason = %accel.reason, "acceleration");
    let mut initial_objects = kubevirt_crds()?;
    initial_objects.push(default_kubevirt_cr(use_emulation));
    let server = kubevirt_apiserver::start(kubevirt_apiserver::Config {
        data_dir: args.data_dir.clone(),
        listen: args.listen,
        initial_objects,
    })
    .await
    .context("starting the API server")?;
    let cancel = CancellationToken::new();
    let data_dir = args.data_dir.clone();

    let api_client = client_from(&data_dir.join("kubeconfig-api")).await?;
    let _virt_api = start_virt_api(&data_dir, api_client, &cancel).await?;

    let node_name = args
        .node_name
        .clone()
        .unwrap_or_else(virt_handler::default_node_name);
    let controller_client = client_from(&data_dir.join("kubeconfig-controller")).await?;
    let controller_config = virt_controller::app::ControllerAppConfig {
        namespace: KUBEVIRT_NAMESPACE.into(),
        labels_sync: args.labels_sync.clone(),
        annotations_sync: args.annotations_sync.clone(),
        launcher: virt_controller::vmi::template::LauncherPodConfig {
            use_emulation,
            ..Default::default()
        },
        // A stable identity: after a restart this process still holds its own Lease and
        // resumes at once instead of waiting for the old holder's lease to expire.
        leader: virt_controller::runtime::leader::LeaderElectionConfig {
            identity: format!("kubevirt-rs-server-{node_name}"),
            ..Default::default()
        },
    };
    let metrics = std::sync::Arc::new(virt_controller::runtime::metrics::Metrics::new());
    let controller = supervise("virt-controller", cancel.clone(), move |token| {
        let (client, config, metrics) = (
            controller_client.clone(),
            controller_config.clone(),
            metrics.clone(),
        );
        async move { Ok(virt_controller::app::run_controller(client, config, &metrics, token).await?) }
    });

    let ca_pem =
        std::fs::read(data_dir.join("pki").join("ca.crt")).context("reading the cluster CA")?;
    let serving_cert = || {
        kubevirt_apiserver::pki::issue_serving_cert(
            &data_dir,
            vec!["127.0.0.1".into(), "localhost".into()],
        )
    };

    let mut tasks = start_embedded_control_plane(&data_dir, &cancel).await?;
    for index in 0..args.nodes.max(1) {
        let (name, dir) = embedded_node(&data_dir, &node_name, index);
        let (node_tasks, kubelet_pods_dir) =
            start_embedded_node(&data_dir, (&name, &dir), args.fake_qemu, &ca_pem, &cancel).await?;
        tasks.extend(node_tasks);

        // KubeVirt's node agent on this node.
        let handler_client = client_from(&data_dir.join("kubeconfig-handler")).await?;
        let handler_config = virt_handler::HandlerConfig {
            node_name: name,
            data_dir: data_dir.clone(),
            kubelet_pods_dir,
            use_emulation: args.use_emulation.then_some(true),
            rest: Some(virt_handler::rest::RestConfig {
                listen: "127.0.0.1:0".parse().context("address")?,
                client_ca_pem: ca_pem.clone(),
                serving_cert: Some(
                    serving_cert().context("issuing virt-handler's serving certificate")?,
                ),
            }),
        };
        tasks.push(supervise("virt-handler", cancel.clone(), move |token| {
            let (client, config) = (handler_client.clone(), handler_config.clone());
            async move { Ok(virt_handler::run_handler(client, config, token).await?) }
        }));
    }

    info!(kubeconfig = %server.kubeconfig.display(), "kubevirt-rs server ready");
    crate::shutdown_signal().await;
    info!("shutting down (running VMs keep running)");
    cancel.cancel();
    // Let the components finish their last API calls (the controller releases its Lease)
    // before the API server goes away.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = controller.await;
        futures::future::join_all(tasks).await;
    })
    .await;
    server.stop().await;
    Ok(())
}
