//! virt-api's `/metrics`, on its one HTTPS port as upstream's (Prometheus scrapes it without a
//! client certificate, so the route sits outside the subresources' certificate check):
//!
//! - `kubevirt_virt_api_ready_status`: 1 once the routes are built to be served;
//! - `kubevirt_console_active_connections`, `kubevirt_vnc_active_connections`,
//!   `kubevirt_portforward_active_tunnels` (`namespace`, `vmi`): the streams open now, each
//!   counted from its upgrade to its close by an [`ActiveConnection`];
//! - `kubevirt_vmi_last_api_connection_timestamp_seconds` (`namespace`, `vmi`): when the last
//!   of those streams of the VMI closed (upstream sets it when its handler returns);
//! - the REST client families of virt-api's own client
//!   ([`kubevirt_api::rest_client_metrics`]).
//!
//! Not served: `kubevirt_usbredir_active_connections` (there is no `usbredir` endpoint).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::{IntoResponse, Response};
use kubevirt_api::rest_client_metrics::RestClientMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The labels of the per-VMI connection families (upstream's `namespace`, `vmi`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VmiLabels {
    namespace: String,
    vmi: String,
}

/// The kind of stream an [`ActiveConnection`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind {
    /// `…/console`.
    Console,
    /// `…/vnc`.
    Vnc,
    /// `…/portforward/…`.
    PortForward,
}

type TimestampGauge = Gauge<f64, AtomicU64>;

/// virt-api's metric families; cloning yields another handle to the same ones.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    registry: Arc<Registry>,
    ready: Gauge,
    console: Family<VmiLabels, Gauge>,
    vnc: Family<VmiLabels, Gauge>,
    portforward: Family<VmiLabels, Gauge>,
    last_connection: Family<VmiLabels, TimestampGauge>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiMetrics {
    /// The families, registered with their own registry (and the process's REST client
    /// families), not ready yet.
    pub fn new() -> Self {
        let (ready, console, vnc, portforward, last_connection) = (
            Gauge::default(),
            Family::<VmiLabels, Gauge>::default(),
            Family::<VmiLabels, Gauge>::default(),
            Family::<VmiLabels, Gauge>::default(),
            Family::<VmiLabels, TimestampGauge>::default(),
        );
        let mut registry = Registry::default();
        registry.register(
            "kubevirt_virt_api_ready_status",
            "Indication for a virt-api server that is ready to serve requests.",
            ready.clone(),
        );
        registry.register(
            "kubevirt_console_active_connections",
            "Amount of active Console connections, broken down by namespace and vmi name.",
            console.clone(),
        );
        registry.register(
            "kubevirt_vnc_active_connections",
            "Amount of active VNC connections, broken down by namespace and vmi name.",
            vnc.clone(),
        );
        registry.register(
            "kubevirt_portforward_active_tunnels",
            "Amount of active portforward tunnels, broken down by namespace and vmi name.",
            portforward.clone(),
        );
        registry.register(
            "kubevirt_vmi_last_api_connection_timestamp_seconds",
            "Virtual Machine Instance last API connection timestamp. Including VNC, console, portforward, SSH and usbredir connections.",
            last_connection.clone(),
        );
        RestClientMetrics::shared().register(&mut registry);
        Self {
            registry: Arc::new(registry),
            ready,
            console,
            vnc,
            portforward,
            last_connection,
        }
    }

    /// Sets `kubevirt_virt_api_ready_status`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Counts one open stream of `kind` to the VMI `namespace/name` until the returned value
    /// is dropped.
    pub fn open(&self, kind: StreamKind, namespace: &str, name: &str) -> ActiveConnection {
        let labels = VmiLabels {
            namespace: namespace.to_owned(),
            vmi: name.to_owned(),
        };
        let family = match kind {
            StreamKind::Console => &self.console,
            StreamKind::Vnc => &self.vnc,
            StreamKind::PortForward => &self.portforward,
        };
        let active = family.get_or_create_owned(&labels);
        active.inc();
        ActiveConnection {
            active,
            last_connection: self.last_connection.clone(),
            labels,
        }
    }

    /// The text exposition of every family (the body of `/metrics`).
    pub fn scrape(&self) -> Response {
        kubevirt_api::exposition::openmetrics_response(&self.registry).into_response()
    }
}

/// One open stream: counted in its family while it lives; when dropped, the count goes down
/// and the VMI's last-connection time is set.
#[derive(Debug)]
pub struct ActiveConnection {
    active: Gauge,
    last_connection: Family<VmiLabels, TimestampGauge>,
    labels: VmiLabels,
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        self.active.dec();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64().floor());
        self.last_connection.get_or_create(&self.labels).set(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn text(metrics: &ApiMetrics) -> String {
        let body = metrics.scrape().into_body();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.expect("body");
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    #[tokio::test]
    async fn a_stream_is_counted_while_open_and_stamps_the_vmi_when_closed() {
        let metrics = ApiMetrics::new();
        metrics.set_ready(true);
        let first = metrics.open(StreamKind::Console, "ns", "a");
        let _second = metrics.open(StreamKind::Console, "ns", "a");
        let _tunnel = metrics.open(StreamKind::PortForward, "ns", "b");
        let open = text(&metrics).await;
        assert!(
            open.contains("kubevirt_virt_api_ready_status 1\n"),
            "{open}"
        );
        assert!(
            open.contains(r#"kubevirt_console_active_connections{namespace="ns",vmi="a"} 2"#),
            "{open}"
        );
        assert!(
            open.contains(r#"kubevirt_portforward_active_tunnels{namespace="ns",vmi="b"} 1"#),
            "{open}"
        );
        assert!(
            !open.contains(r#"kubevirt_vmi_last_api_connection_timestamp_seconds{"#),
            "no stream closed yet: {open}"
        );
        drop(first);
        let closed = text(&metrics).await;
        assert!(
            closed.contains(r#"kubevirt_console_active_connections{namespace="ns",vmi="a"} 1"#),
            "{closed}"
        );
        let stamp: f64 = closed
            .lines()
            .find_map(|l| {
                l.strip_prefix(r#"kubevirt_vmi_last_api_connection_timestamp_seconds{namespace="ns",vmi="a"} "#)
            })
            .expect("the closed stream's VMI is stamped")
            .parse()
            .expect("a number");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        assert!(
            (now - stamp).abs() < 3600.0,
            "{stamp} is not about now ({now})"
        );
        assert!(
            !closed.contains(
                r#"kubevirt_vmi_last_api_connection_timestamp_seconds{namespace="ns",vmi="b"}"#
            ),
            "{closed}"
        );
    }
}
