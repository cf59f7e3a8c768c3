//! The pure half of `start`, `stop` and `restart`: from the VM, its VMI (if any) and the
//! request options, decide which JSON patch to send — or which error to answer.
//!
//! Two kinds of patch, as upstream: a *spec* patch flips `spec.runStrategy` (or the
//! deprecated `spec.running`) guarded by a `test` of the current value; a *status* patch
//! appends `status.stateChangeRequests` guarded by a `test` of the current list. Either
//! `test` failing at the API server means the VM changed meanwhile (answered 409).

use kubevirt_api::v1::{
    ConditionStatus, RestartOptions, RunStrategy, START_REQUEST_DATA_PAUSED_KEY,
    START_REQUEST_DATA_PAUSED_TRUE, StartOptions, StateChangeRequestAction, StopOptions,
    VirtualMachine, VirtualMachineConditionType, VirtualMachineInstance,
    VirtualMachineInstancePhase, VirtualMachineStateChangeRequest, VirtualMachineStatus,
};
use serde_json::{Value, json};

use super::error::{Res, SubError};

/// Upstream's message when a volume migration left the VM needing manual recovery.
pub const MANUAL_RECOVERY_MESSAGE: &str = "VM recovery required: Volume migration failed, leaving some volumes pointing to non-consistent targets; manual intervention is needed to reassign them to their original volumes.";
/// The inner error when the VM has no live VMI.
pub const VM_NOT_RUNNING: &str = "VM is not running";

/// What to send to the API server.
#[derive(Debug, Clone, PartialEq)]
pub enum VmPatch {
    /// A JSON patch of the VM object (spec).
    Spec(Value),
    /// A JSON patch of the VM's `status` subresource.
    Status(Value),
    /// Nothing to change (still answered 202).
    Nothing,
}

/// Whether the VMI has reached a final phase (Succeeded or Failed).
pub fn vmi_is_final(vmi: &VirtualMachineInstance) -> bool {
    matches!(
        phase(vmi),
        VirtualMachineInstancePhase::Succeeded | VirtualMachineInstancePhase::Failed
    )
}

/// The VMI's phase (`""` when unset).
pub fn phase(vmi: &VirtualMachineInstance) -> VirtualMachineInstancePhase {
    vmi.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or(VirtualMachineInstancePhase::Unset)
}

fn name(vm: &VirtualMachine) -> &str {
    vm.metadata.name.as_deref().unwrap_or("")
}

fn run_strategy(vm: &VirtualMachine) -> Result<RunStrategy, SubError> {
    vm.run_strategy().map_err(SubError::internal)
}

fn vm_condition_true(vm: &VirtualMachine, type_: &str) -> bool {
    vm.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_.as_str() == type_ && c.status == ConditionStatus::True)
    })
}

fn stop_request(vmi: &VirtualMachineInstance) -> VirtualMachineStateChangeRequest {
    VirtualMachineStateChangeRequest {
        action: StateChangeRequestAction::Stop,
        data: Default::default(),
        uid: vmi.metadata.uid.clone(),
    }
}

fn start_request(paused: bool) -> VirtualMachineStateChangeRequest {
    let mut data = std::collections::BTreeMap::new();
    if paused {
        data.insert(
            START_REQUEST_DATA_PAUSED_KEY.to_owned(),
            START_REQUEST_DATA_PAUSED_TRUE.to_owned(),
        );
    }
    VirtualMachineStateChangeRequest {
        action: StateChangeRequestAction::Start,
        data,
        uid: None,
    }
}

/// The status patch that records `changes` (upstream's `getChangeRequestJson`).
///
/// # Errors
/// 500 "unable to complete request: stop/start already underway" when requests are pending
/// and the new ones are not a single stop (which replaces them).
pub fn change_request_patch(
    vm: &VirtualMachine,
    changes: Vec<VirtualMachineStateChangeRequest>,
) -> Result<Value, SubError> {
    let status = vm.status.clone().unwrap_or_default();
    let mut ops = Vec::new();
    if status == VirtualMachineStatus::default() {
        let new = VirtualMachineStatus {
            state_change_requests: changes,
            ..Default::default()
        };
        ops.push(json!({"op": "add", "path": "/status", "value": new}));
    } else {
        let current = if status.state_change_requests.is_empty() {
            Value::Null
        } else {
            json!(status.state_change_requests)
        };
        ops.push(json!({"op": "test", "path": "/status/stateChangeRequests", "value": current}));
        if status.state_change_requests.is_empty() {
            ops.push(json!({"op": "add", "path": "/status/stateChangeRequests", "value": changes}));
        } else if changes.len() == 1 && changes[0].action == StateChangeRequestAction::Stop {
            ops.push(
                json!({"op": "replace", "path": "/status/stateChangeRequests", "value": changes}),
            );
        } else {
            return Err(SubError::internal(
                "unable to complete request: stop/start already underway",
            ));
        }
        if status.start_failure.is_some() {
            ops.push(json!({"op": "remove", "path": "/status/startFailure"}));
        }
    }
    Ok(Value::Array(ops))
}

/// The spec patch that makes the VM run (`Always`) or not (`Halted`), guarded by a `test`
/// of the current value; a VM with neither field set gets `spec.running` added.
pub fn running_patch(vm: &VirtualMachine, running: bool) -> Value {
    if let Some(current) = &vm.spec.run_strategy {
        let new = if running {
            RunStrategy::Always
        } else {
            RunStrategy::Halted
        };
        json!([
            {"op": "test", "path": "/spec/runStrategy", "value": current},
            {"op": "replace", "path": "/spec/runStrategy", "value": new},
        ])
    } else {
        json!([
            {"op": "test", "path": "/spec/running", "value": vm.spec.running},
            {"op": "add", "path": "/spec/running", "value": running},
        ])
    }
}

/// Decides the `start` request.
///
/// # Errors
/// The 409s of upstream (already running, manual recovery, strategy refuses manual start).
pub fn plan_start(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    opts: &StartOptions,
) -> Result<VmPatch, SubError> {
    let strategy = run_strategy(vm)?;
    let name = name(vm);
    if let Some(vmi) = vmi
        && !vmi_is_final(vmi)
        && !matches!(
            phase(vmi),
            VirtualMachineInstancePhase::Unknown | VirtualMachineInstancePhase::Unset
        )
    {
        return Err(SubError::conflict(Res::Vm, name, "VM is already running"));
    }
    if vm_condition_true(
        vm,
        VirtualMachineConditionType::ManualRecoveryRequired.as_str(),
    ) {
        return Err(SubError::conflict(Res::Vm, name, MANUAL_RECOVERY_MESSAGE));
    }
    let paused = opts.paused.unwrap_or(false);
    match strategy {
        RunStrategy::Halted if paused => Ok(VmPatch::Status(change_request_patch(
            vm,
            vec![start_request(true)],
        )?)),
        RunStrategy::Halted => Ok(VmPatch::Spec(running_patch(vm, true))),
        RunStrategy::Manual | RunStrategy::RerunOnFailure => {
            let mut changes = Vec::new();
            if let Some(vmi) = vmi {
                let phase = phase(vmi);
                let rerun = strategy == RunStrategy::RerunOnFailure;
                if rerun && phase == VirtualMachineInstancePhase::Failed {
                    return Err(SubError::conflict(
                        Res::Vm,
                        name,
                        "RerunOnFailure does not support starting VM from failed state",
                    ));
                }
                let stop_first = if rerun {
                    phase == VirtualMachineInstancePhase::Succeeded
                } else {
                    vmi_is_final(vmi)
                };
                if stop_first {
                    changes.push(stop_request(vmi));
                }
            }
            changes.push(start_request(paused));
            Ok(VmPatch::Status(change_request_patch(vm, changes)?))
        }
        RunStrategy::Always | RunStrategy::Once => Err(SubError::conflict(
            Res::Vm,
            name,
            format!(
                "{} does not support manual start requests",
                strategy.as_str()
            ),
        )),
        RunStrategy::WaitAsReceiver => Ok(VmPatch::Nothing),
        other => Err(SubError::internal(format!(
            "unknown runstrategy: {}",
            other.as_str()
        ))),
    }
}

/// The VMI patch that sets `terminationGracePeriodSeconds` before a stop with a grace
/// period (only for a live VMI), guarded by a `test` of the old value.
pub fn grace_period_patch(
    vmi: Option<&VirtualMachineInstance>,
    opts: &StopOptions,
) -> Option<Value> {
    let vmi = vmi.filter(|v| !vmi_is_final(v))?;
    let grace = opts.grace_period?;
    Some(json!([
        {"op": "test", "path": "/spec/terminationGracePeriodSeconds", "value": vmi.spec.termination_grace_period_seconds},
        {"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": grace},
    ]))
}

/// Decides the `stop` request (the grace-period patch of [`grace_period_patch`] is sent
/// before this is consulted, as upstream).
///
/// # Errors
/// The 409s of upstream (not running, Halted without a shorter grace period).
pub fn plan_stop(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    opts: &StopOptions,
) -> Result<VmPatch, SubError> {
    let strategy = run_strategy(vm)?;
    let name = name(vm);
    let live = vmi.filter(|v| !vmi_is_final(v));
    match strategy {
        RunStrategy::Halted | RunStrategy::Manual | RunStrategy::RerunOnFailure => {
            let Some(vmi) = live else {
                return Err(SubError::conflict(Res::Vm, name, VM_NOT_RUNNING));
            };
            if strategy == RunStrategy::Halted {
                let old = vmi.spec.termination_grace_period_seconds;
                let shorter = match (opts.grace_period, old) {
                    (None, _) => false,
                    (Some(new), Some(old)) => new < old,
                    (Some(_), None) => true,
                };
                if !shorter {
                    return Err(SubError::conflict(
                        Res::Vm,
                        name,
                        "Halted only supports manual stop requests with a shorter graceperiod",
                    ));
                }
            }
            Ok(VmPatch::Status(change_request_patch(
                vm,
                vec![stop_request(vmi)],
            )?))
        }
        RunStrategy::Always | RunStrategy::Once => Ok(VmPatch::Spec(running_patch(vm, false))),
        RunStrategy::WaitAsReceiver => Ok(VmPatch::Nothing),
        other => Err(SubError::internal(format!(
            "unknown runstrategy: {}",
            other.as_str()
        ))),
    }
}

/// Checks the `restart` options.
///
/// # Errors
/// 400 for a grace period other than 0 or unset.
pub fn check_restart_options(opts: &RestartOptions) -> Result<(), SubError> {
    match opts.grace_period_seconds {
        Some(g) if g > 0 => Err(SubError::bad_request(
            "For force restart, only gracePeriod=0 is supported for now",
        )),
        Some(g) if g < 0 => Err(SubError::bad_request(
            "gracePeriod has to be greater or equal to 0",
        )),
        _ => Ok(()),
    }
}

/// Decides the `restart` request: a status patch with `[Stop{uid}, Start]`.
///
/// # Errors
/// The 409s of upstream (manual recovery, Halted/Once, no VMI).
pub fn plan_restart(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
) -> Result<VmPatch, SubError> {
    let name = name(vm);
    if vm_condition_true(vm, "VolumesChange") {
        return Err(SubError::conflict(Res::Vm, name, MANUAL_RECOVERY_MESSAGE));
    }
    let strategy = run_strategy(vm)?;
    if matches!(strategy, RunStrategy::Halted | RunStrategy::Once) {
        return Err(SubError::conflict(
            Res::Vm,
            name,
            format!(
                "RunStategy {} does not support manual restart requests",
                strategy.as_str()
            ),
        ));
    }
    let Some(vmi) = vmi else {
        return Err(SubError::conflict(
            Res::Vm,
            name,
            "VM is not running: Halted",
        ));
    };
    Ok(VmPatch::Status(change_request_patch(
        vm,
        vec![stop_request(vmi), start_request(false)],
    )?))
}

#[cfg(test)]
mod tests;
