use super::*;
use crate::vm::tests::fixtures::{now, time, vm, vmi};
use kubevirt_api::v1::{
    VirtualMachineInstanceCondition, VirtualMachineInstanceMigrationState,
    VirtualMachineStartFailure, VirtualMachineStateChangeRequest, find_condition,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn status_of(input: &StatusInput<'_>) -> VirtualMachineStatus {
    compute_status(input, &mut StdRng::seed_from_u64(5))
}

fn input<'a>(vm: &'a VirtualMachine, vmi: Option<&'a VirtualMachineInstance>) -> StatusInput<'a> {
    StatusInput {
        vm,
        vmi,
        expectations: ExpectView::idle(),
        sync_error: None,
        vmi_generation: None,
        restart_required: RestartRequired::Keep,
        now: now(),
        claim_unbound: false,
        data_volumes: &[],
    }
}

fn vmi_cond(
    type_: VmiCond,
    status: ConditionStatus,
    reason: Option<&str>,
) -> VirtualMachineInstanceCondition {
    VirtualMachineInstanceCondition {
        reason: reason.map(str::to_owned),
        ..VirtualMachineInstanceCondition::new(type_, status)
    }
}

fn with_conditions(
    mut vmi: VirtualMachineInstance,
    conditions: Vec<VirtualMachineInstanceCondition>,
) -> VirtualMachineInstance {
    vmi.status.as_mut().unwrap().conditions = conditions;
    vmi
}

/// `vmi` after it reached Running once (so its end is no start failure).
fn ran(mut vmi: VirtualMachineInstance) -> VirtualMachineInstance {
    let status = vmi.status.as_mut().unwrap();
    status.phase_transition_timestamps.push(
        kubevirt_api::v1::VirtualMachineInstancePhaseTransitionTimestamp {
            phase: Some(Phase::Running),
            phase_transition_timestamp: Some(time(-60)),
        },
    );
    vmi
}

fn crash_looping(strategy: RunStrategy) -> VirtualMachine {
    let mut vm = vm(strategy);
    vm.status.as_mut().unwrap().start_failure = Some(VirtualMachineStartFailure {
        consecutive_fail_count: Some(1),
        last_failed_vmi_uid: Some("old".into()),
        retry_after_timestamp: Some(time(300)),
    });
    vm
}

#[test]
#[allow(clippy::too_many_lines)] // one table of fixtures and expectations
fn printable_status_follows_upstreams_first_match_order() {
    use PrintableStatus as P;
    let creating = ExpectView {
        satisfied: false,
        creations_pending: true,
        deletions_pending: false,
    };
    let deleting_expected = ExpectView {
        satisfied: false,
        creations_pending: false,
        deletions_pending: true,
    };
    let mut deleting_vm = vm(RunStrategy::Always);
    deleting_vm.metadata.deletion_timestamp = Some(time(0));
    let mut deleting_running = vmi(Phase::Running);
    deleting_running.metadata.deletion_timestamp = Some(time(0));
    let mut deleting_failed = ran(vmi(Phase::Failed));
    deleting_failed.metadata.deletion_timestamp = Some(time(0));
    let mut migrating = vmi(Phase::Running);
    migrating.status.as_mut().unwrap().migration_state =
        Some(VirtualMachineInstanceMigrationState {
            start_timestamp: Some(time(-10)),
            ..VirtualMachineInstanceMigrationState::default()
        });
    let mut migrated = migrating.clone();
    migrated
        .status
        .as_mut()
        .unwrap()
        .migration_state
        .as_mut()
        .unwrap()
        .end_timestamp = Some(time(-1));
    let paused = with_conditions(
        vmi(Phase::Running),
        vec![vmi_cond(VmiCond::Paused, ConditionStatus::True, None)],
    );
    let unschedulable = with_conditions(
        vmi(Phase::Scheduling),
        vec![vmi_cond(
            VmiCond::PodScheduled,
            ConditionStatus::False,
            Some("Unschedulable"),
        )],
    );
    let pull = |reason: &str| {
        with_conditions(
            vmi(Phase::Scheduling),
            vec![vmi_cond(
                VmiCond::Synchronized,
                ConditionStatus::False,
                Some(reason),
            )],
        )
    };
    let halted = vm(RunStrategy::Halted);
    let always = vm(RunStrategy::Always);
    let cases: Vec<(
        &str,
        &VirtualMachine,
        Option<VirtualMachineInstance>,
        ExpectView,
        P,
    )> = vec![
        (
            "no vmi, halted",
            &halted,
            None,
            ExpectView::idle(),
            P::Stopped,
        ),
        (
            "succeeded vmi",
            &always,
            Some(ran(vmi(Phase::Succeeded))),
            ExpectView::idle(),
            P::Stopped,
        ),
        (
            "failed vmi being deleted",
            &always,
            Some(deleting_failed),
            ExpectView::idle(),
            P::Stopped,
        ),
        ("creation expected", &always, None, creating, P::Starting),
        (
            "phase unset",
            &always,
            Some(vmi(Phase::Unset)),
            ExpectView::idle(),
            P::Starting,
        ),
        (
            "pending",
            &always,
            Some(vmi(Phase::Pending)),
            ExpectView::idle(),
            P::Starting,
        ),
        (
            "scheduling",
            &always,
            Some(vmi(Phase::Scheduling)),
            ExpectView::idle(),
            P::Starting,
        ),
        (
            "scheduled",
            &always,
            Some(vmi(Phase::Scheduled)),
            ExpectView::idle(),
            P::Starting,
        ),
        (
            "running",
            &always,
            Some(vmi(Phase::Running)),
            ExpectView::idle(),
            P::Running,
        ),
        (
            "paused",
            &always,
            Some(paused),
            ExpectView::idle(),
            P::Paused,
        ),
        (
            "vmi being deleted",
            &always,
            Some(deleting_running),
            ExpectView::idle(),
            P::Stopping,
        ),
        (
            "vmi deletion expected",
            &always,
            Some(vmi(Phase::Running)),
            deleting_expected,
            P::Stopping,
        ),
        (
            "vm being deleted",
            &deleting_vm,
            Some(vmi(Phase::Running)),
            ExpectView::idle(),
            P::Terminating,
        ),
        (
            "vm being deleted without vmi",
            &deleting_vm,
            None,
            ExpectView::idle(),
            P::Terminating,
        ),
        (
            "migrating",
            &always,
            Some(migrating),
            ExpectView::idle(),
            P::Migrating,
        ),
        (
            "migration ended",
            &always,
            Some(migrated),
            ExpectView::idle(),
            P::Running,
        ),
        (
            "unschedulable",
            &always,
            Some(unschedulable),
            ExpectView::idle(),
            P::ErrorUnschedulable,
        ),
        (
            "pvc not found",
            &always,
            Some(pull("FailedPvcNotFound")),
            ExpectView::idle(),
            P::ErrorPvcNotFound,
        ),
        (
            "image pull",
            &always,
            Some(pull("ErrImagePull")),
            ExpectView::idle(),
            P::ErrImagePull,
        ),
        (
            "image backoff",
            &always,
            Some(pull("ImagePullBackOff")),
            ExpectView::idle(),
            P::ImagePullBackOff,
        ),
        (
            "unknown phase",
            &always,
            Some(vmi(Phase::Unknown)),
            ExpectView::idle(),
            P::Unknown,
        ),
    ];
    for (name, vm, vmi, expectations, want) in cases {
        let mut input = input(vm, vmi.as_ref());
        input.expectations = expectations;
        assert_eq!(status_of(&input).printable_status, Some(want), "{name}");
    }
}

#[test]
fn crash_loop_back_off_shows_only_for_backoff_strategies_without_a_running_vmi() {
    use PrintableStatus as P;
    let running = vmi(Phase::Running);
    let cases = [
        (RunStrategy::Always, None, P::CrashLoopBackOff),
        (RunStrategy::RerunOnFailure, None, P::CrashLoopBackOff),
        (RunStrategy::Halted, None, P::Stopped),
        (RunStrategy::Manual, None, P::Stopped),
        (RunStrategy::Always, Some(&running), P::Running),
        (RunStrategy::Once, Some(&running), P::Running),
    ];
    for (strategy, vmi, want) in cases {
        let vm = crash_looping(strategy.clone());
        let status = status_of(&input(&vm, vmi));
        assert_eq!(status.printable_status, Some(want), "{strategy:?}");
    }
}

#[test]
fn a_failed_vmi_that_never_ran_records_a_start_failure() {
    let vm = vm(RunStrategy::Always);
    let failed = vmi(Phase::Failed);
    let status = status_of(&input(&vm, Some(&failed)));
    let failure = status.start_failure.unwrap();
    assert_eq!(failure.consecutive_fail_count, Some(1));
    assert_eq!(failure.last_failed_vmi_uid.as_deref(), Some("vmi-uid"));
    assert_eq!(
        status.printable_status,
        Some(PrintableStatus::CrashLoopBackOff)
    );
}

#[test]
fn created_and_ready_mirror_the_vmi() {
    let vm = vm(RunStrategy::Always);
    let none = status_of(&input(&vm, None));
    assert_eq!(
        (none.created, none.ready),
        (None, None),
        "false is omitted as upstream"
    );
    let running = vmi(Phase::Running);
    let s = status_of(&input(&vm, Some(&running)));
    assert_eq!((s.created, s.ready), (Some(true), None));
    let ready = with_conditions(
        vmi(Phase::Running),
        vec![vmi_cond(VmiCond::Ready, ConditionStatus::True, None)],
    );
    let s = status_of(&input(&vm, Some(&ready)));
    assert_eq!((s.created, s.ready), (Some(true), Some(true)));
}

#[test]
fn the_ready_condition_is_copied_or_explains_why_it_is_false() {
    let vm = vm(RunStrategy::Always);
    let ready = |s: &VirtualMachineStatus| {
        find_condition(&s.conditions, &VmCond::Ready)
            .cloned()
            .unwrap()
    };
    let none = ready(&status_of(&input(&vm, None)));
    assert_eq!(
        (none.status, none.reason.as_deref()),
        (ConditionStatus::False, Some("VMINotExists"))
    );
    assert_eq!(none.message.as_deref(), Some("VMI does not exist"));
    let running = vmi(Phase::Running);
    let missing = ready(&status_of(&input(&vm, Some(&running))));
    assert_eq!(missing.reason.as_deref(), Some("VMIConditionMissing"));
    let copied = with_conditions(
        vmi(Phase::Running),
        vec![vmi_cond(
            VmiCond::Ready,
            ConditionStatus::False,
            Some("GuestNotRunning"),
        )],
    );
    let c = ready(&status_of(&input(&vm, Some(&copied))));
    assert_eq!(
        (c.status, c.reason.as_deref()),
        (ConditionStatus::False, Some("GuestNotRunning"))
    );
}

#[test]
fn a_ready_condition_derived_without_a_vmi_ready_is_probed_now() {
    let vm = vm(RunStrategy::Always);
    let running = vmi(Phase::Running);
    for vmi in [None, Some(&running)] {
        let status = status_of(&input(&vm, vmi));
        let ready = find_condition(&status.conditions, &VmCond::Ready).unwrap();
        assert_eq!(ready.last_probe_time, Some(Time(now())), "{vmi:?}");
        assert_eq!(ready.last_transition_time, Some(Time(now())));
    }
}

#[test]
fn conditions_are_ordered_as_upstream_restart_required_before_ready_and_failure() {
    let vm = vm(RunStrategy::Always);
    let running = with_conditions(
        vmi(Phase::Running),
        vec![vmi_cond(VmiCond::Paused, ConditionStatus::True, None)],
    );
    let mut i = input(&vm, Some(&running));
    i.restart_required = RestartRequired::Set("changed".into());
    i.sync_error = Some(("FailedUpdate", "boom".into()));
    let types: Vec<VmCond> = status_of(&i)
        .conditions
        .into_iter()
        .map(|c| c.type_)
        .collect();
    assert_eq!(
        types,
        [
            VmCond::RestartRequired,
            VmCond::Ready,
            VmCond::Failure,
            VmCond::Paused
        ]
    );
}

#[test]
fn vmi_conditions_are_copied_and_removed_with_the_vmi() {
    let mut vm = vm(RunStrategy::Always);
    let paused = with_conditions(
        vmi(Phase::Running),
        vec![vmi_cond(VmiCond::Paused, ConditionStatus::True, None)],
    );
    let status = status_of(&input(&vm, Some(&paused)));
    assert!(has_true_condition(&status.conditions, &VmCond::Paused));
    vm.status = Some(status);
    let unpaused = vmi(Phase::Running);
    let status = status_of(&input(&vm, Some(&unpaused)));
    assert_eq!(find_condition(&status.conditions, &VmCond::Paused), None);
}

#[test]
fn a_sync_error_becomes_the_failure_condition_and_message_only_changes_are_ignored() {
    let mut vm = vm(RunStrategy::Always);
    let mut i = input(&vm, None);
    i.sync_error = Some(("FailedCreate", "Failure while starting VMI: boom".into()));
    let status = status_of(&i);
    let failure = find_condition(&status.conditions, &VmCond::Failure).unwrap();
    assert_eq!(failure.reason.as_deref(), Some("FailedCreate"));
    vm.status = Some(status.clone());
    let mut again = input(&vm, None);
    again.sync_error = Some(("FailedCreate", "Failure while starting VMI: other".into()));
    let second = status_of(&again);
    assert_eq!(
        find_condition(&second.conditions, &VmCond::Failure)
            .unwrap()
            .message
            .as_deref(),
        Some("Failure while starting VMI: boom")
    );
    assert_eq!(status_patch(Some(&status), &second), None);
    let cleared = status_of(&input(&vm, None));
    assert_eq!(find_condition(&cleared.conditions, &VmCond::Failure), None);
}

#[test]
fn restart_required_is_set_and_removed_as_the_sync_decided() {
    let mut vm = vm(RunStrategy::Always);
    let running = vmi(Phase::Running);
    let mut i = input(&vm, Some(&running));
    i.restart_required = RestartRequired::Set("changed".into());
    let status = status_of(&i);
    assert!(has_true_condition(
        &status.conditions,
        &VmCond::RestartRequired
    ));
    vm.status = Some(status);
    let mut i = input(&vm, Some(&running));
    assert!(
        has_true_condition(&status_of(&i).conditions, &VmCond::RestartRequired),
        "kept"
    );
    i.restart_required = RestartRequired::Remove;
    assert_eq!(
        find_condition(&status_of(&i).conditions, &VmCond::RestartRequired),
        None
    );
}

#[test]
fn fulfilled_state_change_requests_are_popped() {
    let stop = |uid: Option<&str>| VirtualMachineStateChangeRequest {
        action: StateChangeRequestAction::Stop,
        uid: uid.map(str::to_owned),
        ..VirtualMachineStateChangeRequest::default()
    };
    let start = VirtualMachineStateChangeRequest {
        action: StateChangeRequestAction::Start,
        ..VirtualMachineStateChangeRequest::default()
    };
    let running = vmi(Phase::Running);
    let failed = vmi(Phase::Failed);
    let cases: Vec<(
        &str,
        Vec<VirtualMachineStateChangeRequest>,
        Option<&VirtualMachineInstance>,
        usize,
    )> = vec![
        (
            "stop of the current vmi stays",
            vec![stop(Some("vmi-uid")), start.clone()],
            Some(&running),
            2,
        ),
        (
            "stop of an old vmi pops",
            vec![stop(Some("old")), start.clone()],
            Some(&running),
            1,
        ),
        (
            "stop without vmi pops",
            vec![stop(Some("vmi-uid"))],
            None,
            0,
        ),
        ("stop without uid pops", vec![stop(None)], Some(&running), 0),
        (
            "start with a running vmi pops",
            vec![start.clone()],
            Some(&running),
            0,
        ),
        ("start without vmi stays", vec![start.clone()], None, 1),
        (
            "start with a final vmi stays",
            vec![start.clone()],
            Some(&failed),
            1,
        ),
    ];
    for (name, requests, vmi, left) in cases {
        let mut vm = vm(RunStrategy::Manual);
        vm.status.as_mut().unwrap().state_change_requests = requests;
        assert_eq!(
            status_of(&input(&vm, vmi)).state_change_requests.len(),
            left,
            "{name}"
        );
    }
}

#[test]
fn run_strategy_and_generations_are_recorded_once_the_vm_was_created() {
    let mut vm = vm(RunStrategy::RerunOnFailure);
    vm.status.as_mut().unwrap().run_strategy = None;
    assert_eq!(status_of(&input(&vm, None)).run_strategy, None);
    vm.metadata.generation = Some(3);
    let running = vmi(Phase::Running);
    let mut i = input(&vm, Some(&running));
    i.vmi_generation = Some(2);
    let status = status_of(&i);
    assert_eq!(status.run_strategy, Some(RunStrategy::RerunOnFailure));
    assert_eq!(
        (status.observed_generation, status.desired_generation),
        (Some(2), Some(3))
    );
}

#[test]
fn an_unchanged_status_is_never_written() {
    let mut vm = vm(RunStrategy::Always);
    let running = vmi(Phase::Running);
    let first = status_of(&input(&vm, Some(&running)));
    let ops = status_patch(vm.status.as_ref(), &first).unwrap();
    assert!(ops.iter().all(|op| op["op"] != "test"), "{ops:?}");
    vm.status = Some(first.clone());
    let second = status_of(&input(&vm, Some(&running)));
    assert_eq!(second, first);
    assert_eq!(status_patch(vm.status.as_ref(), &second), None);
}

#[test]
fn the_status_patch_adds_a_missing_status_and_guards_popped_requests() {
    let new = VirtualMachineStatus {
        created: Some(true),
        ..VirtualMachineStatus::default()
    };
    assert_eq!(
        status_patch(None, &new),
        Some(vec![
            json!({"op": "add", "path": "/status", "value": {"created": true}})
        ])
    );
    let old = VirtualMachineStatus {
        state_change_requests: vec![VirtualMachineStateChangeRequest {
            action: StateChangeRequestAction::Start,
            ..VirtualMachineStateChangeRequest::default()
        }],
        ..new.clone()
    };
    assert_eq!(
        status_patch(Some(&old), &new),
        Some(vec![
            json!({"op": "test", "path": "/status/stateChangeRequests", "value": [{"action": "Start"}]}),
            json!({"op": "remove", "path": "/status/stateChangeRequests"}),
        ])
    );
}

#[test]
fn a_run_strategy_error_keeps_the_start_failure() {
    let mut vm = crash_looping(RunStrategy::Always);
    vm.spec.running = Some(true);
    let status = status_of(&input(&vm, None));
    assert_eq!(
        status.start_failure,
        vm.status.as_ref().unwrap().start_failure,
        "upstream's shouldClearStartFailure is false when the run strategy errs"
    );
}

#[test]
fn an_unbound_claim_shows_waiting_for_volume_binding_only_while_the_vm_is_set_to_start() {
    let always = vm(RunStrategy::Always);
    let halted = vm(RunStrategy::Halted);
    let scheduling = vmi(Phase::Scheduling);
    let unbound = |vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>| {
        let mut i = input(vm, vmi);
        i.claim_unbound = true;
        status_of(&i).printable_status
    };
    assert_eq!(
        unbound(&always, Some(&scheduling)),
        Some(PrintableStatus::WaitingForVolumeBinding)
    );
    assert_eq!(
        unbound(&always, None),
        Some(PrintableStatus::WaitingForVolumeBinding)
    );
    // A halted VM is not set to start: it is Stopped.
    assert_eq!(unbound(&halted, None), Some(PrintableStatus::Stopped));
    // Earlier rules win: a running VMI is Running whatever its claims.
    assert_eq!(
        unbound(&always, Some(&vmi(Phase::Running))),
        Some(PrintableStatus::Running)
    );
    // Without an unbound claim the same VM is Starting.
    assert_eq!(
        status_of(&input(&always, Some(&scheduling))).printable_status,
        Some(PrintableStatus::Starting)
    );
    // A Succeeded VMI of a RerunOnFailure VM is not set to start.
    let rerun = vm(RunStrategy::RerunOnFailure);
    let done = ran(vmi(Phase::Succeeded));
    assert!(!set_to_start(&rerun, Some(&done)));
    assert!(set_to_start(&rerun, None));
    assert!(!set_to_start(&vm(RunStrategy::Manual), None));
}

#[test]
fn data_volume_states_come_in_upstreams_order() {
    let mut v = vm(RunStrategy::Always);
    let spec = v.spec.template.spec.get_or_insert_with(Default::default);
    spec.volumes.push(kubevirt_api::v1::Volume {
        name: "root".into(),
        volume_source: serde_json::from_value(serde_json::json!({"dataVolume": {"name": "root"}}))
            .unwrap(),
    });
    let dv = |status: serde_json::Value| {
        std::sync::Arc::new(
            serde_json::from_value::<kubevirt_api::cdi::DataVolume>(serde_json::json!({
                "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "metadata": {"name": "root", "namespace": "default"},
                "spec": {}, "status": status
            }))
            .unwrap(),
        )
    };
    let printable = |dvs: &[std::sync::Arc<kubevirt_api::cdi::DataVolume>], unbound: bool| {
        let mut i = input(&v, None);
        i.data_volumes = dvs;
        i.claim_unbound = unbound;
        status_of(&i).printable_status.unwrap()
    };
    let importing = [dv(serde_json::json!({"phase": "ImportInProgress"}))];
    assert_eq!(printable(&importing, true), PrintableStatus::Provisioning);
    let failed = [dv(serde_json::json!({"phase": "Failed"}))];
    assert_eq!(printable(&failed, true), PrintableStatus::DataVolumeError);
    let wffc = [dv(serde_json::json!({"phase": "WaitForFirstConsumer"}))];
    assert_eq!(
        printable(&wffc, true),
        PrintableStatus::WaitingForVolumeBinding
    );
    let done = [dv(serde_json::json!({"phase": "Succeeded"}))];
    assert_eq!(printable(&done, false), PrintableStatus::Stopped);
}
