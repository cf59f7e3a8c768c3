//! `kubevirt-rs operator`: virt-operator against any API server — in-cluster configuration
//! unless given a kubeconfig. Wiring only: the controller is [`virt_operator::kubevirt`].

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct OperatorArgs {
    /// Kubeconfig with the operator's credentials (default: the in-cluster configuration,
    /// else `KUBECONFIG`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the KubeVirt CR, the installation and the leader Lease (default: the
    /// pod's namespace, else `kubevirt`).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Address of the metrics (8443) and webhook (8444) ports.
    #[arg(long, default_value = "0.0.0.0")]
    pub listen: std::net::IpAddr,
    /// Where the Secret `kubevirt-operator-certs` is mounted; the ports open once it holds
    /// `tls.crt` and `tls.key`.
    #[arg(long, default_value = kubevirt_install::virt_operator::CERTIFICATES_DIR)]
    pub certificates_dir: PathBuf,
}

pub fn run(args: OperatorArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let client =
            crate::kube_config::client(args.kubeconfig.as_deref(), "virt-operator").await?;
        let namespace = args
            .namespace
            .unwrap_or_else(|| crate::kube_config::pod_namespace("kubevirt"));
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        tokio::spawn(async move {
            crate::shutdown_signal().await;
            token.cancel();
        });
        let metrics = virt_operator::serving::OperatorMetrics::default();
        let ports = tokio::spawn(virt_operator::serving::serve(
            client.clone(),
            args.listen,
            args.certificates_dir.clone(),
            metrics.clone(),
            cancel.clone(),
        ));
        let result = virt_operator::kubevirt::run(client, &namespace, &metrics, cancel).await;
        ports.abort();
        result
    })
}
