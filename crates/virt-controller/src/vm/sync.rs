//! The pure decision of one VM reconcile (upstream `sync`, reference §2.2–§2.3, §2.7): from
//! the VM, its claimed VMI, the expectations and the cached start revisions, a [`SyncPlan`]
//! of API actions that `execute` performs in order.
//!
//! Order: expectations pending → nothing; VM deleting → delete the VMI (unless orphaning)
//! then drop the VM finalizer; otherwise ensure the finalizer; the VMI generation annotation;
//! resolve the run strategy; the run strategy's start/stop decision; `RestartRequired`; and,
//! when no create/delete was planned, the label/annotation sync onto the VMI.
//!
//! When no create/delete was planned (upstream re-checks its expectations there), a template
//! without a firmware UUID gets upstream's legacy UUID of the VM name written back (upstream's
//! firmware synchronizer), then the VM's `status.volumeRequests` are applied to the template
//! and the running VMI ([`super::volume_requests`]), before the label/annotation sync onto
//! the VMI.
//!
//! DataVolumes ([`super::data_volumes`]): after the run strategy is resolved, the missing
//! DataVolumes of `dataVolumeTemplates` are created (unless the VM defers that with
//! `kubevirt.io/immediate-data-volume-creation: "false"`, then at start), and while they are
//! not ready nothing else is planned unless the strategy is `Halted`; a start waits for them.
//!
//! Not planned (yet) compared to upstream: instancetypes, NIC hotplug, and the
//! decentralized-migration special case of `Always`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::jiff::Timestamp;
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::constants::{
    CREATE_MIGRATION_TARGET_ANNOTATION, RESTORE_RUN_STRATEGY_ANNOTATION, VM_CONTROLLER_FINALIZER,
    VM_GENERATION_ANNOTATION,
};
use kubevirt_api::v1::{
    RunStrategy, StateChangeRequestAction, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstancePhase as Phase, VirtualMachineSpec, VirtualMachineStateChangeRequest,
};
use serde_json::{Value, json};

use super::backoff::backoff_time_left;
use super::label_sync::vmi_metadata_ops;
use super::start::{
    START_REVISION_PREFIX, build_revision, build_vmi, legacy_firmware_uuid, revision_generation,
    revision_spec,
};
use super::status::RestartRequired;
use super::{ExpectView, SyncFailure};
use crate::metadata_sync::MetadataSyncPatterns;

/// Reason of failed starts (and of run strategy errors).
pub const FAILED_CREATE: &str = "FailedCreate";
/// Reason of failed stops.
pub const FAILED_DELETE: &str = "FailedDelete";
/// Event reason of a started VMI.
pub const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
/// Event reason of a stopped VMI.
pub const SUCCESSFUL_DELETE: &str = "SuccessfulDelete";
/// Reason of a failed VMI metadata sync.
pub const ANNOTATIONS_LABELS_CHANGE_ERROR: &str = "AnnotationsLabelsChangeError";
/// Reason of a failed VM metadata or spec patch.
pub const FAILED_UPDATE: &str = "FailedUpdate";
/// Reason of a failed application of the VM's volume requests.
pub const HOTPLUG_VOLUME_ERROR: &str = "HotPlugVolumeError";
/// Reason of a failed write of the firmware UUID into the VM template.
pub const FIRMWARE_UUID_ERROR: &str = "FirmwareUUIDError";
/// How soon a live update waiting for a hotplug in progress is tried again.
const LIVE_UPDATE_RETRY: Duration = Duration::from_secs(1);
/// Message of the `RestartRequired` condition.
pub const RESTART_REQUIRED_MESSAGE: &str =
    "a non-live-updatable field was changed in the template spec";

/// One API write the sync wants.
#[derive(Clone, Debug, PartialEq)]
pub enum VmAction {
    /// JSON Patch of the VM's finalizers. Upstream returns a failure as a plain error: the
    /// reconcile is retried and the status is not written.
    PatchVmFinalizers(Vec<Value>),
    /// JSON Patch of the VM spec (the run strategy a finished receiver restores).
    PatchVm(Vec<Value>),
    /// JSON Patch writing the firmware UUID into a VM template that has none (upstream's
    /// firmware synchronizer).
    PatchVmFirmware(Vec<Value>),
    /// JSON Patch of the VM spec that turns a start request of a Halted VM into a running
    /// strategy. Upstream always reports a sync failure afterwards, even on success.
    StartHaltedVm(Vec<Value>),
    /// Delete the start revisions of other generations, create the start revision unless
    /// one of this generation is cached (kept as is, as upstream), then create the VMI.
    CreateVmi {
        /// The VMI to create.
        vmi: Box<VirtualMachineInstance>,
        /// The start revision to create; `None` when one of this generation exists.
        revision: Option<Box<ControllerRevision>>,
        /// Start revisions of the VM from other generations, to delete.
        stale_revisions: Vec<String>,
    },
    /// Delete the VMI with this name.
    DeleteVmi(String),
    /// JSON Patch of the VM status (append a start request).
    PatchVmStatus(Vec<Value>),
    /// JSON Patch of the VMI metadata.
    PatchVmi(Vec<Value>),
    /// JSON Patch of the running VMI's spec with the template's live-updatable changes
    /// ([`super::live_update`]).
    LiveUpdateVmi(Vec<Value>),
    /// JSON Patch of the VM template's volumes and disks with the VM's volume requests
    /// ([`super::volume_requests`]).
    PatchVmVolumes(Vec<Value>),
    /// JSON Patch of the running VMI's volumes and disks with the VM's volume requests.
    PatchVmiVolumes(Vec<Value>),
    /// JSON Patch of the running VMI's networks and interfaces (NIC hotplug,
    /// [`super::network`]).
    PatchVmiInterfaces(Vec<Value>),
    /// JSON Patch of the VM template's networks and interfaces (unplugged ones cleared).
    PatchVmInterfaces(Vec<Value>),
    /// Create this DataVolume (from a `dataVolumeTemplates` entry) under a creation
    /// expectation.
    CreateDataVolume(Box<Value>),
    /// Record upstream's `FailedDataVolumeImport` event for this failed DataVolume.
    DataVolumeFailed(String),
}

/// What one reconcile intends to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncPlan {
    /// Writes, in order; the executor stops at the first failure.
    pub actions: Vec<VmAction>,
    /// A failure known without any API call (e.g. an unknown run strategy).
    pub error: Option<SyncFailure>,
    /// A failure upstream returns as a plain error rather than a sync error (the run strategy
    /// cannot be resolved): after the planned actions the reconcile fails and is retried
    /// with backoff, and the status — conditions, `startFailure` and all — is not written.
    pub requeue_error: Option<String>,
    /// Reconcile again after this delay (start-failure backoff).
    pub requeue_after: Option<Duration>,
    /// What to do with the `RestartRequired` condition.
    pub restart_required: RestartRequired,
    /// The generation the VMI was started from, as read now (for `observedGeneration`).
    pub vmi_generation: Option<i64>,
}

/// Everything the sync looks at.
#[derive(Clone, Debug)]
pub struct SyncInput<'a> {
    /// The VM as read from the cache.
    pub vm: &'a VirtualMachine,
    /// Its claimed VMI.
    pub vmi: Option<&'a VirtualMachineInstance>,
    /// The expectations of the VM key.
    pub expectations: ExpectView,
    /// Cached ControllerRevisions of the VM's namespace whose name starts with its prefix.
    pub revisions: &'a [Arc<ControllerRevision>],
    /// Label and annotation sync patterns.
    pub config: &'a MetadataSyncPatterns,
    /// The cluster's `vmRolloutStrategy` is `LiveUpdate` (upstream's default).
    pub live_update: bool,
    /// The current time.
    pub now: Timestamp,
    /// The cached DataVolumes the VM refers to ([`super::data_volumes::referenced`]).
    pub data_volumes: &'a [Arc<DataVolume>],
}

impl SyncInput<'_> {
    fn revision_prefix(&self) -> String {
        let uid = self.vm.metadata.uid.as_deref().unwrap_or_default();
        format!("{START_REVISION_PREFIX}{uid}-")
    }

    fn revision(&self, name: &str) -> Option<&ControllerRevision> {
        self.revisions
            .iter()
            .map(AsRef::as_ref)
            .find(|r| r.metadata.name.as_deref() == Some(name))
    }

    /// The spec of the newest start revision of this VM.
    fn last_start_spec(&self) -> Option<VirtualMachineSpec> {
        let prefix = self.revision_prefix();
        self.revisions
            .iter()
            .filter_map(|r| {
                let name = r.metadata.name.as_deref()?;
                name.strip_prefix(&prefix)?;
                Some((revision_generation(name)?, r))
            })
            .max_by_key(|(g, _)| *g)
            .and_then(|(_, r)| revision_spec(r))
    }
}

fn finalizer_ops(original: Option<&Vec<String>>, next: &[String]) -> Vec<Value> {
    match original {
        None => vec![json!({"op": "add", "path": "/metadata/finalizers", "value": next})],
        Some(old) => vec![
            json!({"op": "test", "path": "/metadata/finalizers", "value": old}),
            json!({"op": "replace", "path": "/metadata/finalizers", "value": next}),
        ],
    }
}

fn vmi_phase(vmi: &VirtualMachineInstance) -> Phase {
    vmi.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or(Phase::Unset)
}

fn first_request(vm: &VirtualMachine) -> Option<&VirtualMachineStateChangeRequest> {
    vm.status
        .as_ref()
        .and_then(|s| s.state_change_requests.first())
}

fn has_start_request(vm: &VirtualMachine) -> bool {
    first_request(vm).is_some_and(|r| r.action == StateChangeRequestAction::Start)
}

fn has_stop_request_for(vm: &VirtualMachine, vmi: &VirtualMachineInstance) -> bool {
    first_request(vm).is_some_and(|r| {
        r.action == StateChangeRequestAction::Stop && r.uid.is_some() && r.uid == vmi.metadata.uid
    })
}

/// Computes the plan of one reconcile.
pub fn plan(input: &SyncInput<'_>) -> SyncPlan {
    let mut plan = SyncPlan {
        vmi_generation: input.vmi.and_then(|vmi| vmi_generation(input, vmi).0),
        ..SyncPlan::default()
    };
    if !input.expectations.satisfied {
        return plan;
    }
    let vm = input.vm;
    let finalizers = vm.metadata.finalizers.as_ref();
    let has_finalizer = finalizers.is_some_and(|f| f.iter().any(|x| x == VM_CONTROLLER_FINALIZER));
    if vm.metadata.deletion_timestamp.is_some() {
        let orphan = finalizers.is_some_and(|f| f.iter().any(|x| x == "orphan"));
        match input.vmi {
            Some(vmi) if !orphan => stop(&mut plan, vmi),
            _ if has_finalizer => {
                let next: Vec<String> = finalizers
                    .into_iter()
                    .flatten()
                    .filter(|f| *f != VM_CONTROLLER_FINALIZER)
                    .cloned()
                    .collect();
                plan.actions.push(VmAction::PatchVmFinalizers(finalizer_ops(
                    finalizers, &next,
                )));
            }
            _ => {}
        }
        return plan;
    }
    if !has_finalizer {
        let mut next = finalizers.cloned().unwrap_or_default();
        next.push(VM_CONTROLLER_FINALIZER.to_owned());
        let mut ops = finalizer_ops(finalizers, &next);
        // A new VM gets its finalizer and its firmware UUID in one write (upstream: two).
        ops.extend(firmware_uuid_ops(vm).into_iter().flatten());
        plan.actions.push(VmAction::PatchVmFinalizers(ops));
    }
    let strategy = match vm.run_strategy() {
        Ok(s) => s,
        Err(err) => {
            plan.requeue_error = Some(format!("Error fetching RunStrategy: {err}"));
            return plan;
        }
    };
    if super::data_volumes::immediate_creation(vm) {
        let dvs = super::data_volumes::plan(vm, input.data_volumes);
        push_data_volume_actions(&mut plan, &dvs);
        // Upstream lets a Halted VM go on (its VMI is deleted) while DataVolumes are pending.
        if !dvs.ready && strategy != RunStrategy::Halted {
            return plan;
        }
    }
    sync_run_strategy(&mut plan, input, &strategy);
    let acted = plan
        .actions
        .iter()
        .any(|a| matches!(a, VmAction::CreateVmi { .. } | VmAction::DeleteVmi(_)));
    if acted {
        plan.restart_required = RestartRequired::Remove;
        return plan;
    }
    if let Some(vmi) = input.vmi {
        plan.restart_required =
            restart_required(vm, vmi, input.last_start_spec().as_ref(), input.live_update);
        if input.live_update && !matches!(plan.restart_required, RestartRequired::Set(_)) {
            let live = super::live_update::plan(vm, vmi);
            if let Some(message) = live.restart_required {
                plan.restart_required = RestartRequired::Set(message);
            } else if !live.vmi_ops.is_empty() {
                plan.actions.push(VmAction::LiveUpdateVmi(live.vmi_ops));
            }
            if let Some(why) = live.wait {
                plan.requeue_after.get_or_insert(LIVE_UPDATE_RETRY);
                tracing::debug!(vm = ?vm.metadata.name, why, "live update waits");
            }
        }
    }
    if has_finalizer && let Some(ops) = firmware_uuid_ops(vm) {
        plan.actions.push(VmAction::PatchVmFirmware(ops));
    }
    push_hotplug_actions(&mut plan, vm, input.vmi);
    if let Some(vmi) = input.vmi {
        let bump = vmi_generation(input, vmi).1;
        let ops = vmi_metadata_ops(vm, vmi, input.config, bump.as_deref());
        if !ops.is_empty() {
            plan.actions.push(VmAction::PatchVmi(ops));
        }
    }
    plan
}

/// The generation the VMI was started from (annotation, else the suffix of its revision) and
/// a new annotation value to write, if any: the VM's generation when the VM template still
/// equals the template of the VMI's revision, or the recovered value when the annotation
/// was missing.
fn vmi_generation(
    input: &SyncInput<'_>,
    vmi: &VirtualMachineInstance,
) -> (Option<i64>, Option<String>) {
    let annotated = vmi
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VM_GENERATION_ANNOTATION))
        .and_then(|g| g.parse::<i64>().ok());
    let revision_name = vmi
        .status
        .as_ref()
        .and_then(|s| s.virtual_machine_revision_name.as_deref());
    let revision = revision_name.and_then(|n| input.revision(n));
    let current = annotated.or_else(|| {
        revision
            .and_then(|r| r.metadata.name.as_deref())
            .and_then(revision_generation)
    });
    let vm_generation = input.vm.metadata.generation;
    let templates_equal = revision
        .and_then(revision_spec)
        .is_some_and(|spec| spec.template == input.vm.spec.template);
    let target = if templates_equal && vm_generation.is_some() {
        vm_generation
    } else {
        current
    };
    let bump = match (annotated, target) {
        (Some(a), Some(t)) if a == t => None,
        (_, Some(t)) => Some(t.to_string()),
        (_, None) => None,
    };
    (current, bump)
}

/// The JSON Patch giving a template without a firmware UUID the legacy UUID of the VM name
/// (`test` of the old firmware, `null` when absent, then `add` of the completed one).
fn firmware_uuid_ops(vm: &VirtualMachine) -> Option<Vec<Value>> {
    let old = vm
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.domain.firmware.as_ref());
    if old.is_some_and(|f| f.uuid.as_deref().is_some_and(|u| !u.is_empty())) {
        return None;
    }
    let mut firmware = old.cloned().unwrap_or_default();
    firmware.uuid = Some(legacy_firmware_uuid(
        vm.metadata.name.as_deref().unwrap_or_default(),
    ));
    let path = "/spec/template/spec/domain/firmware";
    Some(vec![
        json!({"op": "test", "path": path, "value": old}),
        json!({"op": "add", "path": path, "value": firmware}),
    ])
}

/// Plans the deletion of `vmi` (no-op when it is already being deleted).
fn stop(plan: &mut SyncPlan, vmi: &VirtualMachineInstance) {
    if vmi.metadata.deletion_timestamp.is_none() {
        let name = vmi.metadata.name.clone().unwrap_or_default();
        plan.actions.push(VmAction::DeleteVmi(name));
    }
}

/// Plans the start of the VM, unless a ManualRecoveryRequired condition forbids it.
fn start(plan: &mut SyncPlan, input: &SyncInput<'_>) {
    let vm = input.vm;
    let blocked = vm.status.as_ref().is_some_and(|s| {
        kubevirt_api::v1::has_true_condition(
            &s.conditions,
            &kubevirt_api::v1::VirtualMachineConditionType::ManualRecoveryRequired,
        )
    });
    if blocked {
        return;
    }
    // Upstream's `startVMI` handles the DataVolumes again: a deferred creation happens now,
    // and the VMI waits until they are ready.
    let dvs = super::data_volumes::plan(vm, input.data_volumes);
    if !dvs.ready {
        if !super::data_volumes::immediate_creation(vm) {
            push_data_volume_actions(plan, &dvs);
        }
        return;
    }
    let revision = build_revision(vm);
    let name = revision.metadata.name.clone().unwrap_or_default();
    let prefix = input.revision_prefix();
    let (current, stale): (Vec<&ControllerRevision>, Vec<&ControllerRevision>) = input
        .revisions
        .iter()
        .map(AsRef::as_ref)
        .filter(|r| {
            r.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .partition(|r| r.revision == revision.revision);
    plan.actions.push(VmAction::CreateVmi {
        vmi: Box::new(build_vmi(vm, &name)),
        revision: current.is_empty().then(|| Box::new(revision)),
        stale_revisions: stale
            .into_iter()
            .filter_map(|r| r.metadata.name.clone())
            .collect(),
    });
}

fn push_data_volume_actions(plan: &mut SyncPlan, dvs: &super::data_volumes::DataVolumePlan) {
    for failed in &dvs.failed {
        plan.actions
            .push(VmAction::DataVolumeFailed(failed.clone()));
    }
    for dv in &dvs.create {
        plan.actions
            .push(VmAction::CreateDataVolume(Box::new(dv.clone())));
    }
}

/// Starts unless the start-failure backoff defers it.
fn start_with_backoff(plan: &mut SyncPlan, input: &SyncInput<'_>) {
    let start_failure = input
        .vm
        .status
        .as_ref()
        .and_then(|s| s.start_failure.as_ref());
    let left = backoff_time_left(start_failure, input.now);
    if left > 0 {
        plan.requeue_after = Some(Duration::from_secs(left.unsigned_abs()));
    } else {
        start(plan, input);
    }
}

fn sync_run_strategy(plan: &mut SyncPlan, input: &SyncInput<'_>, strategy: &RunStrategy) {
    let vm = input.vm;
    match (strategy, input.vmi) {
        (RunStrategy::Always, Some(vmi)) => {
            if has_stop_request_for(vm, vmi) || vmi_phase(vmi).is_final() {
                stop(plan, vmi);
            }
        }
        (RunStrategy::Always, None) => start_with_backoff(plan, input),
        (RunStrategy::RerunOnFailure, Some(vmi)) => rerun_on_failure(plan, vm, vmi),
        (RunStrategy::RerunOnFailure, None) => {
            let was = vm.status.as_ref().and_then(|s| s.run_strategy.as_ref());
            if has_start_request(vm) || was != Some(&RunStrategy::RerunOnFailure) {
                start_with_backoff(plan, input);
            }
        }
        (RunStrategy::Manual, Some(vmi)) => {
            if has_stop_request_for(vm, vmi) {
                stop(plan, vmi);
            }
        }
        (RunStrategy::Manual, None) => {
            if has_start_request(vm) {
                start(plan, input);
            }
        }
        (RunStrategy::Halted, Some(vmi)) => stop(plan, vmi),
        (RunStrategy::Halted, None) => {
            if has_start_request(vm) {
                let ops = if vm.spec.run_strategy.is_some() {
                    vec![json!({"op": "replace", "path": "/spec/runStrategy", "value": "Always"})]
                } else {
                    vec![json!({"op": "add", "path": "/spec/running", "value": true})]
                };
                plan.actions.push(VmAction::StartHaltedVm(ops));
            }
        }
        (RunStrategy::Once, None) | (RunStrategy::WaitAsReceiver, None) => start(plan, input),
        (RunStrategy::Once, Some(_)) => {}
        (RunStrategy::WaitAsReceiver, Some(vmi)) => wait_as_receiver(plan, vm, vmi),
        (other, _) => {
            plan.error = Some(SyncFailure::new(
                FAILED_CREATE,
                format!("unknown runstrategy: {}", other.as_str()),
            ));
        }
    }
}

fn rerun_on_failure(plan: &mut SyncPlan, vm: &VirtualMachine, vmi: &VirtualMachineInstance) {
    let phase = vmi_phase(vmi);
    let finished = has_stop_request_for(vm, vmi) || phase.is_final();
    if vmi.metadata.deletion_timestamp.is_some() || !finished {
        return;
    }
    stop(plan, vmi);
    if phase == Phase::Failed {
        let mut requests = vm
            .status
            .as_ref()
            .map(|s| s.state_change_requests.clone())
            .unwrap_or_default();
        requests.push(VirtualMachineStateChangeRequest {
            action: StateChangeRequestAction::Start,
            ..VirtualMachineStateChangeRequest::default()
        });
        let op = json!({"op": "add", "path": "/status/stateChangeRequests", "value": requests});
        plan.actions.push(VmAction::PatchVmStatus(vec![op]));
    }
}

fn wait_as_receiver(plan: &mut SyncPlan, vm: &VirtualMachine, vmi: &VirtualMachineInstance) {
    let receiver = vmi
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CREATE_MIGRATION_TARGET_ANNOTATION))
        .is_some_and(|v| v == "true");
    if receiver {
        return;
    }
    let completed = vmi
        .status
        .as_ref()
        .and_then(|s| s.migration_state.as_ref())
        .and_then(|m| m.completed)
        == Some(true);
    if completed {
        let restore = vm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESTORE_RUN_STRATEGY_ANNOTATION));
        if let Some(strategy) = restore {
            let op = json!({"op": "replace", "path": "/spec/runStrategy", "value": strategy});
            plan.actions.push(VmAction::PatchVm(vec![op]));
        }
        return;
    }
    plan.error = Some(SyncFailure::new(
        FAILED_CREATE,
        "Found non receiver VMI while VM is receiver".to_owned(),
    ));
}

/// The writes of volume hotplug ([`super::volume_requests`]) and NIC hotplug
/// ([`super::network`]).
fn push_hotplug_actions(
    plan: &mut SyncPlan,
    vm: &VirtualMachine,
    vmi: Option<&kubevirt_api::v1::VirtualMachineInstance>,
) {
    let volumes = super::volume_requests::plan(vm, vmi);
    let networks = super::network::plan(vm, vmi);
    type Write = fn(Vec<Value>) -> VmAction;
    let writes: [(Vec<Value>, Write); 4] = [
        (volumes.template_ops, VmAction::PatchVmVolumes),
        (volumes.vmi_ops, VmAction::PatchVmiVolumes),
        (networks.vmi_ops, VmAction::PatchVmiInterfaces),
        (networks.template_ops, VmAction::PatchVmInterfaces),
    ];
    for (ops, action) in writes {
        if !ops.is_empty() {
            plan.actions.push(action(ops));
        }
    }
}

/// Removes hotpluggable volumes and their disks, which never require a restart.
fn without_hotplug(spec: &mut kubevirt_api::v1::VirtualMachineInstanceSpec) {
    let hotplugged: Vec<String> = spec
        .volumes
        .iter()
        .filter(|v| v.volume_source.is_hotpluggable())
        .map(|v| v.name.clone())
        .collect();
    spec.volumes.retain(|v| !hotplugged.contains(&v.name));
    spec.domain
        .devices
        .disks
        .retain(|d| !hotplugged.contains(&d.name));
}

/// `RestartRequired` from comparing the current template spec with the one the VMI was
/// started from, ignoring hotpluggable volumes and a firmware UUID the VMI already has.
fn restart_required(
    vm: &VirtualMachine,
    vmi: &VirtualMachineInstance,
    last: Option<&VirtualMachineSpec>,
    live_update: bool,
) -> RestartRequired {
    let Some(last) = last else {
        return RestartRequired::Keep;
    };
    let mut current = vm.spec.template.spec.clone().unwrap_or_default();
    let mut seen = last.template.spec.clone().unwrap_or_default();
    let uuid = |s: &kubevirt_api::v1::VirtualMachineInstanceSpec| {
        s.domain.firmware.as_ref().and_then(|f| f.uuid.clone())
    };
    if uuid(&current).is_some() && uuid(&current) == uuid(&vmi.spec) {
        let firmware = seen.domain.firmware.get_or_insert_with(Default::default);
        firmware.uuid = uuid(&current);
    }
    if live_update {
        super::live_update::live_fields_of(&current, &mut seen);
    }
    without_hotplug(&mut current);
    without_hotplug(&mut seen);
    // NIC hotplug (upstream): what the network rule lets through live is not compared; what
    // it does not is compared with the start template as any other field.
    if !super::network::restart_required(vm, vmi) {
        seen.networks.clone_from(&current.networks);
        seen.domain
            .devices
            .interfaces
            .clone_from(&current.domain.devices.interfaces);
    }
    // Volumes are a set (their order changes nothing in the domain; disks keep theirs).
    current.volumes.sort_by(|a, b| a.name.cmp(&b.name));
    seen.volumes.sort_by(|a, b| a.name.cmp(&b.name));
    if current == seen {
        RestartRequired::Remove
    } else {
        RestartRequired::Set(RESTART_REQUIRED_MESSAGE.to_owned())
    }
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
