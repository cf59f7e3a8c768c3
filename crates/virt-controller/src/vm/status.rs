//! The VM status derived from the VM, its VMI, the expectations and the sync outcome
//! (upstream `updateStatus`, reference §2.6), and the patch that writes it.
//!
//! [`compute_status`] is pure: `created`/`ready`, `observedGeneration`/`desiredGeneration`,
//! `runStrategy`, popping of satisfied state change requests, `startFailure`, conditions and
//! `printableStatus` in upstream's first-match order. [`status_patch`] turns the difference
//! into a JSON Patch on the status subresource.
//!
//! Deviations from upstream:
//! - upstream replaces the whole status (`UpdateStatus`) when it changed; we send a JSON Patch
//!   touching only the changed top-level status fields, and nothing when nothing changed. A
//!   changed `stateChangeRequests` or `volumeRequests` list is guarded by a `test` of the list we
//!   read, so a request appended concurrently by the subresource API is never lost.
//! - memory dumps and changed block tracking are not derived yet.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubevirt_api::v1::{
    ConditionStatus, PrintableStatus, RunStrategy, StateChangeRequestAction, VirtualMachine,
    VirtualMachineCondition, VirtualMachineConditionType as VmCond, VirtualMachineInstance,
    VirtualMachineInstanceConditionType as VmiCond, VirtualMachineInstancePhase as Phase,
    VirtualMachineStatus, has_true_condition,
};
use rand::Rng;
use serde_json::{Value, json};

use super::ExpectView;
use super::backoff::{backoff_applies, next_start_failure};

/// What the sync decided about the `RestartRequired` condition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RestartRequired {
    /// Leave the condition as it is.
    #[default]
    Keep,
    /// Set it (True) with this message.
    Set(String),
    /// Remove it.
    Remove,
}

/// Everything [`compute_status`] looks at.
#[derive(Clone, Debug)]
pub struct StatusInput<'a> {
    /// The VM as read from the cache.
    pub vm: &'a VirtualMachine,
    /// Its (claimed) VMI.
    pub vmi: Option<&'a VirtualMachineInstance>,
    /// Pending creations and deletions of the VM key.
    pub expectations: ExpectView,
    /// The reason and message of a failed sync.
    pub sync_error: Option<(&'a str, String)>,
    /// The generation the VMI was started from, if known.
    pub vmi_generation: Option<i64>,
    /// The sync's decision about `RestartRequired`.
    pub restart_required: RestartRequired,
    /// The current time.
    pub now: Timestamp,
    /// A claim of the template's volumes is in the cache and not `Bound` (upstream's
    /// `WaitingForVolumeBinding` applies only while the VM is set to start, see
    /// [`set_to_start`]).
    pub claim_unbound: bool,
    /// The cached DataVolumes the VM refers to (for `DataVolumeError` and `Provisioning`).
    pub data_volumes: &'a [std::sync::Arc<kubevirt_api::cdi::DataVolume>],
}

/// The volume-related printable states that hold, decided from the caches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeStates {
    /// Upstream's `DataVolumeError` predicate.
    pub data_volume_error: bool,
    /// Upstream's `Provisioning` predicate.
    pub provisioning: bool,
    /// A claim is unbound while the VM is set to start (`WaitingForVolumeBinding`).
    pub waiting_for_binding: bool,
}

/// Upstream's `isSetToStart`: whether the VM, with its run strategy and VMI, is meant to run.
pub fn set_to_start(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> bool {
    let final_vmi = vmi.map(|v| vmi_phase(v).is_final());
    match vm.run_strategy().ok() {
        Some(RunStrategy::Always) => true,
        Some(RunStrategy::RerunOnFailure) => vmi.is_none_or(|v| vmi_phase(v) != Phase::Succeeded),
        Some(RunStrategy::Once) => final_vmi != Some(true),
        Some(RunStrategy::Manual) => match final_vmi {
            Some(is_final) => !is_final,
            None => vm.status.as_ref().is_some_and(|s| {
                s.state_change_requests
                    .first()
                    .is_some_and(|r| r.action == StateChangeRequestAction::Start)
            }),
        },
        _ => false,
    }
}

fn vmi_phase(vmi: &VirtualMachineInstance) -> Phase {
    vmi.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or(Phase::Unset)
}

fn vmi_condition<'a>(
    vmi: &'a VirtualMachineInstance,
    type_: &VmiCond,
) -> Option<&'a kubevirt_api::v1::VirtualMachineInstanceCondition> {
    vmi.status.as_ref().and_then(|s| s.condition(type_))
}

fn vmi_condition_is(
    vmi: &VirtualMachineInstance,
    type_: &VmiCond,
    status: &ConditionStatus,
    reason: &str,
) -> bool {
    vmi_condition(vmi, type_)
        .is_some_and(|c| c.status == *status && c.reason.as_deref() == Some(reason))
}

/// The VM status after this reconcile.
pub fn compute_status(input: &StatusInput<'_>, rng: &mut impl Rng) -> VirtualMachineStatus {
    let vm = input.vm;
    let vmi = input.vmi;
    let mut status = vm.status.clone().unwrap_or_default();
    let strategy = vm.run_strategy().ok();

    // Upstream's `created`/`ready` are `omitempty` booleans: false is not written.
    status.created = vmi.is_some().then_some(true);
    status.ready = (vmi.is_some_and(|v| {
        v.status
            .as_ref()
            .is_some_and(|s| has_true_condition(&s.conditions, &VmiCond::Ready))
    }))
    .then_some(true);
    if vmi.is_some()
        && let Some(generation) = input.vmi_generation
    {
        status.observed_generation = Some(generation);
        status.desired_generation = vm.metadata.generation;
    }
    let had_strategy = status
        .run_strategy
        .as_ref()
        .is_some_and(|s| !s.as_str().is_empty());
    if let Some(s) = &strategy
        && (had_strategy || status.created == Some(true))
    {
        status.run_strategy = Some(s.clone());
    }
    pop_state_change_request(&mut status, vmi);
    super::volume_requests::trim_done(&mut status, vm, vmi);
    let effective = strategy.clone().unwrap_or(RunStrategy::Unknown);
    status.start_failure = next_start_failure(
        status.start_failure.as_ref(),
        vmi,
        strategy.as_ref(),
        input.now,
        rng,
    );
    sync_conditions(&mut status.conditions, input);
    let volumes = VolumeStates {
        data_volume_error: super::data_volumes::data_volume_error(vm, input.data_volumes),
        provisioning: super::data_volumes::provisioning(vm, input.data_volumes),
        waiting_for_binding: input.claim_unbound && set_to_start(vm, vmi),
    };
    status.printable_status = Some(printable_status(
        vm,
        &status,
        vmi,
        input.expectations,
        &effective,
        input.now,
        volumes,
    ));
    status
}

/// Removes the first state change request once it is fulfilled.
fn pop_state_change_request(
    status: &mut VirtualMachineStatus,
    vmi: Option<&VirtualMachineInstance>,
) {
    let Some(first) = status.state_change_requests.first() else {
        return;
    };
    let pop = match first.action {
        StateChangeRequestAction::Stop => match (vmi, &first.uid) {
            (None, _) | (_, None) => true,
            (Some(v), Some(uid)) => v.metadata.uid.as_ref() != Some(uid),
        },
        StateChangeRequestAction::Start => {
            vmi.is_some_and(|v| v.metadata.deletion_timestamp.is_none() && !vmi_phase(v).is_final())
        }
        StateChangeRequestAction::Other(_) => false,
    };
    if pop {
        status.state_change_requests.remove(0);
    }
}

/// Puts `cond` into `conditions`: appended when new, replaced only when its status or
/// reason differ (message-only changes are ignored, as upstream).
fn put_condition(conditions: &mut Vec<VirtualMachineCondition>, cond: VirtualMachineCondition) {
    match conditions.iter_mut().find(|c| c.type_ == cond.type_) {
        Some(existing) => {
            if existing.status != cond.status || existing.reason != cond.reason {
                *existing = cond;
            }
        }
        None => conditions.push(cond),
    }
}

fn condition(
    type_: VmCond,
    status: ConditionStatus,
    reason: &str,
    message: String,
    now: Timestamp,
) -> VirtualMachineCondition {
    VirtualMachineCondition {
        type_,
        status,
        last_probe_time: None,
        last_transition_time: Some(Time(now)),
        reason: Some(reason.to_owned()),
        message: Some(message),
    }
}

/// Conditions in upstream's order: `RestartRequired` is decided during the sync, before the
/// status pass sets `Ready` (probed now when derived without a VMI `Ready`), then `Failure`,
/// then the copies of the VMI's conditions; a condition new to the list is appended.
fn sync_conditions(conditions: &mut Vec<VirtualMachineCondition>, input: &StatusInput<'_>) {
    let now = input.now;
    match &input.restart_required {
        RestartRequired::Keep => {}
        RestartRequired::Remove => conditions.retain(|c| c.type_ != VmCond::RestartRequired),
        RestartRequired::Set(message) => put_condition(
            conditions,
            VirtualMachineCondition {
                reason: None,
                ..condition(
                    VmCond::RestartRequired,
                    ConditionStatus::True,
                    "",
                    message.clone(),
                    now,
                )
            },
        ),
    }
    let not_ready = |reason: &str, message: &str| VirtualMachineCondition {
        last_probe_time: Some(Time(now)),
        ..condition(
            VmCond::Ready,
            ConditionStatus::False,
            reason,
            message.into(),
            now,
        )
    };
    let ready = match input.vmi {
        None => not_ready("VMINotExists", "VMI does not exist"),
        Some(vmi) => match vmi_condition(vmi, &VmiCond::Ready) {
            None => not_ready("VMIConditionMissing", "VMI is missing the Ready condition"),
            Some(c) => VirtualMachineCondition {
                type_: VmCond::Ready,
                status: c.status.clone(),
                last_probe_time: c.last_probe_time.clone(),
                last_transition_time: c.last_transition_time.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            },
        },
    };
    put_condition(conditions, ready);
    match &input.sync_error {
        Some((reason, message)) => put_condition(
            conditions,
            condition(
                VmCond::Failure,
                ConditionStatus::True,
                reason,
                message.clone(),
                now,
            ),
        ),
        None => conditions.retain(|c| c.type_ != VmCond::Failure),
    }
    if let Some(vmi) = input.vmi {
        copy_vmi_conditions(conditions, vmi);
    }
}

/// Copies every VMI condition except Ready/Failure/RestartRequired and removes VM conditions
/// the VMI no longer has (again except those three).
fn copy_vmi_conditions(
    conditions: &mut Vec<VirtualMachineCondition>,
    vmi: &VirtualMachineInstance,
) {
    let own = |t: &VmCond| matches!(t, VmCond::Ready | VmCond::Failure | VmCond::RestartRequired);
    let vmi_conditions = vmi
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    for c in vmi_conditions {
        let type_ = VmCond::from(c.type_.as_str());
        if own(&type_) {
            continue;
        }
        put_condition(
            conditions,
            VirtualMachineCondition {
                type_,
                status: c.status.clone(),
                last_probe_time: c.last_probe_time.clone(),
                last_transition_time: c.last_transition_time.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            },
        );
    }
    conditions.retain(|c| {
        own(&c.type_)
            || vmi_conditions
                .iter()
                .any(|v| v.type_.as_str() == c.type_.as_str())
    });
}

/// Whether the VM is migrating at `now`.
fn migrating(vmi: &VirtualMachineInstance, now: Timestamp) -> bool {
    let Some(state) = vmi.status.as_ref().and_then(|s| s.migration_state.as_ref()) else {
        return false;
    };
    let started = state.start_timestamp.as_ref().is_some_and(|t| t.0 <= now);
    let ended = state.end_timestamp.as_ref().is_some_and(|t| t.0 <= now);
    started && !ended
}

/// `status.printableStatus`, the first matching rule of upstream's list.
pub fn printable_status(
    vm: &VirtualMachine,
    status: &VirtualMachineStatus,
    vmi: Option<&VirtualMachineInstance>,
    expectations: ExpectView,
    strategy: &RunStrategy,
    now: Timestamp,
    volumes: VolumeStates,
) -> PrintableStatus {
    use PrintableStatus as P;
    let phase = vmi.map(vmi_phase);
    let is_final = phase.as_ref().is_some_and(Phase::is_final);
    let has = |t: &VmiCond, s: ConditionStatus, r: &str| {
        vmi.is_some_and(|v| vmi_condition_is(v, t, &s, r))
    };
    let paused = vmi.is_some_and(|v| {
        v.status
            .as_ref()
            .is_some_and(|s| has_true_condition(&s.conditions, &VmiCond::Paused))
    });
    let crash_loop = status
        .start_failure
        .as_ref()
        .and_then(|f| f.consecutive_fail_count)
        .is_some_and(|n| n > 0);
    if vm.metadata.deletion_timestamp.is_some() {
        return P::Terminating;
    }
    if let Some(v) = vmi
        && !is_final
        && (v.metadata.deletion_timestamp.is_some() || expectations.deletions_pending)
    {
        return P::Stopping;
    }
    if vmi.is_some_and(|v| migrating(v, now)) {
        return P::Migrating;
    }
    if phase == Some(Phase::Running) {
        return if paused { P::Paused } else { P::Running };
    }
    let rules: [(bool, P); 7] = [
        (
            has(
                &VmiCond::Synchronized,
                ConditionStatus::False,
                "FailedPvcNotFound",
            ),
            P::ErrorPvcNotFound,
        ),
        (volumes.data_volume_error, P::DataVolumeError),
        (
            has(
                &VmiCond::PodScheduled,
                ConditionStatus::False,
                "Unschedulable",
            ),
            P::ErrorUnschedulable,
        ),
        (volumes.provisioning, P::Provisioning),
        (volumes.waiting_for_binding, P::WaitingForVolumeBinding),
        (
            has(
                &VmiCond::Synchronized,
                ConditionStatus::False,
                "ErrImagePull",
            ),
            P::ErrImagePull,
        ),
        (
            has(
                &VmiCond::Synchronized,
                ConditionStatus::False,
                "ImagePullBackOff",
            ),
            P::ImagePullBackOff,
        ),
    ];
    if let Some((_, p)) = rules.into_iter().find(|(hit, _)| *hit) {
        return p;
    }
    let starting = match &phase {
        None => expectations.creations_pending,
        Some(p) => matches!(
            p,
            Phase::Unset | Phase::Pending | Phase::Scheduling | Phase::Scheduled
        ),
    };
    if starting {
        return P::Starting;
    }
    if (vmi.is_none() || is_final)
        && !expectations.creations_pending
        && crash_loop
        && backoff_applies(strategy)
    {
        return P::CrashLoopBackOff;
    }
    if is_final || (vmi.is_none() && !expectations.creations_pending) {
        return P::Stopped;
    }
    if *strategy == RunStrategy::WaitAsReceiver
        && (vmi.is_none() || phase == Some(Phase::WaitingForSync))
    {
        return P::WaitingForReceiver;
    }
    P::Unknown
}

/// The JSON Patch writing `new` over `old` on the status subresource, or `None` when nothing
/// changed. Only changed top-level fields are written; a changed `stateChangeRequests` is
/// guarded by a `test` of its old value.
pub fn status_patch(
    old: Option<&VirtualMachineStatus>,
    new: &VirtualMachineStatus,
) -> Option<Vec<Value>> {
    let new_value = serde_json::to_value(new).ok()?;
    let Some(old) = old else {
        return Some(vec![
            json!({"op": "add", "path": "/status", "value": new_value}),
        ]);
    };
    let old_value = serde_json::to_value(old).ok()?;
    let (Value::Object(old_map), Value::Object(new_map)) = (old_value, new_value) else {
        return None;
    };
    let mut ops = Vec::new();
    let keys: std::collections::BTreeSet<&String> = old_map.keys().chain(new_map.keys()).collect();
    for key in keys {
        let path = format!("/status/{key}");
        match (old_map.get(key), new_map.get(key)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), next) => {
                // Lists virt-api appends to concurrently: never write over an append.
                if key == "stateChangeRequests" || key == "volumeRequests" {
                    ops.push(json!({"op": "test", "path": path, "value": a}));
                }
                match next {
                    Some(b) => ops.push(json!({"op": "replace", "path": path, "value": b})),
                    None => ops.push(json!({"op": "remove", "path": path})),
                }
            }
            (None, Some(b)) => ops.push(json!({"op": "add", "path": path, "value": b})),
            (None, None) => {}
        }
    }
    (!ops.is_empty()).then_some(ops)
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
