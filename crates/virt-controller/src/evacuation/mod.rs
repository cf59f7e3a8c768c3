//! The evacuation controller: asks for the migration of VMIs that must leave a node
//! (upstream's `pkg/virt-controller/watch/drain/evacuation`).
//!
//! Data flow: informers on Nodes, VMIs and VirtualMachineInstanceMigrations feed the queue
//! `virt-controller-evacuation`, keyed by node name (a VMI by its `status.nodeName`, a
//! migration by its VMI's node; a created migration's `kubevirt.io/evacuationMigration`
//! annotation lowers the node's creation expectations). A reconcile waits until the node's
//! expectations are met, then picks the candidates ([`vmis_to_migrate`]): every VMI on the
//! node when it carries the drain taint (`spec.configuration.migrations.nodeDrainTaintKey`,
//! default `kubevirt.io/drain`, effect `NoSchedule`; upstream's deprecated path), else the
//! VMIs marked by the pod-eviction webhook (`status.evacuationNodeName` equal to their node)
//! that are not migrating. Of these, [`migration_candidates`] keeps the VMIs that are not
//! final or deleting, whose eviction strategy migrates ([`migrates_on_eviction`]), that are
//! `LiveMigratable`, have no unfinished migration and at most one active pod. Each gets a
//! VirtualMachineInstanceMigration `kubevirt-evacuation-…` (annotation
//! `kubevirt.io/evacuationMigration=<node>`, priority `system-critical`, or
//! `system-maintenance` when the descheduler asked) and a `SuccessfulCreate` /
//! `FailedCreate` event.
//!
//! The migration controller ([`crate::migration`]) carries the migrations out.

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{
    EvictionStrategy, MigrationPriority, VirtualMachineInstance,
    VirtualMachineInstanceConditionType, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationSpec,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::kubevirt_config::ClusterSettings;
use crate::runtime::controller::{Action, Controller, ControllerError, Reconciler};
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::expectations::Expectations;
use crate::runtime::informer::{Change, Informer, InformerHandle};
use crate::runtime::metrics::Metrics;
use crate::runtime::queue::{RateLimiterConfig, WorkQueue};

/// Name of the evacuation controller's queue (as upstream).
pub const QUEUE_NAME: &str = "virt-controller-evacuation";
/// The component its events are recorded as (as upstream).
pub const EVENT_COMPONENT: &str = "evacuation-controller";
/// Upstream's default drain taint key.
pub const DEFAULT_DRAIN_TAINT_KEY: &str = "kubevirt.io/drain";
/// The prefix of the migrations it creates.
pub const MIGRATION_GENERATE_NAME: &str = "kubevirt-evacuation-";
/// VMI annotation naming who asked for the evacuation (set by the eviction webhook).
pub const EVICTION_SOURCE_ANNOTATION: &str = "kubevirt.io/eviction-source";

fn phase_is_final(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.phase.as_ref())
        .is_some_and(|p| {
            matches!(
                p,
                kubevirt_api::v1::VirtualMachineInstancePhase::Succeeded
                    | kubevirt_api::v1::VirtualMachineInstancePhase::Failed
            )
        })
}

fn node_of(vmi: &VirtualMachineInstance) -> Option<&str> {
    vmi.status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Whether a migration of the VMI is under way (`migrationState` present, not completed).
fn is_migrating(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.migration_state.as_ref())
        .is_some_and(|m| m.completed != Some(true) && m.failed != Some(true))
}

/// Whether the node has the drain taint `key` with effect `NoSchedule`.
pub fn has_drain_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == "NoSchedule"))
}

/// Upstream's `vmisToMigrate`: all VMIs on a tainted node, else the marked ones that have not
/// left their node yet and are not migrating.
pub fn vmis_to_migrate<'a>(
    node: &Node,
    on_node: &[&'a VirtualMachineInstance],
    taint_key: &str,
) -> Vec<&'a VirtualMachineInstance> {
    if has_drain_taint(node, taint_key) {
        return on_node.to_vec();
    }
    on_node
        .iter()
        .copied()
        .filter(|vmi| {
            let marked = vmi
                .status
                .as_ref()
                .and_then(|s| s.evacuation_node_name.as_deref())
                .filter(|n| !n.is_empty());
            marked.is_some() && marked == node_of(vmi) && !is_migrating(vmi)
        })
        .collect()
}

/// Upstream's `VMIMigratableOnEviction`: `LiveMigrate` always, `LiveMigrateIfPossible` when
/// `LiveMigratable`, nothing else (the VMI's strategy, else the cluster's).
pub fn migrates_on_eviction(
    vmi: &VirtualMachineInstance,
    cluster: Option<&EvictionStrategy>,
) -> bool {
    match vmi.spec.eviction_strategy.as_ref().or(cluster) {
        Some(EvictionStrategy::LiveMigrate) => true,
        Some(EvictionStrategy::LiveMigrateIfPossible) => is_live_migratable(vmi),
        _ => false,
    }
}

/// Whether the VMI's `LiveMigratable` condition is true.
pub(crate) fn is_live_migratable(vmi: &VirtualMachineInstance) -> bool {
    vmi.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|cond| cond.is_true(&VirtualMachineInstanceConditionType::LiveMigratable))
    })
}

/// Upstream's `filterRunningNonMigratingVMIs` (its migratable half): `unfinished` holds the
/// `namespace/vmi` keys of migrations not yet final.
pub fn migration_candidates<'a>(
    vmis: &[&'a VirtualMachineInstance],
    unfinished: &BTreeSet<String>,
    cluster: Option<&EvictionStrategy>,
) -> Vec<&'a VirtualMachineInstance> {
    vmis.iter()
        .copied()
        .filter(|vmi| !phase_is_final(vmi) && vmi.metadata.deletion_timestamp.is_none())
        .filter(|vmi| migrates_on_eviction(vmi, cluster) && is_live_migratable(vmi))
        .filter(|vmi| !unfinished.contains(&crate::runtime::key_of(*vmi)))
        .filter(|vmi| vmi.status.as_ref().is_none_or(|s| s.active_pods.len() <= 1))
        .collect()
}

/// Upstream's `GenerateNewMigration`.
pub fn new_migration(vmi: &VirtualMachineInstance, node: &str) -> VirtualMachineInstanceMigration {
    let descheduler = vmi
        .annotations()
        .get(EVICTION_SOURCE_ANNOTATION)
        .is_some_and(|v| v == "descheduler");
    let mut migration = VirtualMachineInstanceMigration::new(
        "",
        VirtualMachineInstanceMigrationSpec {
            vmi_name: vmi.metadata.name.clone(),
            priority: Some(if descheduler {
                MigrationPriority::SystemMaintenance
            } else {
                MigrationPriority::SystemCritical
            }),
            ..VirtualMachineInstanceMigrationSpec::default()
        },
    );
    migration.metadata.name = None;
    migration.metadata.generate_name = Some(MIGRATION_GENERATE_NAME.to_owned());
    migration
        .metadata
        .namespace
        .clone_from(&vmi.metadata.namespace);
    migration.metadata.annotations = Some(
        [(
            c::EVACUATION_MIGRATION_ANNOTATION.to_owned(),
            node.to_owned(),
        )]
        .into_iter()
        .collect(),
    );
    migration
}

/// Why one reconcile of a node failed.
#[derive(Debug, thiserror::Error)]
pub enum EvacuationError {
    /// Creating a migration failed.
    #[error("creating a migration for vmi {0}")]
    CreateMigration(String, #[source] kube::Error),
}

impl ControllerError for EvacuationError {
    fn reason(&self) -> &str {
        "FailedCreate"
    }
}

/// Everything a reconcile needs; shared by the workers.
pub struct EvacuationReconciler {
    client: Client,
    nodes: InformerHandle<Node>,
    vmis: InformerHandle<VirtualMachineInstance>,
    migrations: InformerHandle<VirtualMachineInstanceMigration>,
    expectations: Arc<Expectations>,
    cluster: watch::Receiver<ClusterSettings>,
    recorder: Arc<EventRecorder>,
}

impl EvacuationReconciler {
    async fn reconcile_node(&self, name: &str) -> Result<Action, EvacuationError> {
        let Some(node) = self.nodes.get(None, name) else {
            self.expectations.delete_expectations(name);
            return Ok(Action::Done);
        };
        if !self.expectations.satisfied(name) {
            // The created migrations' events wake the node; expired expectations are caught
            // by this look.
            return Ok(Action::RequeueAfter(crate::vmi::EXPECTATIONS_RECHECK));
        }
        let (taint_key, strategy) = {
            let cluster = self.cluster.borrow();
            let key = cluster
                .node_drain_taint_key
                .clone()
                .unwrap_or_else(|| DEFAULT_DRAIN_TAINT_KEY.to_owned());
            (key, cluster.eviction_strategy.clone())
        };
        let all = self.vmis.store().state();
        let on_node: Vec<&VirtualMachineInstance> = all
            .iter()
            .map(AsRef::as_ref)
            .filter(|vmi| node_of(vmi) == Some(name))
            .collect();
        let wanted = vmis_to_migrate(&node, &on_node, &taint_key);
        if wanted.is_empty() {
            return Ok(Action::Done);
        }
        let unfinished: BTreeSet<String> = self
            .migrations
            .store()
            .state()
            .iter()
            .filter(|m| {
                !m.status
                    .as_ref()
                    .and_then(|s| s.phase.as_ref())
                    .is_some_and(|p| p.is_final())
            })
            .filter_map(|m| {
                let vmi = m.spec.vmi_name.as_deref()?;
                Some(format!("{}/{vmi}", m.namespace().unwrap_or_default()))
            })
            .collect();
        let candidates = migration_candidates(&wanted, &unfinished, strategy.as_ref());
        if candidates.is_empty() {
            return Ok(Action::Done);
        }
        info!(
            node = name,
            candidates = candidates.len(),
            "creating evacuation migrations"
        );
        self.expectations
            .expect_creations(name, i64::try_from(candidates.len()).unwrap_or(i64::MAX));
        let mut first_error = None;
        for vmi in candidates {
            let ns = vmi.namespace().unwrap_or_default();
            let api: Api<VirtualMachineInstanceMigration> =
                Api::namespaced(self.client.clone(), &ns);
            match api
                .create(&PostParams::default(), &new_migration(vmi, name))
                .await
            {
                Ok(created) => {
                    let message = format!("Created Migration {}", created.name_any());
                    self.recorder
                        .record(vmi, EventType::Normal, "SuccessfulCreate", &message)
                        .await;
                }
                Err(e) => {
                    self.expectations.creation_observed(name);
                    let message = format!(
                        "Error creating a Migration: {}",
                        crate::runtime::controller::error_chain(&e)
                    );
                    self.recorder
                        .record(vmi, EventType::Warning, "FailedCreate", &message)
                        .await;
                    first_error.get_or_insert(EvacuationError::CreateMigration(vmi.name_any(), e));
                }
            }
        }
        first_error.map_or(Ok(Action::Done), Err)
    }
}

impl Reconciler for EvacuationReconciler {
    type Error = EvacuationError;

    async fn reconcile(&self, key: &str) -> Result<Action, EvacuationError> {
        self.reconcile_node(key).await
    }
}

/// Runs the evacuation controller until `cancel` fires.
pub async fn run_evacuation_controller(
    client: Client,
    cluster: watch::Receiver<ClusterSettings>,
    metrics: &Metrics,
    cancel: CancellationToken,
) {
    let queue =
        WorkQueue::with_config(RateLimiterConfig::default(), metrics.controller(QUEUE_NAME));
    let expectations = Arc::new(Expectations::new());
    let mut node_informer = Informer::<Node>::new();
    node_informer.enqueue(queue.clone(), |node: &Node| Some(node.name_any()));
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    vmi_informer.enqueue(queue.clone(), |vmi: &VirtualMachineInstance| {
        node_of(vmi).map(str::to_owned)
    });
    let vmis = vmi_informer.handle();
    let mut migration_informer = Informer::<VirtualMachineInstanceMigration>::new();
    let (q, exp, cache) = (queue.clone(), Arc::clone(&expectations), vmis.clone());
    migration_informer.on_change(move |change| {
        let migration = change.object();
        if let Change::Added(m) = change
            && let Some(node) = m.annotations().get(c::EVACUATION_MIGRATION_ANNOTATION)
        {
            exp.creation_observed(node);
            q.add(node.clone());
        }
        let ns = migration.namespace().unwrap_or_default();
        let node = migration
            .spec
            .vmi_name
            .as_deref()
            .and_then(|name| cache.get(Some(&ns), name))
            .and_then(|vmi| node_of(&vmi).map(str::to_owned));
        if let Some(node) = node {
            q.add(node);
        }
    });
    let (nodes, migrations) = (node_informer.handle(), migration_informer.handle());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(node_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(vmi_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(migration_informer.run(Api::all(client.clone()), watcher::Config::default()));
    let synced = async {
        nodes.wait_for_sync().await?;
        vmis.wait_for_sync().await?;
        migrations.wait_for_sync().await
    };
    tokio::select! {
        () = cancel.cancelled() => { tasks.abort_all(); return; }
        res = synced => if res.is_err() { tasks.abort_all(); return; },
    }
    let reconciler = EvacuationReconciler {
        recorder: Arc::new(EventRecorder::new(client.clone(), EVENT_COMPONENT)),
        client,
        nodes,
        vmis,
        migrations,
        expectations,
        cluster,
    };
    let panics = Controller::new(QUEUE_NAME, queue, reconciler)
        .workers(3)
        .run(cancel)
        .await;
    if panics > 0 {
        error!(panics, "evacuation controller workers panicked");
    }
    tasks.abort_all();
}
