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
//! The same server is the node side of virt-api's VMI subresources, under
//! `/v1/namespaces/{ns}/pods/{pod}/`: `console` (websocket, subprotocol `plain.kubevirt.io`,
//! bridged to the launcher's serial console socket `<state dir>/<uid>/serial0.sock`), `vnc`
//! (websocket to `<uid>/vnc.sock` when the launcher provides one), and `pause`, `unpause`
//! (PUT, sent as commands over `<uid>/launcher.sock`) and `softreboot` (PUT; refused: the
//! launcher has neither a guest agent nor an ACPI reboot command).
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
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use tracing::{debug, warn};
use virt_launcher::protocol::{Command, LauncherClient};

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

/// The websocket subprotocol of console and vnc streams: raw bytes in binary frames.
const PLAIN_STREAM_PROTOCOL: &str = "plain.kubevirt.io";

fn pod_dir(state: &LogState, namespace: &str, pod: &str) -> Option<PathBuf> {
    (state.lookup)(namespace, pod).map(|(uid, _)| state.state_dir.join(uid))
}

fn not_on_node(namespace: &str, pod: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!("pod {namespace}/{pod} is not on this node"),
    )
        .into_response()
}

/// Copies websocket frames into the unix socket and the socket's bytes into frames until
/// either side closes.
async fn bridge_unix(socket: WebSocket, unix: tokio::net::UnixStream) {
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (mut unix_rx, mut unix_tx) = unix.into_split();
    let up = async {
        while let Some(Ok(msg)) = ws_rx.next().await {
            let written = match msg {
                Message::Binary(b) => unix_tx.write_all(&b).await,
                Message::Text(t) => unix_tx.write_all(t.as_str().as_bytes()).await,
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if written.is_err() {
                break;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match unix_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = axum::body::Bytes::copy_from_slice(&buf[..n]);
                    if ws_tx.send(Message::Binary(chunk)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = ws_tx.close().await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

async fn stream_socket(
    state: &LogState,
    namespace: &str,
    pod: &str,
    socket_name: &str,
    missing: &'static str,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Some(dir) = pod_dir(state, namespace, pod) else {
        return not_on_node(namespace, pod);
    };
    let path = dir.join(socket_name);
    if !path.exists() {
        return (StatusCode::BAD_REQUEST, missing).into_response();
    }
    let unix = match tokio::net::UnixStream::connect(&path).await {
        Ok(u) => u,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("connecting to {socket_name}: {e}"),
            )
                .into_response();
        }
    };
    upgrade
        .protocols([PLAIN_STREAM_PROTOCOL])
        .on_upgrade(move |socket| bridge_unix(socket, unix))
}

async fn console(
    State(state): State<LogState>,
    Path((namespace, pod)): Path<(String, String)>,
    upgrade: WebSocketUpgrade,
) -> Response {
    stream_socket(
        &state,
        &namespace,
        &pod,
        "serial0.sock",
        "No serial consoles are present.",
        upgrade,
    )
    .await
}

async fn vnc(
    State(state): State<LogState>,
    Path((namespace, pod)): Path<(String, String)>,
    upgrade: WebSocketUpgrade,
) -> Response {
    stream_socket(
        &state,
        &namespace,
        &pod,
        "vnc.sock",
        "No graphics devices are present.",
        upgrade,
    )
    .await
}

async fn launcher_command(
    State(state): State<LogState>,
    Path((namespace, pod, command)): Path<(String, String, String)>,
) -> Response {
    let command = match command.as_str() {
        "pause" => Command::Pause,
        "unpause" => Command::Unpause,
        "softreboot" => {
            return (
                StatusCode::BAD_REQUEST,
                "VMI neither have the agent connected nor the ACPI feature enabled",
            )
                .into_response();
        }
        other => {
            return (StatusCode::NOT_FOUND, format!("unknown command {other}")).into_response();
        }
    };
    let Some(dir) = pod_dir(&state, &namespace, &pod) else {
        return not_on_node(&namespace, &pod);
    };
    let result = match LauncherClient::connect(&dir.join("launcher.sock")).await {
        Ok(mut client) => client.request(command).await,
        Err(e) => Err(e),
    };
    match result {
        Ok(Ok(_)) => StatusCode::OK.into_response(),
        Ok(Err(message)) => (StatusCode::INTERNAL_SERVER_ERROR, message).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("talking to the launcher: {e}"),
        )
            .into_response(),
    }
}

/// The routes of the node endpoint (exposed for tests).
fn router(state_dir: PathBuf, lookup: PodLookup) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container::container_logs),
        )
        .route(
            "/v1/namespaces/{namespace}/pods/{pod}/console",
            get(console),
        )
        .route("/v1/namespaces/{namespace}/pods/{pod}/vnc", get(vnc))
        .route(
            "/v1/namespaces/{namespace}/pods/{pod}/{command}",
            put(launcher_command),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn app(dir: &std::path::Path) -> Router {
        let lookup: PodLookup = Arc::new(|ns: &str, pod: &str| {
            (ns == "default" && pod == "virt-launcher-a")
                .then(|| ("uid-a".to_owned(), vec!["compute".to_owned()]))
        });
        router(dir.to_owned(), lookup)
    }

    async fn put(app: Router, path: &str) -> (StatusCode, String) {
        let req = axum::http::Request::put(path).body(Body::empty()).unwrap();
        let res = app.oneshot(req).await.unwrap();
        let code = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn soft_reboot_is_refused_with_upstreams_message() {
        let dir = tempfile::tempdir().unwrap();
        let (code, body) = put(
            app(dir.path()),
            "/v1/namespaces/default/pods/virt-launcher-a/softreboot",
        )
        .await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            "VMI neither have the agent connected nor the ACPI feature enabled"
        );
    }

    #[tokio::test]
    async fn pause_of_a_pod_not_on_this_node_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let (code, _) = put(app(dir.path()), "/v1/namespaces/default/pods/other/pause").await;
        assert_eq!(code, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn pause_without_a_launcher_socket_is_an_internal_error() {
        let dir = tempfile::tempdir().unwrap();
        let (code, body) = put(
            app(dir.path()),
            "/v1/namespaces/default/pods/virt-launcher-a/pause",
        )
        .await;
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("launcher"), "{body}");
    }
}
