//! virt-api's one HTTPS listener: the admission webhooks and the `subresources.kubevirt.io`
//! API on the same port, as upstream's virt-api serves both on 8443 behind one Service.
//!
//! Data flow: TLS accept (a client certificate is asked for but optional: the API server's
//! webhook calls come without one, its aggregation proxy presents its front-proxy
//! certificate) → one axum router: `POST /<webhook path>` → [`crate::webhook`];
//! `/apis/subresources.kubevirt.io/…` and `/healthz` → [`crate::subresources`], which refuses
//! every request but the health checks that came without a verified client certificate when
//! a client CA is configured. A verified client certificate whose common name is not one of
//! [`VirtApiServerConfig::proxy_names`] (when any are given) is refused with 401 before any
//! route ([`proxy_name_allowed`]), as Kubernetes' aggregated API servers refuse a proxy not
//! named in `requestheader-allowed-names`.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use kubevirt_tls::{ClientAuth, SwappableCert};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::info;

use crate::config::ClusterConfig;
use crate::subresources::{self, NodeClientConfig, SubresourceServerError};
use crate::webhook;

/// Inputs of [`run_virt_api_server`].
pub struct VirtApiServerConfig {
    /// Address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Serving certificate and key (must verify against the `caBundle` of the webhook
    /// configurations and of the APIService); swap it to rotate without a restart.
    pub cert: Arc<SwappableCert>,
    /// Client to the API server (subresources, migration checks of the webhooks).
    pub client: kube::Client,
    /// Credentials towards virt-handler (pause, console, …); `None` answers those with 500.
    pub node_endpoint: Option<NodeClientConfig>,
    /// The CA of the aggregation proxy's client certificate; when set, subresource requests
    /// without a certificate it signed are refused (health checks excepted).
    pub client_ca_pem: Option<Vec<u8>>,
    /// The common names the aggregation proxy's certificate may have
    /// (`requestheader-allowed-names`); empty: any certificate of the CA.
    pub proxy_names: Vec<String>,
    /// Current cluster configuration.
    pub cluster_config: watch::Receiver<ClusterConfig>,
    /// Users treated as KubeVirt service accounts (see [`webhook::kubevirt_service_accounts`]).
    pub service_accounts: BTreeSet<String>,
    /// Serve the subresource API only, no webhooks (upstream's `--subresources-only`).
    pub subresources_only: bool,
}

/// The webhook and subresource routes of one listener (exposed for in-process tests);
/// `require_cert` applies to the subresources only (see [`subresources::router`]).
pub fn router(
    client: kube::Client,
    node: Option<subresources::node::NodeClient>,
    cluster_config: watch::Receiver<ClusterConfig>,
    service_accounts: BTreeSet<String>,
    require_cert: bool,
) -> axum::Router {
    subresources::router(client.clone(), node, cluster_config.clone(), require_cert).merge(
        webhook::reviews_router(cluster_config, service_accounts, Some(client)),
    )
}

/// Binds and serves webhooks and subresources until `shutdown` completes; returns once
/// listening, with the bound address and the server task.
///
/// # Errors
/// When a certificate or key is unusable or the address cannot be bound.
pub async fn run_virt_api_server(
    config: VirtApiServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), SubresourceServerError> {
    let client_auth = match &config.client_ca_pem {
        Some(ca) => ClientAuth::Optional(ca.clone()),
        None => ClientAuth::None,
    };
    let tls = kubevirt_tls::server_config(config.cert, &client_auth)
        .map_err(SubresourceServerError::Tls)?;
    let node = config
        .node_endpoint
        .as_ref()
        .map(subresources::node::NodeClient::new)
        .transpose()
        .map_err(SubresourceServerError::NodeClient)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| SubresourceServerError::Bind(config.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| SubresourceServerError::Bind(config.listen, e))?;
    let require_cert = config.client_ca_pem.is_some();
    let app = if config.subresources_only {
        subresources::router(config.client, node, config.cluster_config, require_cert)
    } else {
        router(
            config.client,
            node,
            config.cluster_config,
            config.service_accounts,
            require_cert,
        )
    };
    let app = if config.proxy_names.is_empty() {
        app
    } else {
        let names: Arc<[String]> = config.proxy_names.into();
        app.layer(axum::middleware::from_fn(move |req, next| {
            proxy_name_allowed(names.clone(), req, next)
        }))
    };
    let task = tokio::spawn(async move {
        crate::serving::serve_until(listener, tls, app, shutdown).await;
        info!("virt-api stopped");
    });
    info!(%addr, "virt-api ready (webhooks and subresources)");
    Ok((addr, task))
}

/// Refuses (401) a request whose verified client certificate does not name one of `names`;
/// requests without a certificate (the API server's webhook calls, health checks) go on.
async fn proxy_name_allowed(
    names: Arc<[String]>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let refused = req
        .extensions()
        .get::<kubevirt_tls::PeerCertificates>()
        .is_some_and(|certs| certs.common_name().is_none_or(|cn| !names.contains(&cn)));
    if refused {
        return (axum::http::StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    }
    next.run(req).await
}
