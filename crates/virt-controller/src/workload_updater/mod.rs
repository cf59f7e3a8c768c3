//! The workload updater: after an upgrade, moves running VMIs off launchers of the previous
//! version (upstream's `pkg/virt-controller/watch/workload-updater`).
//!
//! Data flow: informers on the KubeVirt CR (this controller's namespace), VMIs and
//! VirtualMachineInstanceMigrations feed the queue `virt-controller-workload-update`, keyed by
//! the CR (`namespace/name`). A reconcile acts only once the installation is complete
//! (`status.phase` `Deployed` and `observedDeploymentID` equal to `targetDeploymentID`), then
//! [`plan`]s from the caches:
//!
//! - a running VMI is **outdated** when its `status.launcherContainerImageVersion` is known and
//!   differs from this controller's launcher image ([`is_outdated`]); their number goes to the
//!   CR's `status.outdatedVirtualMachineInstanceWorkloads` and to the gauge
//!   `kubevirt_vmi_number_of_outdated`;
//! - with `LiveMigrate` among `spec.workloadUpdateStrategy.workloadUpdateMethods`, each
//!   `LiveMigratable` outdated VMI that is not migrating gets a migration
//!   `kubevirt-workload-update-…` (annotation `kubevirt.io/workloadUpdateMigration`, priority
//!   `system-critical`), at most `parallelMigrationsPerCluster` minus the running migrations
//!   per pass, picked in random order so that one stuck VMI does not hold the others;
//! - with `Evict`, the others (all, without `LiveMigrate`) have their launcher pod evicted
//!   through the Eviction API, `batchEvictionSize` (10) every `batchEvictionInterval` (1m);
//! - a VMI that is no longer outdated but still has an unfinished workload-update migration
//!   whose target domain is not ready yet has that migration deleted.
//!
//! Events on the VMI as upstream's (`SuccessfulCreate` "Created Migration <name> for automated
//! workload update", `FailedCreate`, `SuccessfulEvict`, `FailedEvict`,
//! `SuccessfulChangeAbortion`, `FailedChangeAbortion`). While anything is left to do, the CR is
//! looked at again after [`RETRY`].
//!
//! # Differences from upstream
//! - CPU and memory hotplug happen in place here (the handler plugs vCPUs and memory over
//!   QMP), so VMIs with `HotVCPUChange`/`HotMemoryChange` need no migration from this loop, and
//!   no volume-update migrations exist.
//! - A VMI becoming or ceasing to be outdated also wakes the CR (upstream counts only on CR
//!   and migration changes and its periodic retry, so its count goes stale once the updates
//!   are done and a VMI is deleted).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{
    KubeVirt, KubeVirtPhase, MigrationPhase, MigrationPriority, VirtualMachineInstance,
    VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationSpec,
    VirtualMachineInstancePhase,
};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use rand::seq::SliceRandom;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::kubevirt_config::ClusterSettings;
use crate::runtime::controller::{Action, Controller, ControllerError, Reconciler, error_chain};
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::expectations::Expectations;
use crate::runtime::informer::{Change, Informer, InformerHandle};
use crate::runtime::metrics::{Metrics, ScrapeCollector};
use crate::runtime::queue::{RateLimiterConfig, WorkQueue};

/// Name of the queue (as upstream).
pub const QUEUE_NAME: &str = "virt-controller-workload-update";
/// The component its events are recorded as (as upstream).
pub const EVENT_COMPONENT: &str = "workload-update-controller";
/// The prefix of the migrations it creates.
pub const MIGRATION_GENERATE_NAME: &str = "kubevirt-workload-update-";
/// Upstream's default number of VMIs evicted per batch.
pub const DEFAULT_BATCH_EVICTION_SIZE: usize = 10;
/// Upstream's default time between two eviction batches.
pub const DEFAULT_BATCH_EVICTION_INTERVAL: Duration = Duration::from_secs(60);
/// When the CR is looked at again while work is left (upstream's throttle interval).
pub const RETRY: Duration = Duration::from_secs(5);

/// The CR's `spec.workloadUpdateStrategy`, with upstream's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpdateStrategy {
    /// `LiveMigrate` is listed.
    pub live_migrate: bool,
    /// `Evict` is listed.
    pub evict: bool,
    /// `batchEvictionSize`.
    pub batch_size: usize,
    /// `batchEvictionInterval`.
    pub batch_interval: Duration,
}

impl UpdateStrategy {
    /// The strategy of `kv` (no method listed: no automatic updates).
    pub fn of(kv: &KubeVirt) -> Self {
        let strategy = kv.spec.workload_update_strategy.as_ref();
        let methods = strategy
            .map(|s| s.workload_update_methods.as_slice())
            .unwrap_or_default();
        UpdateStrategy {
            live_migrate: methods.iter().any(|m| m == "LiveMigrate"),
            evict: methods.iter().any(|m| m == "Evict"),
            batch_size: strategy
                .and_then(|s| s.batch_eviction_size)
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(DEFAULT_BATCH_EVICTION_SIZE),
            batch_interval: strategy
                .and_then(|s| s.batch_eviction_interval.as_deref())
                .and_then(kubevirt_api::duration::parse_go_duration)
                .unwrap_or(DEFAULT_BATCH_EVICTION_INTERVAL),
        }
    }
}

fn phase(vmi: &VirtualMachineInstance) -> Option<&VirtualMachineInstancePhase> {
    vmi.status.as_ref().and_then(|s| s.phase.as_ref())
}

/// Upstream's `isOutdated`: not final, and a launcher image is known and is not `launcher_image`
/// (an unknown image, while the VMI starts or migrates, is not outdated).
pub fn is_outdated(vmi: &VirtualMachineInstance, launcher_image: &str) -> bool {
    !crate::vmi::status::phase_is_final(vmi)
        && vmi
            .status
            .as_ref()
            .and_then(|s| s.launcher_container_image_version.as_deref())
            .is_some_and(|image| !image.is_empty() && image != launcher_image)
}

/// Upstream's `IsMigrating`: a migration has started and not ended.
fn is_migrating(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.migration_state.as_ref())
        .is_some_and(|m| m.start_timestamp.is_some() && m.end_timestamp.is_none())
}

fn migration_phase(m: &VirtualMachineInstanceMigration) -> Option<&MigrationPhase> {
    m.status.as_ref().and_then(|s| s.phase.as_ref())
}

fn is_unfinished(m: &VirtualMachineInstanceMigration) -> bool {
    !migration_phase(m).is_some_and(MigrationPhase::is_final)
}

/// Upstream's `IsRunning` of a migration: past `Pending` (and the receiver's waits), not final.
fn is_running(m: &VirtualMachineInstanceMigration) -> bool {
    !matches!(
        migration_phase(m),
        None | Some(
            MigrationPhase::Unset
                | MigrationPhase::Pending
                | MigrationPhase::Succeeded
                | MigrationPhase::Failed
                | MigrationPhase::WaitingForSync
                | MigrationPhase::Synchronizing
        )
    )
}

fn is_workload_update(m: &VirtualMachineInstanceMigration) -> bool {
    m.annotations()
        .contains_key(c::WORKLOAD_UPDATE_MIGRATION_ANNOTATION)
}

fn vmi_key_of(m: &VirtualMachineInstanceMigration) -> Option<String> {
    let vmi = m.spec.vmi_name.as_deref()?;
    Some(format!("{}/{vmi}", m.namespace().unwrap_or_default()))
}

/// What one pass does.
#[derive(Debug, Default)]
pub struct UpdatePlan<'a> {
    /// Every outdated running VMI (the count the CR reports).
    pub outdated: usize,
    /// Outdated VMIs to migrate (before the per-pass limit).
    pub migrate: Vec<&'a VirtualMachineInstance>,
    /// Outdated VMIs to evict (before the batch limit).
    pub evict: Vec<&'a VirtualMachineInstance>,
    /// Up-to-date VMIs and the names of their workload-update migrations to delete.
    pub abort: Vec<(&'a VirtualMachineInstance, Vec<String>)>,
    /// Migrations past `Pending` and not final.
    pub running_migrations: usize,
}

impl UpdatePlan<'_> {
    /// Whether anything is left to act on.
    pub fn has_work(&self) -> bool {
        !(self.migrate.is_empty() && self.evict.is_empty() && self.abort.is_empty())
    }
}

/// Upstream's `getUpdateData` (see the module documentation).
pub fn plan<'a>(
    vmis: &[&'a VirtualMachineInstance],
    migrations: &[&VirtualMachineInstanceMigration],
    launcher_image: &str,
    strategy: &UpdateStrategy,
) -> UpdatePlan<'a> {
    let unfinished: Vec<&VirtualMachineInstanceMigration> = migrations
        .iter()
        .copied()
        .filter(|m| is_unfinished(m))
        .collect();
    let migrating: BTreeSet<String> = unfinished.iter().filter_map(|m| vmi_key_of(m)).collect();
    let mut update_migrations: BTreeMap<String, Vec<&VirtualMachineInstanceMigration>> =
        BTreeMap::new();
    for m in unfinished.iter().filter(|m| is_workload_update(m)) {
        if let Some(key) = vmi_key_of(m) {
            update_migrations.entry(key).or_default().push(m);
        }
    }
    let mut plan = UpdatePlan {
        running_migrations: unfinished.iter().filter(|m| is_running(m)).count(),
        ..UpdatePlan::default()
    };
    for &vmi in vmis {
        let running = phase(vmi) == Some(&VirtualMachineInstancePhase::Running);
        if !running || vmi.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let key = crate::runtime::key_of(vmi);
        if !is_outdated(vmi, launcher_image) {
            let target_ready = vmi
                .status
                .as_ref()
                .and_then(|s| s.migration_state.as_ref())
                .is_some_and(|m| m.target_node_domain_ready_timestamp.is_some());
            if let Some(stale) = update_migrations.get(&key).filter(|_| !target_ready) {
                let names = stale.iter().map(|m| m.name_any()).collect();
                plan.abort.push((vmi, names));
            }
            continue;
        }
        plan.outdated += 1;
        // A migrating VMI counts as outdated but is left alone.
        if is_migrating(vmi) || migrating.contains(&key) {
            continue;
        }
        if strategy.live_migrate && crate::evacuation::is_live_migratable(vmi) {
            plan.migrate.push(vmi);
        } else if strategy.evict {
            plan.evict.push(vmi);
        }
    }
    plan
}

/// The migration upstream creates for an outdated VMI.
pub fn new_migration(vmi: &VirtualMachineInstance) -> VirtualMachineInstanceMigration {
    let mut migration = VirtualMachineInstanceMigration::new(
        "",
        VirtualMachineInstanceMigrationSpec {
            vmi_name: vmi.metadata.name.clone(),
            priority: Some(MigrationPriority::SystemCritical),
            ..VirtualMachineInstanceMigrationSpec::default()
        },
    );
    migration.metadata.name = None;
    migration.metadata.generate_name = Some(MIGRATION_GENERATE_NAME.to_owned());
    migration
        .metadata
        .namespace
        .clone_from(&vmi.metadata.namespace);
    migration.metadata.annotations = Some(BTreeMap::from([(
        c::WORKLOAD_UPDATE_MIGRATION_ANNOTATION.to_owned(),
        String::new(),
    )]));
    migration
}

/// The JSON patch setting the CR's outdated count to `count`, `None` when it has it already.
pub fn outdated_count_patch(kv: &KubeVirt, count: usize) -> Option<serde_json::Value> {
    let path = "/status/outdatedVirtualMachineInstanceWorkloads";
    let current = kv
        .status
        .as_ref()
        .and_then(|s| s.outdated_virtual_machine_instance_workloads);
    let count = i32::try_from(count).unwrap_or(i32::MAX);
    match current {
        Some(c) if c == count => None,
        Some(c) => Some(json!([
            {"op": "test", "path": path, "value": c},
            {"op": "replace", "path": path, "value": count},
        ])),
        None if kv.status.is_none() => Some(json!([
            {"op": "add", "path": "/status", "value": {"outdatedVirtualMachineInstanceWorkloads": count}},
        ])),
        None => Some(json!([{"op": "add", "path": path, "value": count}])),
    }
}

/// Why one pass failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadUpdateError {
    /// Writing the CR's outdated count failed.
    #[error("patching the KubeVirt status with the outdated workload count")]
    PatchStatus(#[source] kube::Error),
    /// Creating a migration, evicting a pod or deleting a migration failed.
    #[error("updating the workload of vmi {0}")]
    Update(String, #[source] kube::Error),
}

impl ControllerError for WorkloadUpdateError {
    fn reason(&self) -> &str {
        match self {
            WorkloadUpdateError::PatchStatus(_) => "FailedPatch",
            WorkloadUpdateError::Update(..) => "FailedUpdate",
        }
    }
}

/// Everything a pass needs.
pub struct WorkloadUpdateReconciler {
    client: Client,
    launcher_image: String,
    kubevirts: InformerHandle<KubeVirt>,
    vmis: InformerHandle<VirtualMachineInstance>,
    migrations: InformerHandle<VirtualMachineInstanceMigration>,
    expectations: Arc<Expectations>,
    cluster: watch::Receiver<ClusterSettings>,
    recorder: Arc<EventRecorder>,
    /// When the last eviction batch went out.
    last_batch: Mutex<Option<Instant>>,
}

impl WorkloadUpdateReconciler {
    async fn reconcile_kubevirt(&self, key: &str) -> Result<Action, WorkloadUpdateError> {
        let Some(kv) = self.kubevirts.get_by_key(key) else {
            self.expectations.delete_expectations(key);
            return Ok(Action::Done);
        };
        if !self.expectations.satisfied(key) {
            return Ok(Action::RequeueAfter(crate::vmi::EXPECTATIONS_RECHECK));
        }
        let status = kv.status.as_ref();
        let deployed = status.and_then(|s| s.phase.as_ref()) == Some(&KubeVirtPhase::Deployed)
            && status.and_then(|s| s.observed_deployment_id.as_ref())
                == status.and_then(|s| s.target_deployment_id.as_ref());
        if !deployed {
            return Ok(Action::Done);
        }
        let strategy = UpdateStrategy::of(&kv);
        let vmis = self.vmis.store().state();
        let migrations = self.migrations.store().state();
        let vmi_refs: Vec<&VirtualMachineInstance> = vmis.iter().map(AsRef::as_ref).collect();
        let migration_refs: Vec<&VirtualMachineInstanceMigration> =
            migrations.iter().map(AsRef::as_ref).collect();
        let mut plan = plan(&vmi_refs, &migration_refs, &self.launcher_image, &strategy);
        if let Some(patch) = outdated_count_patch(&kv, plan.outdated) {
            let api: Api<KubeVirt> =
                Api::namespaced(self.client.clone(), &kv.namespace().unwrap_or_default());
            let patch: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| WorkloadUpdateError::PatchStatus(kube::Error::SerdeError(e)))?;
            api.patch_status(
                &kv.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
            .map_err(WorkloadUpdateError::PatchStatus)?;
        }
        let again = if plan.has_work() {
            Action::RequeueAfter(RETRY)
        } else {
            Action::Done
        };
        plan.migrate.shuffle(&mut rand::rng());
        let parallel = self
            .cluster
            .borrow()
            .migrations
            .as_ref()
            .and_then(|m| m.parallel_migrations_per_cluster)
            .unwrap_or(crate::migration::DEFAULT_PARALLEL_MIGRATIONS_PER_CLUSTER);
        let room = usize::try_from(parallel)
            .unwrap_or(usize::MAX)
            .saturating_sub(plan.running_migrations);
        plan.migrate.truncate(room);
        let evict = self.eviction_batch(&strategy, plan.evict.len());
        plan.evict.truncate(evict);
        let mut first_error = None;
        self.expectations
            .expect_creations(key, i64::try_from(plan.migrate.len()).unwrap_or(i64::MAX));
        for vmi in &plan.migrate {
            if let Err(e) = self.migrate(key, vmi).await {
                first_error.get_or_insert(e);
            }
        }
        for vmi in &plan.evict {
            if let Err(e) = self.evict(vmi).await {
                first_error.get_or_insert(e);
            }
        }
        for (vmi, names) in &plan.abort {
            if let Err(e) = self.abort(vmi, names).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(again), Err)
    }

    /// How many of `candidates` VMIs may be evicted now (a batch once per interval).
    fn eviction_batch(&self, strategy: &UpdateStrategy, candidates: usize) -> usize {
        if candidates == 0 {
            return 0;
        }
        let mut last = self
            .last_batch
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if last.is_some_and(|at| now < at + strategy.batch_interval) {
            return 0;
        }
        *last = Some(now);
        strategy.batch_size.min(candidates)
    }

    async fn migrate(
        &self,
        key: &str,
        vmi: &VirtualMachineInstance,
    ) -> Result<(), WorkloadUpdateError> {
        let api: Api<VirtualMachineInstanceMigration> =
            Api::namespaced(self.client.clone(), &vmi.namespace().unwrap_or_default());
        match api
            .create(&PostParams::default(), &new_migration(vmi))
            .await
        {
            Ok(created) => {
                info!(vmi = %crate::runtime::key_of(vmi), migration = %created.name_any(), "migrating an outdated VMI");
                let message = format!(
                    "Created Migration {} for automated workload update",
                    created.name_any()
                );
                self.recorder
                    .record(vmi, EventType::Normal, "SuccessfulCreate", &message)
                    .await;
                Ok(())
            }
            Err(e) => {
                self.expectations.creation_observed(key);
                let message = format!(
                    "Error creating a Migration for automated workload update: {}",
                    error_chain(&e)
                );
                self.recorder
                    .record(vmi, EventType::Warning, "FailedCreate", &message)
                    .await;
                Err(WorkloadUpdateError::Update(vmi.name_any(), e))
            }
        }
    }

    /// Evicts the VMI's current launcher pod (the newest of its pods that has not ended).
    async fn evict(&self, vmi: &VirtualMachineInstance) -> Result<(), WorkloadUpdateError> {
        let ns = vmi.namespace().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let selector = format!(
            "{}={}",
            c::CREATED_BY_LABEL,
            vmi.metadata.uid.as_deref().unwrap_or_default()
        );
        let result = match pods.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => {
                let current = list
                    .items
                    .into_iter()
                    .filter(|p| {
                        !matches!(
                            p.status.as_ref().and_then(|s| s.phase.as_deref()),
                            Some("Succeeded" | "Failed")
                        )
                    })
                    .max_by(|a, b| {
                        a.metadata
                            .creation_timestamp
                            .cmp(&b.metadata.creation_timestamp)
                    });
                match current {
                    Some(pod) => match pods.evict(&pod.name_any(), &EvictParams::default()).await {
                        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                        other => other.map(drop),
                    },
                    None => Ok(()),
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => {
                info!(vmi = %crate::runtime::key_of(vmi), "evicted an outdated VMI's launcher pod");
                self.recorder
                    .record(
                        vmi,
                        EventType::Normal,
                        "SuccessfulEvict",
                        "Initiated eviction of VMI as part of automated workload update",
                    )
                    .await;
                Ok(())
            }
            Err(e) => {
                let message = format!(
                    "Error deleting VMI during automated workload update: {}",
                    error_chain(&e)
                );
                self.recorder
                    .record(vmi, EventType::Warning, "FailedEvict", &message)
                    .await;
                Err(WorkloadUpdateError::Update(vmi.name_any(), e))
            }
        }
    }

    /// Deletes the workload-update migrations `names` of a VMI that no longer needs them.
    async fn abort(
        &self,
        vmi: &VirtualMachineInstance,
        names: &[String],
    ) -> Result<(), WorkloadUpdateError> {
        let api: Api<VirtualMachineInstanceMigration> =
            Api::namespaced(self.client.clone(), &vmi.namespace().unwrap_or_default());
        for name in names {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    let message = format!("Aborted change for vmi: {}", vmi.name_any());
                    self.recorder
                        .record(vmi, EventType::Normal, "SuccessfulChangeAbortion", &message)
                        .await;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    let message = format!(
                        "Failed to abort change for vmi: {}: {}",
                        vmi.name_any(),
                        error_chain(&e)
                    );
                    self.recorder
                        .record(vmi, EventType::Normal, "FailedChangeAbortion", &message)
                        .await;
                    return Err(WorkloadUpdateError::Update(vmi.name_any(), e));
                }
            }
        }
        Ok(())
    }
}

impl Reconciler for WorkloadUpdateReconciler {
    type Error = WorkloadUpdateError;

    async fn reconcile(&self, key: &str) -> Result<Action, WorkloadUpdateError> {
        self.reconcile_kubevirt(key).await
    }
}

/// `kubevirt_vmi_number_of_outdated`, counted from the VMI cache at each scrape.
struct OutdatedCollector {
    vmis: InformerHandle<VirtualMachineInstance>,
    launcher_image: String,
}

impl std::fmt::Debug for OutdatedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutdatedCollector").finish_non_exhaustive()
    }
}

impl ScrapeCollector for OutdatedCollector {
    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let outdated = self
            .vmis
            .store()
            .state()
            .iter()
            .filter(|vmi| is_outdated(vmi, &self.launcher_image))
            .count();
        let metric = encoder.encode_descriptor(
            "kubevirt_vmi_number_of_outdated",
            "Indication for the total number of VirtualMachineInstance workloads that are not running within the most up-to-date version of the virt-launcher environment.",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::try_from(outdated).unwrap_or(i64::MAX)).encode(metric)
    }
}

/// Runs the workload updater for the KubeVirt CR in `namespace` until `cancel` fires.
pub async fn run_workload_updater(
    client: Client,
    namespace: &str,
    launcher_image: String,
    cluster: watch::Receiver<ClusterSettings>,
    metrics: &Metrics,
    cancel: CancellationToken,
) {
    let queue =
        WorkQueue::with_config(RateLimiterConfig::default(), metrics.controller(QUEUE_NAME));
    let expectations = Arc::new(Expectations::new());
    let mut kubevirt_informer = Informer::<KubeVirt>::new();
    kubevirt_informer.enqueue(queue.clone(), |kv: &KubeVirt| {
        Some(crate::runtime::key_of(kv))
    });
    let kubevirts = kubevirt_informer.handle();
    // The one CR's key, for the VMI and migration changes that concern it.
    let cr_key = {
        let kubevirts = kubevirts.clone();
        move || {
            let all = kubevirts.store().state();
            (all.len() == 1).then(|| crate::runtime::key_of(all[0].as_ref()))
        }
    };
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    let (q, key, image) = (queue.clone(), cr_key.clone(), launcher_image.clone());
    vmi_informer.on_change(move |change| {
        let outdated = |vmi: &VirtualMachineInstance| is_outdated(vmi, &image);
        let wakes = match change {
            Change::Added(vmi) | Change::Deleted(vmi) => outdated(vmi),
            Change::Updated { old, new } => outdated(old) != outdated(new),
        };
        if let Some(k) = key().filter(|_| wakes) {
            q.add(k);
        }
    });
    let vmis = vmi_informer.handle();
    let mut migration_informer = Informer::<VirtualMachineInstanceMigration>::new();
    let (q, exp) = (queue.clone(), Arc::clone(&expectations));
    migration_informer.on_change(move |change| {
        let Some(k) = cr_key() else {
            return;
        };
        if let Change::Added(m) = change
            && is_workload_update(m)
        {
            exp.creation_observed(&k);
        }
        q.add_after(k, RETRY);
    });
    let migrations = migration_informer.handle();
    metrics.add_collector(OutdatedCollector {
        vmis: vmis.clone(),
        launcher_image: launcher_image.clone(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(kubevirt_informer.run(
        Api::namespaced(client.clone(), namespace),
        watcher::Config::default(),
    ));
    tasks.spawn(vmi_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(migration_informer.run(Api::all(client.clone()), watcher::Config::default()));
    let synced = async {
        kubevirts.wait_for_sync().await?;
        vmis.wait_for_sync().await?;
        migrations.wait_for_sync().await
    };
    tokio::select! {
        () = cancel.cancelled() => { tasks.abort_all(); return; }
        res = synced => if res.is_err() { tasks.abort_all(); return; },
    }
    let reconciler = WorkloadUpdateReconciler {
        recorder: Arc::new(EventRecorder::new(client.clone(), EVENT_COMPONENT)),
        client,
        launcher_image,
        kubevirts,
        vmis,
        migrations,
        expectations,
        cluster,
        last_batch: Mutex::new(None),
    };
    // One worker: the queue holds one key, the CR.
    let panics = Controller::new(QUEUE_NAME, queue, reconciler)
        .workers(1)
        .run(cancel)
        .await;
    if panics > 0 {
        error!(panics, "workload updater workers panicked");
    }
    tasks.abort_all();
}
