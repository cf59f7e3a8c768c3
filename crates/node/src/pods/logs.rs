//! The node's container-log endpoint (kubelet's `/containerLogs`), so `kubectl logs` works in
//! embedded mode: the API server's `pods/log` proxies to
//! `https://<node InternalIP>:<kubeletEndpoint port>/containerLogs/{ns}/{pod}/{container}`.
//!
//! Data flow: a request names a pod; the runner's pod cache gives its uid; the answer is the
//! file `<state dir>/<uid>/<container>.log` (the pod runner's container output; the launcher's
//! QEMU writes the guest serial console to `guest-console-log.log`), streamed in bounded chunks
//! with kubelet's `tailLines`, `limitBytes`, `sinceSeconds`/`sinceTime` and `follow`
//! ([`container`]).
//!
//! # Guarantees
//! Only clients presenting a certificate signed by the cluster CA are served (the API server
//! uses its kubelet-client certificate). Paths are built from the pod's uid and a container
//! name the pod declares, never from request text.
//!
//! # Caveats
//! Without a given serving certificate a self-signed one is made, as kubelet's default is;
//! the embedded API server verifies node certificates against the cluster CA, so the embedded
//! server hands the node one issued by that CA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{debug, warn};

mod container;

/// Looks up a pod's uid and container names by namespace and name.
pub type PodLookup = Arc<dyn Fn(&str, &str) -> Option<(String, Vec<String>)> + Send + Sync>;

/// Errors starting the log server.
#[derive(Debug, thiserror::Error)]
pub enum LogServerError {
    /// Building the TLS configuration failed.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// Binding the listen address failed.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
}

#[derive(Clone)]
struct LogState {
    state_dir: PathBuf,
    lookup: PodLookup,
}

fn tls_config(
    cluster_ca_pem: &[u8],
    host: &str,
    serving: Option<&(String, String)>,
) -> Result<rustls::ServerConfig, LogServerError> {
    let err = |e: &dyn std::fmt::Display| LogServerError::Tls(e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(cluster_ca_pem) {
        roots.add(c.map_err(|e| err(&e))?).map_err(|e| err(&e))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| err(&e))?;
    let (cert_pem, key_pem) = match serving {
        Some((cert, key)) => (cert.clone(), key.clone()),
        None => {
            let key = rcgen::KeyPair::generate().map_err(|e| err(&e))?;
            let params =
                rcgen::CertificateParams::new(vec![host.to_owned(), "localhost".to_owned()])
                    .map_err(|e| err(&e))?;
            let cert = params.self_signed(&key).map_err(|e| err(&e))?;
            (cert.pem(), key.serialize_pem())
        }
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| err(&e))?;
    let key_der = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| err(&e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key_der)
        .map_err(|e| err(&e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The routes of the node endpoint (exposed for tests).
fn router(state_dir: PathBuf, lookup: PodLookup) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container::container_logs),
        )
        .with_state(LogState { state_dir, lookup })
}

/// Serves container logs on `listen` until the task is dropped; returns the bound address.
/// `serving` is the certificate and key (PEM) to present; without one a self-signed
/// certificate is made, as kubelet does by default.
pub async fn serve_logs(
    listen: SocketAddr,
    cluster_ca_pem: &[u8],
    state_dir: PathBuf,
    lookup: PodLookup,
    serving: Option<&(String, String)>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), LogServerError> {
    let tls = TlsAcceptor::from(Arc::new(tls_config(
        cluster_ca_pem,
        &listen.ip().to_string(),
        serving,
    )?));
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| LogServerError::Bind(listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| LogServerError::Bind(listen, e))?;
    let app = router(state_dir, lookup);
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, peer)) = listener.accept().await else {
                continue;
            };
            let (tls, app) = (tls.clone(), app.clone());
            tokio::spawn(async move {
                let stream =
                    match tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            return debug!(%peer, error = %e, "log endpoint: TLS handshake failed");
                        }
                        Err(_) => return,
                    };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        app.clone().oneshot(req.map(Body::new))
                    },
                );
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                if let Err(e) = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await
                {
                    warn!(%peer, error = %e, "log endpoint connection failed");
                }
            });
        }
    });
    Ok((addr, task))
}
