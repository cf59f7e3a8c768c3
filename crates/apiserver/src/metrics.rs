//! Prometheus metrics served at `/metrics`: requests by verb, resource, subresource and
//! code; request latency; in-flight watches; store commit latency; stored objects that
//! failed to decode (kube's `apiserver_storage_decode_errors_total`).
//!
//! # Caveats
//! The decode-error counter is process-wide (every server of the process reports the
//! same figures): it is counted where records are decoded, which has no server at hand.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::registry::ResourceInfo;

/// Labels of one request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub code: String,
}

/// Labels of latency (no code).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    pub verb: String,
    pub resource: String,
}

/// Labels of in-flight watches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    pub group: String,
    pub resource: String,
}

/// Labels of decode errors: the resource as kube's storage labels it (`group/resource`,
/// `resource` alone for the core group).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecodeErrorLabels {
    pub resource: String,
}

static DECODE_ERRORS: std::sync::LazyLock<Family<DecodeErrorLabels, Counter>> =
    std::sync::LazyLock::new(Family::default);

/// Counts one stored object under `key` (`/registry/<group>/<resource>/…`) that could not
/// be decoded.
pub fn decode_error(key: &str) {
    let mut parts = key.trim_start_matches("/registry/").split('/');
    let (group, resource) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let resource = if group == "core" || group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    };
    DECODE_ERRORS
        .get_or_create(&DecodeErrorLabels { resource })
        .inc();
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily<LatencyLabels>,
    watches: Family<WatchLabels, Gauge>,
    commit: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily<LatencyLabels> =
            Family::new_with_constructor(latency_histogram);
        let watches = Family::<WatchLabels, Gauge>::default();
        let commit = latency_histogram();
        registry.register(
            "apiserver_request",
            "API requests by verb, group, resource, subresource and HTTP code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "API request latency (watches: until the stream starts)",
            latency.clone(),
        );
        registry.register(
            "apiserver_registered_watchers",
            "Watches currently open",
            watches.clone(),
        );
        registry.register(
            "apiserver_storage_commit_duration_seconds",
            "Store write latency (durable commit included)",
            commit.clone(),
        );
        registry.register(
            "apiserver_storage_decode_errors",
            "Stored objects that could not be decoded, by resource (skipped by lists and watches)",
            DECODE_ERRORS.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            watches,
            commit,
        }
    }
}

impl Metrics {
    /// Counts one finished request.
    pub fn request(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        subresource: &str,
        code: u16,
        took: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                group: group.to_owned(),
                resource: resource.to_owned(),
                subresource: subresource.to_owned(),
                code: code.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    fn watch_labels(info: &ResourceInfo) -> WatchLabels {
        WatchLabels {
            group: info.group.clone(),
            resource: info.plural.clone(),
        }
    }

    /// A watch stream started.
    pub fn watch_started(&self, info: &ResourceInfo) {
        self.watches.get_or_create(&Self::watch_labels(info)).inc();
    }

    /// A watch stream ended.
    pub fn watch_ended(&self, info: &ResourceInfo) {
        self.watches.get_or_create(&Self::watch_labels(info)).dec();
    }

    /// One store write took `took`.
    pub fn commit(&self, took: Duration) {
        self.commit.observe(took.as_secs_f64());
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_verb_resource_and_code() {
        let m = Metrics::default();
        m.request(
            "PATCH",
            "kubevirt.io",
            "virtualmachineinstances",
            "status",
            200,
            Duration::from_millis(2),
        );
        m.request(
            "PATCH",
            "kubevirt.io",
            "virtualmachineinstances",
            "status",
            200,
            Duration::from_millis(2),
        );
        let text = m.render();
        assert!(text.contains(
            "apiserver_request_total{verb=\"PATCH\",group=\"kubevirt.io\",resource=\"virtualmachineinstances\",subresource=\"status\",code=\"200\"} 2"
        ), "{text}");
    }
}
