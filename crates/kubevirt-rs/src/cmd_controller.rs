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
    /// How old virt-handler's heartbeat on a Node may get before the node controller marks
    /// the node unschedulable and fails its VMIs without a live launcher (upstream's fixed
    /// 5 minutes; `customizeComponents.flags.controller` sets it through the KubeVirt CR).
    #[arg(long, default_value = "5m", value_parser = crate::parse_duration)]
    pub node_heartbeat_timeout: std::time::Duration,
}

pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let client = crate::kube_config::client(args.kubeconfig.as_deref()).await?;
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
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        tokio::spawn(async move {
            crate::shutdown_signal().await;
            token.cancel();
        });
        virt_controller::app::run_controller(client, config, &metrics, cancel)
            .await
            .context("virt-controller")
    })
}
