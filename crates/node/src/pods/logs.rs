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
//! Only the API server is served: a client must present a certificate signed by the cluster
//! CA whose common name is [`API_SERVER_CLIENT`] (the API server's kubelet-client
//! certificate); any other identity of the cluster CA (a node, a component) gets 403, as
//! kubelet refuses users not authorized for `nodes/proxy`. Paths are built from the pod's uid and a container
//! name the pod declares, never from request text.
//!
//! # Caveats
//! Without a given serving certificate a self-signed one is made, as kubelet's default is;
//! the embedded API server verifies node certificates against the cluster CA, so the embedded
//! server hands the node one issued by that CA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;

mod container;
pub mod cri;

/// The identity the API server presents to node log servers (kube's kubelet-client
/// certificate subject).
pub const API_SERVER_CLIENT: &str = "kube-apiserver-kubelet-client";

/// Middleware: only the API server's client certificate passes; anything else gets kubelet's
/// 403 text.
async fn api_server_only(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let user = req
        .extensions()
        .get::<kubevirt_tls::PeerCertificates>()
        .and_then(kubevirt_tls::PeerCertificates::common_name);
    if user.as_deref() == Some(API_SERVER_CLIENT) {
        return next.run(req).await;
    }
    let user = user.unwrap_or_else(|| "system:anonymous".to_owned());
    (
        axum::http::StatusCode::FORBIDDEN,
        format!("Forbidden (user={user}, verb=get, resource=nodes, subresource=proxy)"),
    )
        .into_response()
}

/// Looks up a pod's uid and container names by namespace and name.
pub type PodLookup = Arc<dyn Fn(&str, &str) -> Option<(String, Vec<String>)> + Send + Sync>;

/// Errors starting the log server.
#[derive(Debug, thiserror::Error)]
pub enum LogServerError {
    /// The TLS set-up or the bind failed.
    #[error("serving")]
    Serve(#[source] kubevirt_tls::SpawnError),
}

#[derive(Clone)]
struct LogState {
    state_dir: PathBuf,
    lookup: PodLookup,
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
    serve_router(listen, cluster_ca_pem, router(state_dir, lookup), serving).await
}

/// Serves `app` over TLS on `listen` (clients must present a certificate of
/// `cluster_ca_pem`) until the task is dropped; returns the bound address. Without a
/// `serving` certificate a self-signed one is made, as kubelet does by default.
async fn serve_router(
    listen: SocketAddr,
    cluster_ca_pem: &[u8],
    app: Router,
    serving: Option<&(String, String)>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), LogServerError> {
    kubevirt_tls::spawn_serving(
        listen,
        serving,
        &kubevirt_tls::ClientAuth::Required(cluster_ca_pem.to_vec()),
        app.layer(axum::middleware::from_fn(api_server_only)),
    )
    .await
    .map_err(LogServerError::Serve)
}

#[cfg(test)]
mod identity_tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    /// A request as the TLS server hands it on: with the client's certificate of `cn`.
    fn request_as(cn: Option<&str>) -> axum::http::Request<Body> {
        let mut req = axum::http::Request::get("/containerLogs/default/p/c")
            .body(Body::empty())
            .unwrap();
        if let Some(cn) = cn {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
            let der = params.self_signed(&key).unwrap().der().clone();
            req.extensions_mut()
                .insert(kubevirt_tls::PeerCertificates(Arc::from(vec![der])));
        }
        req
    }

    async fn status_of(cn: Option<&str>) -> (axum::http::StatusCode, String) {
        let dir = tempfile::tempdir().unwrap();
        let lookup: PodLookup = Arc::new(|_, _| None);
        let app =
            router(dir.path().to_owned(), lookup).layer(axum::middleware::from_fn(api_server_only));
        let res = app.oneshot(request_as(cn)).await.unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn only_the_api_servers_client_identity_reads_logs() {
        // The API server passes the identity check (the pod is unknown: kubelet's 404).
        let (status, _) = status_of(Some(API_SERVER_CLIENT)).await;
        assert_eq!(status, axum::http::StatusCode::NOT_FOUND);
        // Another identity of the same CA is refused, with kubelet's wording.
        let (status, body) = status_of(Some("system:node:other")).await;
        assert_eq!(status, axum::http::StatusCode::FORBIDDEN);
        assert_eq!(
            body,
            "Forbidden (user=system:node:other, verb=get, resource=nodes, subresource=proxy)"
        );
        let (status, _) = status_of(None).await;
        assert_eq!(status, axum::http::StatusCode::FORBIDDEN);
    }
}
