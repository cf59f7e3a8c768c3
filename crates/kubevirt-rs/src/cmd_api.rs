//! `kubevirt-rs api`: virt-api alone against any API server (a cluster, or a
//! `kubevirt-rs apiserver`), and [`start`], the set-up `kubevirt-rs server` runs in-process.
//!
//! Wiring only: one HTTPS listener (upstream's port 8443) serving the admission webhooks and
//! the `subresources.kubevirt.io` API ([`virt_api::server`]), then its registration — the
//! `MutatingWebhookConfiguration` `virt-api-mutator`, the `ValidatingWebhookConfiguration`
//! `virt-api-validator` and the `APIService` `v1.subresources.kubevirt.io`, all trusting the
//! CA that signed the serving certificate, and all pointing either at a Service (a cluster:
//! `--service-name virt-api`, port 443, in virt-api's namespace) or at an explicit URL
//! (`--advertise-url`, what the embedded server uses: it has no service network).
//!
//! The serving certificate: upstream's virt-operator issues it into the Secret
//! `kubevirt-virt-api-certs`, mounted at `/etc/virt-api/certificates` (`tls.crt`, `tls.key`,
//! and here also `ca.crt`); virt-api reads it from there and follows its renewals, and then
//! registers nothing: whoever issued the Secret (the operator upstream, the embedded server's
//! [`virt_operator::installer`] here) owns the registration objects. Otherwise `--tls-cert-file`/
//! `--tls-key-file` when given, else one issued at start (and again at its renewal time) from
//! the KubeVirt CA that [`certificates`] keeps in the Secret `kubevirt-ca`; in those two cases virt-api
//! registers itself.
//!
//! Towards virt-handler virt-api presents the client certificate of the Secret
//! `kubevirt-virt-handler-certs` (mounted at `/etc/virt-handler/clientcertificates`), and
//! accepts the handler's serving certificate when it chains to that Secret's `ca.crt` and names
//! [`virt_api::subresources::HANDLER_SERVER_NAME`] (upstream checks the handler's identity the
//! same way, not its address).
//!
//! The subresource API trusts the aggregation proxy's client certificate through the
//! `requestheader-client-ca-file` of the ConfigMap `kube-system/extension-apiserver-authentication`
//! (as upstream; the embedded API server publishes it with a front-proxy CA of its own, as
//! kubeadm sets one up), and only with a common name of its `requestheader-allowed-names`
//! when that list is not empty (as Kubernetes' aggregated API servers; upstream checks no
//! name). Without that ConfigMap virt-api does not start: no other CA is trusted to speak
//! for users.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kubevirt_tls::SwappableCert;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use virt_api::subresources::{NodeClientConfig, NodeCredentials};
use virt_api::webhook::WebhookTarget;

use virt_operator::certificates::{self, KubeVirtCa};

#[derive(Args)]
pub struct ApiArgs {
    /// Kubeconfig with virt-api's credentials (default: the in-cluster configuration, else
    /// `KUBECONFIG`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// KubeVirt's namespace: its CR, the `kubevirt-ca` Secret, the Service (default: the pod's
    /// namespace, else `kubevirt`).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub listen: IpAddr,
    /// Port of the HTTPS listener (webhooks and subresources; 0 picks a free port).
    #[arg(long, default_value_t = 8443)]
    pub port: u16,
    /// Serving certificate (PEM); without it one is issued from the `kubevirt-ca` Secret.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// CA that signed --tls-cert-file, trusted by the registration objects (default: the
    /// certificate file itself, right for a self-signed certificate or a chain ending at its
    /// CA).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate towards virt-handler (console, VNC, pause); without it those
    /// subresources answer 500.
    #[arg(long, requires = "handler_key_file")]
    pub handler_cert_file: Option<PathBuf>,
    /// Private key of --handler-cert-file.
    #[arg(long, requires = "handler_cert_file")]
    pub handler_key_file: Option<PathBuf>,
    /// The Service in front of virt-api (port 443) the registration objects name.
    #[arg(long, default_value = "virt-api")]
    pub service_name: String,
    /// Serve and register the subresource API only, no admission webhooks.
    #[arg(long)]
    pub subresources_only: bool,
    /// Register this base URL instead of the Service (`https://127.0.0.1:8443`; port 0 stands
    /// for the port bound).
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// Where the Secret `kubevirt-virt-api-certs` is mounted (used when it holds `tls.crt`
    /// and no --tls-cert-file is given).
    #[arg(long, default_value = "/etc/virt-api/certificates")]
    pub certificates_dir: PathBuf,
    /// Where the Secret `kubevirt-virt-handler-certs` is mounted (used when it holds
    /// `tls.crt` and no --handler-cert-file is given).
    #[arg(long, default_value = "/etc/virt-handler/clientcertificates")]
    pub handler_certificates_dir: PathBuf,
    /// virt-handler's console port (upstream's flag; the handler's endpoint is read from its
    /// Node, see virt-handler's `--pod-ip-address`).
    #[arg(long, default_value_t = 8186)]
    pub console_server_port: u16,
}

/// Where virt-api's serving certificate comes from.
pub(crate) enum Serving {
    /// Given certificate and key, and the CA bundle that verifies them.
    Provided {
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        ca_bundle_pem: Vec<u8>,
    },
    /// Issued from the `kubevirt-ca` Secret (see [`certificates`]), and rotated.
    KubeVirtCa,
    /// `tls.crt`, `tls.key` and `ca.crt` of a mounted Secret, followed as they are renewed.
    Mounted(PathBuf),
}

/// How the API server reaches virt-api.
pub(crate) enum Advertise {
    /// The Service `name` in virt-api's namespace, port 443.
    Service(String),
    /// A base URL; port 0 is replaced by the port bound.
    Url(String),
    /// Registered by whoever issued the mounted certificate ([`Serving::Mounted`]).
    Registered,
}

/// Everything [`start`] needs besides the client.
pub(crate) struct VirtApiSetup {
    pub namespace: String,
    pub listen: SocketAddr,
    pub serving: Serving,
    pub advertise: Advertise,
    pub node_endpoint: Option<NodeClientConfig>,
    /// The aggregation proxy's client CA and allowed names; `None` looks them up (see the
    /// module documentation).
    pub proxy_trust: Option<ProxyTrust>,
    /// No webhooks (served or registered).
    pub subresources_only: bool,
    /// Who writes the webhook configurations and the APIService: upstream's operator does,
    /// with rights virt-api's own account does not have. `None`: virt-api's client.
    pub registrar: Option<kube::Client>,
}

/// A running virt-api; it stops when the token given to [`start`] is cancelled.
pub(crate) struct VirtApi {
    server: tokio::task::JoinHandle<()>,
    _rotation: Option<tokio::task::JoinHandle<()>>,
}

impl VirtApi {
    /// Waits until the server has stopped.
    pub async fn wait(self) {
        let _ = self.server.await;
    }
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

/// The host of an `https://host[:port][/…]` URL.
fn url_host(url: &str) -> Option<String> {
    let authority = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = authority.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_owned())
}

/// `url` with a port 0 replaced by `port`.
fn with_bound_port(url: &str, port: u16) -> String {
    let url = url.trim_end_matches('/');
    match url.strip_suffix(":0") {
        Some(base) => format!("{base}:{port}"),
        None => url.to_owned(),
    }
}

/// Whom virt-api trusts as the aggregation proxy.
pub(crate) struct ProxyTrust {
    /// `requestheader-client-ca-file`.
    pub ca_pem: Vec<u8>,
    /// `requestheader-allowed-names` (empty: any name).
    pub allowed_names: Vec<String>,
}

/// The aggregation proxy's trust from `kube-system/extension-apiserver-authentication` (see
/// the module documentation).
async fn lookup_proxy_trust(client: &kube::Client) -> anyhow::Result<ProxyTrust> {
    let name = "kube-system/extension-apiserver-authentication";
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get_opt("extension-apiserver-authentication")
        .await
        .with_context(|| format!("reading the ConfigMap {name}"))?
        .ok_or_else(|| anyhow::anyhow!("the ConfigMap {name} does not exist"))?;
    let data = cm.data.unwrap_or_default();
    let ca = data
        .get("requestheader-client-ca-file")
        .ok_or_else(|| anyhow::anyhow!("requestheader-client-ca-file not found in {name}"))?;
    let allowed_names = match data.get("requestheader-allowed-names") {
        Some(list) if !list.trim().is_empty() => serde_json::from_str(list)
            .with_context(|| format!("requestheader-allowed-names of {name}"))?,
        _ => Vec::new(),
    };
    Ok(ProxyTrust {
        ca_pem: ca.clone().into_bytes(),
        allowed_names,
    })
}

/// Creates or replaces the webhook configurations and the APIService, trusting `ca_bundle`.
async fn register(
    client: &kube::Client,
    ca_bundle: &[u8],
    target: &WebhookTarget,
    webhooks: bool,
) -> anyhow::Result<()> {
    if webhooks {
        let (mutating, validating) =
            virt_api::webhook::webhook_configurations_for(ca_bundle, target);
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
    }
    let api_service = match target {
        WebhookTarget::Url(url) => virt_api::subresources::api_service(ca_bundle, Some(url)),
        WebhookTarget::Service {
            namespace,
            name,
            port,
        } => {
            let mut svc = virt_api::subresources::api_service(ca_bundle, None);
            svc["spec"]["service"] =
                serde_json::json!({"namespace": namespace, "name": name, "port": port});
            svc
        }
    };
    virt_operator::apply::create_or_replace_dynamic(client.clone(), api_service)
        .await
        .context("registering the subresource APIService")
}

/// The serving names for `target`.
fn serving_names(target: &WebhookTarget) -> Vec<String> {
    match target {
        WebhookTarget::Url(url) => url_host(url).into_iter().collect(),
        WebhookTarget::Service {
            namespace, name, ..
        } => certificates::service_names(name, namespace),
    }
}

/// At the serving certificate's renewal time ([`certificates::leaf_renewal`]): a new one
/// from the (possibly renewed) CA, swapped in, and the registration objects trusting that CA.
fn rotate(
    client: kube::Client,
    namespace: String,
    target: WebhookTarget,
    cert: std::sync::Arc<SwappableCert>,
    webhooks: bool,
    first: (Vec<u8>, Vec<u8>),
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let lifetimes = certificates::Lifetimes::default();
    let renew_in = move |(leaf, ca): &(Vec<u8>, Vec<u8>)| {
        certificates::leaf_renewal(leaf, ca, &lifetimes, time::OffsetDateTime::now_utc())
            .map_or(Duration::from_secs(5), certificates::until)
    };
    tokio::spawn(async move {
        let mut wait = renew_in(&first);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let result = async {
                let ca = KubeVirtCa::load_or_create(client.clone(), &namespace).await?;
                let (c, k) = ca.issue_serving(serving_names(&target))?;
                cert.swap_pem(c.as_bytes(), k.as_bytes())
                    .context("swapping the serving certificate")?;
                register(&client, ca.cert_pem.as_bytes(), &target, webhooks).await?;
                anyhow::Ok((c.into_bytes(), ca.cert_pem.into_bytes()))
            }
            .await;
            match result {
                Ok(issued) => {
                    info!("virt-api serving certificate rotated");
                    wait = renew_in(&issued);
                }
                Err(e) => {
                    warn!(error = format!("{e:#}"), "rotating virt-api's certificate");
                    wait = Duration::from_secs(5);
                }
            }
        }
    })
}

/// Starts virt-api and registers it; see the module documentation.
pub(crate) async fn start(
    client: kube::Client,
    setup: VirtApiSetup,
    cancel: &CancellationToken,
) -> anyhow::Result<VirtApi> {
    let ns = setup.namespace.clone();
    let cluster_config = kubevirt_api::cluster_config::subscribe(
        Api::namespaced(client.clone(), &ns),
        virt_api::ClusterConfig::from_kubevirt,
    )
    .receiver();
    let proxy = match setup.proxy_trust {
        Some(trust) => trust,
        None => lookup_proxy_trust(&client).await?,
    };
    // The serving names do not depend on the port, which is only known once bound.
    let unbound = match &setup.advertise {
        Advertise::Url(url) => WebhookTarget::Url(url.clone()),
        Advertise::Service(name) => WebhookTarget::Service {
            namespace: ns.clone(),
            name: name.clone(),
            port: 443,
        },
        Advertise::Registered => WebhookTarget::Service {
            namespace: ns.clone(),
            name: "virt-api".into(),
            port: 443,
        },
    };
    let register_self = !matches!(setup.advertise, Advertise::Registered);
    let mut mounted = None;
    let (cert_pem, key_pem, ca_bundle, issuing) = match setup.serving {
        Serving::Provided {
            cert_pem,
            key_pem,
            ca_bundle_pem,
        } => (cert_pem, key_pem, ca_bundle_pem, false),
        Serving::KubeVirtCa => {
            let ca = KubeVirtCa::load_or_create(client.clone(), &ns).await?;
            let (c, k) = ca.issue_serving(serving_names(&unbound))?;
            (
                c.into_bytes(),
                k.into_bytes(),
                ca.cert_pem.into_bytes(),
                true,
            )
        }
        Serving::Mounted(dir) => {
            let ca = read(&dir.join("ca.crt"))?;
            mounted = Some(dir);
            (Vec::new(), Vec::new(), ca, false)
        }
    };
    let cert = match &mounted {
        // Followed per handshake: the renewals the operator writes are served at once.
        Some(dir) => SwappableCert::following_files(&dir.join("tls.crt"), &dir.join("tls.key")),
        None => SwappableCert::from_pem(&cert_pem, &key_pem),
    }
    .context("virt-api's serving certificate")?;
    let (addr, server) = virt_api::server::run_virt_api_server(
        virt_api::server::VirtApiServerConfig {
            listen: setup.listen,
            cert: cert.clone(),
            client: client.clone(),
            node_endpoint: setup.node_endpoint,
            client_ca_pem: Some(proxy.ca_pem),
            proxy_names: proxy.allowed_names,
            cluster_config,
            service_accounts: virt_api::webhook::kubevirt_service_accounts(&ns),
            subresources_only: setup.subresources_only,
        },
        cancel.clone().cancelled_owned(),
    )
    .await
    .context("starting virt-api")?;
    let target = match unbound {
        WebhookTarget::Url(url) => WebhookTarget::Url(with_bound_port(&url, addr.port())),
        service @ WebhookTarget::Service { .. } => service,
    };
    let rotation = issuing.then(|| {
        rotate(
            client.clone(),
            ns.clone(),
            target.clone(),
            cert.clone(),
            !setup.subresources_only,
            (cert_pem.clone(), ca_bundle.clone()),
            cancel.clone(),
        )
    });
    if register_self {
        let registrar = setup.registrar.unwrap_or_else(|| client.clone());
        register(&registrar, &ca_bundle, &target, !setup.subresources_only).await?;
        info!(%addr, target = ?target, "virt-api registered");
    } else {
        info!(%addr, "virt-api serving (registered by its installer)");
    }
    Ok(VirtApi {
        server,
        _rotation: rotation,
    })
}

fn read(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

pub fn run(args: ApiArgs) -> anyhow::Result<()> {
    let serving = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => Serving::Provided {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
            ca_bundle_pem: read(args.tls_ca_file.as_ref().unwrap_or(cert))?,
        },
        _ if args.certificates_dir.join("tls.crt").exists() => {
            Serving::Mounted(args.certificates_dir.clone())
        }
        _ => Serving::KubeVirtCa,
    };
    let handler_dir = &args.handler_certificates_dir;
    let node_endpoint = match (&args.handler_cert_file, &args.handler_key_file) {
        (Some(cert), Some(key)) => Some(NodeClientConfig {
            credentials: NodeCredentials::Pem {
                client_cert_pem: read(cert)?,
                client_key_pem: read(key)?,
                server_ca_pem: None,
            },
            server_name: None,
        }),
        _ if handler_dir.join("tls.crt").exists() => Some(NodeClientConfig {
            credentials: NodeCredentials::Mounted(handler_dir.clone()),
            server_name: Some(virt_api::subresources::HANDLER_SERVER_NAME.to_owned()),
        }),
        _ => None,
    };
    let advertise = match (args.advertise_url, &serving) {
        (Some(url), _) => Advertise::Url(url),
        (None, Serving::Mounted(_)) => Advertise::Registered,
        (None, _) => Advertise::Service(args.service_name),
    };
    let setup = VirtApiSetup {
        namespace: args
            .namespace
            .unwrap_or_else(|| crate::kube_config::pod_namespace("kubevirt")),
        listen: SocketAddr::new(args.listen, args.port),
        serving,
        advertise,
        node_endpoint,
        proxy_trust: None,
        subresources_only: args.subresources_only,
        registrar: None,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let client = crate::kube_config::client(args.kubeconfig.as_deref(), "virt-api").await?;
        let cancel = CancellationToken::new();
        let api = start(client, setup, &cancel).await?;
        crate::shutdown_signal().await;
        cancel.cancel();
        api.wait().await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_advertised_url_is_its_serving_name() {
        assert_eq!(
            url_host("https://127.0.0.1:8443").as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(url_host("https://[::1]:8443/").as_deref(), Some("::1"));
        assert_eq!(
            url_host("https://virt-api.example").as_deref(),
            Some("virt-api.example")
        );
    }

    #[test]
    fn port_zero_of_an_advertised_url_is_the_port_bound() {
        assert_eq!(
            with_bound_port("https://127.0.0.1:0/", 4321),
            "https://127.0.0.1:4321"
        );
        assert_eq!(
            with_bound_port("https://127.0.0.1:8443", 4321),
            "https://127.0.0.1:8443"
        );
    }
}
