//! The VMI status as this controller derives it from the launcher pod (upstream's
//! `updateStatus`), and the JSON Patch that writes it back.
//!
//! Data flow: [`desired_vmi`] takes the cached VMI and what sync observed (the current
//! launcher pod, every pod the VMI controls, the sync failure) and returns the VMI as it
//! should be, plus a failure the status pass itself found (image pull errors, unguaranteed
//! resources). [`vmi_patch`] turns old and new into JSON Patch operations; an empty list
//! means nothing is written. Both are pure.
//!
//! The write-back differs by who owns the VMI at the time it was read (see the ownership
//! table in [`super`]):
//! - before hand-off (phase `""`, `Pending`, `Scheduling`, final, `WaitingForSync`): every
//!   changed status field, the labels and the finalizers, guarded by a `test` of
//!   `metadata.resourceVersion` (what upstream's full `Update` guarantees);
//! - after hand-off (`Scheduled`, `Running`): only `conditions`, `activePods`, `phase`,
//!   `launcherContainerImageVersion`, labels and finalizers, each as `test` old + `replace`
//!   (or `add` when absent), so a concurrent write by virt-handler to any of them makes the
//!   patch fail instead of being lost; the `Synchronized` condition is not written.
//!
//! `phaseTransitionTimestamps` are appended (`add …/-`) when this controller changes the phase
//! before hand-off, so appends by virt-handler are never overwritten; after hand-off (say
//! `Running` → `Failed` because the pod is gone) no transition is recorded, as upstream.

use k8s_openapi::api::core::v1::{Pod, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubevirt_api::constants as c;
use kubevirt_api::v1::{
    ConditionStatus, GUEST_NOT_RUNNING_REASON, MigrationTransport, POD_CONDITION_MISSING_REASON,
    POD_NOT_EXISTS_REASON, POD_TERMINATING_REASON, VirtualMachineInstance,
    VirtualMachineInstanceCondition as Condition, VirtualMachineInstanceConditionType as CondType,
    VirtualMachineInstancePhase as Phase, VirtualMachineInstancePhaseTransitionTimestamp,
    VirtualMachineInstanceStatus,
};
use serde_json::{Map, Value, json};

use crate::sync_failure::SyncFailure;

/// The status pass cannot proceed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatusError {
    /// The VMI is in a phase this controller does not handle (such as `Unknown`).
    #[error("unknown vmi phase {0}")]
    UnknownPhase(String),
}

impl StatusError {
    /// The error-metric reason.
    pub fn reason(&self) -> &'static str {
        "UnknownPhase"
    }
}

/// What sync observed, the input of the status pass.
pub struct Observed<'a> {
    /// The current launcher pod (newest controlled pod, on `status.nodeName` when set).
    pub pod: Option<&'a Pod>,
    /// Every pod the VMI controls.
    pub pods: &'a [&'a Pod],
    /// The failure of sync, if any.
    pub sync_failure: Option<&'a SyncFailure>,
    /// The configured launcher image, to detect outdated launchers.
    pub launcher_image: &'a str,
    /// The VMI's controlling `VirtualMachine` is in the VM cache with the UID of the
    /// reference (upstream `hasOwnerVM`); without it a final VMI loses the VM controller's
    /// finalizer.
    pub owner_vm_exists: bool,
    /// The time written into new conditions and phase transitions.
    pub now: &'a Time,
    /// The status of each claim-backed volume whose claim is cached, with its
    /// `persistentVolumeClaimInfo` (written before hand-off, as upstream, so that the launcher
    /// can size a disk image it creates).
    pub claim_volumes: &'a [kubevirt_api::v1::VolumeStatus],
    /// The volume status with the hotplug volumes' phases and attachment pods
    /// ([`super::hotplug::update_volume_status`]), for a running VMI with a launcher pod.
    pub hotplug_volume_status: Option<&'a [kubevirt_api::v1::VolumeStatus]>,
}

/// Whether the VMI, as read, is owned by virt-handler (phase `Scheduled` or `Running`).
pub fn handler_owned(vmi: &VirtualMachineInstance) -> bool {
    matches!(phase_of(vmi), Phase::Scheduled | Phase::Running)
}

/// Whether the VMI, as read, is `Running`.
pub fn phase_is_running(vmi: &VirtualMachineInstance) -> bool {
    phase_of(vmi) == Phase::Running
}

/// Whether the VMI, as read, is `Succeeded` or `Failed`.
pub fn phase_is_final(vmi: &VirtualMachineInstance) -> bool {
    phase_of(vmi).is_final()
}

fn phase_of(vmi: &VirtualMachineInstance) -> Phase {
    vmi.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// Down: phase `Succeeded`/`Failed`, the `compute` container terminated, or deleting.
pub fn pod_is_down(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let final_phase = matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let compute_terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .any(|cs| {
            cs.name == c::COMPUTE_CONTAINER_NAME
                && cs.state.as_ref().is_some_and(|s| s.terminated.is_some())
        });
    final_phase || compute_terminated || pod.metadata.deletion_timestamp.is_some()
}

/// Ready for hand-off: not down, phase `Running`, every container ready except `compute` and
/// `istio-proxy`, which need only be running.
pub fn pod_is_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let containers_ok = status.container_statuses.iter().flatten().all(|cs| {
        if cs.name == c::COMPUTE_CONTAINER_NAME || cs.name == "istio-proxy" {
            cs.state.as_ref().is_some_and(|s| s.running.is_some())
        } else {
            cs.ready
        }
    });
    !pod_is_down(pod) && containers_ok && status.phase.as_deref() == Some("Running")
}

fn pod_condition<'a>(pod: &'a Pod, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn from_pod_condition(type_: CondType, pc: &PodCondition) -> Condition {
    Condition {
        type_,
        status: ConditionStatus::from(pc.status.as_str()),
        last_probe_time: pc.last_probe_time.clone(),
        last_transition_time: pc.last_transition_time.clone(),
        reason: pc.reason.clone(),
        message: pc.message.clone(),
    }
}

fn condition(
    type_: CondType,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: &Time,
) -> Condition {
    Condition {
        type_,
        status,
        last_probe_time: None,
        last_transition_time: Some(now.clone()),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
    }
}

/// Sets `new` in `conds` as upstream's condition manager does: kept as is when status and
/// reason already agree (a changed message alone is ignored), replaced in place otherwise,
/// appended when missing.
fn set_condition(conds: &mut Vec<Condition>, new: Condition) {
    match conds.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) if old.status == new.status && old.reason == new.reason => {}
        Some(old) => *old = new,
        None => conds.push(new),
    }
}

fn remove_condition(conds: &mut Vec<Condition>, type_: &CondType) {
    conds.retain(|c| c.type_ != *type_);
}

/// The Ready condition upstream derives from the pod.
pub fn ready_condition(vmi: &VirtualMachineInstance, pod: Option<&Pod>, now: &Time) -> Condition {
    let f = |reason, message| Condition {
        last_probe_time: Some(now.clone()),
        ..condition(
            CondType::Ready,
            ConditionStatus::False,
            reason,
            message,
            now,
        )
    };
    match pod {
        None => f(
            POD_NOT_EXISTS_REASON,
            "virt-launcher pod has not yet been scheduled",
        ),
        Some(pod) if pod_is_down(pod) => {
            f(POD_TERMINATING_REASON, "virt-launcher pod is terminating")
        }
        Some(_) if phase_of(vmi) != Phase::Running => f(
            GUEST_NOT_RUNNING_REASON,
            "Guest VM is not reported as running",
        ),
        Some(pod) => match pod_condition(pod, "Ready") {
            Some(pc) => from_pod_condition(CondType::Ready, pc),
            None => f(
                POD_CONDITION_MISSING_REASON,
                "virt-launcher pod is missing the Ready condition",
            ),
        },
    }
}

fn compute_image(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == c::COMPUTE_CONTAINER_NAME)?
        .image
        .as_deref()
}

fn is_receiver(vmi: &VirtualMachineInstance) -> bool {
    vmi.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(c::CREATE_MIGRATION_TARGET_ANNOTATION))
        .is_some_and(|v| v == "true")
}

fn has_label(vmi: &VirtualMachineInstance, key: &str) -> bool {
    vmi.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(key))
}

/// The VMI as it should be after this pass, and the failure the pass found itself.
pub fn desired_vmi(
    vmi: &VirtualMachineInstance,
    obs: &Observed<'_>,
) -> Result<(VirtualMachineInstance, Option<SyncFailure>), StatusError> {
    let mut new = vmi.clone();
    if let Some(finalizers) = new.metadata.finalizers.as_mut() {
        for f in finalizers
            .iter_mut()
            .filter(|f| *f == c::DEPRECATED_VMI_FINALIZER)
        {
            c::VMI_FINALIZER.clone_into(f);
        }
    }
    let status = new
        .status
        .get_or_insert_with(VirtualMachineInstanceStatus::default);
    status.active_pods = obs
        .pods
        .iter()
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            Some((
                uid,
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
            ))
        })
        .collect();
    set_condition(
        &mut status.conditions,
        ready_condition(vmi, obs.pod, obs.now),
    );
    if let Some(pod) = obs.pod {
        let image = compute_image(pod).unwrap_or_default();
        status.launcher_container_image_version = (!image.is_empty()).then(|| image.to_owned());
        let labels = new.metadata.labels.get_or_insert_default();
        if !image.is_empty() && image != obs.launcher_image {
            labels.insert(c::OUTDATED_LAUNCHER_IMAGE_LABEL.to_owned(), String::new());
        } else {
            labels.remove(c::OUTDATED_LAUNCHER_IMAGE_LABEL);
        }
    }
    let failure = apply_phase_table(vmi, &mut new, obs)?;
    let status = new
        .status
        .get_or_insert_with(VirtualMachineInstanceStatus::default);
    claim_missing_condition(status, obs);
    if !handler_owned(vmi) {
        merge_claim_volumes(status, obs.claim_volumes);
    }
    if let Some(volumes) = obs.hotplug_volume_status {
        status.volume_status = volumes.to_vec();
    }
    match status.evacuation_node_name.is_some() {
        true if !status
            .conditions
            .iter()
            .any(|c| c.is_true(&CondType::EvictionRequested)) =>
        {
            set_condition(
                &mut status.conditions,
                condition(
                    CondType::EvictionRequested,
                    ConditionStatus::True,
                    "EvictionRequested",
                    "VMI is marked for eviction",
                    obs.now,
                ),
            );
        }
        true => {}
        false => remove_condition(&mut status.conditions, &CondType::EvictionRequested),
    }
    if phase_of(vmi) == Phase::Running {
        add_hotplug_conditions(vmi, &mut status.conditions);
    }
    if let Some(pod) = obs.pod.filter(|_| handler_owned(vmi)) {
        status.interfaces = super::network::interfaces_status(vmi, pod);
    }
    if !handler_owned(vmi) {
        set_synchronized(
            &mut status.conditions,
            failure.as_ref().or(obs.sync_failure),
            obs.now,
        );
    }
    let old_phase = phase_of(vmi);
    let new_phase = status.phase.clone().unwrap_or_default();
    let recorded = status
        .phase_transition_timestamps
        .iter()
        .any(|t| t.phase.as_ref() == Some(&new_phase));
    // After hand-off upstream patches and returns before recording transitions.
    if !handler_owned(vmi) && new_phase != old_phase && !recorded {
        status
            .phase_transition_timestamps
            .push(VirtualMachineInstancePhaseTransitionTimestamp {
                phase: Some(new_phase),
                phase_transition_timestamp: Some(obs.now.clone()),
            });
    }
    Ok((new, failure))
}

/// Upstream's `requireCPUHotplug` / `requireMemoryHotplug`: while the VMI's spec asks for
/// vCPUs or memory its domain has not been given, `HotVCPUChange` / `HotMemoryChange` are
/// added (status True, no reason, as upstream). virt-handler removes them once the domain has
/// what the spec asks for.
fn add_hotplug_conditions(vmi: &VirtualMachineInstance, conds: &mut Vec<Condition>) {
    let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| kubevirt_api::quantity::Quantity::try_from(q).ok())
            .map(|q| q.value())
    };
    let status = vmi.status.as_ref();
    use kubevirt_api::live_update::vcpus;
    let cpu_change = match (
        &vmi.spec.domain.cpu,
        status.and_then(|s| s.current_cpu_topology.as_ref()),
    ) {
        (Some(cpu), Some(now)) if cpu.max_sockets.unwrap_or(0) > 0 => {
            vcpus(cpu.sockets, cpu.cores, cpu.threads) != vcpus(now.sockets, now.cores, now.threads)
        }
        _ => false,
    };
    let memory = vmi.spec.domain.memory.as_ref();
    let memory_change = match (memory, status.and_then(|s| s.memory.as_ref())) {
        (Some(m), Some(now)) if m.guest.is_some() && m.max_guest.is_some() => {
            bytes(m.guest.as_ref()) != bytes(now.guest_requested.as_ref())
        }
        _ => false,
    };
    for (wanted, type_) in [
        (cpu_change, CondType::HotVcpuChange),
        (memory_change, CondType::HotMemoryChange),
    ] {
        if wanted && !conds.iter().any(|c| c.type_ == type_) {
            conds.push(Condition {
                type_,
                status: ConditionStatus::True,
                last_probe_time: None,
                last_transition_time: None,
                reason: None,
                message: None,
            });
        }
    }
}

/// Puts each of `claim_volumes` into the volume status: its claim details replace those of the
/// entry of the same name, a new entry is added.
fn merge_claim_volumes(
    status: &mut VirtualMachineInstanceStatus,
    claim_volumes: &[kubevirt_api::v1::VolumeStatus],
) {
    for wanted in claim_volumes {
        match status
            .volume_status
            .iter_mut()
            .find(|v| v.name == wanted.name)
        {
            Some(existing) => existing
                .persistent_volume_claim_info
                .clone_from(&wanted.persistent_volume_claim_info),
            None => status.volume_status.push(wanted.clone()),
        }
    }
}

/// As upstream: a pending VMI whose claim is missing is unschedulable, with the sync error as
/// the `PodScheduled` message.
fn claim_missing_condition(status: &mut VirtualMachineInstanceStatus, obs: &Observed<'_>) {
    let Some(missing) = obs
        .sync_failure
        .filter(|f| f.reason == crate::vmi::sync::FAILED_PVC_NOT_FOUND)
        .filter(|_| status.phase == Some(Phase::Pending))
    else {
        return;
    };
    let same = status.condition(&CondType::PodScheduled).is_some_and(|c| {
        c.status == ConditionStatus::False && c.message.as_deref() == Some(&missing.message)
    });
    if !same {
        set_condition(
            &mut status.conditions,
            condition(
                CondType::PodScheduled,
                ConditionStatus::False,
                "Unschedulable",
                &missing.message,
                obs.now,
            ),
        );
    }
}

/// `Synchronized`: False with the failure (kept as is when a False one with the same reason
/// exists, else replaced at the end of the list); removed without a failure.
fn set_synchronized(conds: &mut Vec<Condition>, failure: Option<&SyncFailure>, now: &Time) {
    let Some(failure) = failure else {
        remove_condition(conds, &CondType::Synchronized);
        return;
    };
    let same = conds.iter().any(|c| {
        c.type_ == CondType::Synchronized
            && c.status == ConditionStatus::False
            && c.reason.as_deref() == Some(failure.reason.as_str())
    });
    if !same {
        remove_condition(conds, &CondType::Synchronized);
        conds.push(condition(
            CondType::Synchronized,
            ConditionStatus::False,
            &failure.reason,
            &failure.message,
            now,
        ));
    }
}

/// Upstream's phase table (controller side); returns a failure found on the way.
fn apply_phase_table(
    old: &VirtualMachineInstance,
    new: &mut VirtualMachineInstance,
    obs: &Observed<'_>,
) -> Result<Option<SyncFailure>, StatusError> {
    let deleting = old.metadata.deletion_timestamp.is_some();
    let receiver = is_receiver(old);
    let lost = if receiver {
        Phase::WaitingForSync
    } else {
        Phase::Failed
    };
    // A receiver whose pod is down, or whose incoming migration failed, waits again.
    let receiver_pod_down = receiver && obs.pod.is_some_and(pod_is_down);
    let target_failed = receiver
        && old
            .status
            .as_ref()
            .and_then(|s| s.migration_state.as_ref())
            .is_some_and(|m| m.failed == Some(true));
    let mut failure = None;
    let phase = match phase_of(old) {
        Phase::Unset | Phase::Pending => {
            if obs.pod.is_some() {
                Phase::Scheduling
            } else if deleting {
                Phase::Failed
            } else if receiver && !has_label(old, c::MIGRATION_TARGET_NODE_NAME_LABEL) {
                Phase::WaitingForSync
            } else {
                Phase::Pending
            }
        }
        Phase::Scheduling => scheduling(old, new, obs, lost, &mut failure),
        Phase::Succeeded | Phase::Failed => {
            finalize(new, obs.pods.is_empty(), obs.owner_vm_exists);
            phase_of(old)
        }
        // As upstream: a running VMI whose pod is gone fails, receiver or not.
        Phase::Running if obs.pod.is_none() => Phase::Failed,
        Phase::Running => Phase::Running,
        Phase::Scheduled if obs.pod.is_none() || receiver_pod_down || target_failed => lost,
        Phase::Scheduled => Phase::Scheduled,
        Phase::WaitingForSync => {
            if deleting {
                finalize(new, true, obs.owner_vm_exists);
                Phase::WaitingForSync
            } else if obs.pod.is_some() && !target_failed && !receiver_pod_down {
                Phase::Scheduling
            } else {
                Phase::WaitingForSync
            }
        }
        other @ (Phase::Unknown | Phase::Other(_)) => {
            return Err(StatusError::UnknownPhase(other.as_str().to_owned()));
        }
    };
    new.status
        .get_or_insert_with(VirtualMachineInstanceStatus::default)
        .phase = Some(phase);
    Ok(failure)
}

/// The `Scheduling` row of the table.
fn scheduling(
    old: &VirtualMachineInstance,
    new: &mut VirtualMachineInstance,
    obs: &Observed<'_>,
    lost: Phase,
    failure: &mut Option<SyncFailure>,
) -> Phase {
    let Some(pod) = obs.pod else {
        return lost;
    };
    let pod_status = pod.status.as_ref();
    let qos = pod_status
        .and_then(|s| s.qos_class.clone())
        .filter(|q| !q.is_empty());
    let status = new
        .status
        .get_or_insert_with(VirtualMachineInstanceStatus::default);
    status.qos_class.clone_from(&qos);
    match pod_condition(pod, "PodScheduled").filter(|pc| pc.status == "False") {
        Some(pc) if status.condition(&CondType::PodScheduled).is_none() => {
            status
                .conditions
                .push(from_pod_condition(CondType::PodScheduled, pc));
        }
        Some(_) => {}
        None => remove_condition(&mut status.conditions, &CondType::PodScheduled),
    }
    *failure = image_pull_failure(pod);
    let deleting = old.metadata.deletion_timestamp.is_some();
    if pod_is_ready(pod) && !deleting {
        let dedicated = old
            .spec
            .domain
            .cpu
            .as_ref()
            .and_then(|c| c.dedicated_cpu_placement)
            .unwrap_or(false);
        if dedicated && qos.as_deref() != Some("Guaranteed") {
            *failure = Some(SyncFailure::new(
                "FailedGuaranteeResources",
                "failed to guarantee pod resources",
            ));
            return Phase::Scheduling;
        }
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        status.node_name = Some(node.clone());
        let unix = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(c::MIGRATION_TRANSPORT_UNIX_ANNOTATION));
        if unix {
            status.migration_transport = Some(MigrationTransport::Unix);
        }
        new.metadata
            .labels
            .get_or_insert_default()
            .insert(c::NODE_NAME_LABEL.to_owned(), node);
        return Phase::Scheduled;
    }
    if pod_is_down(pod) {
        lost
    } else {
        Phase::Scheduling
    }
}

/// `ErrImagePull` / `ImagePullBackOff` of an init or regular container, as a failure.
fn image_pull_failure(pod: &Pod) -> Option<SyncFailure> {
    let status = pod.status.as_ref()?;
    let all = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    all.filter_map(|cs| cs.state.as_ref()?.waiting.as_ref())
        .find_map(|w| {
            let reason = w.reason.as_deref()?;
            matches!(reason, "ErrImagePull" | "ImagePullBackOff")
                .then(|| SyncFailure::new(reason, w.message.clone().unwrap_or_default()))
        })
}

/// A final VMI: drop the VMI finalizers when no pod remains, and the VM controller's
/// finalizer when its owning VM is gone (see [`Observed::owner_vm_exists`]).
fn finalize(new: &mut VirtualMachineInstance, no_pods: bool, owned_by_vm: bool) {
    if let Some(finalizers) = new.metadata.finalizers.as_mut() {
        finalizers.retain(|f| {
            let vmi_finalizer = f == c::VMI_FINALIZER || f == c::DEPRECATED_VMI_FINALIZER;
            !(vmi_finalizer && no_pods || f == c::VM_CONTROLLER_FINALIZER && !owned_by_vm)
        });
    }
    if no_pods {
        if let Some(labels) = new.metadata.labels.as_mut() {
            labels.remove(c::OUTDATED_LAUNCHER_IMAGE_LABEL);
        }
        if let Some(status) = new.status.as_mut() {
            status.launcher_container_image_version = None;
        }
    }
}

/// Status fields written after hand-off, in upstream's order.
const HANDLER_PATH_FIELDS: &[&str] = &[
    "conditions",
    "activePods",
    "phase",
    "launcherContainerImageVersion",
    // The hotplug phases: virt-handler writes MountedToPod and Ready, each write `test`s.
    "volumeStatus",
    // NIC hotplug: this controller marks what the pod's network status lists
    // (`multus-status`), virt-handler what the domain has; each write `test`s.
    "interfaces",
];
const TIMESTAMPS: &str = "phaseTransitionTimestamps";

/// `test` + `replace` / `add` / `test` + `remove` for one value, nothing when equal.
fn value_ops(ops: &mut Vec<Value>, path: &str, old: Option<&Value>, new: Option<&Value>) {
    match (old, new) {
        (Some(o), Some(n)) if o == n => {}
        (None, None) => {}
        (None, Some(n)) => ops.push(json!({"op": "add", "path": path, "value": n})),
        (Some(o), None) => {
            ops.push(json!({"op": "test", "path": path, "value": o}));
            ops.push(json!({"op": "remove", "path": path}));
        }
        (Some(o), Some(n)) => {
            ops.push(json!({"op": "test", "path": path, "value": o}));
            ops.push(json!({"op": "replace", "path": path, "value": n}));
        }
    }
}

fn status_json(vmi: &VirtualMachineInstance) -> Option<Map<String, Value>> {
    match serde_json::to_value(vmi.status.as_ref()?) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

/// JSON Patch operations writing `new` over `old` (see the module docs); empty when nothing
/// changed.
pub fn vmi_patch(old: &VirtualMachineInstance, new: &VirtualMachineInstance) -> Vec<Value> {
    let mut ops = Vec::new();
    let old_status = status_json(old);
    let new_status = status_json(new).unwrap_or_default();
    let handler = handler_owned(old);
    match (&old_status, handler) {
        (None, _) => {
            if !new_status.is_empty() {
                ops.push(json!({"op": "add", "path": "/status", "value": new_status}));
            }
        }
        (Some(old_s), true) => {
            for key in HANDLER_PATH_FIELDS {
                value_ops(
                    &mut ops,
                    &format!("/status/{key}"),
                    old_s.get(*key),
                    new_status.get(*key),
                );
            }
        }
        (Some(old_s), false) => {
            let keys = new_status
                .keys()
                .chain(old_s.keys().filter(|k| !new_status.contains_key(*k)));
            for key in keys.filter(|k| *k != TIMESTAMPS) {
                value_ops(
                    &mut ops,
                    &format!("/status/{key}"),
                    old_s.get(key),
                    new_status.get(key),
                );
            }
        }
    }
    if let Some(old_s) = &old_status {
        timestamp_ops(&mut ops, old_s.get(TIMESTAMPS), new_status.get(TIMESTAMPS));
    }
    let labels = |v: &VirtualMachineInstance| {
        v.metadata
            .labels
            .as_ref()
            .and_then(|l| serde_json::to_value(l).ok())
    };
    let finalizers = |v: &VirtualMachineInstance| {
        v.metadata
            .finalizers
            .as_ref()
            .and_then(|f| serde_json::to_value(f).ok())
    };
    value_ops(
        &mut ops,
        "/metadata/labels",
        labels(old).as_ref(),
        labels(new).as_ref(),
    );
    value_ops(
        &mut ops,
        "/metadata/finalizers",
        finalizers(old).as_ref(),
        finalizers(new).as_ref(),
    );
    if only_deferrable(old, new, &ops) {
        return Vec::new();
    }
    if !ops.is_empty()
        && !handler
        && let Some(rv) = old.metadata.resource_version.as_deref()
    {
        ops.insert(
            0,
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
        );
    }
    ops
}

/// Status fields that may wait while the VMI stays `Scheduling`: the node the pod was bound
/// to (`activePods`) and the pod's QoS class. The `Scheduled` write carries them a moment
/// later, so writing them alone costs a VMI write for nothing (upstream writes them at once;
/// nothing reads them before `Scheduled`).
const DEFERRABLE_WHILE_SCHEDULING: &[&str] = &["/status/activePods", "/status/qosClass"];

/// Whether `ops` change nothing but [`DEFERRABLE_WHILE_SCHEDULING`] of a VMI that is and
/// stays `Scheduling`.
fn only_deferrable(
    old: &VirtualMachineInstance,
    new: &VirtualMachineInstance,
    ops: &[Value],
) -> bool {
    let phase = |v: &VirtualMachineInstance| v.status.as_ref().and_then(|s| s.phase.clone());
    let scheduling = Some(Phase::Scheduling);
    phase(old) == scheduling
        && phase(new) == scheduling
        && !ops.is_empty()
        && ops
            .iter()
            .filter(|op| op["op"] != "test")
            .all(|op| DEFERRABLE_WHILE_SCHEDULING.contains(&op["path"].as_str().unwrap_or("")))
}

/// Appends the new phase transitions (`add …/-`), or adds the list when there was none.
fn timestamp_ops(ops: &mut Vec<Value>, old: Option<&Value>, new: Option<&Value>) {
    let old_len = old.and_then(Value::as_array).map_or(0, Vec::len);
    let Some(new_list) = new.and_then(Value::as_array) else {
        return;
    };
    if old_len == 0 {
        ops.push(
            json!({"op": "add", "path": "/status/phaseTransitionTimestamps", "value": new_list}),
        );
        return;
    }
    for entry in new_list.iter().skip(old_len) {
        ops.push(
            json!({"op": "add", "path": "/status/phaseTransitionTimestamps/-", "value": entry}),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn now() -> Time {
        Time(Timestamp::from_second(1_700_000_000).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    fn vmi(phase: &Phase, extra: Value) -> VirtualMachineInstance {
        let mut v = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vmi", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "finalizers": ["kubevirt.io/foregroundDeleteVirtualMachine"]},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": phase.as_str()}
        });
        merge(&mut v, extra);
        serde_json::from_value(v).expect("vmi")
    }

    fn merge(base: &mut Value, extra: Value) {
        match (base, extra) {
            (Value::Object(b), Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    /// A launcher pod in `phase`; `ready` makes compute running and the pod Ready.
    fn pod(phase: &str, ready: bool, extra: Value) -> Pod {
        let compute_state = if ready {
            json!({"running": {}})
        } else {
            json!({"waiting": {"reason": "ContainerCreating"}})
        };
        let mut p = json!({
            "metadata": {"name": "virt-launcher-vmi-x", "namespace": "ns", "uid": "pod-uid",
                         "annotations": {"kubevirt.io/migrationTransportUnix": "true"}},
            "spec": {"nodeName": "node01", "containers": [{"name": "compute", "image": "img:v1"}]},
            "status": {
                "phase": phase,
                "qosClass": "Burstable",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [{"name": "compute", "ready": ready, "restartCount": 0, "image": "img:v1",
                                       "imageID": "", "state": compute_state}]
            }
        });
        merge(&mut p, extra);
        serde_json::from_value(p).expect("pod")
    }

    fn run(
        vmi: &VirtualMachineInstance,
        pod: Option<&Pod>,
        failure: Option<&SyncFailure>,
    ) -> (VirtualMachineInstance, Option<SyncFailure>) {
        let pods: Vec<&Pod> = pod.into_iter().collect();
        let now = now();
        let obs = Observed {
            pod,
            pods: &pods,
            sync_failure: failure,
            launcher_image: "img:v1",
            owner_vm_exists: false,
            now: &now,
            claim_volumes: &[],
            hotplug_volume_status: None,
        };
        desired_vmi(vmi, &obs).expect("status pass")
    }

    fn phase(vmi: &VirtualMachineInstance) -> Phase {
        phase_of(vmi)
    }

    #[test]
    fn the_phase_table_moves_vmis_as_upstream() {
        let deleting = json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}});
        let pending_pod = pod("Pending", false, json!({}));
        let ready_pod = pod("Running", true, json!({}));
        let failed_pod = pod("Failed", false, json!({}));
        let terminated = pod(
            "Running",
            false,
            json!({"status": {"containerStatuses": [{"name": "compute", "ready": false,
            "restartCount": 0, "image": "", "imageID": "", "state": {"terminated": {"exitCode": 1}}}]}}),
        );
        // (case, vmi, pod, expected phase)
        let cases: Vec<(&str, VirtualMachineInstance, Option<&Pod>, Phase)> = vec![
            (
                "a new VMI without a pod is pending",
                vmi(&Phase::Unset, json!({})),
                None,
                Phase::Pending,
            ),
            (
                "a pending VMI with any pod is scheduling",
                vmi(&Phase::Pending, json!({})),
                Some(&pending_pod),
                Phase::Scheduling,
            ),
            (
                "a pending VMI deleted before its pod fails",
                vmi(&Phase::Pending, deleting.clone()),
                None,
                Phase::Failed,
            ),
            (
                "a scheduling VMI waits for an unready pod",
                vmi(&Phase::Scheduling, json!({})),
                Some(&pending_pod),
                Phase::Scheduling,
            ),
            (
                "a scheduling VMI with a ready pod is scheduled",
                vmi(&Phase::Scheduling, json!({})),
                Some(&ready_pod),
                Phase::Scheduled,
            ),
            (
                "a deleting scheduling VMI is not scheduled",
                vmi(&Phase::Scheduling, deleting),
                Some(&ready_pod),
                Phase::Scheduling,
            ),
            (
                "a scheduling VMI whose pod is gone fails",
                vmi(&Phase::Scheduling, json!({})),
                None,
                Phase::Failed,
            ),
            (
                "a scheduling VMI whose pod failed fails",
                vmi(&Phase::Scheduling, json!({})),
                Some(&failed_pod),
                Phase::Failed,
            ),
            (
                "a scheduling VMI whose compute container exited fails",
                vmi(&Phase::Scheduling, json!({})),
                Some(&terminated),
                Phase::Failed,
            ),
            (
                "a scheduled VMI without a pod fails",
                vmi(&Phase::Scheduled, json!({})),
                None,
                Phase::Failed,
            ),
            (
                "a running VMI without a pod fails",
                vmi(&Phase::Running, json!({})),
                None,
                Phase::Failed,
            ),
            (
                "a running VMI with its pod stays running",
                vmi(&Phase::Running, json!({})),
                Some(&ready_pod),
                Phase::Running,
            ),
            (
                "a scheduled VMI with its pod is left to the handler",
                vmi(&Phase::Scheduled, json!({})),
                Some(&pending_pod),
                Phase::Scheduled,
            ),
            (
                "a succeeded VMI stays succeeded",
                vmi(&Phase::Succeeded, json!({})),
                None,
                Phase::Succeeded,
            ),
        ];
        for (case, vmi, pod, expected) in cases {
            assert_eq!(phase(&run(&vmi, pod, None).0), expected, "{case}");
        }
    }

    #[test]
    fn receiver_vmis_wait_for_sync_again_only_from_scheduled() {
        let receiver =
            json!({"metadata": {"annotations": {"kubevirt.io/create-migration-target": "true"}}});
        let mut receiver_failed = receiver.clone();
        merge(
            &mut receiver_failed,
            json!({"status": {"migrationState": {"failed": true}}}),
        );
        let pending_pod = pod("Pending", false, json!({}));
        let ready_pod = pod("Running", true, json!({}));
        let failed_pod = pod("Failed", false, json!({}));
        // (case, vmi, pod, expected phase)
        let cases: Vec<(&str, VirtualMachineInstance, Option<&Pod>, Phase)> = vec![
            (
                "a running receiver without a pod fails too",
                vmi(&Phase::Running, receiver.clone()),
                None,
                Phase::Failed,
            ),
            (
                "a scheduled receiver without a pod waits for sync again",
                vmi(&Phase::Scheduled, receiver.clone()),
                None,
                Phase::WaitingForSync,
            ),
            (
                "a scheduled receiver whose pod failed waits for sync again",
                vmi(&Phase::Scheduled, receiver.clone()),
                Some(&failed_pod),
                Phase::WaitingForSync,
            ),
            (
                "a scheduled receiver whose migration failed waits for sync again",
                vmi(&Phase::Scheduled, receiver_failed.clone()),
                Some(&ready_pod),
                Phase::WaitingForSync,
            ),
            (
                "a scheduled plain VMI with a failed pod is left to the handler",
                vmi(&Phase::Scheduled, json!({})),
                Some(&failed_pod),
                Phase::Scheduled,
            ),
            (
                "a waiting receiver with a pod is scheduling",
                vmi(&Phase::WaitingForSync, receiver.clone()),
                Some(&pending_pod),
                Phase::Scheduling,
            ),
            (
                "a waiting receiver whose pod failed keeps waiting",
                vmi(&Phase::WaitingForSync, receiver.clone()),
                Some(&failed_pod),
                Phase::WaitingForSync,
            ),
            (
                "a waiting receiver whose migration failed keeps waiting",
                vmi(&Phase::WaitingForSync, receiver_failed),
                Some(&pending_pod),
                Phase::WaitingForSync,
            ),
        ];
        for (case, vmi, pod, expected) in cases {
            assert_eq!(phase(&run(&vmi, pod, None).0), expected, "{case}");
        }
    }

    #[test]
    fn the_scheduled_transition_records_node_label_transport_and_timestamp() {
        let (new, failure) = run(
            &vmi(&Phase::Scheduling, json!({})),
            Some(&pod("Running", true, json!({}))),
            None,
        );
        assert_eq!(failure, None);
        let status = new.status.as_ref().expect("status");
        assert_eq!(status.node_name.as_deref(), Some("node01"));
        assert_eq!(status.migration_transport, Some(MigrationTransport::Unix));
        assert_eq!(status.qos_class.as_deref(), Some("Burstable"));
        assert_eq!(
            status.launcher_container_image_version.as_deref(),
            Some("img:v1")
        );
        assert_eq!(
            status.active_pods.get("pod-uid").map(String::as_str),
            Some("node01")
        );
        assert_eq!(
            new.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(c::NODE_NAME_LABEL))
                .map(String::as_str),
            Some("node01")
        );
        assert_eq!(
            status
                .phase_transition_timestamps
                .last()
                .and_then(|t| t.phase.clone()),
            Some(Phase::Scheduled)
        );
    }

    #[test]
    fn the_ready_condition_has_upstream_reasons() {
        let running = vmi(&Phase::Running, json!({}));
        let scheduled = vmi(&Phase::Scheduled, json!({}));
        let ready_pod = pod("Running", true, json!({}));
        let terminating = pod(
            "Running",
            true,
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        );
        let mut no_condition = pod("Running", true, json!({}));
        if let Some(s) = no_condition.status.as_mut() {
            s.conditions = None;
        }
        // (case, vmi, pod, status, reason)
        let cases = [
            (
                "no pod",
                &running,
                None,
                ConditionStatus::False,
                Some(POD_NOT_EXISTS_REASON),
            ),
            (
                "terminating pod",
                &running,
                Some(&terminating),
                ConditionStatus::False,
                Some(POD_TERMINATING_REASON),
            ),
            (
                "guest not running",
                &scheduled,
                Some(&ready_pod),
                ConditionStatus::False,
                Some(GUEST_NOT_RUNNING_REASON),
            ),
            (
                "pod condition missing",
                &running,
                Some(&no_condition),
                ConditionStatus::False,
                Some(POD_CONDITION_MISSING_REASON),
            ),
            (
                "copied from the pod",
                &running,
                Some(&ready_pod),
                ConditionStatus::True,
                None,
            ),
        ];
        for (case, vmi, pod, status, reason) in cases {
            let c = ready_condition(vmi, pod, &now());
            assert_eq!((c.status, c.reason.as_deref()), (status, reason), "{case}");
        }
    }

    #[test]
    fn an_unschedulable_pod_puts_pod_scheduled_on_the_vmi_until_it_recovers() {
        let unschedulable = pod(
            "Pending",
            false,
            json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available"}]}}),
        );
        let (new, _) = run(
            &vmi(&Phase::Scheduling, json!({})),
            Some(&unschedulable),
            None,
        );
        let cond = new
            .status
            .as_ref()
            .and_then(|s| s.condition(&CondType::PodScheduled).cloned())
            .expect("copied");
        assert_eq!(
            (cond.status, cond.reason.as_deref()),
            (ConditionStatus::False, Some("Unschedulable"))
        );
        let (recovered, _) = run(&new, Some(&pod("Pending", false, json!({}))), None);
        assert!(
            recovered
                .status
                .as_ref()
                .and_then(|s| s.condition(&CondType::PodScheduled))
                .is_none()
        );
    }

    #[test]
    fn sync_and_image_pull_failures_show_in_the_synchronized_condition() {
        let failure =
            SyncFailure::new("FailedCreate", "failed to create virtual machine pod: boom");
        let (new, _) = run(&vmi(&Phase::Pending, json!({})), None, Some(&failure));
        let sync = new
            .status
            .as_ref()
            .and_then(|s| s.condition(&CondType::Synchronized).cloned())
            .expect("set");
        assert_eq!(
            (sync.status, sync.reason.as_deref()),
            (ConditionStatus::False, Some("FailedCreate"))
        );
        let (cleared, _) = run(&new, None, None);
        assert!(
            cleared
                .status
                .as_ref()
                .and_then(|s| s.condition(&CondType::Synchronized))
                .is_none()
        );

        let pulling = pod(
            "Pending",
            false,
            json!({"status": {"containerStatuses": [{"name": "compute", "ready": false,
            "restartCount": 0, "image": "", "imageID": "", "state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}]}}),
        );
        let (new, failure) = run(&vmi(&Phase::Scheduling, json!({})), Some(&pulling), None);
        assert_eq!(failure.map(|f| f.reason), Some("ErrImagePull".to_owned()));
        let sync = new
            .status
            .as_ref()
            .and_then(|s| s.condition(&CondType::Synchronized).cloned())
            .expect("set");
        assert_eq!(sync.message.as_deref(), Some("no such image"));
    }

    #[test]
    fn an_outdated_launcher_image_is_labelled_and_the_label_leaves_with_the_pod() {
        let old_image = pod(
            "Running",
            true,
            json!({"spec": {"containers": [{"name": "compute", "image": "img:v0"}]}}),
        );
        let (new, _) = run(&vmi(&Phase::Running, json!({})), Some(&old_image), None);
        assert!(
            new.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(c::OUTDATED_LAUNCHER_IMAGE_LABEL))
        );
        let (current, _) = run(&new, Some(&pod("Running", true, json!({}))), None);
        assert!(
            !current
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(c::OUTDATED_LAUNCHER_IMAGE_LABEL))
        );
    }

    #[test]
    fn a_final_vmi_loses_its_finalizers_once_no_pod_remains() {
        let failed = vmi(
            &Phase::Failed,
            json!({"metadata": {"finalizers": ["foregroundDeleteVirtualMachine", "kubevirt.io/virtualMachineControllerFinalize"]}}),
        );
        let (with_pod, _) = run(&failed, Some(&pod("Failed", false, json!({}))), None);
        assert_eq!(
            with_pod.metadata.finalizers,
            Some(vec![c::VMI_FINALIZER.to_owned()]),
            "orphan: VM finalizer dropped, old form migrated"
        );
        let (gone, _) = run(&failed, None, None);
        assert_eq!(gone.metadata.finalizers, Some(vec![]));
    }

    #[test]
    fn a_final_or_deleted_waiting_vmi_keeps_the_vm_finalizer_only_while_its_vm_exists() {
        let finalizers = json!({"metadata": {
            "finalizers": ["kubevirt.io/virtualMachineControllerFinalize"],
            "deletionTimestamp": "2024-01-01T00:00:00Z"
        }});
        let now = now();
        for phase in [Phase::Failed, Phase::WaitingForSync] {
            let vmi = vmi(&phase, finalizers.clone());
            for (owner_vm_exists, kept) in [(true, true), (false, false)] {
                let obs = Observed {
                    pod: None,
                    pods: &[],
                    sync_failure: None,
                    launcher_image: "",
                    owner_vm_exists,
                    now: &now,
                    claim_volumes: &[],
                    hotplug_volume_status: None,
                };
                let (new, _) = desired_vmi(&vmi, &obs).expect("status pass");
                let has = new
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == c::VM_CONTROLLER_FINALIZER);
                assert_eq!(has, kept, "{phase:?}, owner VM exists: {owner_vm_exists}");
            }
        }
    }

    #[test]
    fn a_running_vmi_failed_by_the_controller_records_no_phase_transition() {
        let running = vmi(
            &Phase::Running,
            json!({"status": {"phaseTransitionTimestamps": [
                {"phase": "Running", "phaseTransitionTimestamp": "2024-01-01T00:00:00Z"}
            ]}}),
        );
        let (new, _) = run(&running, None, None);
        let status = new.status.as_ref().expect("status");
        assert_eq!(status.phase, Some(Phase::Failed));
        assert_eq!(status.phase_transition_timestamps.len(), 1);
        let (scheduling, _) = run(&vmi(&Phase::Scheduling, json!({})), None, None);
        let recorded = &scheduling
            .status
            .as_ref()
            .expect("status")
            .phase_transition_timestamps;
        assert_eq!(
            recorded.len(),
            1,
            "before hand-off the transition is recorded"
        );
    }

    #[test]
    fn a_condition_is_replaced_only_when_its_status_or_reason_changes() {
        let with_ready = |status: &str, reason: &str, message: &str| {
            vmi(
                &Phase::Pending,
                json!({"status": {"conditions": [{"type": "Ready", "status": status,
                    "reason": reason, "message": message,
                    "lastTransitionTime": "2024-01-01T00:00:00Z"}]}}),
            )
        };
        let ready = |v: &VirtualMachineInstance| {
            v.status
                .as_ref()
                .and_then(|s| s.condition(&CondType::Ready).cloned())
                .expect("Ready")
        };
        let old = with_ready("False", POD_NOT_EXISTS_REASON, "an older wording");
        let (kept, _) = run(&old, None, None);
        assert_eq!(ready(&kept), ready(&old), "message-only change ignored");
        let old = with_ready("False", "SomethingElse", "x");
        let (replaced, _) = run(&old, None, None);
        let cond = ready(&replaced);
        assert_eq!(cond.reason.as_deref(), Some(POD_NOT_EXISTS_REASON));
        assert_eq!(
            cond.message.as_deref(),
            Some("virt-launcher pod has not yet been scheduled")
        );
        assert_eq!(cond.last_probe_time, Some(now()), "probed now, as upstream");
        assert_eq!(cond.last_transition_time, Some(now()));
    }

    #[test]
    fn the_unknown_phase_is_refused() {
        let now = now();
        let obs = Observed {
            pod: None,
            pods: &[],
            sync_failure: None,
            launcher_image: "",
            owner_vm_exists: false,
            now: &now,
            claim_volumes: &[],
            hotplug_volume_status: None,
        };
        assert_eq!(
            desired_vmi(&vmi(&Phase::Unknown, json!({})), &obs).err(),
            Some(StatusError::UnknownPhase("Unknown".to_owned()))
        );
    }

    #[test]
    fn after_hand_off_only_owned_fields_are_patched_with_tests() {
        let old = vmi(
            &Phase::Running,
            json!({"status": {"nodeName": "node01", "interfaces": [{"name": "default"}]}}),
        );
        let (new, _) = run(&old, None, None);
        let ops = vmi_patch(&old, &new);
        let paths: Vec<(&str, &str)> = ops
            .iter()
            .map(|o| {
                (
                    o["op"].as_str().unwrap_or(""),
                    o["path"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            paths,
            vec![
                ("add", "/status/conditions"),
                ("test", "/status/phase"),
                ("replace", "/status/phase"),
            ]
        );
        assert_eq!(ops[2]["value"], "Failed");
    }

    #[test]
    fn before_hand_off_the_patch_tests_the_resource_version_and_writes_every_change() {
        let old = vmi(&Phase::Scheduling, json!({}));
        let (new, _) = run(&old, Some(&pod("Running", true, json!({}))), None);
        let ops = vmi_patch(&old, &new);
        assert_eq!(
            ops[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        let paths: Vec<&str> = ops.iter().filter_map(|o| o["path"].as_str()).collect();
        for path in [
            "/status/nodeName",
            "/status/phase",
            "/status/activePods",
            "/status/qosClass",
            "/metadata/labels",
        ] {
            assert!(paths.contains(&path), "{path} in {paths:?}");
        }
        assert!(ops.contains(
            &json!({"op": "add", "path": "/status/phaseTransitionTimestamps",
            "value": [{"phase": "Scheduled", "phaseTransitionTimestamp": "2023-11-14T22:13:20Z"}]})
        ));
    }

    #[test]
    fn a_bound_pod_alone_writes_nothing_until_the_vmi_is_scheduled() {
        // As the VMI stands once its pod is created: written, the pod not bound yet.
        let unbound = pod("Pending", false, json!({"spec": {"nodeName": null}}));
        let (old, _) = run(&vmi(&Phase::Scheduling, json!({})), Some(&unbound), None);
        assert_eq!(
            old.status
                .as_ref()
                .and_then(|s| s.active_pods.get("pod-uid"))
                .map(String::as_str),
            Some("")
        );
        let bound = pod("Pending", false, json!({}));
        let (new, _) = run(&old, Some(&bound), None);
        let status = new.status.as_ref().expect("status");
        assert_eq!(status.phase, Some(Phase::Scheduling));
        assert_eq!(
            status.active_pods.get("pod-uid").map(String::as_str),
            Some("node01")
        );
        let ops = vmi_patch(&old, &new);
        assert!(
            ops.is_empty(),
            "the node name and QoS class wait for the Scheduled write: {ops:?}"
        );
        // A change beside them is written, and takes them along.
        let (scheduled, _) = run(&old, Some(&pod("Running", true, json!({}))), None);
        let paths: Vec<String> = vmi_patch(&old, &scheduled)
            .iter()
            .filter_map(|o| o["path"].as_str().map(str::to_owned))
            .collect();
        assert!(
            paths.contains(&"/status/activePods".to_owned()),
            "{paths:?}"
        );
    }

    #[test]
    fn nothing_is_written_when_nothing_changed() {
        let old = vmi(&Phase::Scheduling, json!({}));
        let pending_pod = pod("Pending", false, json!({}));
        let (first, _) = run(&old, Some(&pending_pod), None);
        let (second, _) = run(&first, Some(&pending_pod), None);
        assert!(vmi_patch(&first, &second).is_empty());
        let running = vmi(&Phase::Running, json!({}));
        let ready = pod("Running", true, json!({}));
        let (first, _) = run(&running, Some(&ready), None);
        let (second, _) = run(&first, Some(&ready), None);
        assert!(vmi_patch(&first, &second).is_empty());
    }
}
