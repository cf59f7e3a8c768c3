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

use axum::Router;
use axum::routing::get;

mod container;

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
        app,
    )
    .await
    .map_err(LogServerError::Serve)
}
