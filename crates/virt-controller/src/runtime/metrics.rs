//! Per-controller Prometheus metrics.
//!
//! One [`Metrics`] value holds the metric families for every controller of the process and
//! is registered once with a [`Registry`] by [`Metrics::register`]. Each controller takes its
//! own handle with [`Metrics::controller`]; the handle resolves the `name` label once, so the
//! hot paths (queue adds, reconcile timings) touch only atomics.
//!
//! The work-queue names follow the ones KubeVirt exposes for client-go's work queues
//! (`kubevirt_workqueue_*`, label `name`); reconcile errors are our own family, labelled by
//! the controller name and the error's reason (see
//! [`ControllerError::reason`](super::controller::ControllerError::reason)).

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set of the per-controller families.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

/// Label set of the error family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    name: String,
    reason: String,
}

type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// Buckets of the reconcile duration histogram: 1 ms … about 65 s, doubling.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Metric families shared by all controllers of one process.
///
/// Cloning yields another handle to the same families.
#[derive(Clone, Debug)]
pub struct Metrics {
    depth: Family<NameLabel, Gauge>,
    adds: Family<NameLabel, Counter>,
    retries: Family<NameLabel, Counter>,
    reconcile_duration: HistogramFamily<NameLabel>,
    errors: Family<ErrorLabels, Counter>,
    leading: Gauge,
    ready: Gauge,
    /// Families computed at scrape time (from informer caches), added as controllers start.
    collectors: Arc<Mutex<Vec<Box<dyn ScrapeCollector>>>>,
}

/// Metric families computed at each scrape, from what a controller has in its caches.
pub trait ScrapeCollector: std::fmt::Debug + Send + Sync + 'static {
    /// Encodes the families (descriptor, then one sample per label set).
    ///
    /// # Errors
    /// As the encoder's.
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error>;
}

/// Encodes, on each scrape, the collectors added to [`Metrics`] so far.
#[derive(Debug)]
struct Collectors(Arc<Mutex<Vec<Box<dyn ScrapeCollector>>>>);

impl Collector for Collectors {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for collector in self.0.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            collector.encode(&mut encoder)?;
        }
        Ok(())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty families; nothing is exported until [`Metrics::register`] is called.
    pub fn new() -> Self {
        Self {
            depth: Family::default(),
            adds: Family::default(),
            retries: Family::default(),
            reconcile_duration: Family::new_with_constructor(duration_histogram),
            errors: Family::default(),
            leading: Gauge::default(),
            ready: Gauge::default(),
            collectors: Arc::default(),
        }
    }

    /// Adds a collector whose families are computed at each scrape (a controller adds one
    /// over its informer cache once it runs); registries made earlier include it too.
    pub fn add_collector(&self, collector: impl ScrapeCollector) {
        self.collectors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(collector));
    }

    /// Upstream's `kubevirt_virt_controller_leading_status`: whether this process holds the
    /// virt-controller Lease and runs the controllers.
    pub fn set_leading(&self, leading: bool) {
        self.leading.set(i64::from(leading));
    }

    /// Whether this process leads (see [`Metrics::set_leading`]).
    pub fn is_leading(&self) -> bool {
        self.leading.get() == 1
    }

    /// Upstream's `kubevirt_virt_controller_ready_status`: whether this process is ready to
    /// take the lead (it runs the leader election).
    pub fn set_ready(&self, ready: bool) {
        self.ready.set(i64::from(ready));
    }

    /// Registers all families with `registry`. Call once per registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kubevirt_workqueue_depth",
            "Current depth of the work queue (keys ready to be processed)",
            self.depth.clone(),
        );
        registry.register(
            "kubevirt_workqueue_adds",
            "Keys added to the work queue",
            self.adds.clone(),
        );
        registry.register(
            "kubevirt_workqueue_retries",
            "Keys re-queued with rate limiting after a failed reconcile",
            self.retries.clone(),
        );
        registry.register(
            "kubevirt_workqueue_work_duration_seconds",
            "Time one reconcile of a key takes",
            self.reconcile_duration.clone(),
        );
        registry.register(
            "kubevirt_controller_reconcile_errors",
            "Failed reconciles by reason",
            self.errors.clone(),
        );
        registry.register(
            "kubevirt_virt_controller_leading_status",
            "Indication for an operating virt-controller.",
            self.leading.clone(),
        );
        registry.register(
            "kubevirt_virt_controller_ready_status",
            "Indication for a virt-controller that is ready to take the lead.",
            self.ready.clone(),
        );
        registry.register_collector(Box::new(Collectors(Arc::clone(&self.collectors))));
    }

    /// The handle of controller `name` (for example `virtualmachine`).
    pub fn controller(&self, name: &str) -> ControllerMetrics {
        let label = NameLabel {
            name: name.to_owned(),
        };
        ControllerMetrics {
            name: name.to_owned(),
            depth: self.depth.get_or_create_owned(&label),
            adds: self.adds.get_or_create_owned(&label),
            retries: self.retries.get_or_create_owned(&label),
            reconcile_duration: self.reconcile_duration.get_or_create_owned(&label),
            errors: self.errors.clone(),
        }
    }
}

/// The metrics of one controller: its queue and its reconciles.
///
/// Cheap to clone; every clone updates the same series.
#[derive(Clone, Debug)]
pub struct ControllerMetrics {
    name: String,
    depth: Gauge,
    adds: Counter,
    retries: Counter,
    reconcile_duration: Histogram,
    errors: Family<ErrorLabels, Counter>,
}

impl ControllerMetrics {
    /// A handle not registered anywhere (for queues whose metrics nobody scrapes).
    pub fn unregistered(name: &str) -> Self {
        Metrics::new().controller(name)
    }

    /// The controller name used as the `name` label.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets the queue depth gauge.
    pub fn set_depth(&self, depth: usize) {
        self.depth.set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// Counts one key newly added to the queue.
    pub fn inc_adds(&self) {
        self.adds.inc();
    }

    /// Counts one rate-limited re-queue.
    pub fn inc_retries(&self) {
        self.retries.inc();
    }

    /// Records the duration of one reconcile.
    pub fn observe_reconcile(&self, seconds: f64) {
        self.reconcile_duration.observe(seconds);
    }

    /// Counts one failed reconcile with `reason`.
    pub fn inc_error(&self, reason: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                name: self.name.clone(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Current value of the depth gauge.
    pub fn depth(&self) -> i64 {
        self.depth.get()
    }

    /// Current value of the adds counter.
    pub fn adds(&self) -> u64 {
        self.adds.get()
    }

    /// Current value of the retries counter.
    pub fn retries(&self) -> u64 {
        self.retries.get()
    }

    /// Number of reconciles recorded in the duration histogram.
    #[cfg(test)]
    pub(crate) fn reconciles(&self) -> u64 {
        self.reconcile_duration.count()
    }

    /// Failed reconciles counted with `reason`.
    pub fn errors(&self, reason: &str) -> u64 {
        self.errors
            .get(&ErrorLabels {
                name: self.name.clone(),
                reason: reason.to_owned(),
            })
            .map_or(0, |c| c.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    fn exposition(metrics: &Metrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        encode(&mut out, &registry).expect("encoding into a String cannot fail");
        out
    }

    #[test]
    fn registered_metrics_are_exported_with_the_controller_name_label() {
        let metrics = Metrics::new();
        let vm = metrics.controller("virtualmachine");
        vm.set_depth(3);
        vm.inc_adds();
        vm.inc_adds();
        vm.inc_retries();
        vm.observe_reconcile(0.004);
        vm.inc_error("FailedCreate");
        assert_eq!(vm.reconciles(), 1);

        let text = exposition(&metrics);
        assert!(text.contains("kubevirt_workqueue_depth{name=\"virtualmachine\"} 3"));
        assert!(text.contains("kubevirt_workqueue_adds_total{name=\"virtualmachine\"} 2"));
        assert!(text.contains("kubevirt_workqueue_retries_total{name=\"virtualmachine\"} 1"));
        assert!(
            text.contains(
                "kubevirt_workqueue_work_duration_seconds_count{name=\"virtualmachine\"} 1"
            )
        );
        assert!(text.contains(
            "kubevirt_controller_reconcile_errors_total{name=\"virtualmachine\",reason=\"FailedCreate\"} 1"
        ));
    }

    #[test]
    fn two_controllers_keep_separate_series() {
        let metrics = Metrics::new();
        let vm = metrics.controller("virtualmachine");
        let vmi = metrics.controller("virtualmachineinstance");
        vm.inc_adds();
        vmi.inc_error("FailedDelete");
        vmi.inc_error("FailedDelete");

        assert_eq!(vm.adds(), 1);
        assert_eq!(vmi.adds(), 0);
        assert_eq!(vm.errors("FailedDelete"), 0);
        assert_eq!(vmi.errors("FailedDelete"), 2);
        // A second handle for the same name shares the series.
        assert_eq!(metrics.controller("virtualmachine").adds(), 1);
    }
}
