//! The VMI controller: creates the virt-launcher pod of every VMI, derives the VMI's early
//! phases and conditions from that pod, and keeps selected VMI labels and annotations on it.
//!
//! Data flow: informers on VMIs and on launcher pods (`kubevirt.io=virt-launcher`; a pod is
//! mapped to its VMI through its controller reference) feed the queue
//! `virt-controller-vmi`; a VM cache (no events) tells whether a final VMI's owner still
//! exists. A reconcile reads the VMI and its pods from the caches, waits while
//! pod or VMI expectations are unmet, then runs [`sync`] (create or delete pods) and
//! [`status`] (phase table, conditions), syncs labels/annotations to the pod
//! ([`label_sync`]), and writes the VMI with one JSON Patch — only when something changed.
//! The launcher pod itself is rendered by [`template`].
//!
//! # Who writes what on a VMI
//!
//! The VMI CRD has no status subresource; every writer JSON-patches the object itself and
//! guards what it replaces with `test` operations, so a lost race fails and is retried from a
//! fresh cache instead of overwriting the other writer.
//!
//! | field | this controller | virt-handler |
//! |---|---|---|
//! | `status.phase` | `""` → `Pending` → `Scheduling` → `Scheduled`; → `Failed` when the pod fails or disappears (also from `Scheduled`/`Running`); `WaitingForSync` ↔ `Scheduling` | `Scheduled` → `Running` → `Succeeded`/`Failed` |
//! | `status.phaseTransitionTimestamps` | appends (`add …/-`) for its own transitions before hand-off | appends for its own |
//! | conditions `Ready`, `PodScheduled`, `EvictionRequested` | owns | — |
//! | condition `Synchronized` | owns, before hand-off only | — |
//! | other conditions (`Paused`, `AgentConnected`, `LiveMigratable`, …) | never touches (the list is replaced with a `test` of the old list) | owns |
//! | `status.activePods`, `launcherContainerImageVersion`, `qosClass`, `nodeName`, `migrationTransport` | owns (`nodeName` and `migrationTransport` only at the `Scheduled` transition) | reads |
//! | `status.interfaces`, `guestOSInfo`, `volumeStatus`, `migrationState`, … | never touches | owns |
//! | labels `kubevirt.io/nodeName`, `kubevirt.io/outdatedLauncherImage` | owns | reads (selects its VMIs by node) |
//! | finalizers `kubevirt.io/foregroundDeleteVirtualMachine` | removes when final and podless | — |
//!
//! The migration controller ([`crate::migration`]) writes a fresh `migrationState` and the
//! label `kubevirt.io/migrationTargetNodeName` at a migration's hand-off, and
//! `migrationState.abortRequested`; the target node's handler then moves `nodeName` and the
//! label `kubevirt.io/nodeName` to its node once the guest runs there (as upstream). Migration
//! target pods are controlled by the VMI too: they appear in `activePods`, and the launcher pod
//! this controller follows is the newest on `status.nodeName`.
//!
//! "Hand-off" is the VMI being read in phase `Scheduled` or `Running`: from then on this
//! controller patches only `conditions`, `activePods`, `phase`, `launcherContainerImageVersion`,
//! labels and finalizers, each with a `test` of the value it read.
//!
//! # Run-time sync patterns
//!
//! The additional label/annotation patterns ([`MetadataSyncPatterns`]) come through a
//! [`tokio::sync::watch::Receiver`]: every reconcile reads the current value, and a change
//! re-queues every cached VMI, so reconfiguring them (say, from the KubeVirt CR's
//! `customizeComponents.flags.controller`, see [`crate::kubevirt_config`]) needs no restart.
//! The VM controller reads the same value: one channel serves both.

pub mod hotplug;
pub mod label_sync;
pub mod metrics;
pub mod network;
pub mod status;
pub mod sync;
pub mod template;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use kubevirt_api::constants as c;
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::kubevirt_config::ClusterSettings;
use crate::runtime::controller::{Action, Controller, ControllerError, Reconciler};
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::expectations::Expectations;
use crate::runtime::informer::{Change, Informer, InformerHandle};
use crate::runtime::metrics::Metrics;
use crate::runtime::queue::{RateLimiterConfig, WorkQueue};
use crate::runtime::{json_patch, key_of, lost_race};
use crate::sync_failure::SyncFailure;
use crate::vm::EVENT_COMPONENT;
use status::Observed;
use template::LauncherPodConfig;

/// Name of the VMI controller's queue (as upstream).
pub const QUEUE_NAME: &str = "virt-controller-vmi";
/// How long a key with unmet expectations waits before it is looked at again.
pub const EXPECTATIONS_RECHECK: Duration = Duration::from_secs(5 * 60);

/// The additional sync patterns of `--additional-launcher-labels-sync` and
/// `--additional-launcher-annotations-sync` (each controller adds its built-in keys). The VM
/// controller's type, so one `watch` channel feeds both controllers.
use crate::metadata_sync::MetadataSyncPatterns;

/// Configuration of [`run_vmi_controller`].
#[derive(Clone, Debug)]
pub struct VmiControllerConfig {
    /// How launcher pods are built.
    pub launcher: LauncherPodConfig,
    /// The current sync patterns; changes take effect at once (see the module docs).
    pub sync_patterns: watch::Receiver<MetadataSyncPatterns>,
    /// Concurrent workers (upstream `--vmi-controller-threads`, default 10).
    pub workers: usize,
    /// The KubeVirt CR's settings; new launcher pods take its `cpuAllocationRatio`.
    pub cluster: watch::Receiver<ClusterSettings>,
}

impl VmiControllerConfig {
    /// Default launcher config, fixed empty patterns, 10 workers.
    pub fn new(
        launcher: LauncherPodConfig,
        sync_patterns: watch::Receiver<MetadataSyncPatterns>,
    ) -> Self {
        let (_, cluster) = watch::channel(ClusterSettings::default());
        Self {
            launcher,
            sync_patterns,
            workers: 10,
            cluster,
        }
    }
}

/// Why one reconcile of a VMI failed.
#[derive(Debug, thiserror::Error)]
pub enum VmiError {
    /// Creating or deleting pods failed, or the pod could not be rendered.
    #[error("{}", .0.message)]
    Sync(SyncFailure),
    /// The status pass refused the VMI.
    #[error(transparent)]
    Status(#[from] status::StatusError),
    /// Writing the VMI failed.
    #[error("patching of vmi conditions and activePods failed")]
    PatchVmi(#[source] kube::Error),
    /// Patching the launcher pod's labels, annotations or readiness condition failed.
    #[error("error syncing annotations and labels to pod")]
    PatchPod(#[source] kube::Error),
}

impl ControllerError for VmiError {
    fn reason(&self) -> &str {
        match self {
            VmiError::Sync(f) => &f.reason,
            VmiError::Status(e) => e.reason(),
            VmiError::PatchVmi(_) => "FailedPatchVMI",
            VmiError::PatchPod(_) => "FailedPodPatch",
        }
    }
}

/// Everything a reconcile needs; shared by the workers.
pub struct VmiReconciler {
    client: Client,
    vmis: InformerHandle<VirtualMachineInstance>,
    pods: InformerHandle<Pod>,
    vms: InformerHandle<VirtualMachine>,
    claims: InformerHandle<PersistentVolumeClaim>,
    data_volumes: InformerHandle<kubevirt_api::cdi::DataVolume>,
    pod_expectations: Arc<Expectations>,
    vmi_expectations: Arc<Expectations>,
    launcher: LauncherPodConfig,
    patterns: watch::Receiver<MetadataSyncPatterns>,
    cluster: watch::Receiver<ClusterSettings>,
    recorder: Arc<EventRecorder>,
}

/// The VMI's pods, in one pass over the cache: those whose controller reference is the VMI
/// (launcher pods), and the attachment pods whose `kubevirt.io/owner-vmi-uid` names it.
fn vmi_pods(
    pods: &InformerHandle<Pod>,
    vmi: &VirtualMachineInstance,
) -> (Vec<Arc<Pod>>, Vec<Arc<Pod>>) {
    let uid = vmi.metadata.uid.as_deref();
    let ns = vmi.metadata.namespace.as_deref();
    let mut controlled = Vec::new();
    let mut attachments = Vec::new();
    for pod in pods.store().state() {
        if pod.metadata.namespace.as_deref() != ns || uid.is_none() {
            continue;
        }
        let controls = pod
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid);
        if controls {
            controlled.push(pod);
        } else if pod
            .annotations()
            .get(c::OWNER_VMI_UID_ANNOTATION)
            .map(String::as_str)
            == uid
        {
            attachments.push(pod);
        }
    }
    (controlled, attachments)
}

/// Upstream's `hasOwnerVM`: the VMI's controller reference is a `VirtualMachine` found in the
/// VM cache under its name with the referenced UID.
pub fn has_owner_vm(
    vmi: &VirtualMachineInstance,
    cached_vm: impl Fn(&str) -> Option<Arc<VirtualMachine>>,
) -> bool {
    let Some(owner) = vmi
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    else {
        return false;
    };
    let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
    owner.kind == "VirtualMachine"
        && cached_vm(&format!("{ns}/{}", owner.name))
            .is_some_and(|vm| vm.metadata.uid.as_deref() == Some(owner.uid.as_str()))
}

/// The newest controlled pod, restricted to `status.nodeName` when that is set.
fn current_pod<'a>(vmi: &VirtualMachineInstance, pods: &[&'a Pod]) -> Option<&'a Pod> {
    let node = vmi.status.as_ref().and_then(|s| s.node_name.as_deref());
    pods.iter()
        .copied()
        .filter(|p| node.is_none() || p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == node)
        .max_by(|a, b| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b))
        })
}

/// Now, truncated to whole seconds (the precision of Kubernetes timestamps), so a value we
/// write reads back equal and a later `test` of it succeeds.
fn now_seconds() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// The launcher configuration with the KubeVirt CR's CPU allocation ratio, when it sets a
/// positive one, and its `developerConfiguration.useEmulation`, when set (upstream reads
/// both from the CR, not from flags).
pub(crate) fn effective_launcher(
    base: &LauncherPodConfig,
    cluster: &ClusterSettings,
) -> LauncherPodConfig {
    let mut launcher = base.clone();
    if let Some(emulation) = cluster.use_emulation {
        launcher.use_emulation = emulation;
    }
    if let Some(ratio) = cluster
        .cpu_allocation_ratio
        .and_then(|r| u32::try_from(r).ok())
        .filter(|r| *r > 0)
    {
        launcher.cpu_allocation_ratio = ratio;
    }
    launcher
        .cluster_skip_backup_hooks
        .clone_from(&cluster.skip_backup_hooks);
    launcher
}

impl VmiReconciler {
    async fn reconcile_vmi(&self, key: &str) -> Result<Action, VmiError> {
        let Some(vmi) = self.vmis.get_by_key(key) else {
            self.pod_expectations.delete_expectations(key);
            self.vmi_expectations.delete_expectations(key);
            return Ok(Action::Done);
        };
        if !self.pod_expectations.satisfied(key) || !self.vmi_expectations.satisfied(key) {
            return Ok(Action::RequeueAfter(EXPECTATIONS_RECHECK));
        }
        let patterns = self.patterns.borrow().clone();
        let (owned, attachments) = vmi_pods(&self.pods, &vmi);
        let mut pods: Vec<&Pod> = owned.iter().map(AsRef::as_ref).collect();
        let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
        let pods_api: Api<Pod> = Api::namespaced(self.client.clone(), ns);

        let claim_state = |claim: &str| {
            let pvc = self.claims.get_by_key(claim)?;
            let dv = sync::controlling_data_volume(&pvc).and_then(|name| {
                self.data_volumes
                    .get(pvc.metadata.namespace.as_deref(), name)
            });
            Some(sync::claim_readiness(&pvc, dv.as_deref()))
        };
        let plan = sync::plan(&vmi, &pods, current_pod(&vmi, &pods), claim_state);
        let launcher = effective_launcher(&self.launcher, &self.cluster.borrow());
        let claim_volumes = claim_volume_status(&vmi, |key| self.claims.get_by_key(key));
        // A new pod renders each claim as its volume mode says (a Block claim is a device),
        // from the claim details this pass writes into the volume status.
        let to_render = matches!(plan, sync::SyncPlan::CreatePod)
            .then(|| template::with_claim_info(&vmi, &claim_volumes));
        let synced = sync::execute(
            &pods_api,
            &self.pod_expectations,
            key,
            to_render.as_ref().unwrap_or(&vmi),
            plan,
            &launcher,
            &self.recorder,
        )
        .await;
        let (created, sync_failure) = match synced {
            Ok(created) => (created, None),
            Err(failure) => (None, Some(failure)),
        };
        if let Some(created) = created.as_ref() {
            pods.push(created);
        }
        let pod = current_pod(&vmi, &pods);
        let now = now_seconds();
        let attachments: Vec<&Pod> = attachments.iter().map(AsRef::as_ref).collect();
        let hotplug_failure = self
            .sync_hotplug(key, &vmi, &pods_api, &pods, pod, &attachments, &launcher)
            .await
            .err();
        let sync_failure = sync_failure.or(hotplug_failure);
        let hotplug_status = match pod.filter(|_| status::phase_is_running(&vmi)) {
            Some(launcher_pod) => Some(
                self.hotplug_volume_status(&vmi, launcher_pod, &attachments, &claim_volumes)
                    .await,
            ),
            None => None,
        };
        let observed = Observed {
            pod,
            pods: &pods,
            sync_failure: sync_failure.as_ref(),
            launcher_image: &self.launcher.launcher_image,
            owner_vm_exists: has_owner_vm(&vmi, |key| self.vms.get_by_key(key)),
            now: &now,
            claim_volumes: &claim_volumes,
            hotplug_volume_status: hotplug_status.as_deref(),
        };
        let (mut desired, status_failure) = status::desired_vmi(&vmi, &observed)?;
        self.set_data_volumes_ready(&mut desired, &now);
        let hints_failure = self.add_topology_hints(&vmi, &mut desired).await;
        let status_failure = status_failure.or(hints_failure);
        // As upstream: whenever a launcher pod exists, whatever its state.
        if let Some(pod) = pod.filter(|p| p.metadata.uid.is_some()) {
            let skip_hooks = launcher.cluster_skip_backup_hooks.as_deref();
            self.sync_pod(&pods_api, &desired, pod, &patterns, skip_hooks, &now)
                .await?;
            if status::phase_is_running(&vmi)
                && let Some(patch) = network::pod_networks_patch(&vmi, pod)
            {
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                pods_api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| {
                        VmiError::Sync(SyncFailure::new(
                            "HotPlugNetworkInterfaceError",
                            format!("failed to update the pod's network annotation: {e}"),
                        ))
                    })?;
            }
        }
        self.write_vmi(key, &vmi, &desired).await?;
        match status_failure.or(sync_failure) {
            // Upstream's informal error: the claim's appearance re-queues the VMI.
            Some(f) if f.reason == sync::FAILED_PVC_NOT_FOUND => Ok(Action::Done),
            Some(f) => Err(VmiError::Sync(f)),
            None => Ok(Action::Done),
        }
    }

    /// Upstream's `addTopologyHints`: a new VMI (`Pending` or `WaitingForSync`) that needs a
    /// TSC frequency gets `status.topologyHints` before its pod ([`crate::topology`]), from
    /// the nodes that report a frequency (listed only for such a VMI); a guest that needs it
    /// to boot and cannot have it gets upstream's Warning event and a sync failure.
    async fn add_topology_hints(
        &self,
        vmi: &VirtualMachineInstance,
        desired: &mut VirtualMachineInstance,
    ) -> Option<SyncFailure> {
        use kubevirt_api::v1::VirtualMachineInstancePhase as P;
        let unprocessed = desired
            .status
            .as_ref()
            .is_some_and(|s| matches!(s.phase, Some(P::Pending | P::WaitingForSync)));
        if !unprocessed || !crate::topology::awaits_hints(vmi) {
            return None;
        }
        let configured = self.cluster.borrow().minimum_cluster_tsc_frequency;
        let hints = match self.tsc_cluster().await {
            Ok((nodes, vmis)) => {
                let empty = std::collections::BTreeMap::new();
                let cluster = crate::topology::ClusterTsc {
                    nodes: nodes
                        .iter()
                        .map(|n| {
                            (
                                n.metadata.name.as_deref().unwrap_or_default(),
                                n.metadata.labels.as_ref().unwrap_or(&empty),
                            )
                        })
                        .collect(),
                    vmis: &vmis,
                };
                crate::topology::hints_for(vmi, configured, &cluster)
            }
            Err(e) => Err(format!("failed to list the nodes: {e}")),
        };
        match hints {
            Ok(hints) => {
                desired.status.get_or_insert_default().topology_hints = hints;
                None
            }
            Err(message)
                if crate::topology::tsc_requirement(vmi)
                    == crate::topology::TscRequirement::RequiredForBoot =>
            {
                self.recorder
                    .record(
                        vmi,
                        EventType::Warning,
                        crate::topology::FAILED_GATHERING_HINTS,
                        &message,
                    )
                    .await;
                Some(SyncFailure::new(
                    crate::topology::FAILED_GATHERING_HINTS,
                    message,
                ))
            }
            Err(_) => None,
        }
    }

    /// The nodes that report a TSC frequency and every VMI, for the topology hints.
    async fn tsc_cluster(
        &self,
    ) -> Result<
        (
            Vec<k8s_openapi::api::core::v1::Node>,
            Vec<VirtualMachineInstance>,
        ),
        kube::Error,
    > {
        use k8s_openapi::api::core::v1::Node;
        let params = kube::api::ListParams::default().labels(crate::topology::TSC_FREQUENCY_LABEL);
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&params)
            .await?
            .items;
        let vmis: Vec<VirtualMachineInstance> = self
            .vmis
            .store()
            .state()
            .iter()
            .map(|v| (**v).clone())
            .collect();
        Ok((nodes, vmis))
    }

    /// Upstream's `DataVolumesReady` condition from the cached DataVolumes of the VMI's
    /// `dataVolume` volumes (replaced only when its status or reason change; untouched when
    /// the VMI has none).
    fn set_data_volumes_ready(&self, vmi: &mut VirtualMachineInstance, now: &Time) {
        let ns = vmi.metadata.namespace.clone();
        let dvs: Vec<kubevirt_api::cdi::DataVolume> = vmi
            .spec
            .volumes
            .iter()
            .filter_map(|v| v.volume_source.data_volume.as_ref())
            .filter_map(|d| self.data_volumes.get(ns.as_deref(), &d.name))
            .map(|dv| (*dv).clone())
            .collect();
        let Some((status, reason, message)) = sync::data_volumes_ready(&dvs) else {
            return;
        };
        let conditions = &mut vmi.status.get_or_insert_with(Default::default).conditions;
        let type_ = kubevirt_api::v1::VirtualMachineInstanceConditionType::DataVolumesReady;
        let new = kubevirt_api::v1::VirtualMachineInstanceCondition {
            type_: type_.clone(),
            status: status.into(),
            last_probe_time: None,
            last_transition_time: Some(now.clone()),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
        };
        match conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(old) if old.status == new.status && old.reason == new.reason => {}
            Some(old) => *old = new,
            None => conditions.push(new),
        }
    }

    /// The running VMI's volume status with its hotplug volumes walked on
    /// ([`hotplug::update_volume_status`]), recording upstream's events for the transitions.
    async fn hotplug_volume_status(
        &self,
        vmi: &VirtualMachineInstance,
        launcher_pod: &Pod,
        attachments: &[&Pod],
        claim_volumes: &[kubevirt_api::v1::VolumeStatus],
    ) -> Vec<kubevirt_api::v1::VolumeStatus> {
        let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
        let old = vmi
            .status
            .as_ref()
            .map_or(&[][..], |s| s.volume_status.as_slice());
        let mut statuses = old.to_vec();
        let attached = hotplug::attachment_pods(attachments, launcher_pod);
        let claims: Vec<Arc<PersistentVolumeClaim>> = vmi
            .spec
            .volumes
            .iter()
            .filter_map(|v| v.volume_source.claim_name())
            .filter_map(|claim| self.claims.get_by_key(&format!("{ns}/{claim}")))
            .collect();
        let lookup = |name: &str| {
            claims
                .iter()
                .map(AsRef::as_ref)
                .find(|c| c.metadata.name.as_deref() == Some(name))
        };
        hotplug::update_volume_status(
            vmi,
            &mut statuses,
            launcher_pod,
            &attached,
            claim_volumes,
            lookup,
        );
        for (reason, message) in hotplug::status_events(old, &statuses) {
            self.recorder
                .record(vmi, EventType::Normal, reason, &message)
                .await;
        }
        statuses
    }

    /// Upstream's hotplug steps of `sync` (reference §3.2 steps 2, 3 and 7): a final VMI's
    /// attachment pods go; so do those of finished launcher pods; and with a ready launcher
    /// pod that is not being deleted the attachment pods follow the ready hotplug volumes.
    #[allow(clippy::too_many_arguments)]
    async fn sync_hotplug(
        &self,
        key: &str,
        vmi: &VirtualMachineInstance,
        pods_api: &Api<Pod>,
        controlled: &[&Pod],
        launcher_pod: Option<&Pod>,
        attachments: &[&Pod],
        launcher: &LauncherPodConfig,
    ) -> Result<(), SyncFailure> {
        if vmi.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let final_vmi = status::phase_is_final(vmi);
        if final_vmi {
            if let Some(pod) = launcher_pod {
                let doomed = hotplug::attachment_pods(attachments, pod);
                self.delete_attachment_pods(key, vmi, pods_api, &doomed)
                    .await
                    .map_err(|e| SyncFailure::new(hotplug::FAILED_HOTPLUG_SYNC, e))?;
            }
            return Ok(());
        }
        for finished in controlled.iter().filter(|p| status::pod_is_down(p)) {
            let doomed = hotplug::attachment_pods(attachments, finished);
            if let Err(e) = self
                .delete_attachment_pods(key, vmi, pods_api, &doomed)
                .await
            {
                tracing::warn!(vmi = key, error = %e, "deleting the attachment pods of a finished launcher pod");
            }
        }
        let Some(pod) = launcher_pod
            .filter(|p| status::pod_is_ready(p) && p.metadata.deletion_timestamp.is_none())
        else {
            return Ok(());
        };
        let attached = hotplug::attachment_pods(attachments, pod);
        let hotplug_volumes = hotplug::hotplug_volumes(vmi, pod);
        if hotplug_volumes.is_empty() && attached.is_empty() {
            return Ok(());
        }
        let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
        let ready: Vec<&kubevirt_api::v1::Volume> = hotplug_volumes
            .into_iter()
            .filter(|v| {
                let claim = v.volume_source.claim_name().unwrap_or_default();
                let cached = self.claims.get_by_key(&format!("{ns}/{claim}"));
                hotplug::claim_ready(cached.as_deref())
            })
            .collect();
        let plan = hotplug::plan(vmi, &ready, &attached);
        if !plan.create.is_empty() {
            let template =
                hotplug::render_attachment_pod(vmi, pod, &plan.create, &launcher.launcher_image);
            self.pod_expectations.expect_creations(key, 1);
            match pods_api.create(&PostParams::default(), &template).await {
                Ok(created) => {
                    let name = created.metadata.name.unwrap_or_default();
                    tracing::info!(vmi = key, pod = %name, "created attachment pod");
                    self.recorder
                        .record(
                            vmi,
                            EventType::Normal,
                            hotplug::SUCCESSFUL_CREATE_POD,
                            &format!("Created attachment pod {name}"),
                        )
                        .await;
                }
                Err(e) => {
                    self.pod_expectations.creation_observed(key);
                    self.recorder
                        .record(
                            vmi,
                            EventType::Warning,
                            hotplug::FAILED_CREATE_POD,
                            &format!("Error creating attachment pod: {e}"),
                        )
                        .await;
                    return Err(SyncFailure::new(
                        hotplug::FAILED_CREATE_POD,
                        format!("Error creating attachment pod {e}"),
                    ));
                }
            }
        }
        let doomed: Vec<&Pod> = attached
            .iter()
            .copied()
            .filter(|p| {
                plan.delete
                    .iter()
                    .any(|d| p.metadata.name.as_ref() == Some(d))
            })
            .collect();
        self.delete_attachment_pods(key, vmi, pods_api, &doomed)
            .await
            .map_err(|e| {
                SyncFailure::new(
                    hotplug::FAILED_DELETE_POD,
                    format!("Error deleting attachment pod {e}"),
                )
            })
    }

    /// Deletes `pods` (attachment pods) with grace 0, skipping those already being deleted;
    /// events as upstream.
    async fn delete_attachment_pods(
        &self,
        key: &str,
        vmi: &VirtualMachineInstance,
        pods_api: &Api<Pod>,
        pods: &[&Pod],
    ) -> Result<(), String> {
        for pod in pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
        {
            let name = pod.name_any();
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            let pod_key = key_of(*pod);
            self.pod_expectations
                .expect_deletions(key, std::slice::from_ref(&pod_key));
            match pods_api.delete(&name, &params).await {
                Ok(_) => {
                    self.recorder
                        .record(
                            vmi,
                            EventType::Normal,
                            hotplug::SUCCESSFUL_DELETE_POD,
                            &format!("Deleted attachment pod {name}"),
                        )
                        .await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    self.pod_expectations.deletion_observed(key, &pod_key);
                }
                Err(e) => {
                    self.pod_expectations.deletion_observed(key, &pod_key);
                    self.recorder
                        .record(
                            vmi,
                            EventType::Warning,
                            hotplug::FAILED_DELETE_POD,
                            &format!("Failed to delete attachment pod {name}"),
                        )
                        .await;
                    return Err(e.to_string());
                }
            }
        }
        Ok(())
    }

    /// Pod-side updates: the unpaused readiness condition, then the label/annotation sync.
    async fn sync_pod(
        &self,
        pods_api: &Api<Pod>,
        vmi: &VirtualMachineInstance,
        pod: &Pod,
        patterns: &MetadataSyncPatterns,
        cluster_skip_backup_hooks: Option<&str>,
        now: &Time,
    ) -> Result<(), VmiError> {
        let name = pod.name_any();
        if let Some(condition) = unpaused_condition(vmi, pod, now) {
            let body = json!({"status": {"conditions": [condition]}});
            pods_api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(body))
                .await
                .map_err(VmiError::PatchPod)?;
        }
        let empty = BTreeMap::new();
        let labels = vmi.metadata.labels.as_ref().unwrap_or(&empty);
        let ops = label_sync::pod_sync_ops(vmi, labels, pod, patterns, cluster_skip_backup_hooks);
        if ops.is_empty() {
            return Ok(());
        }
        let patch = json_patch(ops).map_err(|e| VmiError::PatchPod(kube::Error::SerdeError(e)))?;
        pods_api
            .patch(&name, &PatchParams::default(), &patch)
            .await
            .map_err(VmiError::PatchPod)?;
        Ok(())
    }

    /// Writes `desired` over `old` when anything changed, with VMI expectations around it.
    async fn write_vmi(
        &self,
        key: &str,
        old: &VirtualMachineInstance,
        desired: &VirtualMachineInstance,
    ) -> Result<(), VmiError> {
        let ops = status::vmi_patch(old, desired);
        if ops.is_empty() {
            return Ok(());
        }
        tracing::debug!(vmi = key, ops = %serde_json::Value::Array(ops.clone()), "patching the VMI");
        let patch = json_patch(ops).map_err(|e| VmiError::PatchVmi(kube::Error::SerdeError(e)))?;
        let ns = old.metadata.namespace.as_deref().unwrap_or_default();
        let api: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), ns);
        self.vmi_expectations.set_expectations(key, 1, 0);
        match api
            .patch(&old.name_any(), &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => Ok(()),
            // Our cache is behind: the newer VMI is on its way through the watch, and its
            // arrival reconciles again. A retry now would read the same stale VMI and fail
            // the same way (the burst of conflicts the write figures showed).
            Err(kube::Error::Api(e)) if lost_race(&e) => {
                self.vmi_expectations.set_expectations(key, 0, 0);
                tracing::debug!(vmi = key, reason = %e.message, "VMI patch lost a race; waiting for the newer VMI");
                Ok(())
            }
            Err(err) => {
                self.vmi_expectations.set_expectations(key, 0, 0);
                Err(VmiError::PatchVmi(err))
            }
        }
    }
}

/// The pod condition `kubevirt.io/virtual-machine-unpaused` to write, if it must change:
/// False/`Paused` while the VMI is paused, True/`NotPaused` otherwise.
fn unpaused_condition(vmi: &VirtualMachineInstance, pod: &Pod, now: &Time) -> Option<Value> {
    let paused = vmi.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.is_true(&kubevirt_api::v1::VirtualMachineInstanceConditionType::Paused))
    });
    let current = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.type_ == c::VIRTUAL_MACHINE_UNPAUSED_READINESS_GATE)
        })
        .map(|c| c.status.as_str());
    let (status, reason, message) = match (paused, current) {
        (true, Some("True")) => ("False", "Paused", "the virtual machine is paused"),
        (false, Some("True")) | (true, _) => return None,
        (false, _) => ("True", "NotPaused", "the virtual machine is not paused"),
    };
    Some(json!({
        "type": c::VIRTUAL_MACHINE_UNPAUSED_READINESS_GATE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }))
}

impl Reconciler for VmiReconciler {
    type Error = VmiError;

    async fn reconcile(&self, key: &str) -> Result<Action, VmiError> {
        self.reconcile_vmi(key).await
    }
}

/// The VMI key of a pod: its controller reference when that is a VMI; for an attachment pod
/// (controlled by a launcher pod) the VMI its annotations name.
fn vmi_key_of_pod(pod: &Pod) -> Option<String> {
    let controller = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    match controller.kind.as_str() {
        "VirtualMachineInstance" => Some(format!("{ns}/{}", controller.name)),
        "Pod" => pod
            .annotations()
            .get(c::OWNER_VMI_NAME_ANNOTATION)
            .map(|name| format!("{ns}/{name}")),
        _ => None,
    }
}

/// Wires the informers' handlers to the queue and the expectations.
fn register_handlers(
    vmis: &mut Informer<VirtualMachineInstance>,
    pods: &mut Informer<Pod>,
    queue: &WorkQueue<String>,
    pod_expectations: &Arc<Expectations>,
    vmi_expectations: &Arc<Expectations>,
) {
    let (q, exp) = (queue.clone(), Arc::clone(vmi_expectations));
    vmis.on_change(move |change| {
        let key = key_of(change.object());
        exp.set_expectations(&key, 0, 0);
        q.add(key);
    });
    let (q, exp) = (queue.clone(), Arc::clone(pod_expectations));
    pods.on_change(move |change| match change {
        Change::Added(pod) => {
            if let Some(key) = vmi_key_of_pod(pod) {
                if pod.metadata.deletion_timestamp.is_some() {
                    exp.deletion_observed(&key, &key_of(*pod));
                } else {
                    exp.creation_observed(&key);
                }
                q.add(key);
            }
        }
        Change::Updated { old, new } => {
            let keys = [vmi_key_of_pod(old), vmi_key_of_pod(new)];
            if new.metadata.deletion_timestamp.is_some()
                && old.metadata.deletion_timestamp.is_none()
                && let Some(key) = &keys[1]
            {
                exp.deletion_observed(key, &key_of(*new));
            }
            let mut keys: Vec<String> = keys.into_iter().flatten().collect();
            keys.dedup();
            keys.into_iter().for_each(|k| q.add(k));
        }
        Change::Deleted(pod) => {
            if let Some(key) = vmi_key_of_pod(pod) {
                exp.deletion_observed(&key, &key_of(*pod));
                q.add(key);
            }
        }
    });
}

/// Runs the VMI controller until `cancel` fires.
///
/// Starts the VMI and launcher-pod informers, waits for their first list, then runs
/// `config.workers` workers. A change of `config.sync_patterns` re-queues every cached VMI.
pub async fn run_vmi_controller(
    client: Client,
    config: VmiControllerConfig,
    metrics: &Metrics,
    cancel: CancellationToken,
) {
    let queue =
        WorkQueue::with_config(RateLimiterConfig::default(), metrics.controller(QUEUE_NAME));
    let pod_expectations = Arc::new(Expectations::new());
    let vmi_expectations = Arc::new(Expectations::new());
    let mut vmi_informer = Informer::<VirtualMachineInstance>::new();
    let mut pod_informer = Informer::<Pod>::new();
    register_handlers(
        &mut vmi_informer,
        &mut pod_informer,
        &queue,
        &pod_expectations,
        &vmi_expectations,
    );
    let vm_informer = Informer::<VirtualMachine>::new();
    let mut claim_informer = Informer::<PersistentVolumeClaim>::new();
    let (vmis, pods, vms) = (
        vmi_informer.handle(),
        pod_informer.handle(),
        vm_informer.handle(),
    );
    requeue_on_claim_change(&mut claim_informer, vmis.clone(), &queue);
    let claims = claim_informer.handle();
    let dv_informer = data_volume_informer(vmis.clone(), queue.clone());
    let data_volumes = dv_informer.handle();
    let cdi_served = client
        .list_api_group_resources(kubevirt_api::cdi::API_VERSION)
        .await
        .is_ok();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(vmi_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(vm_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(claim_informer.run(Api::all(client.clone()), watcher::Config::default()));
    tasks.spawn(dv_informer.run(Api::all(client.clone()), watcher::Config::default()));
    let selector = format!(
        "{} in ({},{})",
        c::APP_LABEL,
        c::VIRT_LAUNCHER_VALUE,
        c::HOTPLUG_DISK_VALUE
    );
    tasks.spawn(pod_informer.run(
        Api::all(client.clone()),
        watcher::Config::default().labels(&selector),
    ));
    tasks.spawn(requeue_on_pattern_change(
        config.sync_patterns.clone(),
        vmis.clone(),
        queue.clone(),
    ));
    tasks.spawn(requeue_on_skip_hooks_change(
        config.cluster.clone(),
        vmis.clone(),
        queue.clone(),
    ));

    metrics.add_collector(metrics::VmiCollector::new(vmis.clone(), pods.clone()));
    let synced = async {
        vmis.wait_for_sync().await?;
        pods.wait_for_sync().await?;
        claims.wait_for_sync().await?;
        if cdi_served {
            data_volumes.wait_for_sync().await?;
        }
        vms.wait_for_sync().await
    };
    tokio::select! {
        () = cancel.cancelled() => { tasks.abort_all(); return; }
        res = synced => if res.is_err() { tasks.abort_all(); return; },
    }
    let reconciler = VmiReconciler {
        recorder: Arc::new(EventRecorder::new(client.clone(), EVENT_COMPONENT)),
        client,
        vmis,
        pods,
        vms,
        claims,
        data_volumes,
        pod_expectations,
        vmi_expectations,
        launcher: config.launcher,
        patterns: config.sync_patterns,
        cluster: config.cluster,
    };
    let panics = Controller::new(QUEUE_NAME, queue, reconciler)
        .workers(config.workers)
        .run(cancel)
        .await;
    if panics > 0 {
        tracing::error!(panics, "VMI controller workers panicked");
    }
    tasks.abort_all();
}

/// The DataVolume informer: a DataVolume's claim has its name, so its changes wake the VMIs
/// needing that claim. Without CDI its list keeps failing and nobody waits for it (see the
/// VM controller).
fn data_volume_informer(
    vmis: InformerHandle<VirtualMachineInstance>,
    queue: WorkQueue<String>,
) -> Informer<kubevirt_api::cdi::DataVolume> {
    let mut informer = Informer::<kubevirt_api::cdi::DataVolume>::new();
    informer.on_change(move |change| {
        let key = key_of(change.object());
        for vmi in vmis.store().state() {
            if sync::required_claims(&vmi).contains(&key) {
                queue.add(key_of(vmi.as_ref()));
            }
        }
    });
    informer
}

/// The volume status of each claim-backed volume of `vmi` (an `ephemeral` volume's claim
/// included) whose claim is cached: the claim's
/// name, access modes, volume mode, capacity and requests, and CDI's default filesystem
/// overhead (there is no CDI to ask).
fn claim_volume_status(
    vmi: &VirtualMachineInstance,
    cached: impl Fn(&str) -> Option<Arc<PersistentVolumeClaim>>,
) -> Vec<kubevirt_api::v1::VolumeStatus> {
    let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
    vmi.spec
        .volumes
        .iter()
        .filter_map(|v| {
            let claim = v.volume_source.pod_claim_name()?.to_owned();
            let pvc = cached(&format!("{ns}/{claim}"))?;
            let spec = pvc.spec.clone().unwrap_or_default();
            let info = kubevirt_api::v1::PersistentVolumeClaimInfo {
                claim_name: Some(claim),
                access_modes: spec.access_modes.unwrap_or_default(),
                volume_mode: Some(spec.volume_mode.unwrap_or_else(|| "Filesystem".into())),
                capacity: pvc
                    .status
                    .as_ref()
                    .and_then(|st| st.capacity.clone())
                    .unwrap_or_default(),
                requests: spec.resources.and_then(|r| r.requests).unwrap_or_default(),
                filesystem_overhead: Some("0.055".into()),
                ..Default::default()
            };
            Some(kubevirt_api::v1::VolumeStatus {
                name: v.name.clone(),
                persistent_volume_claim_info: Some(info),
                ..Default::default()
            })
        })
        .collect()
}

/// Re-queues the VMIs of a claim's namespace whose volumes need it when the claim is added,
/// changes or goes away (upstream indexes VMIs by claim).
fn requeue_on_claim_change(
    claims: &mut Informer<PersistentVolumeClaim>,
    vmis: InformerHandle<VirtualMachineInstance>,
    queue: &WorkQueue<String>,
) {
    let queue = queue.clone();
    claims.on_change(move |change| {
        let claim = key_of(change.object());
        for vmi in vmis.store().state() {
            if sync::required_claims(&vmi).contains(&claim) {
                queue.add(key_of(vmi.as_ref()));
            }
        }
    });
}

/// Re-queues every cached VMI whenever the sync patterns change.
async fn requeue_on_pattern_change(
    mut patterns: watch::Receiver<MetadataSyncPatterns>,
    vmis: InformerHandle<VirtualMachineInstance>,
    queue: WorkQueue<String>,
) {
    while patterns.changed().await.is_ok() {
        tracing::info!("launcher sync patterns changed; re-queueing every VMI");
        for vmi in vmis.store().state() {
            queue.add(key_of(vmi.as_ref()));
        }
    }
}

/// Re-queues every cached VMI when the KubeVirt CR's `kubevirt.io/skip-backup-hooks`
/// annotation changes (as upstream; other CR changes apply from the next reconcile).
async fn requeue_on_skip_hooks_change(
    mut cluster: watch::Receiver<ClusterSettings>,
    vmis: InformerHandle<VirtualMachineInstance>,
    queue: WorkQueue<String>,
) {
    let mut seen = cluster.borrow_and_update().skip_backup_hooks.clone();
    while cluster.changed().await.is_ok() {
        let now = cluster.borrow_and_update().skip_backup_hooks.clone();
        if now == seen {
            continue;
        }
        seen = now;
        tracing::info!("the KubeVirt CR's skip-backup-hooks changed; re-queueing every VMI");
        for vmi in vmis.store().state() {
            queue.add(key_of(vmi.as_ref()));
        }
    }
}

#[cfg(test)]
mod tests;
