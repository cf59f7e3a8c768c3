//! The admission webhook HTTPS server (axum over rustls/ring) and its registration objects.
//!
//! Data flow: TLS accept → hyper HTTP/1 → axum route per webhook path → [`review::handle`]
//! decodes the `AdmissionReview`, runs the pure mutator/validator with the current
//! [`ClusterConfig`] (a `watch` channel, so a `KubeVirt` CR change applies to the next request)
//! and answers the review. A body that is not an AdmissionReview gets HTTP 400.
//!
//! Required inputs for the `api` subcommand: a listen address, the serving certificate and key
//! (PEM, the certificate chain must verify against the `caBundle` given to
//! [`webhook_configurations`]), and a `watch::Receiver<ClusterConfig>` (send
//! [`ClusterConfig::from_kubevirt`] on every `KubeVirt` CR change). Optionally a kube `Client`
//! for migration checks that need the VMI.

pub mod pod_eviction;
pub mod registration;
pub mod review;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kubevirt_tls::{ClientAuth, SwappableCert};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{debug, info};

pub use registration::{WebhookTarget, webhook_configurations, webhook_configurations_for};
pub use review::{kubevirt_service_accounts, paths};

use crate::config::ClusterConfig;

/// Inputs of [`run_webhook_server`].
pub struct WebhookServerConfig {
    /// Address to listen on (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Serving certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// Serving private key, PEM.
    pub key_pem: Vec<u8>,
    /// Current cluster configuration.
    pub cluster_config: watch::Receiver<ClusterConfig>,
    /// Users treated as KubeVirt service accounts (see [`kubevirt_service_accounts`]).
    pub service_accounts: BTreeSet<String>,
    /// Client for look-ups (migration create); `None` skips them.
    pub client: Option<kube::Client>,
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum WebhookServerError {
    /// The certificate or key could not be used.
    #[error("configuring TLS")]
    Tls(#[source] kubevirt_tls::ConfigError),
    /// Binding the listener failed.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
}

/// A running server; dropping it aborts the server task.
pub struct WebhookServer {
    /// The bound address.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl WebhookServer {
    /// Waits until the server stops (after the shutdown future completes).
    pub async fn wait(mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct AppState {
    cfg: watch::Receiver<ClusterConfig>,
    service_accounts: BTreeSet<String>,
    client: Option<kube::Client>,
}

async fn review_handler(
    State(state): State<Arc<AppState>>,
    Path(path): Path<String>,
    body: Bytes,
) -> Response {
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            "request body is not an AdmissionReview",
        )
            .into_response();
    };
    let cfg = state.cfg.borrow().clone();
    let ctx = review::ReviewContext {
        cfg: &cfg,
        service_accounts: &state.service_accounts,
        client: state.client.as_ref(),
    };
    let path = format!("/{path}");
    match review::handle(&path, &review, &ctx).await {
        Ok(resp) => {
            debug!(%path, allowed = %resp["response"]["allowed"], "admission reviewed");
            axum::Json(resp).into_response()
        }
        Err(e @ review::ReviewError::UnknownPath(_)) => {
            (StatusCode::NOT_FOUND, e.to_string()).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// The router serving every webhook path (exposed for in-process tests).
pub fn router(
    cfg: watch::Receiver<ClusterConfig>,
    service_accounts: BTreeSet<String>,
    client: Option<kube::Client>,
) -> Router {
    reviews_router(cfg, service_accounts, client)
        .route("/healthz", axum::routing::get(|| async { "ok" }))
}

/// The webhook paths alone (`POST /<webhook>`), to merge with other routes on one listener
/// (see [`crate::server`]).
pub fn reviews_router(
    cfg: watch::Receiver<ClusterConfig>,
    service_accounts: BTreeSet<String>,
    client: Option<kube::Client>,
) -> Router {
    let state = Arc::new(AppState {
        cfg,
        service_accounts,
        client,
    });
    Router::new()
        .route("/{path}", axum::routing::post(review_handler))
        .with_state(state)
}

fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ServerConfig, WebhookServerError> {
    let cert = SwappableCert::from_pem(cert_pem, key_pem).map_err(WebhookServerError::Tls)?;
    kubevirt_tls::server_config(cert, &ClientAuth::None).map_err(WebhookServerError::Tls)
}

/// Binds and serves the webhooks until `shutdown` completes; returns once listening.
///
/// # Errors
/// When the certificate/key are unusable or the address cannot be bound.
pub async fn run_webhook_server(
    config: WebhookServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<WebhookServer, WebhookServerError> {
    let tls = tls_config(&config.cert_pem, &config.key_pem)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| WebhookServerError::Bind(config.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| WebhookServerError::Bind(config.listen, e))?;
    let app = router(
        config.cluster_config,
        config.service_accounts,
        config.client,
    );
    let task = tokio::spawn(async move {
        crate::serving::serve_until(listener, tls, app, shutdown).await;
        info!("virt-api webhooks stopped");
    });
    info!(%addr, "virt-api webhooks ready");
    Ok(WebhookServer { addr, task })
}

#[cfg(test)]
mod tests;
