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
        virt_operator::kubevirt::run(client, &namespace, cancel).await
    })
}
