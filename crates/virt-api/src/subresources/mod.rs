//! The subresource API `subresources.kubevirt.io/v1`, served to the API server's
//! aggregator over HTTPS (registered by [`api_service`]).
//!
//! Data flow: kubectl/virtctl → API server (authenticates, proxies `/apis/subresources…`
//! with its front-proxy client certificate and `X-Remote-User`) → this server → one
//! handler per endpoint family: [`vm`] (start/stop/restart/migrate, decided by the pure
//! [`state_change`]), [`vmi`] (pause/unpause/softreboot/guest agent), [`volumes`]
//! (add/removevolume), [`console`] (console/vnc websockets), [`portforward`] (a TCP
//! tunnel to the guest), [`discovery`]. Handlers read
//! and patch objects with their own kube `Client`; the node-side work goes through
//! [`node::NodeClient`] to the node agent of the VMI's node.
//!
//! Entry points: [`run_subresource_server`], [`api_service`], and [`router`] for tests.

pub mod console;
pub mod discovery;
pub mod error;
pub mod node;
pub mod portforward;
pub mod state_change;
pub mod vm;
pub mod vmi;
pub mod volumes;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use kube::Api;
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance};
use kubevirt_tls::{ClientAuth, PeerCertificates, SwappableCert};
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, info};

pub use discovery::GROUP;
pub use error::{Res, SubError};
pub use node::{HANDLER_SERVER_NAME, NodeClientConfig, NodeCredentials};

use crate::config::ClusterConfig;
use crate::metrics::ApiMetrics;

/// Inputs of [`run_subresource_server`].
pub struct SubresourceServerConfig {
    /// Address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Serving certificate chain, PEM (must verify against the APIService's `caBundle`).
    pub cert_pem: Vec<u8>,
    /// Serving private key, PEM.
    pub key_pem: Vec<u8>,
    /// Client to the API server (reads VMs/VMIs/Nodes/Pods, patches VMs/VMIs, creates
    /// migrations).
    pub client: kube::Client,
    /// Credentials towards node agents (pause, unpause, softreboot, console, vnc);
    /// `None` answers those with 500.
    pub node_endpoint: Option<NodeClientConfig>,
    /// When set, every request except `healthz` must present a client certificate signed
    /// by this CA (the API server's front-proxy client certificate).
    pub client_ca_pem: Option<Vec<u8>>,
    /// Current cluster configuration (feature gates for volume hotplug).
    pub cluster_config: watch::Receiver<ClusterConfig>,
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum SubresourceServerError {
    /// The serving certificate, its key or the client CA could not be used.
    #[error("configuring TLS")]
    Tls(#[source] kubevirt_tls::ConfigError),
    /// The client to node agents could not be configured.
    #[error("configuring the node agent client")]
    NodeClient(#[source] kubevirt_tls::ConfigError),
    /// Binding the listener failed.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
}

/// Shared state of the handlers.
pub struct Ctx {
    client: kube::Client,
    node: Option<node::NodeClient>,
    cluster_config: watch::Receiver<ClusterConfig>,
    metrics: ApiMetrics,
}

/// The `APIService` object registering `subresources.kubevirt.io/v1`; `url` is the
/// backend's base URL in embedded mode (annotation `kubevirt-rs.io/url`).
pub fn api_service(ca_bundle_pem: &[u8], url: Option<&str>) -> serde_json::Value {
    discovery::api_service_for("v1", ca_bundle_pem, url)
}

/// Whether `dryRun` asks for a dry run (`["All"]`).
pub(crate) fn dry_run(modes: &[String]) -> bool {
    modes.first().is_some_and(|m| m == "All")
}

/// Decodes an options body; an empty body means the defaults.
pub(crate) fn decode<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, SubError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(SubError::undecodable)
}

/// A JSON patch document from a JSON array of operations.
pub(crate) fn json_patch(ops: serde_json::Value) -> Result<json_patch::Patch, SubError> {
    serde_json::from_value(ops).map_err(SubError::internal)
}

/// An empty answer with `code`, or the error.
pub(crate) fn respond(result: Result<StatusCode, SubError>) -> Response {
    match result {
        Ok(code) => code.into_response(),
        Err(e) => {
            debug!(code = e.code, message = %e.message, "subresource request refused");
            e.into_response()
        }
    }
}

pub(crate) async fn get_vm(ctx: &Ctx, ns: &str, name: &str) -> Result<VirtualMachine, SubError> {
    Api::<VirtualMachine>::namespaced(ctx.client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| SubError::from_kube(Res::Vm, name, &e))
}

pub(crate) async fn get_vmi(
    ctx: &Ctx,
    ns: &str,
    name: &str,
) -> Result<VirtualMachineInstance, SubError> {
    Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| SubError::from_kube(Res::Vmi, name, &e))
}

pub(crate) async fn get_vmi_opt(
    ctx: &Ctx,
    ns: &str,
    name: &str,
) -> Result<Option<VirtualMachineInstance>, SubError> {
    Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(SubError::internal)
}

async fn require_client_cert(req: Request, next: Next) -> Response {
    let health = req.uri().path().ends_with("/healthz");
    if health || req.extensions().get::<PeerCertificates>().is_some() {
        return next.run(req).await;
    }
    SubError {
        code: 401,
        reason: "Unauthorized",
        message: "Unauthorized".into(),
        details: None,
        plain: false,
    }
    .into_response()
}

/// The router of every endpoint (exposed for in-process tests). `require_cert` refuses
/// requests whose connection did not present a verified client certificate, but for the
/// health checks and `/metrics` ([`crate::metrics`]), which Prometheus scrapes without one.
pub fn router(
    client: kube::Client,
    node_endpoint: Option<node::NodeClient>,
    cluster_config: watch::Receiver<ClusterConfig>,
    require_cert: bool,
) -> Router {
    let metrics = ApiMetrics::new();
    // The routes are built to be served at once: from here on virt-api serves requests.
    metrics.set_ready(true);
    let ctx = Arc::new(Ctx {
        client,
        node: node_endpoint,
        cluster_config,
        metrics: metrics.clone(),
    });
    let mut app = Router::new()
        .route("/healthz", get(discovery::healthz_handler))
        .route(&format!("/apis/{GROUP}"), get(discovery::group_handler))
        .route(
            &format!("/apis/{GROUP}/{{version}}"),
            get(discovery::resources_handler),
        );
    for version in discovery::VERSIONS {
        let base = format!("/apis/{GROUP}/{version}");
        let vm = format!("{base}/namespaces/{{namespace}}/virtualmachines/{{name}}");
        let vmi = format!("{base}/namespaces/{{namespace}}/virtualmachineinstances/{{name}}");
        app = app
            .route(&format!("{base}/version"), get(discovery::version_handler))
            .route(&format!("{base}/healthz"), get(discovery::healthz_handler))
            .route(&format!("{vm}/start"), put(vm::start_handler))
            .route(&format!("{vm}/stop"), put(vm::stop_handler))
            .route(&format!("{vm}/restart"), put(vm::restart_handler))
            .route(&format!("{vm}/migrate"), put(vm::migrate_handler))
            .route(&format!("{vm}/addvolume"), put(volumes::vm_add))
            .route(&format!("{vm}/removevolume"), put(volumes::vm_remove))
            .route(&format!("{vmi}/pause"), put(vmi::pause_handler))
            .route(&format!("{vmi}/unpause"), put(vmi::unpause_handler))
            .route(&format!("{vmi}/softreboot"), put(vmi::soft_reboot_handler))
            .route(&format!("{vmi}/freeze"), put(vmi::freeze_handler))
            .route(&format!("{vmi}/unfreeze"), put(vmi::unfreeze_handler))
            .route(&format!("{vmi}/addvolume"), put(volumes::vmi_add))
            .route(&format!("{vmi}/removevolume"), put(volumes::vmi_remove))
            .route(&format!("{vmi}/console"), get(console::console_handler))
            .route(&format!("{vmi}/vnc"), get(console::vnc_handler))
            .route(
                &format!("{vmi}/portforward/{{port}}"),
                get(portforward::vmi_handler),
            )
            .route(
                &format!("{vmi}/portforward/{{port}}/{{protocol}}"),
                get(portforward::vmi_protocol_handler),
            )
            .route(
                &format!("{vm}/portforward/{{port}}"),
                get(portforward::vm_handler),
            )
            .route(
                &format!("{vm}/portforward/{{port}}/{{protocol}}"),
                get(portforward::vm_protocol_handler),
            )
            .route(
                &format!("{vmi}/guestosinfo"),
                get(vmi::guest_os_info_handler),
            )
            .route(&format!("{vmi}/userlist"), get(vmi::user_list_handler))
            .route(
                &format!("{vmi}/filesystemlist"),
                get(vmi::filesystem_list_handler),
            );
    }
    let app = app.with_state(ctx);
    let app = if require_cert {
        app.layer(axum::middleware::from_fn(require_client_cert))
    } else {
        app
    };
    app.route("/metrics", get(move || async move { metrics.scrape() }))
}

/// TLS with the serving certificate; with a client CA, a client certificate is optional
/// at the handshake (health checks come without) and [`require_client_cert`] refuses the
/// other requests without one.
fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<rustls::ServerConfig, SubresourceServerError> {
    let cert = SwappableCert::from_pem(cert_pem, key_pem).map_err(SubresourceServerError::Tls)?;
    let client_auth = match client_ca_pem {
        Some(ca) => ClientAuth::Optional(ca.to_vec()),
        None => ClientAuth::None,
    };
    kubevirt_tls::server_config(cert, &client_auth).map_err(SubresourceServerError::Tls)
}

/// Binds and serves until `shutdown` completes; returns once listening, with the bound
/// address and the server task.
///
/// # Errors
/// When a certificate or key is unusable or the address cannot be bound.
pub async fn run_subresource_server(
    config: SubresourceServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), SubresourceServerError> {
    let tls = tls_config(
        &config.cert_pem,
        &config.key_pem,
        config.client_ca_pem.as_deref(),
    )?;
    let node = config
        .node_endpoint
        .as_ref()
        .map(node::NodeClient::new)
        .transpose()
        .map_err(SubresourceServerError::NodeClient)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| SubresourceServerError::Bind(config.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| SubresourceServerError::Bind(config.listen, e))?;
    let app = router(
        config.client,
        node,
        config.cluster_config,
        config.client_ca_pem.is_some(),
    );
    let task = tokio::spawn(async move {
        crate::serving::serve_until(listener, tls, app, shutdown).await;
        info!("virt-api subresources stopped");
    });
    info!(%addr, "virt-api subresources ready");
    Ok((addr, task))
}
