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

pub mod registration;
pub mod review;

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{debug, info, warn};

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
    #[error("configuring TLS: {0}")]
    Tls(String),
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
    let state = Arc::new(AppState {
        cfg,
        service_accounts,
        client,
    });
    Router::new()
        .route("/{path}", axum::routing::post(review_handler))
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .with_state(state)
}

fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ServerConfig, WebhookServerError> {
    let tls = |e: &dyn std::fmt::Display| WebhookServerError::Tls(e.to_string());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| tls(&e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| tls(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| tls(&e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Binds and serves the webhooks until `shutdown` completes; returns once listening.
///
/// # Errors
/// When the certificate/key are unusable or the address cannot be bound.
pub async fn run_webhook_server(
    config: WebhookServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<WebhookServer, WebhookServerError> {
    let tls = TlsAcceptor::from(Arc::new(tls_config(&config.cert_pem, &config.key_pem)?));
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
    let task = tokio::spawn(serve(listener, tls, app, shutdown));
    info!(%addr, "virt-api webhooks ready");
    Ok(WebhookServer { addr, task })
}

async fn serve(
    listener: TcpListener,
    tls: TlsAcceptor,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => { warn!(error = %e, "accept failed"); continue; }
                };
                let (tls, app) = (tls.clone(), app.clone());
                conns.spawn(async move {
                    let stream = match tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => { debug!(%peer, error = %e, "TLS handshake failed"); return; }
                        Err(_) => return,
                    };
                    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        app.clone().oneshot(req.map(axum::body::Body::new))
                    });
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    if let Err(e) = builder.serve_connection(TokioIo::new(stream), svc).await {
                        debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
    info!("virt-api webhooks stopped");
}

#[cfg(test)]
mod tests;
