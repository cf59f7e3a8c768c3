//! The HTTPS listener: TLS (rustls, ring), the axum router, authentication, metrics and
//! graceful shutdown.
//!
//! Start-up order: open the store → create/load the PKI and the service-account signing
//! key → load CRDs → ensure namespaces and initial objects → the bootstrap RBAC policy →
//! bind → write the kubeconfigs (with the bound address) → start the garbage collector,
//! the built-in controllers and ClusterRole aggregation → serve.
//! The kubeconfig therefore exists only once the server accepts connections, so tests and
//! users can wait for the file.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kubevirt_store::Store;
use kubevirt_tls::{ClientAuth, ServeOptions, SwappableCert};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::auth;
use crate::handlers::{RequestInfo, common::WriteOptions, create};
use crate::pki;
use crate::state::ApiState;
use crate::status::json_response;

/// Server configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the SQLite file, the PKI and the kubeconfigs live.
    pub data_dir: PathBuf,
    /// Address to listen on (port 0: any free port, written into the kubeconfig).
    pub listen: SocketAddr,
    /// Objects created at start if absent (e.g. CRDs).
    pub initial_objects: Vec<Value>,
}

/// Start-up and serving failures.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Creating the data directory failed.
    #[error("creating data directory {0}")]
    DataDir(PathBuf, #[source] std::io::Error),
    /// Opening the store failed.
    #[error("opening the store")]
    Store(#[source] kubevirt_store::StoreError),
    /// Setting up certificates failed.
    #[error("setting up the PKI")]
    Pki(#[source] pki::PkiError),
    /// Building the TLS configuration failed.
    #[error("configuring TLS")]
    Tls(#[source] kubevirt_tls::ConfigError),
    /// Binding the listener failed.
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    /// The `kubernetes` Service or its endpoints could not be written.
    #[error("publishing the kubernetes Service")]
    KubernetesService(#[source] crate::status::ApiError),
    /// An initial object could not be created.
    #[error("creating initial object {0}: {1}")]
    InitialObject(String, String),
}

/// A server running in the background (tests, embedding).
pub struct RunningServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// The admin kubeconfig path.
    pub kubeconfig: PathBuf,
    /// Shared state (store, registry, metrics).
    pub state: Arc<ApiState>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// Background tasks (garbage collector …), aborted on stop.
    background: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningServer {
    /// Stops accepting, lets requests in flight finish (within [`SHUTDOWN_GRACE`]; watches
    /// do not finish on their own and are cut then) and waits for the server task.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let _ = (&mut self.task).await;
        for t in self.background.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.task.abort();
        for t in &self.background {
            t.abort();
        }
    }
}

/// The namespaces kube-apiserver creates itself (everything else is created by who needs it:
/// KubeVirt's namespace by its installer).
const NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

async fn ensure_initial(state: &ApiState, objects: &[Value]) -> Result<(), ServerError> {
    let opts = WriteOptions {
        user: "system:apiserver".into(),
        ..WriteOptions::default()
    };
    let namespaces = NAMESPACES
        .iter()
        .map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}));
    for obj in namespaces.chain(objects.iter().cloned()) {
        let av = obj["apiVersion"].as_str().unwrap_or("");
        let kind = obj["kind"].as_str().unwrap_or("");
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let Some(info) = state.registry.find_kind(av, kind) else {
            return Err(ServerError::InitialObject(
                format!("{av}/{kind} {name}"),
                "unknown kind".into(),
            ));
        };
        let ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
        if state.store.get(&info.key(ns.as_deref(), &name)).is_some() {
            continue;
        }
        match create::create(state, &info, ns.as_deref(), obj.clone(), &opts).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => {
                return Err(ServerError::InitialObject(
                    format!("{kind} {name}"),
                    e.message.clone(),
                ));
            }
        }
    }
    Ok(())
}

async fn version() -> Response {
    json_response(
        200,
        &json!({
            "major": "1", "minor": "32", "gitVersion": "v1.32.0-kubevirt-rs",
            "gitCommit": "", "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
            "goVersion": "rust", "compiler": "rustc",
            "platform": format!("{}/{}", std::env::consts::OS, if std::env::consts::ARCH == "x86_64" { "amd64" } else { std::env::consts::ARCH }),
        }),
    )
}

/// The service-account issuer's public keys (kube serves them to authenticated clients).
async fn jwks(State(state): State<Arc<ApiState>>) -> Response {
    match &state.token_issuer {
        Some(i) => json_response(200, &i.jwks()),
        None => crate::status::ApiError::no_route().into_response(),
    }
}

/// The service-account issuer's OpenID discovery document.
async fn openid_configuration(State(state): State<Arc<ApiState>>) -> Response {
    match &state.token_issuer {
        Some(i) => json_response(200, &i.openid_configuration()),
        None => crate::status::ApiError::no_route().into_response(),
    }
}

async fn ok() -> &'static str {
    "ok"
}

async fn metrics(State(state): State<Arc<ApiState>>) -> Response {
    let mut resp = state.metrics.render().into_response();
    if let Ok(v) = "text/plain; version=0.0.4; charset=utf-8".parse() {
        resp.headers_mut()
            .insert(axum::http::header::CONTENT_TYPE, v);
    }
    resp
}

/// Counts every request in `apiserver_request_total` and its latency histogram; with
/// `RUST_LOG=kubevirt_apiserver::requests=debug` also logs each one as it completes (verb,
/// path, code, latency, user agent): the request log a profile of the control plane reads.
async fn count_requests(State(state): State<Arc<ApiState>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().as_str().to_owned();
    let logged = tracing::enabled!(target: "kubevirt_apiserver::requests", tracing::Level::DEBUG)
        .then(|| {
            let agent = req
                .headers()
                .get(axum::http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (req.uri().path().to_owned(), agent)
        });
    let resp = next.run(req).await;
    let code = resp.status().as_u16();
    if let Some((path, agent)) = logged {
        let verb = resp
            .extensions()
            .get::<RequestInfo>()
            .map_or(method.as_str(), |ri| ri.verb);
        tracing::debug!(
            target: "kubevirt_apiserver::requests",
            verb,
            path,
            code,
            elapsed_us = start.elapsed().as_micros(),
            agent,
            "request"
        );
    }
    match resp.extensions().get::<RequestInfo>() {
        Some(ri) => state.metrics.request(
            ri.verb,
            &ri.group,
            &ri.resource,
            &ri.subresource,
            code,
            start.elapsed(),
        ),
        None => state
            .metrics
            .request(&method, "", "", "", code, start.elapsed()),
    }
    resp
}

/// The router (without TLS): usable in-process by tests via `tower::ServiceExt::oneshot`.
pub fn router(state: Arc<ApiState>) -> Router {
    with_layers(routes(), state)
}

/// The routes, before the layers every request goes through.
fn routes() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/version", get(version))
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(ok))
        .route("/metrics", get(metrics))
        .route("/openapi/v2", get(crate::openapi::v2))
        .route("/openapi/v3", get(crate::openapi::index))
        .route("/openapi/v3/{*path}", get(crate::openapi::group_version))
        .route("/openid/v1/jwks", get(jwks))
        .route(
            "/.well-known/openid-configuration",
            get(openid_configuration),
        )
        .fallback(crate::handlers::api_request)
}

/// Authentication, then authorization (impersonation and RBAC), then panic recovery, then
/// metrics (outermost), so a request that panicked is still counted, as a 500.
fn with_layers(routes: Router<Arc<ApiState>>, state: Arc<ApiState>) -> Router {
    routes
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::rbac::authorize,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_auth,
        ))
        .layer(middleware::from_fn(crate::catch_panic::catch_panic))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .with_state(state)
}

/// How long requests in flight may take to finish once the server stops: short, as
/// watches never finish on their own and hold the stop until it passes.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// TLS with the server certificate of the PKI; a client certificate is optional (tokens
/// authenticate too) and, when given, must chain to the cluster CA.
fn tls_config(p: &pki::Pki) -> Result<rustls::ServerConfig, ServerError> {
    let cert = SwappableCert::from_pem(p.server_cert_pem.as_bytes(), p.server_key_pem.as_bytes())
        .map_err(ServerError::Tls)?;
    kubevirt_tls::server_config(cert, &ClientAuth::Optional(p.ca_pem.clone().into_bytes()))
        .map_err(ServerError::Tls)
}

/// Creates the data directory (and missing parents) 0700 whatever the umask, and
/// narrows an existing one to 0700: it holds the store (every Secret) and the PKI keys.
#[cfg(unix)]
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
    if mode != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        warn!(dir = %dir.display(), mode = format!("{mode:o}"), "narrowed the data directory's mode to 0700");
    }
    Ok(())
}

/// File modes are a Unix matter; elsewhere the directory gets what the platform gives.
#[cfg(not(unix))]
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

/// Opens everything and starts serving in the background.
pub async fn start(config: Config) -> Result<RunningServer, ServerError> {
    create_private_dir(&config.data_dir)
        .map_err(|e| ServerError::DataDir(config.data_dir.clone(), e))?;
    let store =
        Store::open_sqlite(&config.data_dir.join("store.sqlite")).map_err(ServerError::Store)?;
    store.spawn_compactor(kubevirt_store::DEFAULT_HISTORY_RETENTION);
    let pki = pki::load_or_create(&config.data_dir).map_err(ServerError::Pki)?;
    let mut state = ApiState::new(store);
    state.tokens = pki.tokens.clone();
    state.token_issuer = Some(Arc::new(
        crate::serviceaccount::TokenIssuer::load_or_create(&config.data_dir)
            .map_err(ServerError::Pki)?,
    ));
    state.outgoing = crate::state::Outgoing {
        ca_pem: pki.ca_pem.clone(),
        proxy_client: Some(pki.proxy_client.clone()),
        kubelet_client: Some(pki.kubelet_client.clone()),
    };
    // Built-in plugins run before the webhooks, as in kube-apiserver.
    state
        .admission
        .push(Arc::new(crate::admission::ServiceAccountAdmission::new(
            state.store.clone(),
        )));
    state
        .admission
        .push(Arc::new(crate::admission::DefaultStorageClass::new(
            state.store.clone(),
        )));
    state
        .admission
        .push(Arc::new(crate::webhook::WebhookAdmission::new(
            state.store.clone(),
            pki.ca_pem.clone().into_bytes(),
        )));
    state
        .admission
        .push(Arc::new(crate::services::ClusterIpAllocation::new(
            state.store.clone(),
        )));
    let state = Arc::new(state);
    crate::crd::load_all(&state);
    ensure_initial(&state, &config.initial_objects).await?;
    crate::rbac::bootstrap::ensure(&state).await.map_err(|e| {
        ServerError::InitialObject("the bootstrap RBAC policy".into(), e.message.clone())
    })?;
    crate::builtin_controllers::publish_authentication_config(&state, &pki.front_proxy_ca_pem)
        .await
        .map_err(|e| {
            ServerError::InitialObject(
                "kube-system/extension-apiserver-authentication".into(),
                e.message.clone(),
            )
        })?;
    let tls = Arc::new(tls_config(&pki)?);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| ServerError::Bind(config.listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServerError::Bind(config.listen, e))?;
    pki::write_kubeconfigs(&config.data_dir, &pki, &format!("https://{addr}"))
        .map_err(ServerError::Pki)?;
    crate::services::ensure_kubernetes_service(&state, addr)
        .await
        .map_err(ServerError::KubernetesService)?;
    let background = vec![
        crate::gc::spawn(state.clone()),
        crate::builtin_controllers::spawn(state.clone()),
        crate::rbac::aggregation::spawn(state.clone()),
    ];
    let app = router(state.clone());
    let shutdown = CancellationToken::new();
    let options = ServeOptions {
        shutdown_grace: SHUTDOWN_GRACE,
        ..ServeOptions::default()
    };
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            kubevirt_tls::serve(listener, tls, app, options, shutdown).await;
            info!("API server stopped");
        }
    });
    info!(%addr, "API server ready");
    Ok(RunningServer {
        addr,
        kubeconfig: config.data_dir.join("kubeconfig"),
        state,
        shutdown,
        task,
        background,
    })
}

/// Runs the server until `shutdown` completes.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let server = start(config).await?;
    shutdown.await;
    server.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::*;
    use crate::catch_panic::PANIC_MESSAGE;

    async fn boom() -> &'static str {
        panic!("a handler bug")
    }

    /// A request as if it came with the admin certificate (TLS verification is the
    /// listener's job; the router only reads the subject).
    fn authenticated(path: &str) -> Request {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kubernetes-admin");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let mut req = Request::get(path).body(Body::empty()).unwrap();
        req.extensions_mut()
            .insert(kubevirt_tls::PeerCertificates(Arc::from(vec![
                cert.der().clone(),
            ])));
        req
    }

    #[cfg(unix)]
    fn mode(path: &std::path::Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[cfg(unix)]
    #[test]
    fn the_data_directory_is_created_or_narrowed_to_0700() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let fresh = tmp.path().join("a/data");
        create_private_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
    }

    #[tokio::test]
    async fn a_panicking_handler_is_answered_with_a_500_status_and_counted() {
        let state = Arc::new(ApiState::new(Store::in_memory()));
        let app = with_layers(routes().route("/boom", get(boom)), state.clone());
        let resp = app.clone().oneshot(authenticated("/boom")).await.unwrap();
        assert_eq!(resp.status(), 500);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let status: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], 500);
        assert_eq!(status["reason"], "InternalError");
        assert_eq!(status["message"], PANIC_MESSAGE);
        assert!(
            state.metrics.render().contains("code=\"500\""),
            "the panicked request is counted"
        );
        // The same router keeps serving.
        let resp = app.oneshot(authenticated("/healthz")).await.unwrap();
        assert_eq!(resp.status(), 200);
    }
}
