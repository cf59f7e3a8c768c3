//! The migration controller: carries a VirtualMachineInstanceMigration from `Pending` to
//! `Succeeded` or `Failed` (upstream's `pkg/virt-controller/watch/migration`, local
//! migrations).
//!
//! Data flow: informers on migrations, VMIs and launcher pods feed the queue
//! `virt-controller-migration`, keyed by migration (a VMI by the migrations naming it, a pod by
//! its `kubevirt.io/migrationJobUID`). A reconcile reads the migration, its VMI and its target
//! pod from the caches and lets [`phase::decide`] pick the phase and the one action of the pass:
//! create the target pod ([`target_pod`]; within upstream's limits of 5 running migrations
//! per cluster and 2 outbound per node, `spec.configuration.migrations`), hand the migration
//! over to the handlers (VMI `status.migrationState` with `migrationUid`, `sourceNode`,
//! `targetNode`, `sourcePod`, `targetPod`, and the label
//! `kubevirt.io/migrationTargetNodeName`, which makes the target node's handler pick the VMI
//! up), or ask for an abort (`migrationState.abortRequested`, when the migration is deleted
//! after hand-off). The handlers fill in the rest of `migrationState`, which moves the phase.
//! A final migration gets the VMI's `migrationState` copied into its status, its target pod
//! deleted when it failed, and its finalizer `kubevirt.io/migrationJobFinalize` removed (so
//! deleting a migration — `virtctl migrate-cancel` — completes once it is final).
//!
//! Ownership: this controller writes the migration's status and finalizers, creates and
//! deletes target pods, and writes on the VMI only `migrationState` at hand-off (guarded by a
//! `test` of the value it replaces), `migrationState.abortRequested` and the target label.
//!
//! # Caveats
//! - MigrationPolicies are matched at hand-off ([`policy`]). No per-priority queue (throttled migrations retry after
//!   upstream's per-priority delay), no garbage collection of old finalized migrations, no
//!   decentralized migrations, no PodDisruptionBudget.
//! - A target pod still `Pending` is deleted after upstream's timeouts (unschedulable 5 min,
//!   any pending 15 min; annotations `kubevirt.io/migrationUnschedulablePodTimeoutSeconds`,
//!   `kubevirt.io/migrationPendingPodTimeoutSeconds`), which fails the migration.

pub mod gc;
pub mod metrics;
pub mod phase;
pub mod policy;
pub mod target_pod;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubevirt_api::constants as c;
use kubevirt_api::migrations::v1alpha1::MigrationPolicy;
use kubevirt_api::v1::{
    ConditionStatus, MigrationConditionType, MigrationConfiguration, MigrationPhase,
    MigrationPriority, VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationCondition,
    VirtualMachineInstanceMigrationPhaseTransitionTimestamp, VirtualMachineInstanceMigrationState,
    VirtualMachineInstanceMigrationStatus,
};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::kubevirt_config::ClusterSettings;
use crate::runtime::controller::{Action, Controller, ControllerError, Reconciler, error_chain};
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::expectations::Expectations;
use crate::runtime::informer::{Change, Informer, InformerHandle};
use crate::runtime::metrics::Metrics;
use crate::runtime::queue::{RateLimiterConfig, WorkQueue};
use crate::runtime::{json_patch, key_of};
use crate::vmi::template::LauncherPodConfig;
use phase::{Decision, VmiAction, handed_off, migration_state};

/// Name of the migration controller's queue (as upstream).
pub const QUEUE_NAME: &str = "virt-controller-migration";
/// Upstream's default `parallelMigrationsPerCluster`.
pub const DEFAULT_PARALLEL_MIGRATIONS_PER_CLUSTER: u32 = 5;
/// Upstream's default `parallelOutboundMigrationsPerNode`.
pub const DEFAULT_PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE: u32 = 2;

/// Why one reconcile of a migration failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The target pod could not be rendered.
    #[error("rendering the migration target pod")]
    RenderPod(#[source] crate::vmi::template::TemplateError),
    /// Creating the target pod failed.
    #[error("creating the migration target pod")]
    CreatePod(#[source] kube::Error),
    /// Deleting the target pod failed.
    #[error("deleting the migration target pod")]
    DeletePod(#[source] kube::Error),
    /// Patching the VMI (hand-off, abort) failed.
    #[error("patching the vmi")]
    PatchVmi(#[source] kube::Error),
    /// Writing the migration's status or finalizers failed.
    #[error("updating the migration")]
    PatchMigration(#[source] kube::Error),
    /// The migration policies or the VMI's namespace could not be read.
    #[error("reading the migration policies")]
    ReadPolicies(#[source] kube::Error),
    /// The source node could not be read (CPU placement of the target).
    #[error("reading the source node")]
    ReadNode(#[source] kube::Error),
    /// A `host-model` guest's source node does not say its host model.
    #[error("{0}")]
    HostModel(String),
}

impl ControllerError for MigrationError {
    fn reason(&self) -> &str {
        match self {
            MigrationError::RenderPod(_)
            | MigrationError::CreatePod(_)
            | MigrationError::ReadNode(_)
            | MigrationError::HostModel(_) => "FailedCreate",
            MigrationError::DeletePod(_) => "FailedDelete",
            MigrationError::PatchVmi(_) | MigrationError::ReadPolicies(_) => "FailedHandOver",
            MigrationError::PatchMigration(_) => "FailedUpdate",
        }
    }
}

fn phase_of(m: &VirtualMachineInstanceMigration) -> MigrationPhase {
    m.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn node_of(vmi: &VirtualMachineInstance) -> Option<&str> {
    vmi.status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// `~` and `/` escaped for a JSON Pointer.
fn pointer_escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Now, in whole seconds.
fn now() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Upstream's requeue delay of a throttled migration, by priority.
fn throttle_delay(m: &VirtualMachineInstanceMigration) -> Duration {
    match m.spec.priority {
        Some(MigrationPriority::SystemCritical) => Duration::from_secs(1),
        Some(MigrationPriority::UserTriggered) => Duration::from_secs(3),
        _ => Duration::from_secs(5),
    }
}

/// Upstream's migration defaults overlaid by the CR's `spec.configuration.migrations`; at
/// hand-off a matching MigrationPolicy is overlaid on that ([`policy::apply`]), and the
/// result, handed over in `migrationState.migrationConfiguration`, is what the handlers
/// apply.
pub fn resolved_configuration(cr: Option<&MigrationConfiguration>) -> MigrationConfiguration {
    let cr = cr.cloned().unwrap_or_default();
    let allow_post_copy = cr.allow_post_copy.unwrap_or(false);
    MigrationConfiguration {
        node_drain_taint_key: Some(
            cr.node_drain_taint_key
                .unwrap_or_else(|| crate::evacuation::DEFAULT_DRAIN_TAINT_KEY.to_owned()),
        ),
        parallel_outbound_migrations_per_node: Some(
            cr.parallel_outbound_migrations_per_node
                .unwrap_or(DEFAULT_PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE),
        ),
        parallel_migrations_per_cluster: Some(
            cr.parallel_migrations_per_cluster
                .unwrap_or(DEFAULT_PARALLEL_MIGRATIONS_PER_CLUSTER),
        ),
        allow_auto_converge: Some(cr.allow_auto_converge.unwrap_or(false)),
        bandwidth_per_migration: Some(
            cr.bandwidth_per_migration
                .unwrap_or_else(|| Quantity("0Mi".to_owned())),
        ),
        completion_timeout_per_gi_b: Some(cr.completion_timeout_per_gi_b.unwrap_or(150)),
        progress_timeout: Some(cr.progress_timeout.unwrap_or(150)),
        unsafe_migration_override: Some(cr.unsafe_migration_override.unwrap_or(false)),
        allow_post_copy: Some(allow_post_copy),
        allow_workload_disruption: Some(cr.allow_workload_disruption.unwrap_or(allow_post_copy)),
        utility_volumes_timeout: Some(cr.utility_volumes_timeout.unwrap_or(150)),
        ..cr
    }
}

/// Whether a migration counts against the limits: not final and past `Pending`, or still
/// `Pending` with its target pod created.
fn is_running(m: &VirtualMachineInstanceMigration) -> bool {
    !matches!(
        phase_of(m),
        MigrationPhase::Unset
            | MigrationPhase::Pending
            | MigrationPhase::Succeeded
            | MigrationPhase::Failed
    )
}

/// Everything a reconcile needs; shared by the workers.
pub struct MigrationReconciler {
    client: Client,
    migrations: InformerHandle<VirtualMachineInstanceMigration>,
    vmis: InformerHandle<VirtualMachineInstance>,
    pods: InformerHandle<Pod>,
    pod_expectations: Arc<Expectations>,
    launcher: LauncherPodConfig,
    cluster: watch::Receiver<ClusterSettings>,
    recorder: Arc<EventRecorder>,
}

impl MigrationReconciler {
    /// The migration's target pod: a pod labelled with its UID, not being deleted first.
    fn target_pod(&self, m: &VirtualMachineInstanceMigration) -> Option<Arc<Pod>> {
        let uid = m.metadata.uid.as_deref()?;
        let ns = m.metadata.namespace.as_deref();
        let mut pods: Vec<Arc<Pod>> = self
            .pods
            .store()
            .state()
            .into_iter()
            .filter(|p| {
                p.metadata.namespace.as_deref() == ns
                    && p.labels().get(c::MIGRATION_JOB_LABEL).map(String::as_str) == Some(uid)
            })
            .collect();
        pods.sort_by_key(|p| p.metadata.deletion_timestamp.is_some());
        pods.into_iter().next()
    }

    /// The VMI's launcher pod on its current node (the migration source).
    fn source_pod(&self, vmi: &VirtualMachineInstance) -> Option<Arc<Pod>> {
        let uid = vmi.metadata.uid.as_deref()?;
        let node = node_of(vmi)?;
        self.pods
            .store()
            .state()
            .into_iter()
            .filter(|p| {
                p.labels().get(c::CREATED_BY_LABEL).map(String::as_str) == Some(uid)
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            })
            .max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0))
    }

    /// The delay before a throttled migration is looked at again, when the limits forbid
    /// creating its target pod now.
    fn throttled(
        &self,
        m: &VirtualMachineInstanceMigration,
        vmi: &VirtualMachineInstance,
    ) -> Option<Duration> {
        let (per_cluster, per_node) = {
            let config = resolved_configuration(self.cluster.borrow().migrations.as_ref());
            (
                config
                    .parallel_migrations_per_cluster
                    .unwrap_or(DEFAULT_PARALLEL_MIGRATIONS_PER_CLUSTER),
                config
                    .parallel_outbound_migrations_per_node
                    .unwrap_or(DEFAULT_PARALLEL_OUTBOUND_MIGRATIONS_PER_NODE),
            )
        };
        let running: Vec<Arc<VirtualMachineInstanceMigration>> = self
            .migrations
            .store()
            .state()
            .into_iter()
            .filter(|o| o.metadata.uid != m.metadata.uid && is_running(o))
            .collect();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        if count(running.len()) >= per_cluster {
            return Some(throttle_delay(m));
        }
        let source = node_of(vmi);
        let outbound = running
            .iter()
            .filter(|o| {
                let ns = o.metadata.namespace.as_deref();
                o.spec
                    .vmi_name
                    .as_deref()
                    .and_then(|name| self.vmis.get(ns, name))
                    .is_some_and(|v| node_of(&v) == source)
            })
            .count();
        (count(outbound) >= per_node).then(|| throttle_delay(m))
    }

    async fn reconcile_migration(&self, key: &str) -> Result<Action, MigrationError> {
        let Some(m) = self.migrations.get_by_key(key) else {
            self.pod_expectations.delete_expectations(key);
            return Ok(Action::Done);
        };
        let ns = m.namespace().unwrap_or_default();
        let vmi = m
            .spec
            .vmi_name
            .as_deref()
            .and_then(|name| self.vmis.get(Some(&ns), name));
        let target = self.target_pod(&m);
        if phase_of(&m).is_final() {
            return self.finalize(&m, vmi.as_deref(), target.as_deref()).await;
        }
        if !self.pod_expectations.satisfied(key) {
            return Ok(Action::RequeueAfter(crate::vmi::EXPECTATIONS_RECHECK));
        }
        let other_in_progress =
            vmi.as_deref()
                .and_then(migration_state)
                .and_then(|s| s.migration_uid.clone())
                .is_some_and(|owner| {
                    Some(&owner) != m.metadata.uid.as_ref()
                        && self.migrations.store().state().iter().any(|o| {
                            o.metadata.uid.as_ref() == Some(&owner) && !phase_of(o).is_final()
                        })
                });
        let decision = phase::decide(&m, vmi.as_deref(), target.as_deref(), other_in_progress);
        let waiting = matches!(
            decision.phase,
            MigrationPhase::Pending | MigrationPhase::Scheduling
        );
        if let (true, Some(vmi), Some(pod)) = (waiting, vmi.as_deref(), target.as_deref())
            && let Some(delay) = self.pending_pod_timeouts(&m, vmi, pod).await?
        {
            self.write_status(&m, &decision).await?;
            return Ok(Action::RequeueAfter(delay));
        }
        let mut requeue = Action::Done;
        if let Some(vmi) = vmi.as_deref() {
            match decision.action {
                VmiAction::CreateTargetPod => match self.throttled(&m, vmi) {
                    Some(delay) => requeue = Action::RequeueAfter(delay),
                    None => self.create_target_pod(key, &m, vmi).await?,
                },
                VmiAction::HandOff => {
                    if let Some(pod) = target.as_deref() {
                        self.hand_off(&m, vmi, pod).await?;
                    }
                }
                VmiAction::Abort => self.request_abort(&m, vmi).await?,
                VmiAction::None => {}
            }
        }
        if let Some((kind, reason, message)) = decision.event {
            self.recorder
                .record(m.as_ref(), kind, reason, message)
                .await;
        }
        self.write_status(&m, &decision).await?;
        Ok(requeue)
    }

    /// Upstream's `handlePendingPodTimeout`: a target pod still `Pending` is deleted once it
    /// was unschedulable for 5 minutes or pending for 15 (the migration then fails because
    /// its target pod is gone); meanwhile the migration is looked at again when the next
    /// timeout is due.
    async fn pending_pod_timeouts(
        &self,
        m: &VirtualMachineInstanceMigration,
        vmi: &VirtualMachineInstance,
        pod: &Pod,
    ) -> Result<Option<Duration>, MigrationError> {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let Some(verdict) = phase::pending_pod(m, pod, now) else {
            return Ok(None);
        };
        if verdict.unschedulable {
            let message = format!(
                "Migration target pod for VMI [{}/{}] is currently unschedulable.",
                vmi.namespace().unwrap_or_default(),
                vmi.name_any()
            );
            self.recorder
                .record(
                    m,
                    EventType::Warning,
                    phase::TARGET_POD_UNSCHEDULABLE,
                    &message,
                )
                .await;
        }
        if let Some(message) = verdict.delete {
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            match api.delete(&pod.name_any(), &DeleteParams::default()).await {
                Ok(_) => {
                    info!(migration = %key_of(m), %message, "deleted the pending migration target pod");
                    self.recorder
                        .record(m, EventType::Normal, "SuccessfulDelete", &message)
                        .await;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    let message =
                        format!("Error deleted migration target pod: {}", error_chain(&e));
                    self.recorder
                        .record(m, EventType::Warning, "FailedDelete", &message)
                        .await;
                    return Err(MigrationError::DeletePod(e));
                }
            }
            return Ok(None);
        }
        Ok(verdict
            .recheck_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs))
    }

    async fn create_target_pod(
        &self,
        key: &str,
        m: &VirtualMachineInstanceMigration,
        vmi: &VirtualMachineInstance,
    ) -> Result<(), MigrationError> {
        let source = node_of(vmi).unwrap_or_default();
        let launcher = crate::vmi::effective_launcher(&self.launcher, &self.cluster.borrow());
        let mut pod = target_pod::render_target_pod(vmi, m, source, &launcher)
            .map_err(MigrationError::RenderPod)?;
        self.place_by_cpu(&mut pod, vmi, source).await?;
        let ns = m.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        self.pod_expectations.expect_creations(key, 1);
        match api.create(&PostParams::default(), &pod).await {
            Ok(created) => {
                let message = format!("Created migration target pod {}", created.name_any());
                info!(migration = key, pod = %created.name_any(), "created the migration target pod");
                self.recorder
                    .record(m, EventType::Normal, "SuccessfulCreate", &message)
                    .await;
                Ok(())
            }
            Err(e) => {
                self.pod_expectations.creation_observed(key);
                let message = format!("Error creating pod: {}", error_chain(&e));
                self.recorder
                    .record(vmi, EventType::Warning, "FailedCreate", &message)
                    .await;
                Err(MigrationError::CreatePod(e))
            }
        }
    }

    /// The target pod's CPU placement ([`target_pod::add_cpu_placement`]) from the source
    /// node (read once per target pod) and the source pod; warns with upstream's
    /// `NoSuitableNodesForHostModelMigration` when no other node has what a `host-model`
    /// guest needs (the pod is created anyway and stays Pending, as upstream).
    async fn place_by_cpu(
        &self,
        pod: &mut Pod,
        vmi: &VirtualMachineInstance,
        source: &str,
    ) -> Result<(), MigrationError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node_labels = nodes
            .get(source)
            .await
            .map_err(MigrationError::ReadNode)?
            .metadata
            .labels
            .unwrap_or_default();
        let source_selector = self
            .source_pod(vmi)
            .and_then(|p| p.spec.as_ref().and_then(|s| s.node_selector.clone()))
            .unwrap_or_default();
        let Some(spec) = pod.spec.as_mut() else {
            return Ok(());
        };
        let selector = spec.node_selector.get_or_insert_default();
        target_pod::add_cpu_placement(selector, vmi, &node_labels, &source_selector)
            .map_err(MigrationError::HostModel)?;
        if !target_pod::is_host_model(vmi) {
            return Ok(());
        }
        let required = target_pod::host_model_requirements(selector);
        let others = nodes
            .list(&ListParams::default())
            .await
            .map_err(MigrationError::ReadNode)?;
        let fits = others.items.iter().any(|n| {
            n.metadata.name.as_deref() != Some(source)
                && required
                    .iter()
                    .all(|(k, v)| n.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
        });
        if !fits {
            let message = format!(
                "Migration cannot proceed since no node is suitable to run the required CPU model / required features: {required:?}"
            );
            self.recorder
                .record(
                    vmi,
                    EventType::Warning,
                    "NoSuitableNodesForHostModelMigration",
                    &message,
                )
                .await;
        }
        Ok(())
    }

    async fn patch_vmi(
        &self,
        vmi: &VirtualMachineInstance,
        ops: Vec<Value>,
    ) -> Result<(), kube::Error> {
        let patch = json_patch(ops).map_err(kube::Error::SerdeError)?;
        let ns = vmi.namespace().unwrap_or_default();
        let api: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), &ns);
        api.patch(&vmi.name_any(), &PatchParams::default(), &patch)
            .await
            .map(drop)
    }

    /// The MigrationPolicy for `vmi` ([`policy`]), read from the API server at hand-off (once
    /// per migration).
    async fn matching_policy(
        &self,
        vmi: &VirtualMachineInstance,
    ) -> Result<Option<MigrationPolicy>, MigrationError> {
        let policies = Api::<MigrationPolicy>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(MigrationError::ReadPolicies)?
            .items;
        if policies.is_empty() {
            return Ok(None);
        }
        let namespace = Api::<Namespace>::all(self.client.clone())
            .get(&vmi.namespace().unwrap_or_default())
            .await
            .map_err(MigrationError::ReadPolicies)?;
        let none = std::collections::BTreeMap::new();
        Ok(policy::matching(
            &policies,
            vmi.metadata.labels.as_ref().unwrap_or(&none),
            namespace.metadata.labels.as_ref().unwrap_or(&none),
        )
        .cloned())
    }

    /// Upstream's `handleTargetPodHandoff`: a fresh `migrationState` and the target label.
    async fn hand_off(
        &self,
        m: &VirtualMachineInstanceMigration,
        vmi: &VirtualMachineInstance,
        target: &Pod,
    ) -> Result<(), MigrationError> {
        let Some(target_node) = target.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return Ok(()); // not scheduled yet; the pod's binding re-queues the migration
        };
        let mut configuration = resolved_configuration(self.cluster.borrow().migrations.as_ref());
        let policy = self.matching_policy(vmi).await?;
        if let Some(policy) = &policy {
            configuration = policy::apply(configuration, &policy.spec);
        }
        let state = VirtualMachineInstanceMigrationState {
            migration_configuration: Some(configuration),
            migration_policy_name: policy.and_then(|p| p.metadata.name),
            migration_uid: m.metadata.uid.clone(),
            target_node: Some(target_node.clone()),
            source_node: node_of(vmi).map(str::to_owned),
            target_pod: target.metadata.name.clone(),
            source_pod: self.source_pod(vmi).and_then(|p| p.metadata.name.clone()),
            ..VirtualMachineInstanceMigrationState::default()
        };
        let state = serde_json::to_value(&state).unwrap_or(Value::Null);
        let mut ops = Vec::new();
        match migration_state(vmi) {
            Some(old) => {
                let old = serde_json::to_value(old).unwrap_or(Value::Null);
                ops.push(json!({"op": "test", "path": "/status/migrationState", "value": old}));
                ops.push(
                    json!({"op": "replace", "path": "/status/migrationState", "value": state}),
                );
            }
            None if vmi.status.is_some() => {
                ops.push(json!({"op": "add", "path": "/status/migrationState", "value": state}));
            }
            None => ops
                .push(json!({"op": "add", "path": "/status", "value": {"migrationState": state}})),
        }
        let label = c::MIGRATION_TARGET_NODE_NAME_LABEL;
        if vmi.metadata.labels.is_some() {
            ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", pointer_escape(label)), "value": target_node}));
        } else {
            ops.push(
                json!({"op": "add", "path": "/metadata/labels", "value": {label: target_node}}),
            );
        }
        self.patch_vmi_recorded(
            m,
            vmi,
            ops,
            (
                "SuccessfulHandOver",
                "Migration target pod is ready for preparation by virt-handler.",
            ),
            (
                "FailedHandOver",
                "Failed to set MigrationStat in VMI status. :",
            ),
        )
        .await
    }

    /// Upstream's `handlePostHandoffMigrationCancel`: `abortRequested` for the source handler.
    async fn request_abort(
        &self,
        m: &VirtualMachineInstanceMigration,
        vmi: &VirtualMachineInstance,
    ) -> Result<(), MigrationError> {
        let uid = m.metadata.uid.clone().unwrap_or_default();
        let ops = vec![
            json!({"op": "test", "path": "/status/migrationState/migrationUid", "value": uid}),
            json!({"op": "add", "path": "/status/migrationState/abortRequested", "value": true}),
        ];
        self.patch_vmi_recorded(
            m,
            vmi,
            ops,
            (
                "SuccessfulAbortMigration",
                "Migration is ready to be canceled by virt-handler.",
            ),
            ("FailedAbortMigration", "failed to abort migration: "),
        )
        .await
    }

    /// Patches the VMI and records on the migration `done` (reason, message), or on failure
    /// `failed` (reason, and the message's start, followed by the error chain), as upstream's
    /// hand-over and abort do.
    async fn patch_vmi_recorded(
        &self,
        m: &VirtualMachineInstanceMigration,
        vmi: &VirtualMachineInstance,
        ops: Vec<Value>,
        done: (&str, &str),
        failed: (&str, &str),
    ) -> Result<(), MigrationError> {
        match self.patch_vmi(vmi, ops).await {
            Ok(()) => {
                self.recorder
                    .record(m, EventType::Normal, done.0, done.1)
                    .await;
                Ok(())
            }
            Err(e) => {
                let message = format!("{}{}", failed.1, error_chain(&e));
                self.recorder
                    .record(m, EventType::Warning, failed.0, &message)
                    .await;
                Err(MigrationError::PatchVmi(e))
            }
        }
    }

    /// Writes the decided phase (with its transition timestamp) and conditions, if changed.
    async fn write_status(
        &self,
        m: &VirtualMachineInstanceMigration,
        decision: &Decision,
    ) -> Result<(), MigrationError> {
        let old = m.status.clone().unwrap_or_default();
        let mut status = old.clone();
        if status.phase.as_ref() != Some(&decision.phase) {
            status.phase = Some(decision.phase.clone());
            status.phase_transition_timestamps.push(
                VirtualMachineInstanceMigrationPhaseTransitionTimestamp {
                    phase: Some(decision.phase.clone()),
                    phase_transition_timestamp: Some(now()),
                },
            );
        }
        if decision.abort_condition {
            let mut condition = VirtualMachineInstanceMigrationCondition::new(
                MigrationConditionType::AbortRequested,
                ConditionStatus::True,
            );
            condition.last_probe_time = Some(now());
            status.conditions.push(condition);
        }
        self.patch_status(m, &old, &status).await
    }

    async fn patch_status(
        &self,
        m: &VirtualMachineInstanceMigration,
        old: &VirtualMachineInstanceMigrationStatus,
        new: &VirtualMachineInstanceMigrationStatus,
    ) -> Result<(), MigrationError> {
        if old == new {
            return Ok(());
        }
        let api: Api<VirtualMachineInstanceMigration> =
            Api::namespaced(self.client.clone(), &m.namespace().unwrap_or_default());
        let body = json!({"status": new});
        api.patch_status(&m.name_any(), &PatchParams::default(), &Patch::Merge(body))
            .await
            .map_err(MigrationError::PatchMigration)?;
        if old.phase != new.phase {
            info!(migration = %key_of(m), phase = ?new.phase.as_ref().map(MigrationPhase::as_str), "migration phase changed");
        }
        Ok(())
    }

    /// A final migration: the VMI's migration state copied, a failed migration's target pod
    /// deleted, the finalizer removed.
    async fn finalize(
        &self,
        m: &VirtualMachineInstanceMigration,
        vmi: Option<&VirtualMachineInstance>,
        target: Option<&Pod>,
    ) -> Result<Action, MigrationError> {
        let old = m.status.clone().unwrap_or_default();
        let mut status = old.clone();
        if let Some(vmi) = vmi.filter(|v| handed_off(m, v)) {
            status.migration_state = migration_state(vmi).cloned();
        }
        self.patch_status(m, &old, &status).await?;
        let failed = phase_of(m) == MigrationPhase::Failed;
        let active_on = |pod: &Pod| {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            node.is_some() && vmi.and_then(node_of) == node
        };
        if let Some(pod) =
            target.filter(|p| failed && p.metadata.deletion_timestamp.is_none() && !active_on(p))
        {
            let api: Api<Pod> =
                Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
            match api.delete(&pod.name_any(), &DeleteParams::default()).await {
                Ok(_) => {
                    let message = format!(
                        "migration failed and pod {}/{} is deleted",
                        pod.namespace().unwrap_or_default(),
                        pod.name_any()
                    );
                    self.recorder
                        .record(m, EventType::Normal, "SuccessfulDelete", &message)
                        .await;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    let message =
                        format!("Error deleted migration target pod: {}", error_chain(&e));
                    self.recorder
                        .record(m, EventType::Warning, "FailedDelete", &message)
                        .await;
                    return Err(MigrationError::DeletePod(e));
                }
            }
        }
        let finalizers = m.finalizers();
        if finalizers.iter().any(|f| f == c::MIGRATION_FINALIZER) {
            let kept: Vec<&String> = finalizers
                .iter()
                .filter(|f| *f != c::MIGRATION_FINALIZER)
                .collect();
            let ops = vec![
                json!({"op": "test", "path": "/metadata/finalizers", "value": finalizers}),
                json!({"op": "replace", "path": "/metadata/finalizers", "value": kept}),
            ];
            let patch = json_patch(ops)
                .map_err(|e| MigrationError::PatchMigration(kube::Error::SerdeError(e)))?;
            let api: Api<VirtualMachineInstanceMigration> =
                Api::namespaced(self.client.clone(), &m.namespace().unwrap_or_default());
            match api
                .patch(&m.name_any(), &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(MigrationError::PatchMigration(e)),
            }
        }
        self.collect_finished(m).await?;
        Ok(Action::Done)
    }

    /// Deletes the VMI's finished migrations beyond the newest five, with the pods they
    /// left ([`gc`]).
    async fn collect_finished(
        &self,
        m: &VirtualMachineInstanceMigration,
    ) -> Result<(), MigrationError> {
        let (Some(ns), Some(vmi)) = (m.namespace(), m.spec.vmi_name.as_deref()) else {
            return Ok(());
        };
        let all = self.migrations.store().state();
        for old in gc::to_collect(&all, &ns, vmi) {
            if let Some(pod) = &old.pod {
                let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
                match pods.delete(pod, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(MigrationError::DeletePod(e)),
                }
            }
            let api: Api<VirtualMachineInstanceMigration> =
                Api::namespaced(self.client.clone(), &ns);
            match api.delete(&old.migration, &DeleteParams::default()).await {
                Ok(_) => {
                    info!(migration = %format!("{ns}/{}", old.migration), "garbage-collected a finished migration")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(MigrationError::PatchMigration(e)),
            }
        }
        Ok(())
    }
}

impl Reconciler for MigrationReconciler {
    type Error = MigrationError;

    async fn reconcile(&self, key: &str) -> Result<Action, MigrationError> {
        self.reconcile_migration(key).await
    }
}

/// The keys of the migrations of VMI `ns/name`.
fn migrations_of(
    migrations: &InformerHandle<VirtualMachineInstanceMigration>,
    ns: Option<&str>,
    name: &str,
) -> Vec<String> {
    migrations
        .store()
        .state()
        .iter()
        .filter(|m| {
            m.metadata.namespace.as_deref() == ns && m.spec.vmi_name.as_deref() == Some(name)
        })
        .map(|m| key_of(m.as_ref()))
        .collect()
}

/// The key of the migration whose UID the pod's `kubevirt.io/migrationJobUID` names.
fn migration_of_pod(
    migrations: &InformerHandle<VirtualMachineInstanceMigration>,
    pod: &Pod,
) -> Option<String> {
    let uid = pod.labels().get(c::MIGRATION_JOB_LABEL)?;
    migrations
        .store()
        .state()
        .iter()
        .find(|m| m.metadata.uid.as_ref() == Some(uid))
        .map(|m| key_of(m.as_ref()))
}

/// Runs the migration controller until `cancel` fires.
pub async fn run_migration_controller(
    client: Client,
    launcher: LauncherPodConfig,
    cluster: watch::Receiver<ClusterSettings>,
    metrics: &Metrics,
    cancel: CancellationToken,
) {
    let queue =
        WorkQueue::with_config(RateLimiterConfig::default(), metrics.controller(QUEUE_NAME));
    let pod_expectations = Arc::new(Expectations::new());
    let mut migration_informer = Informer::<VirtualMachineInstanceMigration>::new();
    migration_informer.enqueue(queue.clone(), |m: &VirtualMachineInstanceMigration| {
        Some(key_of(m))
    });
    let migrations = migration_informer.handle();
    metrics.add_collector(self::metrics::MigrationCollector::new(migrations.clone()));
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    let (q, cache) = (queue.clone(), migrations.clone());
    vmi_informer.on_change(move |change| {
        let vmi = change.object();
        let ns = vmi.metadata.namespace.as_deref();
        for key in migrations_of(&cache, ns, &vmi.name_any()) {
            q.add(key);
        }
    });
    let mut pod_informer = Informer::<Pod>::new();
    let (q, cache, exp) = (
        queue.clone(),
        migrations.clone(),
        Arc::clone(&pod_expectations),
    );
    pod_informer.on_change(move |change| {
        let Some(key) = migration_of_pod(&cache, change.object()) else {
            return;
        };
        if let Change::Added(_) = change {
            exp.creation_observed(&key);
        }
        q.add(key);
    });
    let (vmis, pods) = (vmi_informer.handle(), pod_informer.handle());
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(migration_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(vmi_informer.run(Api::all(client.clone()), watcher::Config::default()));
    let selector = format!("{}={}", c::APP_LABEL, c::VIRT_LAUNCHER_VALUE);
    tasks.spawn(pod_informer.run(
        Api::all(client.clone()),
        watcher::Config::default().labels(&selector),
    ));
    let synced = async {
        migrations.wait_for_sync().await?;
        vmis.wait_for_sync().await?;
        pods.wait_for_sync().await
    };
    tokio::select! {
        () = cancel.cancelled() => { tasks.abort_all(); return; }
        res = synced => if res.is_err() { tasks.abort_all(); return; },
    }
    let reconciler = MigrationReconciler {
        recorder: Arc::new(EventRecorder::new(
            client.clone(),
            crate::vm::EVENT_COMPONENT,
        )),
        client,
        migrations,
        vmis,
        pods,
        pod_expectations,
        launcher,
        cluster,
    };
    let panics = Controller::new(QUEUE_NAME, queue, reconciler)
        .workers(3)
        .run(cancel)
        .await;
    if panics > 0 {
        error!(panics, "migration controller workers panicked");
    }
    tasks.abort_all();
}

#[cfg(test)]
mod tests;
