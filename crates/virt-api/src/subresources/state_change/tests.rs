use kubevirt_api::v1::{
    RestartOptions, RunStrategy, StartOptions, StopOptions, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstancePhase, VirtualMachineSpec,
};
use serde_json::{Value, json};

use super::*;

#[derive(Clone, Copy, Debug)]
enum Vmi {
    None,
    Running,
    Succeeded,
    Failed,
}

#[derive(Debug, PartialEq)]
enum Outcome {
    /// Spec patch setting runStrategy to this.
    Spec(&'static str),
    /// Status patch adding these actions.
    Status(Vec<&'static str>),
    Nothing,
    /// 409 whose message ends with this.
    Conflict(&'static str),
}

fn vm(strategy: &str) -> VirtualMachine {
    let mut vm = VirtualMachine::new(
        "testvm",
        VirtualMachineSpec {
            run_strategy: Some(RunStrategy::from(strategy)),
            ..Default::default()
        },
    );
    vm.metadata.namespace = Some("default".into());
    vm
}

fn vmi(state: Vmi) -> Option<VirtualMachineInstance> {
    let phase = match state {
        Vmi::None => return None,
        Vmi::Running => "Running",
        Vmi::Succeeded => "Succeeded",
        Vmi::Failed => "Failed",
    };
    let mut vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "testvm", "namespace": "default", "uid": "vmi-uid"},
        "spec": {"domain": {"devices": {}}},
        "status": {"phase": phase},
    }))
    .unwrap();
    vmi.status.get_or_insert_default().phase = Some(VirtualMachineInstancePhase::from(phase));
    Some(vmi)
}

fn outcome(result: Result<VmPatch, SubError>) -> Outcome {
    match result {
        Ok(VmPatch::Nothing) => Outcome::Nothing,
        Ok(VmPatch::Spec(p)) => {
            let strategy = p.as_array().unwrap()[1]["value"]
                .as_str()
                .unwrap()
                .to_owned();
            Outcome::Spec(Box::leak(strategy.into_boxed_str()))
        }
        Ok(VmPatch::Status(p)) => {
            let ops = p.as_array().unwrap();
            let list = &ops.last().unwrap()["value"];
            let list = list.get("stateChangeRequests").unwrap_or(list);
            Outcome::Status(
                list.as_array()
                    .unwrap()
                    .iter()
                    .map(|r| match r["action"].as_str().unwrap() {
                        "Start" => "Start",
                        _ => "Stop",
                    })
                    .collect(),
            )
        }
        Err(e) => {
            assert_eq!(e.code, 409, "{e:?}");
            let inner = e.message.split(": ").nth(1).unwrap().to_owned();
            Outcome::Conflict(Box::leak(inner.into_boxed_str()))
        }
    }
}

#[test]
fn start_follows_each_run_strategy_as_upstream() {
    use Outcome::*;
    let cases = [
        ("Halted", Vmi::None, Spec("Always")),
        ("Halted", Vmi::Running, Conflict("VM is already running")),
        ("Halted", Vmi::Succeeded, Spec("Always")),
        ("Manual", Vmi::None, Status(vec!["Start"])),
        ("Manual", Vmi::Running, Conflict("VM is already running")),
        ("Manual", Vmi::Succeeded, Status(vec!["Stop", "Start"])),
        ("Manual", Vmi::Failed, Status(vec!["Stop", "Start"])),
        ("RerunOnFailure", Vmi::None, Status(vec!["Start"])),
        (
            "RerunOnFailure",
            Vmi::Succeeded,
            Status(vec!["Stop", "Start"]),
        ),
        (
            "RerunOnFailure",
            Vmi::Failed,
            Conflict("RerunOnFailure does not support starting VM from failed state"),
        ),
        (
            "Always",
            Vmi::None,
            Conflict("Always does not support manual start requests"),
        ),
        ("Always", Vmi::Running, Conflict("VM is already running")),
        (
            "Once",
            Vmi::Succeeded,
            Conflict("Once does not support manual start requests"),
        ),
        ("WaitAsReceiver", Vmi::None, Nothing),
    ];
    for (strategy, state, want) in cases {
        let got = outcome(plan_start(
            &vm(strategy),
            vmi(state).as_ref(),
            &StartOptions::default(),
        ));
        assert_eq!(got, want, "start {strategy} with VMI {state:?}");
    }
}

#[test]
fn stop_follows_each_run_strategy_as_upstream() {
    use Outcome::*;
    let cases = [
        ("Halted", Vmi::None, None, Conflict(VM_NOT_RUNNING)),
        (
            "Halted",
            Vmi::Running,
            None,
            Conflict("Halted only supports manual stop requests with a shorter graceperiod"),
        ),
        ("Halted", Vmi::Running, Some(0), Status(vec!["Stop"])),
        ("Halted", Vmi::Succeeded, Some(0), Conflict(VM_NOT_RUNNING)),
        ("Manual", Vmi::None, None, Conflict(VM_NOT_RUNNING)),
        ("Manual", Vmi::Running, None, Status(vec!["Stop"])),
        ("Manual", Vmi::Failed, None, Conflict(VM_NOT_RUNNING)),
        ("RerunOnFailure", Vmi::Running, None, Status(vec!["Stop"])),
        ("RerunOnFailure", Vmi::None, None, Conflict(VM_NOT_RUNNING)),
        ("Always", Vmi::Running, None, Spec("Halted")),
        ("Always", Vmi::None, None, Spec("Halted")),
        ("Once", Vmi::Succeeded, None, Spec("Halted")),
        ("WaitAsReceiver", Vmi::Running, None, Nothing),
    ];
    for (strategy, state, grace, want) in cases {
        let opts = StopOptions {
            grace_period: grace,
            ..Default::default()
        };
        let got = outcome(plan_stop(&vm(strategy), vmi(state).as_ref(), &opts));
        assert_eq!(
            got, want,
            "stop {strategy} with VMI {state:?}, grace {grace:?}"
        );
    }
}

#[test]
fn restart_follows_each_run_strategy_as_upstream() {
    use Outcome::*;
    let cases = [
        (
            "Halted",
            Vmi::Running,
            Conflict("RunStategy Halted does not support manual restart requests"),
        ),
        (
            "Once",
            Vmi::Running,
            Conflict("RunStategy Once does not support manual restart requests"),
        ),
        ("Always", Vmi::None, Conflict("VM is not running")),
        ("Always", Vmi::Running, Status(vec!["Stop", "Start"])),
        ("Manual", Vmi::Running, Status(vec!["Stop", "Start"])),
        (
            "RerunOnFailure",
            Vmi::Succeeded,
            Status(vec!["Stop", "Start"]),
        ),
    ];
    for (strategy, state, want) in cases {
        let got = outcome(plan_restart(&vm(strategy), vmi(state).as_ref()));
        assert_eq!(got, want, "restart {strategy} with VMI {state:?}");
    }
}

#[test]
fn restart_without_a_vmi_says_halted_literally() {
    let err = plan_restart(&vm("Always"), None).unwrap_err();
    assert!(
        err.message.ends_with("VM is not running: Halted"),
        "{}",
        err.message
    );
}

#[test]
fn paused_start_of_a_halted_vm_is_a_start_request_with_paused_data() {
    let opts = StartOptions {
        paused: Some(true),
        ..Default::default()
    };
    let VmPatch::Status(p) = plan_start(&vm("Halted"), None, &opts).unwrap() else {
        panic!("expected a status patch");
    };
    assert_eq!(
        p,
        json!([{"op": "add", "path": "/status", "value": {
            "stateChangeRequests": [{"action": "Start", "data": {"paused": "true"}}]
        }}])
    );
}

#[test]
fn halted_start_tests_and_replaces_the_run_strategy() {
    let VmPatch::Spec(p) = plan_start(&vm("Halted"), None, &StartOptions::default()).unwrap()
    else {
        panic!("expected a spec patch");
    };
    assert_eq!(
        p,
        json!([
            {"op": "test", "path": "/spec/runStrategy", "value": "Halted"},
            {"op": "replace", "path": "/spec/runStrategy", "value": "Always"},
        ])
    );
}

#[test]
fn deprecated_running_field_is_patched_instead_of_the_run_strategy() {
    let mut vm = vm("Halted");
    vm.spec.run_strategy = None;
    vm.spec.running = Some(true);
    assert_eq!(
        plan_stop(&vm, vmi(Vmi::Running).as_ref(), &StopOptions::default()).unwrap(),
        VmPatch::Spec(json!([
            {"op": "test", "path": "/spec/running", "value": true},
            {"op": "add", "path": "/spec/running", "value": false},
        ]))
    );
}

#[test]
fn manual_stop_requests_carry_the_vmi_uid_and_test_the_current_list() {
    let mut vm = vm("Manual");
    vm.status = Some(VirtualMachineStatus {
        created: Some(true),
        ..Default::default()
    });
    let VmPatch::Status(p) =
        plan_stop(&vm, vmi(Vmi::Running).as_ref(), &StopOptions::default()).unwrap()
    else {
        panic!("expected a status patch");
    };
    assert_eq!(
        p,
        json!([
            {"op": "test", "path": "/status/stateChangeRequests", "value": null},
            {"op": "add", "path": "/status/stateChangeRequests", "value": [{"action": "Stop", "uid": "vmi-uid"}]},
        ])
    );
}

#[test]
fn pending_requests_are_replaced_by_a_stop_but_block_a_start() {
    let mut vm = vm("Manual");
    vm.status = Some(VirtualMachineStatus {
        state_change_requests: vec![start_request(false)],
        start_failure: Some(Default::default()),
        ..Default::default()
    });
    let p = change_request_patch(&vm, vec![start_request(false)]).unwrap_err();
    assert_eq!(p.code, 500);
    assert!(p.message.contains("stop/start already underway"));
    let p = change_request_patch(&vm, vec![stop_request(&vmi(Vmi::Running).unwrap())]).unwrap();
    let ops: Vec<&str> = p
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["test", "replace", "remove"]);
    assert_eq!(p[2]["path"], "/status/startFailure");
}

#[test]
fn manual_recovery_blocks_a_start() {
    let mut vm = vm("Halted");
    vm.status = Some(
        serde_json::from_value(
            json!({"conditions": [{"type": "ManualRecoveryRequired", "status": "True"}]}),
        )
        .unwrap(),
    );
    let err = plan_start(&vm, None, &StartOptions::default()).unwrap_err();
    assert_eq!(err.code, 409);
    assert!(err.message.ends_with(MANUAL_RECOVERY_MESSAGE));
}

#[test]
fn grace_period_is_patched_only_for_a_live_vmi() {
    let opts = StopOptions {
        grace_period: Some(5),
        ..Default::default()
    };
    assert!(grace_period_patch(vmi(Vmi::Succeeded).as_ref(), &opts).is_none());
    assert!(grace_period_patch(None, &opts).is_none());
    assert!(grace_period_patch(vmi(Vmi::Running).as_ref(), &StopOptions::default()).is_none());
    let p: Value = grace_period_patch(vmi(Vmi::Running).as_ref(), &opts).unwrap();
    assert_eq!(p[1]["value"], 5);
}

#[test]
fn restart_options_accept_only_zero_or_unset() {
    let with = |g| RestartOptions {
        grace_period_seconds: g,
        ..Default::default()
    };
    assert!(check_restart_options(&with(None)).is_ok());
    assert!(check_restart_options(&with(Some(0))).is_ok());
    assert_eq!(
        check_restart_options(&with(Some(3))).unwrap_err().message,
        "For force restart, only gracePeriod=0 is supported for now"
    );
    assert_eq!(
        check_restart_options(&with(Some(-1))).unwrap_err().message,
        "gracePeriod has to be greater or equal to 0"
    );
}
