//! `kubevirt-rs handler`: virt-handler for this node against any API server, with in-cluster
//! configuration unless given a kubeconfig.
//!
//! Its REST server (console, VNC, pause for virt-api) presents the certificate of the Secret
//! `kubevirt-virt-handler-server-certs` when mounted (`tls.crt`, `tls.key`) and accepts the
//! client certificates its `ca.crt` signed (virt-api's `kubevirt-virt-handler-certs`), as
//! upstream, both followed per handshake so renewals take effect at once; without it a
//! self-signed certificate, accepting clients of the cluster CA.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct HandlerArgs {
    /// Kubeconfig of the API server (default: the in-cluster configuration, else
    /// `KUBECONFIG`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// State directory: `images/`, `hostdisks/`.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The kubelet's pod directory (where launcher pods' emptyDir volumes are).
    #[arg(long, default_value = "/var/lib/kubelet/pods")]
    pub kubelet_pods_dir: PathBuf,
    /// Address of the REST server (console, VNC, pause) virt-api connects to.
    #[arg(long, default_value = "0.0.0.0:8186")]
    pub listen: std::net::SocketAddr,
    /// Address of the metrics port (`/metrics`, `/healthz`; upstream's 8443), served
    /// with the REST server's certificate.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub metrics_listen: std::net::SocketAddr,
    /// This node's name (default: the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Force (`true`) or forbid (`false`) software emulation instead of following the
    /// KubeVirt CR.
    #[arg(long)]
    pub use_emulation: Option<bool>,
    /// This pod's IP (upstream's flag, from `status.podIP`): the REST endpoint announced on
    /// the Node when listening on every address.
    #[arg(long)]
    pub pod_ip_address: Option<std::net::IpAddr>,
    /// Where the Secret `kubevirt-virt-handler-server-certs` is mounted.
    #[arg(long, default_value = "/etc/virt-handler/servercertificates")]
    pub server_certificates_dir: PathBuf,
    /// Where the Secret `kubevirt-virt-handler-certs` (the handler's client certificate,
    /// presented to the target handler of a migration) is mounted.
    #[arg(long, default_value = "/etc/virt-handler/clientcertificates")]
    pub client_certificates_dir: PathBuf,
    /// The heartbeat period (upstream's fixed minute, plus up to 1.2 times it of jitter);
    /// `customizeComponents.flags.handler` sets it through the KubeVirt CR.
    #[arg(long, default_value = "1m", value_parser = crate::parse_duration)]
    pub heartbeat_interval: std::time::Duration,
}

pub fn run(args: HandlerArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let kube_config =
            crate::kube_config::load(args.kubeconfig.as_deref(), "virt-handler").await?;
        let rest = if args.server_certificates_dir.join("tls.crt").exists() {
            // Followed per handshake: the operator's renewals are served at once.
            Some(virt_handler::rest::RestConfig {
                listen: args.listen,
                tls: virt_handler::rest::RestTls::Mounted(args.server_certificates_dir.clone()),
                advertise_ip: args.pod_ip_address,
            })
        } else {
            // virt-api's client certificates are verified against the cluster CA.
            crate::kube_config::cluster_ca_pem(&kube_config).map(|ca| {
                virt_handler::rest::RestConfig {
                    listen: args.listen,
                    tls: virt_handler::rest::RestTls::Pem {
                        client_ca_pem: ca,
                        serving_cert: None,
                    },
                    advertise_ip: args.pod_ip_address,
                }
            })
        };
        let client = crate::kube_config::build(kube_config)?;
        let migration_tls =
            migration_tls(&args.server_certificates_dir, &args.client_certificates_dir)?;
        let config = virt_handler::HandlerConfig {
            node_name: args
                .node_name
                .unwrap_or_else(virt_handler::default_node_name),
            data_dir: args.data_dir,
            kubelet_pods_dir: args.kubelet_pods_dir,
            use_emulation: args.use_emulation,
            rest,
            metrics_listen: Some(args.metrics_listen),
            heartbeat_interval: args.heartbeat_interval,
            migration_ip: args.pod_ip_address,
            migration_tls,
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

/// The migration proxies' mutual TLS from the two mounted certificate Secrets; `None` (the
/// handlers migrate in the clear) when they are not mounted, as for a handler started by hand.
fn migration_tls(
    server: &std::path::Path,
    client: &std::path::Path,
) -> anyhow::Result<Option<virt_handler::migration_proxy::MigrationTls>> {
    if !(server.join("tls.crt").exists() && client.join("tls.crt").exists()) {
        tracing::warn!(
            server = %server.display(),
            client = %client.display(),
            "no certificates mounted: migrations between handlers will not use TLS"
        );
        return Ok(None);
    }
    virt_handler::migration_proxy::MigrationTls::from_mounted(server, client)
        .map(Some)
        .context("the migration proxies' certificates")
}
