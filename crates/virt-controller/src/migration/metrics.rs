//! The migration families virt-controller serves, counted from the migration cache at each
//! scrape as upstream's migration stats collector counts them:
//!
//! - `kubevirt_vmi_migrations_in_{pending,scheduling,unset,running}_phase`: the migrations
//!   per phase group (`running` takes every phase from `Scheduled` to `Running`, the
//!   receiver's waits included);
//! - `kubevirt_vmi_migration_succeeded` / `kubevirt_vmi_migration_failed` (`vmi`, `vmim`,
//!   `namespace`): 1 for each migration that ended so.
//!
//! Not served: the phase-transition histogram
//! (`kubevirt_vmi_migration_phase_transition_time_from_creation_seconds`).

use kubevirt_api::v1::{MigrationPhase, VirtualMachineInstanceMigration};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::runtime::informer::InformerHandle;
use crate::runtime::metrics::ScrapeCollector;

/// The counts of one scrape.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MigrationStats {
    /// `Pending`.
    pub pending: i64,
    /// `Scheduling`.
    pub scheduling: i64,
    /// No phase yet.
    pub unset: i64,
    /// `Scheduled` … `Running`.
    pub running: i64,
    /// `(vmi, vmim, namespace)` of the succeeded migrations.
    pub succeeded: Vec<[String; 3]>,
    /// `(vmi, vmim, namespace)` of the failed migrations.
    pub failed: Vec<[String; 3]>,
}

/// Counts `migrations` as upstream's `reportMigrationStats` does.
pub fn migration_stats<'a>(
    migrations: impl IntoIterator<Item = &'a VirtualMachineInstanceMigration>,
) -> MigrationStats {
    let mut stats = MigrationStats::default();
    for m in migrations {
        let labels = || {
            [
                m.spec.vmi_name.clone().unwrap_or_default(),
                m.metadata.name.clone().unwrap_or_default(),
                m.metadata.namespace.clone().unwrap_or_default(),
            ]
        };
        match m.status.as_ref().and_then(|s| s.phase.as_ref()) {
            None | Some(MigrationPhase::Unset) => stats.unset += 1,
            Some(MigrationPhase::Pending) => stats.pending += 1,
            Some(MigrationPhase::Scheduling) => stats.scheduling += 1,
            Some(MigrationPhase::Succeeded) => stats.succeeded.push(labels()),
            Some(MigrationPhase::Failed) => stats.failed.push(labels()),
            Some(_) => stats.running += 1,
        }
    }
    stats
}

/// Collects from the migration controller's cache.
pub struct MigrationCollector {
    migrations: InformerHandle<VirtualMachineInstanceMigration>,
}

impl MigrationCollector {
    /// A collector over the migration cache.
    pub fn new(migrations: InformerHandle<VirtualMachineInstanceMigration>) -> Self {
        Self { migrations }
    }
}

impl std::fmt::Debug for MigrationCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrationCollector").finish_non_exhaustive()
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

fn ended(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    migrations: &[[String; 3]],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for [vmi, vmim, namespace] in migrations {
        let labels = [("vmi", vmi), ("vmim", vmim), ("namespace", namespace)];
        ConstGauge::new(1_i64).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl ScrapeCollector for MigrationCollector {
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let all = self.migrations.store().state();
        let stats = migration_stats(all.iter().map(AsRef::as_ref));
        gauge(
            encoder,
            "kubevirt_vmi_migrations_in_pending_phase",
            "Number of current pending migrations.",
            stats.pending,
        )?;
        gauge(
            encoder,
            "kubevirt_vmi_migrations_in_scheduling_phase",
            "Number of current scheduling migrations.",
            stats.scheduling,
        )?;
        gauge(
            encoder,
            "kubevirt_vmi_migrations_in_unset_phase",
            "Number of current unset migrations. These are pending items the virt-controller hasn't processed yet from the queue.",
            stats.unset,
        )?;
        gauge(
            encoder,
            "kubevirt_vmi_migrations_in_running_phase",
            "Number of current running migrations.",
            stats.running,
        )?;
        ended(
            encoder,
            "kubevirt_vmi_migration_succeeded",
            "Indicates if the VMI migration succeeded.",
            &stats.succeeded,
        )?;
        ended(
            encoder,
            "kubevirt_vmi_migration_failed",
            "Indicates if the VMI migration failed.",
            &stats.failed,
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn migration(name: &str, phase: Option<&str>) -> VirtualMachineInstanceMigration {
        let mut m = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"vmiName": format!("vmi-{name}")},
        });
        if let Some(phase) = phase {
            m["status"] = json!({"phase": phase});
        }
        serde_json::from_value(m).expect("migration")
    }

    #[test]
    fn migrations_are_counted_per_phase_group_and_the_ended_ones_named() {
        let all = [
            migration("a", None),
            migration("b", Some("Pending")),
            migration("c", Some("Scheduling")),
            migration("d", Some("Scheduled")),
            migration("e", Some("PreparingTarget")),
            migration("f", Some("Running")),
            migration("g", Some("WaitingForSync")),
            migration("h", Some("Succeeded")),
            migration("i", Some("Failed")),
        ];
        let stats = migration_stats(&all);
        let name = |n: &str| [format!("vmi-{n}"), n.to_owned(), "ns".to_owned()];
        assert_eq!(
            stats,
            MigrationStats {
                pending: 1,
                scheduling: 1,
                unset: 1,
                running: 4,
                succeeded: vec![name("h")],
                failed: vec![name("i")],
            }
        );
    }
}
