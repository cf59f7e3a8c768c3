//! virt-controller as an application: leader election, the KubeVirt CR's settings, and the
//! VM, VMI, node, evacuation, migration and workload-update controllers — what `kubevirt-rs controller` and `kubevirt-rs server` run.
//!
//! Data flow: the shared CR watch ([`kubevirt_api::cluster_config::subscribe`]) publishes the
//! CR's settings ([`ClusterSettings`]); the effective
//! label/annotation sync patterns (command-line flags overlaid by
//! `spec.customizeComponents.flags.controller`) go to both controllers through one
//! `watch` channel, so a `kubectl patch kubevirt` reconfigures them in place. The controllers
//! run only while this replica holds the `virt-controller` Lease.
//!
//! # Caveats
//! Losing the lease stops the controllers and ends [`run_controller`] with an error, as
//! upstream's virt-controller exits; the caller (a Deployment, or the embedded server's
//! supervisor) starts it again.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::evacuation::run_evacuation_controller;
use crate::kubevirt_config::{ClusterSettings, effective_flag};
use crate::metadata_sync::{MetadataSyncPatterns, SyncPatterns};
use crate::migration::run_migration_controller;
use crate::node::{NodeControllerConfig, run_node_controller};
use crate::runtime::leader::{LeaderElectionConfig, LeaderElector};
use crate::runtime::metrics::Metrics;
use crate::vm::{VmControllerConfig, run_vm_controller};
use crate::vmi::template::LauncherPodConfig;
use crate::vmi::{VmiControllerConfig, run_vmi_controller};
use crate::workload_updater::run_workload_updater;

/// Flag names shared by the command line and the KubeVirt CR.
pub const LABELS_SYNC_FLAG: &str = "additional-launcher-labels-sync";
pub const ANNOTATIONS_SYNC_FLAG: &str = "additional-launcher-annotations-sync";

/// Workers of the VM controller. Upstream runs 3 goroutines (its `defaultControllerThreads`);
/// a sync spends nearly all its time waiting for the API server (the VMI patch goes through
/// virt-api's admission webhooks), and a waiting worker here is a parked task, not a thread.
/// With 3, a template change on 100 VMs reached the last VMI after ~0.7 s (measured, see
/// docs/benchmarks.md); the VMI controller's 10 is upstream's too.
const VM_CONTROLLER_WORKERS: usize = 10;

/// How virt-controller is set up.
#[derive(Clone, Debug)]
pub struct ControllerAppConfig {
    /// Namespace of the KubeVirt CR and the leader Lease.
    pub namespace: String,
    /// `--additional-launcher-labels-sync` (comma-separated).
    pub labels_sync: String,
    /// `--additional-launcher-annotations-sync` (comma-separated).
    pub annotations_sync: String,
    /// How launcher pods are built.
    pub launcher: LauncherPodConfig,
    /// Leader election settings.
    pub leader: LeaderElectionConfig,
    /// The node controller's settings (`--node-heartbeat-timeout`).
    pub node: NodeControllerConfig,
}

/// Errors that end the controller application.
#[derive(Debug, thiserror::Error)]
pub enum ControllerAppError {
    /// Leadership was lost (or could not be kept); the controllers were stopped.
    #[error("leader election")]
    LeaderElection(#[source] crate::runtime::leader::LeaderElectionError),
}

/// The sync patterns in effect: the CR's flag values where set, else the command line's.
/// Ignored patterns (a bare `*`) are logged.
pub fn effective_sync_config(
    config: &ControllerAppConfig,
    settings: &ClusterSettings,
) -> MetadataSyncPatterns {
    let parse = |name: &str, cli: &str| {
        let (patterns, warnings) =
            SyncPatterns::parse_flag(effective_flag(&settings.controller_flags, name, cli));
        for w in warnings {
            warn!(flag = name, "{w}");
        }
        patterns
    };
    MetadataSyncPatterns {
        labels: parse(LABELS_SYNC_FLAG, &config.labels_sync),
        annotations: parse(ANNOTATIONS_SYNC_FLAG, &config.annotations_sync),
    }
}

/// Runs virt-controller until `cancel` fires or leadership is lost.
pub async fn run_controller(
    client: kube::Client,
    config: ControllerAppConfig,
    metrics: &Metrics,
    cancel: CancellationToken,
) -> Result<(), ControllerAppError> {
    // The watch ends once the last receiver (the republisher's, the VMI controller's) is gone.
    let settings = kubevirt_api::cluster_config::subscribe(
        kube::Api::namespaced(client.clone(), &config.namespace),
        ClusterSettings::from_kubevirt,
    );
    let mut settings_rx = settings.receiver();
    let cluster_rx = settings.receiver();
    drop(settings);
    let (sync_tx, sync_rx) =
        watch::channel(effective_sync_config(&config, &ClusterSettings::default()));
    let republish = tokio::spawn({
        let config = config.clone();
        async move {
            while settings_rx.changed().await.is_ok() {
                let next = effective_sync_config(&config, &settings_rx.borrow_and_update());
                sync_tx.send_if_modified(|old| {
                    let changed = *old != next;
                    *old = next;
                    changed
                });
            }
        }
    });

    let (elector, status) = LeaderElector::new(client.clone(), config.leader.clone());
    let election_cancel = cancel.child_token();
    let election = tokio::spawn(elector.run(election_cancel.clone()));
    metrics.set_ready(true);
    let result = tokio::select! {
        _ = cancel.cancelled() => Ok(()),
        acquired = status.acquired() => match acquired {
            Err(_) => Ok(()),
            Ok(()) => {
                info!("acquired the virt-controller lease; starting controllers");
                metrics.set_leading(true);
                let controllers = cancel.child_token();
                let vm = run_vm_controller(client.clone(), VmControllerConfig { sync: sync_rx.clone(), workers: VM_CONTROLLER_WORKERS, cluster: cluster_rx.clone() }, metrics, controllers.clone());
                let vmi_config = VmiControllerConfig {
                    cluster: cluster_rx.clone(),
                    ..VmiControllerConfig::new(config.launcher.clone(), sync_rx.clone())
                };
                let vmi = run_vmi_controller(client.clone(), vmi_config, metrics, controllers.clone());
                let node = run_node_controller(client.clone(), config.node, metrics, controllers.clone());
                let evacuation = run_evacuation_controller(client.clone(), cluster_rx.clone(), metrics, controllers.clone());
                let migration = run_migration_controller(client.clone(), config.launcher.clone(), cluster_rx.clone(), metrics, controllers.clone());
                let workload_updater = run_workload_updater(client.clone(), &config.namespace, config.launcher.launcher_image.clone(), cluster_rx.clone(), metrics, controllers.clone());
                let tsc_settings = cluster_rx.clone();
                let topology = crate::topology::run_node_topology_updater(client.clone(), move || tsc_settings.borrow().minimum_cluster_tsc_frequency, controllers.clone());
                tokio::select! {
                    _ = async { tokio::join!(vm, vmi, node, evacuation, migration, workload_updater, topology) } => Ok(()),
                    _ = status.lost() => {
                        warn!("lost the virt-controller lease; stopping controllers");
                        controllers.cancel();
                        Ok(())
                    }
                }
            }
        },
    };
    metrics.set_leading(false);
    metrics.set_ready(false);
    election_cancel.cancel();
    let election_result = election.await;
    republish.abort();
    match election_result {
        Ok(Err(e)) if !cancel.is_cancelled() => Err(ControllerAppError::LeaderElection(e)),
        _ => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ControllerAppConfig {
        ControllerAppConfig {
            namespace: "kubevirt".into(),
            labels_sync: "cli.example.com/*".into(),
            annotations_sync: String::new(),
            launcher: LauncherPodConfig::default(),
            leader: LeaderElectionConfig::default(),
            node: NodeControllerConfig::default(),
        }
    }

    #[test]
    fn the_crs_flags_override_the_command_line() {
        let mut settings = ClusterSettings::default();
        let cli = effective_sync_config(&config(), &settings);
        assert!(cli.labels.matches("cli.example.com/a"));
        settings
            .controller_flags
            .insert(LABELS_SYNC_FLAG.into(), "ops.example.com/*".into());
        let cr = effective_sync_config(&config(), &settings);
        assert!(cr.labels.matches("ops.example.com/a"));
        assert!(!cr.labels.matches("cli.example.com/a"));
        assert!(cr.annotations.is_empty());
    }
}
