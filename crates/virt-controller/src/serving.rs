//! virt-controller's HTTPS port (upstream's `--port 8443`): `/healthz` (its liveness probe),
//! `/leader` (its readiness probe) and `/metrics` (Prometheus text), as upstream's
//! `VirtControllerApp` serves them.
//!
//! - `/healthz` answers `200 {"apiserver":{"connectivity":"ok","version":…}}` once the API
//!   server's version could be read, else `500 {"apiserver":{"connectivity":"failed",
//!   "error":…}}`. A version read is reused for [`VERSION_TTL`], so a probe does not cost an
//!   API request each time.
//! - `/leader` always answers `200`, with `{"apiserver":{"leader":"true"}}` on the replica that
//!   runs the controllers and `"false"` on the others (upstream: every replica is Ready, the
//!   body says which leads).
//! - `/metrics`: the work-queue and reconcile families,
//!   `kubevirt_virt_controller_{leading,ready}_status` ([`Metrics`]) and the REST client
//!   families of the process's clients ([`kubevirt_api::rest_client_metrics`]).
//!
//! The certificate is the operator's `kubevirt-controller-certs`, mounted and followed per
//! handshake ([`kubevirt_tls::SwappableCert::following_files`]), so its renewals need no
//! restart.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::runtime::metrics::Metrics;

/// How long a version read from the API server counts as proof of connectivity.
pub const VERSION_TTL: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct Serving {
    client: kube::Client,
    metrics: Metrics,
    registry: Arc<Registry>,
    version: Arc<Mutex<Option<(Instant, serde_json::Value)>>>,
}

/// The routes of virt-controller's port.
pub fn router(client: kube::Client, metrics: Metrics) -> Router {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    kubevirt_api::rest_client_metrics::RestClientMetrics::shared().register(&mut registry);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/leader", get(leader))
        .route("/metrics", get(scrape))
        .with_state(Serving {
            client,
            metrics,
            registry: Arc::new(registry),
            version: Arc::default(),
        })
}

/// Serves [`router`] over HTTPS on `listen` with `cert`; returns the bound address and the
/// serving task (aborted to stop).
///
/// # Errors
/// When the TLS set-up or the bind fails.
pub async fn spawn(
    listen: SocketAddr,
    cert: Arc<kubevirt_tls::SwappableCert>,
    client: kube::Client,
    metrics: Metrics,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), kubevirt_tls::SpawnError> {
    kubevirt_tls::spawn_serving_cert(
        listen,
        cert,
        &kubevirt_tls::ClientAuth::None,
        router(client, metrics),
    )
    .await
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn healthz(State(s): State<Serving>) -> Response {
    let cached = s
        .version
        .lock()
        .ok()
        .and_then(|v| v.clone())
        .filter(|(at, _)| at.elapsed() < VERSION_TTL)
        .map(|(_, v)| v);
    let version = match cached {
        Some(v) => v,
        None => match s.client.apiserver_version().await {
            Ok(info) => {
                let v = serde_json::to_value(&info).unwrap_or_default();
                if let Ok(mut slot) = s.version.lock() {
                    *slot = Some((Instant::now(), v.clone()));
                }
                v
            }
            Err(e) => {
                return json_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &json!({"apiserver": {"connectivity": "failed", "error": e.to_string()}}),
                );
            }
        },
    };
    json_response(
        StatusCode::OK,
        &json!({"apiserver": {"connectivity": "ok", "version": version}}),
    )
}

async fn leader(State(s): State<Serving>) -> Response {
    let leading = if s.metrics.is_leading() {
        "true"
    } else {
        "false"
    };
    json_response(StatusCode::OK, &json!({"apiserver": {"leader": leading}}))
}

async fn scrape(State(s): State<Serving>) -> Response {
    kubevirt_api::exposition::openmetrics_response(&s.registry).into_response()
}
