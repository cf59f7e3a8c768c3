//! `kubevirt-rs handler`: virt-handler for this node against any API server.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct HandlerArgs {
    /// Kubeconfig of the API server.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// State directory: `images/`, `hostdisks/`.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The kubelet's pod directory (where launcher pods' emptyDir volumes are).
    #[arg(long, default_value = "/var/lib/kubelet/pods")]
    pub kubelet_pods_dir: PathBuf,
    /// Address of the REST server (console, VNC, pause) virt-api connects to.
    #[arg(long, default_value = "0.0.0.0:8186")]
    pub listen: std::net::SocketAddr,
    /// This node's name (default: the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Force (`true`) or forbid (`false`) software emulation instead of following the
    /// KubeVirt CR.
    #[arg(long)]
    pub use_emulation: Option<bool>,
}

async fn client_from(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .context("client configuration")?;
    kube::Client::try_from(config).context("client")
}

/// The cluster CA (PEM) named by the kubeconfig's current cluster, if it carries one.
fn cluster_ca(kubeconfig: &std::path::Path) -> Option<Vec<u8>> {
    use base64::Engine;
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).ok()?;
    let cluster = kc.clusters.first()?.cluster.as_ref()?;
    if let Some(data) = &cluster.certificate_authority_data {
        return base64::engine::general_purpose::STANDARD.decode(data).ok();
    }
    std::fs::read(cluster.certificate_authority.as_ref()?).ok()
}

pub fn run(args: HandlerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let client = client_from(&args.kubeconfig).await?;
        let config = virt_handler::HandlerConfig {
            node_name: args
                .node_name
                .unwrap_or_else(virt_handler::default_node_name),
            data_dir: args.data_dir,
            kubelet_pods_dir: args.kubelet_pods_dir,
            use_emulation: args.use_emulation,
            rest: cluster_ca(&args.kubeconfig).map(|ca| virt_handler::rest::RestConfig {
                listen: args.listen,
                client_ca_pem: ca,
                serving_cert: None,
            }),
        };
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        tokio::spawn(async move {
            crate::shutdown_signal().await;
            token.cancel();
        });
        virt_handler::run_handler(client, config, cancel)
            .await
            .context("virt-handler")
    })
}
