//! `kubevirt-rs controller`: virt-controller against any API server (a real cluster, or a
//! `kubevirt-rs apiserver`), with in-cluster configuration unless given a kubeconfig. Exits with an error when it loses its Lease, as upstream does;
//! its Deployment restarts it.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct ControllerArgs {
    /// Kubeconfig with the controller's credentials (default: the in-cluster configuration,
    /// else `KUBECONFIG`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the KubeVirt CR and the leader Lease (default: the pod's namespace, else
    /// `kubevirt`).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Label keys (or `prefix/*`) synced from VM templates to VMIs and launcher pods; the
    /// KubeVirt CR's `spec.customizeComponents.flags.controller` overrides it at run time.
    #[arg(long = "additional-launcher-labels-sync", default_value = "")]
    pub labels_sync: String,
    /// Annotation keys (or `prefix/*`) synced likewise.
    #[arg(long = "additional-launcher-annotations-sync", default_value = "")]
    pub annotations_sync: String,
    /// Image of launcher pods (upstream `--launcher-image`).
    #[arg(long)]
    pub launcher_image: Option<String>,
    /// Launcher pods request no `/dev/kvm` and budget for TCG.
    #[arg(long)]
    pub use_emulation: bool,
    /// HTTPS port of `/healthz`, `/leader` and `/metrics` (upstream's `--port`); 0 for none.
    #[arg(long, default_value_t = 8443)]
    pub port: u16,
    /// Address the port binds to.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: std::net::IpAddr,
    /// Directory with the serving certificate's `tls.crt` and `tls.key` (the mounted Secret
    /// `kubevirt-controller-certs`), followed as the operator renews it; without them the
    /// port presents a self-signed certificate.
    #[arg(long, default_value = "/etc/virt-controller/certificates")]
    pub certificates_dir: PathBuf,
    /// How old virt-handler's heartbeat on a Node may get before the node controller marks
    /// the node unschedulable and fails its VMIs without a live launcher (upstream's fixed
    /// 5 minutes; `customizeComponents.flags.controller` sets it through the KubeVirt CR).
    #[arg(long, default_value = "5m", value_parser = crate::parse_duration)]
    pub node_heartbeat_timeout: std::time::Duration,
}

pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let client =
            crate::kube_config::client(args.kubeconfig.as_deref(), "virt-controller").await?;
        let mut launcher = virt_controller::vmi::template::LauncherPodConfig {
            use_emulation: args.use_emulation,
            ..Default::default()
        };
        if let Some(image) = args.launcher_image {
            launcher.launcher_image = image;
        }
        let config = virt_controller::app::ControllerAppConfig {
            namespace: args
                .namespace
                .unwrap_or_else(|| crate::kube_config::pod_namespace("kubevirt")),
            labels_sync: args.labels_sync,
            annotations_sync: args.annotations_sync,
            launcher,
            leader: virt_controller::runtime::leader::LeaderElectionConfig::default(),
            node: virt_controller::node::NodeControllerConfig {
                heartbeat_timeout: args.node_heartbeat_timeout,
                ..Default::default()
            },
        };
        let metrics = virt_controller::runtime::metrics::Metrics::new();
        let serving = if args.port == 0 {
            None
        } else {
            let listen = std::net::SocketAddr::new(args.bind_address, args.port);
            let (addr, task) = virt_controller::serving::spawn(
                listen,
                serving_certificate(&args.certificates_dir, listen)?,
                client.clone(),
                metrics.clone(),
            )
            .await
            .context("virt-controller's HTTPS port")?;
            tracing::info!(%addr, "serving /healthz, /leader and /metrics");
            Some(task)
        };
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        tokio::spawn(async move {
            crate::shutdown_signal().await;
            token.cancel();
        });
        let result = virt_controller::app::run_controller(client, config, &metrics, cancel)
            .await
            .context("virt-controller");
        if let Some(task) = serving {
            task.abort();
        }
        result
    })
}

/// The mounted certificate of `dir`, followed per handshake, or a self-signed one for
/// `listen` when `dir` has none (a controller run outside a pod).
fn serving_certificate(
    dir: &std::path::Path,
    listen: std::net::SocketAddr,
) -> anyhow::Result<std::sync::Arc<kubevirt_tls::SwappableCert>> {
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    if cert.is_file() && key.is_file() {
        return kubevirt_tls::SwappableCert::following_files(&cert, &key)
            .with_context(|| format!("the certificate in {}", dir.display()));
    }
    tracing::warn!(dir = %dir.display(), "no certificate mounted; serving a self-signed one");
    let (cert_pem, key_pem) =
        kubevirt_tls::self_signed_pem(vec![listen.ip().to_string(), "localhost".to_owned()])?;
    Ok(kubevirt_tls::SwappableCert::from_pem(
        cert_pem.as_bytes(),
        key_pem.as_bytes(),
    )?)
}
