//! virt-handler's metrics port (upstream's 8443, container port `metrics`): `/metrics` with
//! the per-VMI domain families upstream's handler serves, read from each launcher of this
//! node at scrape time ([`Command::DomainStats`]), and `/healthz`.
//!
//! Families (names, types and labels as upstream's; every sample carries `node`,
//! `namespace`, `name` and one `kubernetes_vmi_label_<key>` per VMI label, the key's
//! characters outside `[a-zA-Z0-9_]` turned into `_`):
//! `kubevirt_vmi_cpu_usage_seconds_total` (with `_user_`/`_system_`),
//! `kubevirt_vmi_vcpu_seconds_total` (`id`, `state`), `kubevirt_vmi_vcpu_delay_seconds_total`
//! (`id`), `kubevirt_vmi_memory_resident_bytes`, `kubevirt_vmi_memory_domain_bytes`,
//! `kubevirt_vmi_network_{receive,transmit}_{bytes,packets,errors,packets_dropped}_total`
//! (`interface`), `kubevirt_vmi_storage_*_total` (`drive`), and from the guest agent
//! `kubevirt_vmi_filesystem_{capacity,used}_bytes` (`disk_name`, `mount_point`,
//! `file_system_type`). Besides them:
//! `kubevirt_virt_handler_ready_status` (1 once the VMI cache has synced) and the REST client
//! families of the handler's client ([`kubevirt_api::rest_client_metrics`]). While a VMI
//! migrates away, its source handler also serves upstream's
//! `kubevirt_vmi_migration_data_bytes_total`, `_data_remaining_bytes`, `_data_processed_bytes`,
//! `_dirty_memory_rate_bytes` and `_memory_transfer_rate_bytes` (`node`, `namespace`, `name`),
//! read from `query-migrate` at the scrape.
//!
//! Differences from upstream: there is no balloon device, so the guest-reported memory
//! families (`_available_`, `_unused_`, `_usable_`, `_cached_`, swap, page faults) are not
//! served; `vcpu_wait` (a KVM statistic) is absent under TCG. A launcher that does not answer
//! within [`LAUNCHER_TIMEOUT`] leaves its VMI out of that scrape instead of holding it.
//!
//! Scrapes are plain HTTPS without client certificates (Prometheus scrapes with
//! `insecureSkipVerify`, as upstream's ServiceMonitor does), at most
//! [`MAX_CONCURRENT_SCRAPES`] at a time (upstream's `--max-metric-requests`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::runtime::reflector::Store;
use kubevirt_api::rest_client_metrics::RestClientMetrics;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstancePhase};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use virt_launcher::protocol::{Command, DomainStats, GuestFilesystem, MigrationStats};

use crate::rest::RestTls;
use crate::vmi_sync::worker::connect_active_launcher;

/// How long a scrape waits for one launcher's answer.
pub const LAUNCHER_TIMEOUT: Duration = Duration::from_secs(3);
/// Scrapes served at once; more are answered 503.
pub const MAX_CONCURRENT_SCRAPES: usize = 3;

#[derive(Clone)]
struct Serving {
    vmis: Store<VirtualMachineInstance>,
    node_name: String,
    kubelet_pods_dir: PathBuf,
    scrapes: Arc<tokio::sync::Semaphore>,
}

/// The routes of the metrics port over this node's VMIs (the VMI sync loop's cache).
pub fn router(
    vmis: Store<VirtualMachineInstance>,
    node_name: &str,
    kubelet_pods_dir: &std::path::Path,
) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Serving {
            vmis,
            node_name: node_name.to_owned(),
            kubelet_pods_dir: kubelet_pods_dir.to_owned(),
            scrapes: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_SCRAPES)),
        })
}

/// Serves [`router`] over HTTPS on `listen` with the REST server's certificate (`tls`), no
/// client certificate asked; returns the bound address and the serving task.
///
/// # Errors
/// When the TLS set-up or the bind fails.
pub async fn serve(
    listen: SocketAddr,
    tls: &RestTls,
    app: Router,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), kubevirt_tls::SpawnError> {
    crate::rest::serve_tls(listen, tls, app, false).await
}

async fn scrape(State(s): State<Serving>) -> Response {
    let Ok(_permit) = s.scrapes.try_acquire() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many concurrent scrapes",
        )
            .into_response();
    };
    let running: Vec<_> = s
        .vmis
        .state()
        .into_iter()
        .filter(|vmi| {
            vmi.status.as_ref().and_then(|st| st.phase.as_ref())
                == Some(&VirtualMachineInstancePhase::Running)
        })
        .collect();
    let reads = running.iter().map(|vmi| domain_stats(&s, vmi));
    let samples: Vec<(Labels, DomainStats)> = futures::future::join_all(reads)
        .await
        .into_iter()
        .zip(&running)
        .filter_map(|(stats, vmi)| Some((vmi_labels(vmi, &s.node_name), stats?)))
        .collect();
    let mut registry = prometheus_client::registry::Registry::default();
    let ready = prometheus_client::metrics::gauge::Gauge::<i64>::default();
    // Upstream is ready once its caches have synced and its controller runs.
    let synced =
        futures::FutureExt::now_or_never(s.vmis.wait_until_ready()).is_some_and(|r| r.is_ok());
    ready.set(i64::from(synced));
    registry.register(
        "kubevirt_virt_handler_ready_status",
        "Indication for a virt-handler that is ready to serve requests.",
        ready,
    );
    RestClientMetrics::shared().register(&mut registry);
    registry.register_collector(Box::new(Snapshot(samples)));
    kubevirt_api::exposition::openmetrics_response(&registry).into_response()
}

/// One VMI's stats from its launcher, `None` when it is not here, does not answer in time or
/// has none (fake QEMU).
async fn domain_stats(s: &Serving, vmi: &VirtualMachineInstance) -> Option<DomainStats> {
    let ask = async {
        let (_, mut client) = connect_active_launcher(vmi, &s.node_name, &s.kubelet_pods_dir)
            .await
            .ok()??;
        let value = client.request(Command::DomainStats).await.ok()?.ok()?;
        serde_json::from_value(value).ok()
    };
    tokio::time::timeout(LAUNCHER_TIMEOUT, ask).await.ok()?
}

type Labels = Vec<(String, String)>;

/// How many of [`vmi_labels`]' labels name the VMI (`node`, `namespace`, `name`, first).
const VMI_IDENTITY_LABELS: usize = 3;

/// Upstream's per-VMI label set: the VMI's identity, then its labels.
fn vmi_labels(vmi: &VirtualMachineInstance, node: &str) -> Labels {
    let mut labels = vec![
        ("node".to_owned(), node.to_owned()),
        (
            "namespace".to_owned(),
            vmi.metadata.namespace.clone().unwrap_or_default(),
        ),
        (
            "name".to_owned(),
            vmi.metadata.name.clone().unwrap_or_default(),
        ),
    ];
    for (key, value) in vmi.metadata.labels.iter().flatten() {
        let key: String = key
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        labels.push((format!("kubernetes_vmi_label_{key}"), value.clone()));
    }
    labels
}

/// `base` plus one more label.
fn with(base: &Labels, key: &str, value: impl Into<String>) -> Labels {
    let mut labels = base.clone();
    labels.push((key.to_owned(), value.into()));
    labels
}

/// The samples of one scrape.
#[derive(Debug)]
struct Snapshot(Vec<(Labels, DomainStats)>);

/// One family's samples.
enum Values {
    Counter(Vec<(Labels, f64)>),
    Gauge(Vec<(Labels, i64)>),
}

#[allow(clippy::cast_precision_loss)]
fn count(n: u64) -> f64 {
    n as f64
}

impl Values {
    /// A gauge family of byte counts and the like (saturating at `i64::MAX`).
    fn gauges(samples: impl IntoIterator<Item = (Labels, u64)>) -> Self {
        Values::Gauge(
            samples
                .into_iter()
                .map(|(l, v)| (l, i64::try_from(v).unwrap_or(i64::MAX)))
                .collect(),
        )
    }
}

impl Snapshot {
    /// A counter family with one sample per item of each VMI.
    fn counter<T>(
        &self,
        items: impl Fn(&DomainStats) -> Vec<(T, f64)>,
        labels: impl Fn(&Labels, &T) -> Labels,
    ) -> Values {
        Values::Counter(
            self.0
                .iter()
                .flat_map(|(base, stats)| {
                    items(stats)
                        .into_iter()
                        .map(|(item, v)| (labels(base, &item), v))
                        .collect::<Vec<_>>()
                })
                .collect(),
        )
    }

    /// A counter family with one sample per VMI.
    fn per_vmi(&self, value: impl Fn(&DomainStats) -> f64) -> Values {
        self.counter(|s| vec![((), value(s))], |base, ()| base.clone())
    }

    fn per_interface(&self, value: InterfaceValue) -> Values {
        self.counter(
            |s| {
                s.interfaces
                    .iter()
                    .map(|i| (i.name.clone(), count(value(i))))
                    .collect()
            },
            |base, name| with(base, "interface", name),
        )
    }

    fn per_drive(&self, value: DriveValue) -> Values {
        self.counter(
            |s| s.disks.iter().map(|d| (d.name.clone(), value(d))).collect(),
            |base, name| with(base, "drive", name),
        )
    }

    fn families(&self) -> Vec<(&'static str, &'static str, Values)> {
        let gauge = |value: fn(&DomainStats) -> u64| {
            Values::gauges(self.0.iter().map(|(l, s)| (l.clone(), value(s))))
        };
        let mut families = vec![
            (
                "kubevirt_vmi_cpu_usage_seconds",
                "Total CPU time spent in all modes (sum of both vcpu and hypervisor usage).",
                self.per_vmi(|s| s.cpu_user_seconds + s.cpu_system_seconds),
            ),
            (
                "kubevirt_vmi_cpu_user_usage_seconds",
                "Total CPU time spent in user mode.",
                self.per_vmi(|s| s.cpu_user_seconds),
            ),
            (
                "kubevirt_vmi_cpu_system_usage_seconds",
                "Total CPU time spent in system mode.",
                self.per_vmi(|s| s.cpu_system_seconds),
            ),
            (
                "kubevirt_vmi_vcpu_seconds",
                "Total amount of time spent in each state by each vcpu (cpu_time excluding hypervisor time). Where `id` is the vcpu identifier and `state` can be one of the following: [`OFFLINE`, `RUNNING`, `BLOCKED`].",
                self.counter(
                    |s| s.vcpus.iter().map(|v| (v.id, v.running_seconds)).collect(),
                    |base, id| with(&with(base, "id", id.to_string()), "state", "running"),
                ),
            ),
            (
                "kubevirt_vmi_vcpu_delay_seconds",
                "Amount of time spent by each vcpu waiting in the queue instead of running.",
                self.counter(
                    |s| s.vcpus.iter().map(|v| (v.id, v.delay_seconds)).collect(),
                    |base, id| with(base, "id", id.to_string()),
                ),
            ),
            (
                "kubevirt_vmi_memory_resident_bytes",
                "Resident set size of the process running the domain.",
                gauge(|s| s.memory_resident_bytes),
            ),
            (
                "kubevirt_vmi_memory_domain_bytes",
                "The amount of memory in bytes allocated to the domain. The `memory` value in domain xml file.",
                gauge(|s| s.memory_domain_bytes),
            ),
        ];
        families.extend(
            NETWORK_FAMILIES
                .iter()
                .map(|(name, help, value)| (*name, *help, self.per_interface(*value))),
        );
        families.extend(
            STORAGE_FAMILIES
                .iter()
                .map(|(name, help, value)| (*name, *help, self.per_drive(*value))),
        );
        families.extend(self.filesystem_families());
        families.extend(self.migration_families());
        families
    }

    /// The guest-agent-reported filesystems, one sample per filesystem (`disk_name`,
    /// `mount_point`, `file_system_type`, as upstream).
    fn filesystem_families(&self) -> Vec<(&'static str, &'static str, Values)> {
        let per_filesystem = |value: fn(&GuestFilesystem) -> u64| {
            Values::gauges(self.0.iter().flat_map(|(base, stats)| {
                stats.filesystems.iter().map(move |fs| {
                    let labels = with(
                        &with(
                            &with(base, "disk_name", &fs.disk_name),
                            "mount_point",
                            &fs.mount_point,
                        ),
                        "file_system_type",
                        &fs.file_system_type,
                    );
                    (labels, value(fs))
                })
            }))
        };
        vec![
            (
                "kubevirt_vmi_filesystem_capacity_bytes",
                "Total VM filesystem capacity in bytes.",
                per_filesystem(|fs| fs.total_bytes),
            ),
            (
                "kubevirt_vmi_filesystem_used_bytes",
                "Used VM filesystem capacity in bytes.",
                per_filesystem(|fs| fs.used_bytes),
            ),
        ]
    }

    /// The families of the outgoing migrations under way, labelled by node, namespace and
    /// name only (as upstream's migration collector).
    fn migration_families(&self) -> Vec<(&'static str, &'static str, Values)> {
        let samples = |value: fn(&MigrationStats) -> u64| {
            self.0
                .iter()
                .filter_map(|(base, s)| {
                    let m = s.migration.as_ref()?;
                    Some((
                        base.iter().take(VMI_IDENTITY_LABELS).cloned().collect(),
                        value(m),
                    ))
                })
                .collect::<Vec<(Labels, u64)>>()
        };
        let gauge = |value: fn(&MigrationStats) -> u64| Values::gauges(samples(value));
        vec![
            (
                "kubevirt_vmi_migration_data_bytes",
                "The total Guest OS data to be migrated to the new VM.",
                Values::Counter(
                    samples(|m| m.data_total_bytes)
                        .into_iter()
                        .map(|(l, v)| (l, count(v)))
                        .collect(),
                ),
            ),
            (
                "kubevirt_vmi_migration_data_remaining_bytes",
                "The remaining guest OS data to be migrated to the new VM.",
                gauge(|m| m.data_remaining_bytes),
            ),
            (
                "kubevirt_vmi_migration_data_processed_bytes",
                "The total Guest OS data processed and migrated to the new VM.",
                gauge(|m| m.data_processed_bytes),
            ),
            (
                "kubevirt_vmi_migration_dirty_memory_rate_bytes",
                "The rate of memory being dirty in the Guest OS.",
                gauge(|m| m.dirty_rate_bytes_per_second),
            ),
            (
                "kubevirt_vmi_migration_memory_transfer_rate_bytes",
                "The rate at which the memory is being transferred.",
                gauge(|m| m.transfer_rate_bytes_per_second),
            ),
        ]
    }
}

type InterfaceValue = fn(&virt_launcher::protocol::InterfaceStats) -> u64;

/// The per-interface families.
const NETWORK_FAMILIES: &[(&str, &str, InterfaceValue)] = &[
    (
        "kubevirt_vmi_network_receive_bytes",
        "Total network traffic received in bytes.",
        |i| i.receive_bytes,
    ),
    (
        "kubevirt_vmi_network_receive_packets",
        "Total network traffic received packets.",
        |i| i.receive_packets,
    ),
    (
        "kubevirt_vmi_network_receive_errors",
        "Total network received error packets.",
        |i| i.receive_errors,
    ),
    (
        "kubevirt_vmi_network_receive_packets_dropped",
        "The total number of rx packets dropped on vNIC interfaces.",
        |i| i.receive_dropped,
    ),
    (
        "kubevirt_vmi_network_transmit_bytes",
        "Total network traffic transmitted in bytes.",
        |i| i.transmit_bytes,
    ),
    (
        "kubevirt_vmi_network_transmit_packets",
        "Total network traffic transmitted packets.",
        |i| i.transmit_packets,
    ),
    (
        "kubevirt_vmi_network_transmit_errors",
        "Total network transmitted error packets.",
        |i| i.transmit_errors,
    ),
    (
        "kubevirt_vmi_network_transmit_packets_dropped",
        "The total number of tx packets dropped on vNIC interfaces.",
        |i| i.transmit_dropped,
    ),
];

type DriveValue = fn(&virt_launcher::protocol::DiskStats) -> f64;

/// The per-drive families.
const STORAGE_FAMILIES: &[(&str, &str, DriveValue)] = &[
    (
        "kubevirt_vmi_storage_iops_read",
        "Total number of I/O read operations.",
        |d| count(d.read_operations),
    ),
    (
        "kubevirt_vmi_storage_iops_write",
        "Total number of I/O write operations.",
        |d| count(d.write_operations),
    ),
    (
        "kubevirt_vmi_storage_read_traffic_bytes",
        "Total number of bytes read from storage.",
        |d| count(d.read_bytes),
    ),
    (
        "kubevirt_vmi_storage_write_traffic_bytes",
        "Total number of written bytes.",
        |d| count(d.write_bytes),
    ),
    (
        "kubevirt_vmi_storage_read_times_seconds",
        "Total time spent on read operations.",
        |d| d.read_seconds,
    ),
    (
        "kubevirt_vmi_storage_write_times_seconds",
        "Total time spent on write operations.",
        |d| d.write_seconds,
    ),
    (
        "kubevirt_vmi_storage_flush_requests",
        "Total storage flush requests.",
        |d| count(d.flush_operations),
    ),
    (
        "kubevirt_vmi_storage_flush_times_seconds",
        "Total time spent on cache flushing.",
        |d| d.flush_seconds,
    ),
];

impl prometheus_client::collector::Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, values) in self.families() {
            match values {
                Values::Counter(samples) => {
                    let mut family =
                        encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                    for (labels, value) in &samples {
                        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
                    }
                }
                Values::Gauge(samples) => {
                    let mut family =
                        encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
                    for (labels, value) in &samples {
                        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use virt_launcher::protocol::{DiskStats, InterfaceStats, VcpuStats};

    use super::*;

    fn vmi() -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "default",
                         "labels": {"kubevirt.io/domain": "vm1", "app": "web"}},
            "spec": {"domain": {"devices": {}}},
        }))
        .expect("VMI")
    }

    fn encoded(snapshot: Snapshot) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(snapshot));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn domain_stats_become_upstreams_families_with_the_vmi_labels() {
        let stats = DomainStats {
            cpu_user_seconds: 1.5,
            cpu_system_seconds: 0.5,
            vcpus: vec![VcpuStats {
                id: 0,
                running_seconds: 1.25,
                delay_seconds: 0.5,
            }],
            memory_resident_bytes: 200 << 20,
            memory_domain_bytes: 128 << 20,
            interfaces: vec![InterfaceStats {
                name: "default".into(),
                receive_bytes: 4096,
                transmit_packets: 3,
                ..InterfaceStats::default()
            }],
            disks: vec![DiskStats {
                name: "rootdisk".into(),
                write_bytes: 8192,
                read_seconds: 0.25,
                ..DiskStats::default()
            }],
            migration: None,
            filesystems: vec![GuestFilesystem {
                disk_name: "vda".into(),
                mount_point: "/mnt/scratch".into(),
                file_system_type: "vfat".into(),
                used_bytes: 4096,
                total_bytes: 16_000_000,
                disks: Vec::new(),
            }],
        };
        let text = encoded(Snapshot(vec![(vmi_labels(&vmi(), "node01"), stats)]));
        let vmi = r#"node="node01",namespace="default",name="vm1",kubernetes_vmi_label_app="web",kubernetes_vmi_label_kubevirt_io_domain="vm1""#;
        for sample in [
            format!("kubevirt_vmi_cpu_usage_seconds_total{{{vmi}}} 2.0"),
            format!(r#"kubevirt_vmi_vcpu_seconds_total{{{vmi},id="0",state="running"}} 1.25"#),
            format!(r#"kubevirt_vmi_vcpu_delay_seconds_total{{{vmi},id="0"}} 0.5"#),
            format!("kubevirt_vmi_memory_resident_bytes{{{vmi}}} 209715200"),
            format!("kubevirt_vmi_memory_domain_bytes{{{vmi}}} 134217728"),
            format!(
                r#"kubevirt_vmi_network_receive_bytes_total{{{vmi},interface="default"}} 4096.0"#
            ),
            format!(
                r#"kubevirt_vmi_network_transmit_packets_total{{{vmi},interface="default"}} 3.0"#
            ),
            format!(
                r#"kubevirt_vmi_storage_write_traffic_bytes_total{{{vmi},drive="rootdisk"}} 8192.0"#
            ),
            format!(
                r#"kubevirt_vmi_storage_read_times_seconds_total{{{vmi},drive="rootdisk"}} 0.25"#
            ),
            format!(
                r#"kubevirt_vmi_filesystem_capacity_bytes{{{vmi},disk_name="vda",mount_point="/mnt/scratch",file_system_type="vfat"}} 16000000"#
            ),
            format!(
                r#"kubevirt_vmi_filesystem_used_bytes{{{vmi},disk_name="vda",mount_point="/mnt/scratch",file_system_type="vfat"}} 4096"#
            ),
        ] {
            assert!(
                text.lines().any(|l| l == sample),
                "{sample} not in:\n{text}"
            );
        }
        assert!(
            text.contains("# TYPE kubevirt_vmi_storage_iops_read counter"),
            "{text}"
        );
        assert!(
            !text.contains("kubevirt_vmi_migration_data_remaining_bytes{"),
            "no migration, no sample: {text}"
        );
    }

    #[test]
    fn a_migration_under_way_is_served_with_the_node_namespace_and_name() {
        let stats = DomainStats {
            migration: Some(MigrationStats {
                data_total_bytes: 1000,
                data_remaining_bytes: 400,
                data_processed_bytes: 600,
                dirty_rate_bytes_per_second: 4096,
                transfer_rate_bytes_per_second: 125_000,
            }),
            ..DomainStats::default()
        };
        let text = encoded(Snapshot(vec![(vmi_labels(&vmi(), "node01"), stats)]));
        let vmi = r#"node="node01",namespace="default",name="vm1""#;
        for sample in [
            format!("kubevirt_vmi_migration_data_bytes_total{{{vmi}}} 1000.0"),
            format!("kubevirt_vmi_migration_data_remaining_bytes{{{vmi}}} 400"),
            format!("kubevirt_vmi_migration_data_processed_bytes{{{vmi}}} 600"),
            format!("kubevirt_vmi_migration_dirty_memory_rate_bytes{{{vmi}}} 4096"),
            format!("kubevirt_vmi_migration_memory_transfer_rate_bytes{{{vmi}}} 125000"),
        ] {
            assert!(
                text.lines().any(|l| l == sample),
                "{sample} not in:\n{text}"
            );
        }
    }
}
