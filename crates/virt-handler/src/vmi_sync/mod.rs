//! Drives the VMIs on this node through their launchers: Scheduled → Running →
//! Succeeded/Failed.
//!
//! Data flow: a reflector watches VMIs labelled `kubevirt.io/nodeName=<node>` (its store is
//! shared with the REST server). Each VMI gets
//! one worker task ([`worker`]) fed the latest object through a `watch` channel. The worker
//! finds the launcher pod in `status.activePods`, connects to
//! `<pods dir>/<pod uid>/launcher.sock` ([`link`]), learns the domain state from the
//! launcher's first event, makes the VMI's images present ([`pull`]: pulled from their
//! registries when missing, with kubelet's back-off), sends `sync` with the spec built by
//! [`crate::launcher_spec::build_spec`] when the domain has not started, and turns every
//! domain event into a VMI status patch ([`status`]). A VMI with a `deletionTimestamp` gets one
//! `shutdown` with its grace period (ACPI power-down; the launcher kills QEMU afterwards).
//!
//! # Guarantees
//! - A running domain is never restarted: `sync` is only sent when the launcher reports
//!   `Pending`, so a restarted handler re-attaches by reconnecting.
//! - Status patches test the phase they expect, so they never overwrite a concurrent
//!   transition (the worker recomputes on the next VMI update).
//! - A VMI's spec goes only to its own launcher: `activePods` keys must be canonical pod
//!   UIDs (they become a path below the pods directory) and the launcher found there must
//!   report the VMI's UID in its hello; otherwise the VMI gets `Synchronized=False`.
//!
//! # Caveats
//! - "Launcher gone" is decided from the socket: connecting fails while the VMI is Running,
//!   or its socket exists and refuses connections (the launcher exited). A launcher that is slow to
//!   create its socket keeps a Scheduled VMI waiting.

pub mod hotplug;
pub mod link;
pub mod migration;
pub mod pull;
pub mod status;
pub mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kubevirt_api::cluster_config::ClusterConfigWatch;
use kubevirt_api::constants::NODE_NAME_LABEL;
use kubevirt_api::v1::{KubeVirt, VirtualMachineInstance};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use virt_launcher::accel::{AccelDecision, AccelMode, detect_accel};

use crate::images::ImageStore;

/// Settings of the VMI sync loop.
#[derive(Debug, Clone)]
pub struct VmiSyncConfig {
    /// This node's name.
    pub node_name: String,
    /// The kubelet's pod directory; a launcher's directory is its pod's `public` emptyDir
    /// there ([`worker::launcher_dir_on_host`]).
    pub kubelet_pods_dir: PathBuf,
    /// Where launchers see their directory (the `public` volume's `mountPath`,
    /// [`kubevirt_api::constants::LAUNCHER_DIR`]); `None` when they see it at its node path
    /// (launchers run without a mount namespace, as in tests).
    pub launcher_dir_in_pod: Option<PathBuf>,
    /// The local image store.
    pub images: ImageStore,
    /// Host disks must lie below this directory.
    pub host_disk_dir: PathBuf,
    /// Forces (`Some(true)`) or forbids (`Some(false)`) software emulation; `None` follows
    /// the KubeVirt CR's `developerConfiguration.useEmulation`, then host detection.
    pub use_emulation: Option<bool>,
    /// The KubeVirt CR's settings, as the shared CR watch keeps them.
    pub cluster: ClusterConfigWatch<ClusterSettings>,
    /// The handler's own address (its pod IP), where migration targets listen; `None`:
    /// loopback ([`migration::announced_ip`]).
    pub migration_ip: Option<std::net::IpAddr>,
    /// The TLS of the migration proxies (the handler's mounted certificates); `None`: the
    /// handlers talk in the clear, as with `disableTLS`.
    pub migration_tls: Option<crate::migration_proxy::MigrationTls>,
}

/// What the handler needs from the `KubeVirt` CR, kept current by
/// [`kubevirt_api::cluster_config::subscribe`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterSettings {
    /// `spec.configuration.developerConfiguration.useEmulation`.
    pub use_emulation: bool,
}

impl ClusterSettings {
    /// The settings a KubeVirt CR states (defaults when there is none).
    pub fn from_kubevirt(kv: Option<&KubeVirt>) -> ClusterSettings {
        let use_emulation = kv
            .and_then(|kv| kv.spec.configuration.as_ref())
            .and_then(|c| c.developer_configuration.as_ref())
            .and_then(|d| d.use_emulation)
            == Some(true);
        ClusterSettings { use_emulation }
    }
}

/// Chooses the accelerator: TCG when emulation is forced by the handler's configuration or
/// by the KubeVirt CR, else host detection (KVM only where it really works).
pub fn choose_accel(use_emulation: Option<bool>, cluster: &ClusterSettings) -> AccelDecision {
    if use_emulation.unwrap_or(cluster.use_emulation) {
        let mut decision = detect_accel(AccelMode::Tcg);
        decision.reason =
            "software emulation requested by developerConfiguration.useEmulation".into();
        decision
    } else {
        detect_accel(AccelMode::Auto)
    }
}

/// Runs the migration targets of this node until `cancel` fires: a watch on VMIs labelled
/// `kubevirt.io/migrationTargetNodeName=<node>` starts one target worker per migration that
/// targets this node ([`migration::target_wanted`]), fed the VMI's updates.
pub async fn run_targets(
    client: kube::Client,
    config: Arc<VmiSyncConfig>,
    cancel: CancellationToken,
) {
    let api: Api<VirtualMachineInstance> = Api::all(client.clone());
    let selector = format!(
        "{}={}",
        kubevirt_api::constants::MIGRATION_TARGET_NODE_NAME_LABEL,
        config.node_name
    );
    let (store, writer) = reflector::store();
    let mut events = watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .reflect(writer)
        .boxed();
    // Keyed by migration UID: a migration is prepared once.
    let mut workers: BTreeMap<String, watch::Sender<Arc<VirtualMachineInstance>>> = BTreeMap::new();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => tracing::warn!(error = %e, "migration target VMI watch failed; retrying"),
                Some(Ok(_)) => {}
            },
        }
        while let Some(Some(_)) = futures::FutureExt::now_or_never(events.next()) {}
        match futures::FutureExt::now_or_never(store.wait_until_ready()) {
            None => continue,
            Some(Err(_)) => return,
            Some(Ok(())) => {}
        }
        for vmi in store.state() {
            let Some(uid) = migration::state(&vmi).and_then(|s| s.migration_uid.clone()) else {
                continue;
            };
            match workers.get(&uid) {
                Some(tx) => {
                    tx.send_if_modified(|current| {
                        let changed =
                            current.metadata.resource_version != vmi.metadata.resource_version;
                        if changed {
                            *current = Arc::clone(&vmi);
                        }
                        changed
                    });
                }
                None if migration::target_wanted(&vmi, &config.node_name) => {
                    tracing::info!(vmi = ?vmi.metadata.name, migration = %uid, "preparing the migration target");
                    let (tx, rx) = watch::channel(Arc::clone(&vmi));
                    workers.insert(uid, tx);
                    tokio::spawn(worker::run_target(
                        client.clone(),
                        Arc::clone(&config),
                        rx,
                        cancel.child_token(),
                    ));
                }
                None => {}
            }
        }
        // Finished workers are kept (closed) so that their migration is not prepared again.
    }
}

/// Runs the VMI sync loop until `cancel` fires. `vmis` receives this node's VMIs (those
/// labelled `kubevirt.io/nodeName=<node>`); its readers (the REST server) share the cache.
pub async fn run(
    client: kube::Client,
    config: VmiSyncConfig,
    vmis: reflector::store::Writer<VirtualMachineInstance>,
    cancel: CancellationToken,
) {
    let config = Arc::new(config);
    tokio::spawn(run_targets(
        client.clone(),
        Arc::clone(&config),
        cancel.child_token(),
    ));
    let api: Api<VirtualMachineInstance> = Api::all(client.clone());
    let selector = format!("{NODE_NAME_LABEL}={}", config.node_name);
    let (store, writer) = (vmis.as_reader(), vmis);
    let mut events = watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .reflect(writer)
        .boxed();
    let mut workers: BTreeMap<String, watch::Sender<Arc<VirtualMachineInstance>>> = BTreeMap::new();
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => match event {
                None => return,
                Some(Err(e)) => tracing::warn!(error = %e, "VMI watch failed; retrying"),
                Some(Ok(e)) => tracing::trace!(event = ?std::mem::discriminant(&e), "VMI watch event"),
            },
        }
        while let Some(Some(_)) = futures::FutureExt::now_or_never(events.next()) {}
        // The watcher yields `Init` before its list completes and only progresses while
        // polled: never block on readiness here, wait for the next event instead.
        match futures::FutureExt::now_or_never(store.wait_until_ready()) {
            None => continue,
            Some(Err(_)) => return,
            Some(Ok(())) => {}
        }
        let vmis = store.state();
        let mut seen = std::collections::BTreeSet::new();
        for vmi in vmis {
            let Some(uid) = vmi.metadata.uid.clone() else {
                continue;
            };
            seen.insert(uid.clone());
            match workers.get(&uid) {
                Some(tx) if !tx.is_closed() => {
                    tx.send_if_modified(|current| {
                        let changed =
                            current.metadata.resource_version != vmi.metadata.resource_version;
                        if changed {
                            *current = Arc::clone(&vmi);
                        }
                        changed
                    });
                }
                _ => {
                    if worker::is_final(&vmi) {
                        continue;
                    }
                    let (tx, rx) = watch::channel(Arc::clone(&vmi));
                    workers.insert(uid, tx);
                    tokio::spawn(worker::run(
                        client.clone(),
                        Arc::clone(&config),
                        rx,
                        cancel.child_token(),
                    ));
                }
            }
        }
        // Dropping the sender of a VMI that left the store ends its worker.
        workers.retain(|uid, tx| seen.contains(uid) && !tx.is_closed());
    }
}
