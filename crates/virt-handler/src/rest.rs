//! virt-handler's REST server: the node side of virt-api's VMI subresources, as upstream's
//! `pkg/virt-handler/rest`, served the same way on the embedded node and on a cluster.
//!
//! Routes under `/v1/namespaces/{ns}/virtualmachineinstances/{name}/`: `console` (websocket,
//! subprotocol `plain.kubevirt.io`, bridged to the launcher's serial console socket
//! `serial0.sock`), `vnc` (websocket to the VNC server's `vnc.sock`; "No graphics devices are
//! present." without one) — one session of each per VMI, a new one ends the previous — and
//! `pause`, `unpause`, `softreboot`, `freeze` and `unfreeze` (PUT, sent as commands over
//! `launcher.sock`; upstream's Events `Paused`, `Unpaused`, `SoftRebooted` on success and
//! `FreezeError` with a 400 on a failed freeze), and the guest agent's `guestosinfo`, `userlist`, `filesystemlist` (GET, [`guest_agent`]). The VMI's
//! active pod on this node names the launcher directory
//! ([`crate::vmi_sync::worker::active_pod_dir`]); the VMI comes from the VMI sync loop's cache of
//! this node's VMIs, so a request makes no API call.
//!
//! virt-api finds the server through the Node annotation [`ENDPOINT_ANNOTATION`]
//! (`host:port`), which the handler writes when it starts. Upstream virt-api looks up the
//! virt-handler pod of the node instead and uses its pod IP and port 8186; the handler does
//! not run as a pod in the embedded server yet.
//!
//! # Guarantees
//! Only clients presenting a certificate signed by the cluster CA are served (virt-api's).
//! Paths are built from a pod UID of the VMI's status in canonical form, never from request
//! text, and a request reaches a launcher only after that launcher reported the VMI's UID in
//! its hello (else the VMI is "not on this node").

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use kube::runtime::reflector::{ObjectRef, Store};
use kubevirt_api::events::{EventRecorder, EventType};
use kubevirt_api::v1::VirtualMachineInstance;
use virt_launcher::protocol::{Command, LauncherClient};

mod guest_agent;

use crate::vmi_sync::worker::connect_active_launcher;

/// The Node annotation that tells virt-api where this node's handler serves (`host:port`).
pub const ENDPOINT_ANNOTATION: &str = "kubevirt-rs.io/virt-handler-endpoint";

/// Where the REST server listens and with what credentials.
#[derive(Debug, Clone)]
pub struct RestConfig {
    /// Listen address (port 0 picks a free port).
    pub listen: SocketAddr,
    /// The serving certificate and the CA of the accepted client certificates.
    pub tls: RestTls,
    /// The address announced on the Node in place of the listen address's (a pod's IP, when
    /// listening on every address of the pod's network).
    pub advertise_ip: Option<std::net::IpAddr>,
}

/// Where the REST server's certificate and its client CA come from.
#[derive(Debug, Clone)]
pub enum RestTls {
    /// PEM material, fixed for the life of the process.
    Pem {
        /// The CA (PEM) whose client certificates are accepted (the cluster CA).
        client_ca_pem: Vec<u8>,
        /// Certificate and key (PEM) to present (self-signed when `None`).
        serving_cert: Option<(String, String)>,
    },
    /// `tls.crt` and `tls.key` (presented) and `ca.crt` (the CA bundle virt-api's client
    /// certificates must chain to) of a mounted Secret (`kubevirt-virt-handler-server-certs`),
    /// as they are at each handshake: renewals are served and trusted from the next
    /// connection on, and a client certificate of a CA that left the bundle is refused.
    Mounted(std::path::PathBuf),
}

/// Errors starting the REST server.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    /// Announcing the endpoint on the Node failed.
    #[error("announcing the REST endpoint on node {0}")]
    Announce(String, #[source] kube::Error),
    /// The TLS set-up or the bind failed.
    #[error("serving")]
    Serve(#[source] kubevirt_tls::SpawnError),
}

#[derive(Clone)]
struct RestState {
    /// This node's VMIs, as the VMI sync loop's reflector keeps them.
    vmis: Store<VirtualMachineInstance>,
    node_name: String,
    kubelet_pods_dir: PathBuf,
    /// The open console and VNC streams.
    sessions: Sessions,
    /// Upstream's lifecycle Events (`Paused`, `Unpaused`, `SoftRebooted`, `FreezeError`).
    events: Arc<EventRecorder>,
}

/// Which stream of which VMI: (namespace, name, socket file).
type SessionKey = (String, String, &'static str);

/// One stream per VMI and socket, as upstream's handler keeps one console and one VNC
/// session per VMI: a new connection ends the previous one.
///
/// # Guarantees
/// [`Sessions::begin`] cancels the token of the stream it replaces; [`Sessions::end`] only
/// forgets the stream it is given, never a newer one of the same key.
#[derive(Clone, Default)]
struct Sessions(Arc<Mutex<SessionMap>>);

#[derive(Default)]
struct SessionMap {
    next_id: u64,
    open: HashMap<SessionKey, (u64, CancellationToken)>,
}

impl Sessions {
    /// Registers a new stream of `key`, ending the one open before; returns its id and the
    /// token that ends it.
    fn begin(&self, key: SessionKey) -> (u64, CancellationToken) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.next_id += 1;
        let id = map.next_id;
        let token = CancellationToken::new();
        if let Some((_, previous)) = map.open.insert(key, (id, token.clone())) {
            previous.cancel();
        }
        (id, token)
    }

    /// Forgets the stream `id` of `key` if it is still the open one.
    fn end(&self, key: &SessionKey, id: u64) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.open.get(key).is_some_and(|(open, _)| *open == id) {
            map.open.remove(key);
        }
    }
}

/// The websocket subprotocol of console and vnc streams: raw bytes in binary frames.
const PLAIN_STREAM_PROTOCOL: &str = "plain.kubevirt.io";

/// How long a request waits for the first list of this node's VMIs (right after start).
const CACHE_READY: Duration = Duration::from_secs(10);

/// The launcher directory of the VMI's active pod on this node, from the cache of this
/// node's VMIs (no API call), and a connection to its launcher, once that launcher has said
/// it runs this VMI ([`connect_active_launcher`]).
async fn pod_launcher(
    state: &RestState,
    namespace: &str,
    name: &str,
) -> Result<(PathBuf, LauncherClient), Refusal> {
    let not_here = || not_on_node(namespace, name);
    tokio::time::timeout(CACHE_READY, state.vmis.wait_until_ready())
        .await
        .map_err(|_| not_here())?
        .map_err(|_| not_here())?;
    let vmi = state
        .vmis
        .get(&ObjectRef::new(name).within(namespace))
        .ok_or_else(not_here)?;
    match connect_active_launcher(&vmi, &state.node_name, &state.kubelet_pods_dir).await {
        Ok(Some(found)) => Ok(found),
        Ok(None) => Err(not_here()),
        Err(e) => Err(Refusal::internal(format!("talking to the launcher: {e}"))),
    }
}

/// Why a request was not carried out: the status and text of its answer.
#[derive(Debug)]
pub(crate) struct Refusal {
    status: StatusCode,
    message: String,
}

impl Refusal {
    fn internal(message: String) -> Self {
        Refusal {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.status, self.message).into_response()
    }
}

fn not_on_node(namespace: &str, name: &str) -> Refusal {
    Refusal {
        status: StatusCode::NOT_FOUND,
        message: format!("VMI {namespace}/{name} does not run on this node"),
    }
}

/// Copies websocket frames into the unix socket and the socket's bytes into frames until
/// either side closes or `stop` is cancelled (a newer session replaced this one).
async fn bridge_unix(socket: WebSocket, unix: tokio::net::UnixStream, stop: CancellationToken) {
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
        () = stop.cancelled() => {}
    }
}

async fn stream_socket(
    state: &RestState,
    namespace: &str,
    pod: &str,
    socket_name: &'static str,
    missing: &'static str,
    upgrade: WebSocketUpgrade,
) -> Response {
    let dir = match pod_launcher(state, namespace, pod).await {
        Ok((dir, _)) => dir,
        Err(refusal) => return refusal.into_response(),
    };
    let path = dir.join(socket_name);
    if !path.exists() {
        return (StatusCode::BAD_REQUEST, missing).into_response();
    }
    let unix = match virt_launcher::unix_socket::connect(&path).await {
        Ok(u) => u,
        Err(e) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("connecting to {socket_name}: {e}"),
            )
                .into_response();
        }
    };
    let sessions = state.sessions.clone();
    let key = (namespace.to_owned(), pod.to_owned(), socket_name);
    upgrade
        .protocols([PLAIN_STREAM_PROTOCOL])
        .on_upgrade(move |socket| async move {
            let (id, stop) = sessions.begin(key.clone());
            bridge_unix(socket, unix, stop).await;
            sessions.end(&key, id);
        })
}

async fn console(
    State(state): State<RestState>,
    Path((namespace, pod)): Path<(String, String)>,
    upgrade: WebSocketUpgrade,
) -> Response {
    stream_socket(
        &state,
        &namespace,
        &pod,
        virt_launcher::pod_layout::SERIAL_CONSOLE_SOCKET,
        "No serial consoles are present.",
        upgrade,
    )
    .await
}

async fn vnc(
    State(state): State<RestState>,
    Path((namespace, pod)): Path<(String, String)>,
    upgrade: WebSocketUpgrade,
) -> Response {
    stream_socket(
        &state,
        &namespace,
        &pod,
        virt_launcher::pod_layout::VNC_SOCKET,
        "No graphics devices are present.",
        upgrade,
    )
    .await
}

/// The `unfreezeTimeout` of a `freeze` request's body (upstream's `FreezeUnfreezeTimeout`),
/// with upstream's answers to a body without one.
fn unfreeze_timeout(body: &[u8]) -> Result<Duration, &'static str> {
    const UNREADABLE: &str = "failed to retrieve unfreeze timeout";
    let request: serde_json::Value = serde_json::from_slice(body).map_err(|_| UNREADABLE)?;
    match request.get("unfreezeTimeout") {
        None | Some(serde_json::Value::Null) => {
            Err("Unfreeze timeout in freeze request is not set")
        }
        Some(value) => value
            .as_str()
            .and_then(kubevirt_api::duration::parse_go_duration)
            .ok_or(UNREADABLE),
    }
}

async fn launcher_command(
    State(state): State<RestState>,
    Path((namespace, name, subresource)): Path<(String, String, String)>,
    body: axum::body::Bytes,
) -> Response {
    let command = match subresource.as_str() {
        "pause" => Command::Pause,
        "unpause" => Command::Unpause,
        "softreboot" => Command::SoftReboot,
        "freeze" => match unfreeze_timeout(&body) {
            Ok(timeout) => Command::Freeze {
                unfreeze_timeout_seconds: timeout.as_secs(),
            },
            Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
        },
        "unfreeze" => Command::Unfreeze,
        other => {
            return (StatusCode::NOT_FOUND, format!("unknown command {other}")).into_response();
        }
    };
    let answer = guest_agent::ask_launcher(&state, &namespace, &name, command).await;
    let vmi = state.vmis.get(&ObjectRef::new(&name).within(&namespace));
    match (answer, vmi) {
        (Ok(_), Some(vmi)) => {
            if let Some((reason, message)) = lifecycle_event(&subresource) {
                state
                    .events
                    .record(&*vmi, EventType::Normal, reason, message)
                    .await;
            }
            StatusCode::OK.into_response()
        }
        (Ok(_), None) => StatusCode::OK.into_response(),
        (Err(error), Some(vmi)) if subresource == "freeze" => {
            // Upstream answers a failed freeze with 400 and records why.
            let message = format!("Failed to freeze VMI: {}", error.message);
            state
                .events
                .record(&*vmi, EventType::Warning, "FreezeError", &message)
                .await;
            (StatusCode::BAD_REQUEST, error.message).into_response()
        }
        (Err(error), _) if subresource == "unfreeze" => {
            (StatusCode::BAD_REQUEST, error.message).into_response()
        }
        (Err(error), _) => error.into_response(),
    }
}

/// The Normal Event upstream's handler records once `subresource` succeeded.
fn lifecycle_event(subresource: &str) -> Option<(&'static str, &'static str)> {
    match subresource {
        "pause" => Some(("Paused", "VirtualMachineInstance paused")),
        "unpause" => Some(("Unpaused", "VirtualMachineInstance unpaused")),
        "softreboot" => Some(("SoftRebooted", "VirtualMachineInstance soft rebooted")),
        _ => None,
    }
}

/// The routes of the REST server.
fn router(state: RestState) -> Router {
    Router::new()
        .route(
            "/v1/namespaces/{namespace}/virtualmachineinstances/{name}/console",
            get(console),
        )
        .route(
            "/v1/namespaces/{namespace}/virtualmachineinstances/{name}/vnc",
            get(vnc),
        )
        .route(
            "/v1/namespaces/{namespace}/virtualmachineinstances/{name}/{command}",
            put(launcher_command).get(guest_agent::query),
        )
        .with_state(state)
}

/// What keeps the REST server running: it stops when this is dropped.
pub struct RestServer {
    /// The bound address.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the REST server and announces it on the Node ([`ENDPOINT_ANNOTATION`]).
///
/// # Errors
/// [`RestError`] when the TLS set-up, the bind or the announcement fails.
pub async fn serve(
    client: kube::Client,
    config: &RestConfig,
    vmis: Store<VirtualMachineInstance>,
    node_name: &str,
    kubelet_pods_dir: &std::path::Path,
) -> Result<RestServer, RestError> {
    let state = RestState {
        vmis,
        node_name: node_name.to_owned(),
        kubelet_pods_dir: kubelet_pods_dir.to_owned(),
        sessions: Sessions::default(),
        events: Arc::new(EventRecorder::new(client.clone(), "virt-handler").on_host(node_name)),
    };
    let (addr, task) = serve_router(config.listen, &config.tls, router(state)).await?;
    let server = RestServer { addr, task };
    let announced = config
        .advertise_ip
        .map_or(addr, |ip| SocketAddr::new(ip, addr.port()));
    announce(&client, node_name, announced).await?;
    Ok(server)
}

/// Writes the endpoint annotation, retrying while the Node is not registered yet.
async fn announce(
    client: &kube::Client,
    node_name: &str,
    addr: SocketAddr,
) -> Result<(), RestError> {
    use kube::api::{Patch, PatchParams};
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let patch =
        serde_json::json!({"metadata": {"annotations": {ENDPOINT_ANNOTATION: addr.to_string()}}});
    let mut attempts = 0;
    loop {
        match api
            .patch(node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 && attempts < 120 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(RestError::Announce(node_name.to_owned(), e)),
        }
    }
}

/// Serves `app` over TLS on `listen` (clients must present a certificate of the client CA
/// of `tls`) until the task is dropped; returns the bound address. Without a serving
/// certificate a self-signed one is made, as kubelet does by default.
async fn serve_router(
    listen: SocketAddr,
    tls: &RestTls,
    app: Router,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), RestError> {
    serve_tls(listen, tls, app, true)
        .await
        .map_err(RestError::Serve)
}

/// Serves `app` over TLS on `listen` with the certificate of `tls`, asking for a client
/// certificate of its client CA when `client_certificates` (the REST server) and for none
/// otherwise (the metrics port).
pub(crate) async fn serve_tls(
    listen: SocketAddr,
    tls: &RestTls,
    app: Router,
    client_certificates: bool,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), kubevirt_tls::SpawnError> {
    use kubevirt_tls::ClientAuth;
    match tls {
        RestTls::Pem {
            client_ca_pem,
            serving_cert,
        } => {
            let auth = if client_certificates {
                ClientAuth::Required(client_ca_pem.clone())
            } else {
                ClientAuth::None
            };
            kubevirt_tls::spawn_serving(listen, serving_cert.as_ref(), &auth, app).await
        }
        RestTls::Mounted(dir) => {
            let cert = kubevirt_tls::SwappableCert::following_files(
                &dir.join("tls.crt"),
                &dir.join("tls.key"),
            )
            .map_err(|e| kubevirt_tls::SpawnError::Tls(e.to_string()))?;
            let auth = if client_certificates {
                ClientAuth::RequiredFile(dir.join("ca.crt"))
            } else {
                ClientAuth::None
            };
            kubevirt_tls::spawn_serving_cert(listen, cert, &auth, app).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmi_sync::link::LauncherLink;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use kube::runtime::watcher;
    use tower::ServiceExt;
    use virt_launcher::pod_layout::PodLayout;

    const POD_UID: &str = "6f1c3b1e-2d4a-4b7e-9c1d-0a1b2c3d4e5f";

    fn vmi(name: &str, active_pod_node: &str) -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"domain": {"devices": {}}},
            "status": {"activePods": {POD_UID: active_pod_node}}
        }))
        .expect("VMI")
    }

    /// A router over a listed cache holding `vmis`, as node01's handler with pods under
    /// `pods_dir`.
    fn router_with(vmis: Vec<VirtualMachineInstance>, pods_dir: &std::path::Path) -> Router {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for vmi in vmis {
            writer.apply_watcher_event(&watcher::Event::InitApply(vmi));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        router(RestState {
            vmis: store,
            node_name: "node01".into(),
            kubelet_pods_dir: pods_dir.to_owned(),
            sessions: Sessions::default(),
            events: Arc::new(EventRecorder::new(unreachable_client(), "virt-handler")),
        })
    }

    /// A client whose requests fail at once (the tests' Events go nowhere).
    fn unreachable_client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        kube::Client::try_from(config).expect("client")
    }

    async fn put(app: Router, name: &str, command: &str) -> (StatusCode, String) {
        let request = Request::put(format!(
            "/v1/namespaces/default/virtualmachineinstances/{name}/{command}"
        ))
        .body(Body::empty())
        .expect("request");
        let response = app.oneshot(request).await.expect("response");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[test]
    fn a_freeze_needs_an_unfreeze_timeout_as_upstreams_handler_does() {
        assert_eq!(
            unfreeze_timeout(br#"{"unfreezeTimeout":"5m0s"}"#).ok(),
            Some(Duration::from_secs(300))
        );
        for (body, message) in [
            (&b"{}"[..], "Unfreeze timeout in freeze request is not set"),
            (b"", "failed to retrieve unfreeze timeout"),
            (
                br#"{"unfreezeTimeout":"soon"}"#,
                "failed to retrieve unfreeze timeout",
            ),
        ] {
            assert_eq!(unfreeze_timeout(body), Err(message));
        }
    }

    #[test]
    fn a_new_session_ends_the_previous_one_of_the_same_stream_only() {
        let sessions = Sessions::default();
        let vnc = || ("default".to_owned(), "a".to_owned(), "vnc.sock");
        let console = ("default".to_owned(), "a".to_owned(), "serial0.sock");
        let (first, first_stop) = sessions.begin(vnc());
        let (_, console_stop) = sessions.begin(console);
        let (second, second_stop) = sessions.begin(vnc());
        assert!(
            first_stop.is_cancelled(),
            "the first VNC session is replaced"
        );
        assert!(
            !console_stop.is_cancelled(),
            "the console is another stream"
        );
        // The replaced session ending late does not forget the open one.
        sessions.end(&vnc(), first);
        let (_, third_stop) = sessions.begin(vnc());
        assert!(second_stop.is_cancelled());
        sessions.end(&vnc(), second);
        assert!(!third_stop.is_cancelled());
    }

    #[tokio::test]
    async fn a_vmi_not_on_this_node_is_not_found() {
        let pods = tempfile::tempdir().expect("tempdir");
        let app = router_with(vec![vmi("elsewhere", "node02")], pods.path());
        for name in ["elsewhere", "absent"] {
            let (status, body) = put(app.clone(), name, "pause").await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{name}");
            assert_eq!(
                body,
                format!("VMI default/{name} does not run on this node")
            );
        }
    }

    /// A launcher (fake QEMU) for `vmi_uid` in `POD_UID`'s launcher directory below `pods`,
    /// listening once the returned task runs; wait with [`wait_socket`].
    fn launcher_in_pod(pods: &std::path::Path, vmi_uid: &str) -> tokio::task::JoinHandle<()> {
        let dir = crate::vmi_sync::worker::launcher_dir_on_host(pods, POD_UID);
        std::fs::create_dir_all(&dir).expect("launcher dir");
        let mut opts = virt_launcher::LauncherOptions::new(PodLayout::new(&dir).launcher_socket());
        opts.fake_qemu = true;
        opts.discover_pod_network = false;
        opts.vmi_uid = Some(vmi_uid.to_owned());
        tokio::spawn(async move {
            let _ = virt_launcher::run_launcher(opts).await;
        })
    }

    async fn wait_socket(pods: &std::path::Path) {
        let socket = PodLayout::new(crate::vmi_sync::worker::launcher_dir_on_host(pods, POD_UID))
            .launcher_socket();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while LauncherLink::connect(&socket).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the launcher never listened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_launcher_of_another_vmi_is_never_reached_through_this_vmis_active_pod() {
        let pods = tempfile::tempdir().expect("tempdir");
        let mut intruder = vmi("intruder", "node01");
        intruder.metadata.uid = Some("11111111-2222-4333-8444-555555555555".into());
        let mut owner = vmi("owner", "node01");
        owner.metadata.uid = Some("99999999-2222-4333-8444-555555555555".into());
        let launcher = launcher_in_pod(pods.path(), "99999999-2222-4333-8444-555555555555");
        wait_socket(pods.path()).await;
        let app = router_with(vec![intruder, owner], pods.path());
        let (status, body) = put(app.clone(), "intruder", "pause").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(body, "VMI default/intruder does not run on this node");
        // The launcher's own VMI reaches it (the fake domain has not started: refused).
        let (status, body) = put(app, "owner", "pause").await;
        assert_ne!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(!body.starts_with("talking to the launcher"), "{body}");
        launcher.abort();
    }

    #[tokio::test]
    async fn a_vmi_on_this_node_is_found_in_the_cache_and_its_launcher_is_asked() {
        let pods = tempfile::tempdir().expect("tempdir");
        let app = router_with(vec![vmi("a", "node01")], pods.path());
        // No launcher listens in the pod's directory: the lookup succeeded, the call failed.
        let (status, body) = put(app, "a", "pause").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.starts_with("talking to the launcher"), "{body}");
    }
}
