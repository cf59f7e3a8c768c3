use super::*;
use crate::vm::tests::fixtures::{now, time, vm, vmi};
use kubevirt_api::v1::{
    ConditionStatus, PersistentVolumeClaimVolumeSource, VirtualMachineCondition,
    VirtualMachineConditionType, VirtualMachineStartFailure, Volume, VolumeSource,
};
use std::collections::BTreeMap;

const NO_REVISIONS: &[Arc<ControllerRevision>] = &[];

fn input<'a>(
    vm: &'a VirtualMachine,
    vmi: Option<&'a VirtualMachineInstance>,
    revisions: &'a [Arc<ControllerRevision>],
    config: &'a MetadataSyncPatterns,
) -> SyncInput<'a> {
    SyncInput {
        vm,
        vmi,
        expectations: ExpectView::idle(),
        revisions,
        config,
        live_update: true,
        now: now(),
        data_volumes: &[],
    }
}

fn run(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> SyncPlan {
    plan(&input(
        vm,
        vmi,
        NO_REVISIONS,
        &MetadataSyncPatterns::default(),
    ))
}

/// A short name per action, for tables.
fn kinds(plan: &SyncPlan) -> Vec<&'static str> {
    plan.actions
        .iter()
        .map(|a| match a {
            VmAction::PatchVm(_) => "patch-vm",
            VmAction::PatchVmFirmware(_) => "patch-firmware",
            VmAction::PatchVmFinalizers(_) => "patch-finalizers",
            VmAction::StartHaltedVm(_) => "start-halted",
            VmAction::CreateVmi { .. } => "create",
            VmAction::DeleteVmi(_) => "delete",
            VmAction::PatchVmStatus(_) => "start-request",
            VmAction::PatchVmi(_) => "patch-vmi",
            VmAction::LiveUpdateVmi(_) => "live-update-vmi",
            VmAction::PatchVmVolumes(_) => "patch-vm-volumes",
            VmAction::PatchVmiVolumes(_) => "patch-vmi-volumes",
            VmAction::PatchVmiInterfaces(_) => "patch-vmi-interfaces",
            VmAction::PatchVmInterfaces(_) => "patch-vm-interfaces",
            VmAction::CreateDataVolume(_) => "create-dv",
            VmAction::DataVolumeFailed(_) => "dv-failed-event",
        })
        .collect()
}

fn request(
    action: StateChangeRequestAction,
    uid: Option<&str>,
) -> VirtualMachineStateChangeRequest {
    VirtualMachineStateChangeRequest {
        action,
        data: BTreeMap::new(),
        uid: uid.map(str::to_owned),
    }
}

#[derive(Clone, Copy, Debug)]
enum Scenario {
    NoVmi,
    RunningVmi,
    FailedVmi,
    SucceededVmi,
    StopRequest,
    StartRequest,
}

fn scenario(
    strategy: RunStrategy,
    s: Scenario,
) -> (VirtualMachine, Option<VirtualMachineInstance>) {
    let mut vm = vm(strategy);
    let status = vm.status.as_mut().unwrap();
    let vmi = match s {
        Scenario::NoVmi => None,
        Scenario::RunningVmi => Some(vmi(Phase::Running)),
        Scenario::FailedVmi => Some(vmi(Phase::Failed)),
        Scenario::SucceededVmi => Some(vmi(Phase::Succeeded)),
        Scenario::StopRequest => {
            status.state_change_requests =
                vec![request(StateChangeRequestAction::Stop, Some("vmi-uid"))];
            Some(vmi(Phase::Running))
        }
        Scenario::StartRequest => {
            status.state_change_requests = vec![request(StateChangeRequestAction::Start, None)];
            None
        }
    };
    (vm, vmi)
}

#[test]
fn every_run_strategy_starts_and_stops_as_upstream() {
    use RunStrategy as R;
    use Scenario as S;
    let cases: &[(RunStrategy, Scenario, &[&str])] = &[
        (R::Always, S::NoVmi, &["create"]),
        (R::Always, S::RunningVmi, &[]),
        (R::Always, S::FailedVmi, &["delete"]),
        (R::Always, S::SucceededVmi, &["delete"]),
        (R::Always, S::StopRequest, &["delete"]),
        (R::Always, S::StartRequest, &["create"]),
        (R::RerunOnFailure, S::NoVmi, &[]),
        (R::RerunOnFailure, S::RunningVmi, &[]),
        (
            R::RerunOnFailure,
            S::FailedVmi,
            &["delete", "start-request"],
        ),
        (R::RerunOnFailure, S::SucceededVmi, &["delete"]),
        (R::RerunOnFailure, S::StopRequest, &["delete"]),
        (R::RerunOnFailure, S::StartRequest, &["create"]),
        (R::Manual, S::NoVmi, &[]),
        (R::Manual, S::RunningVmi, &[]),
        (R::Manual, S::FailedVmi, &[]),
        (R::Manual, S::SucceededVmi, &[]),
        (R::Manual, S::StopRequest, &["delete"]),
        (R::Manual, S::StartRequest, &["create"]),
        (R::Halted, S::NoVmi, &[]),
        (R::Halted, S::RunningVmi, &["delete"]),
        (R::Halted, S::FailedVmi, &["delete"]),
        (R::Halted, S::SucceededVmi, &["delete"]),
        (R::Halted, S::StopRequest, &["delete"]),
        (R::Halted, S::StartRequest, &["start-halted"]),
        (R::Once, S::NoVmi, &["create"]),
        (R::Once, S::RunningVmi, &[]),
        (R::Once, S::FailedVmi, &[]),
        (R::Once, S::SucceededVmi, &[]),
        (R::Once, S::StopRequest, &[]),
        (R::Once, S::StartRequest, &["create"]),
        (R::WaitAsReceiver, S::NoVmi, &["create"]),
        (R::WaitAsReceiver, S::StartRequest, &["create"]),
    ];
    for (strategy, s, want) in cases {
        let (vm, vmi) = scenario(strategy.clone(), *s);
        let plan = run(&vm, vmi.as_ref());
        assert_eq!(kinds(&plan), *want, "{strategy:?} with {s:?}");
        assert_eq!(plan.error, None, "{strategy:?} with {s:?}");
    }
}

#[test]
fn rerun_on_failure_starts_when_never_started_or_switched_from_another_strategy() {
    for previous in [
        None,
        Some(RunStrategy::Halted),
        Some(RunStrategy::Manual),
        Some(RunStrategy::Always),
    ] {
        let mut vm = vm(RunStrategy::RerunOnFailure);
        vm.status.as_mut().unwrap().run_strategy = previous.clone();
        assert_eq!(kinds(&run(&vm, None)), ["create"], "previous {previous:?}");
    }
}

#[test]
fn rerun_on_failure_appends_a_start_request_to_the_existing_ones() {
    let (vm, vmi) = scenario(RunStrategy::RerunOnFailure, Scenario::FailedVmi);
    let plan = run(&vm, vmi.as_ref());
    let VmAction::PatchVmStatus(ops) = &plan.actions[1] else {
        panic!("{plan:?}");
    };
    assert_eq!(
        ops,
        &vec![
            json!({"op": "add", "path": "/status/stateChangeRequests", "value": [{"action": "Start"}]})
        ]
    );
}

#[test]
fn halted_start_request_switches_the_spec_to_running() {
    let (vm, _) = scenario(RunStrategy::Halted, Scenario::StartRequest);
    assert_eq!(
        run(&vm, None).actions,
        [VmAction::StartHaltedVm(vec![
            json!({"op": "replace", "path": "/spec/runStrategy", "value": "Always"})
        ])]
    );
    let mut legacy = vm.clone();
    legacy.spec.run_strategy = None;
    legacy.spec.running = Some(false);
    assert_eq!(
        run(&legacy, None).actions,
        [VmAction::StartHaltedVm(vec![
            json!({"op": "add", "path": "/spec/running", "value": true})
        ])]
    );
}

#[test]
fn running_and_run_strategy_together_are_a_plain_error_after_the_finalizer() {
    let mut vm = vm(RunStrategy::Always);
    vm.spec.running = Some(true);
    let plan = run(&vm, None);
    assert!(plan.actions.is_empty());
    assert_eq!(
        plan.error, None,
        "no Failure condition: upstream writes no status"
    );
    assert_eq!(
        plan.requeue_error.as_deref(),
        Some("Error fetching RunStrategy: running and runstrategy are mutually exclusive")
    );
    vm.metadata.finalizers = None;
    assert_eq!(kinds(&run(&vm, None)), ["patch-finalizers"]);
}

#[test]
fn an_unknown_or_receiver_mismatch_strategy_is_a_failed_create() {
    let vm = vm(RunStrategy::from("Sometimes"));
    assert_eq!(
        run(&vm, None).error.unwrap().message,
        "unknown runstrategy: Sometimes"
    );
    let vm = crate::vm::tests::fixtures::vm(RunStrategy::WaitAsReceiver);
    let plan = run(&vm, Some(&vmi(Phase::Running)));
    assert_eq!(
        plan.error.unwrap().message,
        "Found non receiver VMI while VM is receiver"
    );
}

#[test]
fn pending_expectations_stop_every_action() {
    let vm = vm(RunStrategy::Always);
    let config = MetadataSyncPatterns::default();
    let mut input = input(&vm, None, NO_REVISIONS, &config);
    input.expectations = ExpectView {
        satisfied: false,
        creations_pending: true,
        deletions_pending: false,
    };
    assert_eq!(plan(&input), SyncPlan::default());
}

#[test]
fn a_vmi_already_being_deleted_is_not_deleted_again() {
    let mut deleting = vmi(Phase::Running);
    deleting.metadata.deletion_timestamp = Some(time(0));
    assert!(
        run(&vm(RunStrategy::Halted), Some(&deleting))
            .actions
            .is_empty()
    );
}

#[test]
fn the_vm_finalizer_is_added_once_and_removed_after_the_vmi_is_gone() {
    let mut fresh = vm(RunStrategy::Halted);
    fresh.metadata.finalizers = None;
    assert_eq!(
        run(&fresh, None).actions,
        [VmAction::PatchVmFinalizers(vec![
            json!({"op": "add", "path": "/metadata/finalizers", "value": [VM_CONTROLLER_FINALIZER]})
        ])]
    );
    assert!(run(&vm(RunStrategy::Halted), None).actions.is_empty());

    let mut deleting = vm(RunStrategy::Always);
    deleting.metadata.deletion_timestamp = Some(time(0));
    let running = vmi(Phase::Running);
    assert_eq!(kinds(&run(&deleting, Some(&running))), ["delete"]);
    let finalizer_removed = VmAction::PatchVmFinalizers(vec![
        json!({"op": "test", "path": "/metadata/finalizers", "value": [VM_CONTROLLER_FINALIZER]}),
        json!({"op": "replace", "path": "/metadata/finalizers", "value": []}),
    ]);
    assert_eq!(run(&deleting, None).actions, [finalizer_removed]);

    let mut orphaning = deleting.clone();
    orphaning.metadata.finalizers = Some(vec!["orphan".into(), VM_CONTROLLER_FINALIZER.into()]);
    assert_eq!(
        run(&orphaning, Some(&running)).actions,
        [VmAction::PatchVmFinalizers(vec![
            json!({"op": "test", "path": "/metadata/finalizers", "value": ["orphan", VM_CONTROLLER_FINALIZER]}),
            json!({"op": "replace", "path": "/metadata/finalizers", "value": ["orphan"]}),
        ])]
    );
}

#[test]
fn a_start_failure_backoff_defers_the_start_and_requeues() {
    let mut vm = vm(RunStrategy::Always);
    vm.status.as_mut().unwrap().start_failure = Some(VirtualMachineStartFailure {
        consecutive_fail_count: Some(1),
        last_failed_vmi_uid: Some("old".into()),
        retry_after_timestamp: Some(time(300)),
    });
    let plan = run(&vm, None);
    assert!(plan.actions.is_empty());
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(300)));
    // Manual ignores the backoff.
    vm.spec.run_strategy = Some(RunStrategy::Manual);
    vm.status.as_mut().unwrap().state_change_requests =
        vec![request(StateChangeRequestAction::Start, None)];
    assert_eq!(kinds(&run(&vm, None)), ["create"]);
}

#[test]
fn manual_recovery_required_blocks_the_start() {
    let mut vm = vm(RunStrategy::Always);
    vm.status.as_mut().unwrap().conditions = vec![VirtualMachineCondition::new(
        VirtualMachineConditionType::ManualRecoveryRequired,
        ConditionStatus::True,
    )];
    assert!(run(&vm, None).actions.is_empty());
}

#[test]
fn the_created_vmi_records_the_generation_and_stale_revisions_are_deleted() {
    let mut vm = vm(RunStrategy::Always);
    vm.metadata.generation = Some(4);
    let mut old = build_revision(&vm);
    old.metadata.name = Some("revision-start-vm-vm-uid-2".into());
    old.revision = 2;
    let mut foreign = old.clone();
    foreign.metadata.name = Some("revision-start-vm-other-uid-2".into());
    let revisions = [Arc::new(old), Arc::new(foreign)];
    let plan = plan(&input(
        &vm,
        None,
        &revisions,
        &MetadataSyncPatterns::default(),
    ));
    let [
        VmAction::CreateVmi {
            vmi,
            revision,
            stale_revisions,
        },
    ] = plan.actions.as_slice()
    else {
        panic!("{plan:?}");
    };
    assert_eq!(
        vmi.metadata.annotations.as_ref().unwrap()[VM_GENERATION_ANNOTATION],
        "4"
    );
    assert_eq!(
        revision.as_ref().and_then(|r| r.metadata.name.as_deref()),
        Some("revision-start-vm-vm-uid-4")
    );
    assert_eq!(stale_revisions, &["revision-start-vm-vm-uid-2".to_owned()]);
    assert_eq!(plan.restart_required, RestartRequired::Remove);
}

#[test]
fn a_cached_start_revision_of_the_same_generation_is_kept_even_with_other_data() {
    let mut vm = vm(RunStrategy::Always);
    vm.metadata.generation = Some(4);
    let mut existing = build_revision(&vm);
    existing.data = Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(
        json!({"spec": {"running": false}}),
    ));
    let plan = plan(&input(
        &vm,
        None,
        &[Arc::new(existing)],
        &MetadataSyncPatterns::default(),
    ));
    let [
        VmAction::CreateVmi {
            vmi,
            revision,
            stale_revisions,
        },
    ] = plan.actions.as_slice()
    else {
        panic!("{plan:?}");
    };
    assert_eq!(revision, &None, "not deleted and recreated");
    assert!(stale_revisions.is_empty());
    assert_eq!(
        vmi.status
            .as_ref()
            .and_then(|s| s.virtual_machine_revision_name.as_deref()),
        Some("revision-start-vm-vm-uid-4")
    );
}

fn started_revision(vm: &VirtualMachine) -> Arc<ControllerRevision> {
    Arc::new(build_revision(vm))
}

fn with_revision(mut vmi: VirtualMachineInstance, name: &str) -> VirtualMachineInstance {
    vmi.status.as_mut().unwrap().virtual_machine_revision_name = Some(name.to_owned());
    vmi
}

#[test]
fn the_generation_annotation_is_bumped_only_when_the_templates_still_match() {
    let started = vm(RunStrategy::Always);
    let revisions = [started_revision(&started)];
    let running = with_revision(vmi(Phase::Running), "revision-start-vm-vm-uid-1");
    let config = MetadataSyncPatterns::default();

    let mut relabelled = started.clone();
    relabelled.metadata.generation = Some(2);
    let plan = plan(&input(&relabelled, Some(&running), &revisions, &config));
    assert_eq!(plan.vmi_generation, Some(1));
    let VmAction::PatchVmi(ops) = &plan.actions[0] else {
        panic!("{plan:?}");
    };
    assert_eq!(ops[1]["value"][VM_GENERATION_ANNOTATION], "2");
    assert_eq!(plan.restart_required, RestartRequired::Remove);

    let mut changed = relabelled.clone();
    changed.spec.template.spec.as_mut().unwrap().hostname = Some("new".into());
    let plan = super::plan(&input(&changed, Some(&running), &revisions, &config));
    assert!(plan.actions.is_empty(), "{plan:?}");
    assert_eq!(
        plan.restart_required,
        RestartRequired::Set(RESTART_REQUIRED_MESSAGE.into())
    );
}

#[test]
fn a_missing_generation_annotation_is_recovered_from_the_revision_name() {
    let started = vm(RunStrategy::Always);
    let revisions = [started_revision(&started)];
    let mut running = with_revision(vmi(Phase::Running), "revision-start-vm-vm-uid-1");
    running.metadata.annotations = None;
    let plan = plan(&input(
        &started,
        Some(&running),
        &revisions,
        &MetadataSyncPatterns::default(),
    ));
    assert_eq!(plan.vmi_generation, Some(1));
    assert_eq!(
        plan.actions,
        [VmAction::PatchVmi(vec![
            json!({"op": "add", "path": "/metadata/annotations", "value": {VM_GENERATION_ANNOTATION: "1"}})
        ])]
    );
}

#[test]
fn reordering_the_volumes_does_not_require_a_restart() {
    let volume = |name: &str| Volume {
        name: name.into(),
        volume_source: VolumeSource {
            empty_disk: Some(Default::default()),
            ..VolumeSource::default()
        },
    };
    let mut started = vm(RunStrategy::Always);
    let template = started.spec.template.spec.as_mut().unwrap();
    template.volumes = vec![volume("a"), volume("b")];
    let revisions = [started_revision(&started)];
    let running = with_revision(vmi(Phase::Running), "revision-start-vm-vm-uid-1");
    let mut reordered = started.clone();
    reordered
        .spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .volumes
        .reverse();
    let plan = plan(&input(
        &reordered,
        Some(&running),
        &revisions,
        &MetadataSyncPatterns::default(),
    ));
    assert_eq!(plan.restart_required, RestartRequired::Remove);
}

#[test]
fn adding_a_hotpluggable_volume_does_not_require_a_restart() {
    let started = vm(RunStrategy::Always);
    let revisions = [started_revision(&started)];
    let running = with_revision(vmi(Phase::Running), "revision-start-vm-vm-uid-1");
    let mut hotplugged = started.clone();
    hotplugged
        .spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .volumes
        .push(Volume {
            name: "hp".into(),
            volume_source: VolumeSource {
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    hotpluggable: Some(true),
                    ..PersistentVolumeClaimVolumeSource::default()
                }),
                ..VolumeSource::default()
            },
        });
    let plan = plan(&input(
        &hotplugged,
        Some(&running),
        &revisions,
        &MetadataSyncPatterns::default(),
    ));
    assert_eq!(plan.restart_required, RestartRequired::Remove);
}

#[test]
fn template_labels_matching_the_patterns_are_synced_to_a_running_vmi() {
    let mut vm = vm(RunStrategy::Always);
    let labels = vm
        .spec
        .template
        .metadata
        .as_mut()
        .unwrap()
        .labels
        .as_mut()
        .unwrap();
    labels.insert("ops.example.com/team".into(), "a".into());
    let config = MetadataSyncPatterns {
        labels: crate::metadata_sync::SyncPatterns::parse_flag("ops.example.com/*").0,
        ..MetadataSyncPatterns::default()
    };
    let running = vmi(Phase::Running);
    let plan = plan(&input(&vm, Some(&running), NO_REVISIONS, &config));
    assert_eq!(kinds(&plan), ["patch-vmi"]);
}

#[test]
fn a_template_without_firmware_uuid_gets_the_legacy_uuid_of_the_vm_name() {
    let mut vm = vm(RunStrategy::Always);
    let serial = Some("serial-1".to_owned());
    vm.spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .domain
        .firmware
        .as_mut()
        .unwrap()
        .uuid = None;
    vm.spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .domain
        .firmware
        .as_mut()
        .unwrap()
        .serial = serial;
    let running = vmi(Phase::Running);
    let plan = run(&vm, Some(&running));
    let path = "/spec/template/spec/domain/firmware";
    let want = legacy_firmware_uuid("testvm");
    assert_eq!(
        plan.actions,
        vec![VmAction::PatchVmFirmware(vec![
            json!({"op": "test", "path": path, "value": {"serial": "serial-1"}}),
            json!({"op": "add", "path": path, "value": {"serial": "serial-1", "uuid": want}}),
        ])]
    );

    // No firmware at all: the test op expects null.
    vm.spec.template.spec.as_mut().unwrap().domain.firmware = None;
    let plan = run(&vm, None);
    assert_eq!(
        kinds(&plan),
        ["create"],
        "a create comes first, the patch next pass"
    );
    let plan = run(&vm, Some(&running));
    assert_eq!(
        plan.actions,
        vec![VmAction::PatchVmFirmware(vec![
            json!({"op": "test", "path": path, "value": null}),
            json!({"op": "add", "path": path, "value": {"uuid": want}}),
        ])]
    );

    // A halted VM without a VMI gets it as well; one with a UUID gets nothing.
    vm.spec.run_strategy = Some(RunStrategy::Halted);
    assert_eq!(kinds(&run(&vm, None)), ["patch-firmware"]);
    let vm = super::super::tests::fixtures::vm(RunStrategy::Halted);
    assert!(run(&vm, None).actions.is_empty());
}

#[test]
fn a_new_vm_gets_its_finalizer_and_firmware_uuid_in_one_patch() {
    let mut vm = vm(RunStrategy::Always);
    vm.metadata.finalizers = None;
    vm.spec.template.spec.as_mut().unwrap().domain.firmware = None;
    let plan = run(&vm, None);
    assert_eq!(kinds(&plan), ["patch-finalizers", "create"]);
    let path = "/spec/template/spec/domain/firmware";
    assert_eq!(
        plan.actions[0],
        VmAction::PatchVmFinalizers(vec![
            json!({"op": "add", "path": "/metadata/finalizers", "value": [VM_CONTROLLER_FINALIZER]}),
            json!({"op": "test", "path": path, "value": null}),
            json!({"op": "add", "path": path, "value": {"uuid": legacy_firmware_uuid("testvm")}}),
        ])
    );
}

fn with_data_volume(mut vm: VirtualMachine, annotations: &[(&str, &str)]) -> VirtualMachine {
    vm.spec.data_volume_templates = vec![kubevirt_api::v1::DataVolumeTemplateSpec {
        metadata: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("root".into()),
            ..Default::default()
        }),
        spec: serde_json::from_value(json!({"source": {"blank": {}}})).unwrap(),
        ..Default::default()
    }];
    if !annotations.is_empty() {
        vm.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }
    vm
}

fn data_volume(phase: &str) -> Arc<kubevirt_api::cdi::DataVolume> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "root", "namespace": "default"},
            "spec": {}, "status": {"phase": phase}
        }))
        .unwrap(),
    )
}

fn run_with_dvs(vm: &VirtualMachine, dvs: &[Arc<kubevirt_api::cdi::DataVolume>]) -> SyncPlan {
    let config = MetadataSyncPatterns::default();
    let mut i = input(vm, None, NO_REVISIONS, &config);
    i.data_volumes = dvs;
    plan(&i)
}

#[test]
fn a_missing_data_volume_is_created_and_the_vmi_waits_for_it() {
    let v = with_data_volume(vm(RunStrategy::Always), &[]);
    assert_eq!(kinds(&run_with_dvs(&v, &[])), ["create-dv"]);
    assert!(kinds(&run_with_dvs(&v, &[data_volume("ImportInProgress")])).is_empty());
    assert_eq!(
        kinds(&run_with_dvs(&v, &[data_volume("Failed")])),
        ["dv-failed-event"]
    );
    assert_eq!(
        kinds(&run_with_dvs(&v, &[data_volume("Succeeded")])),
        ["create"]
    );
    // Waiting for the first consumer: the VMI is its consumer.
    assert_eq!(
        kinds(&run_with_dvs(&v, &[data_volume("WaitForFirstConsumer")])),
        ["create"]
    );
}

#[test]
fn a_halted_vm_creates_its_data_volumes_and_a_deferred_one_only_at_start() {
    let halted = with_data_volume(vm(RunStrategy::Halted), &[]);
    assert_eq!(kinds(&run_with_dvs(&halted, &[])), ["create-dv"]);
    let deferred = with_data_volume(
        vm(RunStrategy::Halted),
        &[("kubevirt.io/immediate-data-volume-creation", "false")],
    );
    assert!(kinds(&run_with_dvs(&deferred, &[])).is_empty());
    let deferred_running = with_data_volume(
        vm(RunStrategy::Always),
        &[("kubevirt.io/immediate-data-volume-creation", "false")],
    );
    assert_eq!(kinds(&run_with_dvs(&deferred_running, &[])), ["create-dv"]);
}

#[test]
fn a_vmi_with_the_default_pod_interface_of_a_template_without_one_needs_no_restart() {
    let started = vm(RunStrategy::Always);
    let revisions = [started_revision(&started)];
    let mut running = with_revision(vmi(Phase::Running), "revision-start-vm-vm-uid-1");
    // virt-api's defaults give the VMI the pod network the template does not name.
    running.spec.networks =
        serde_json::from_value(serde_json::json!([{"name": "default", "pod": {}}])).unwrap();
    running.spec.domain.devices.interfaces =
        serde_json::from_value(serde_json::json!([{"name": "default", "masquerade": {}}])).unwrap();
    let same = plan(&input(
        &started,
        Some(&running),
        &revisions,
        &MetadataSyncPatterns::default(),
    ));
    assert_eq!(same.restart_required, RestartRequired::Remove);
    // A NIC added to the template is hotplugged, not a restart.
    let mut with_nic = started.clone();
    let template = with_nic.spec.template.spec.as_mut().unwrap();
    template.networks = serde_json::from_value(serde_json::json!([
        {"name": "default", "pod": {}}, {"name": "blue", "multus": {"networkName": "blue"}}
    ]))
    .unwrap();
    template.domain.devices.interfaces = serde_json::from_value(serde_json::json!([
        {"name": "default", "masquerade": {}}, {"name": "blue", "bridge": {}}
    ]))
    .unwrap();
    let hotplug = plan(&input(
        &with_nic,
        Some(&running),
        &revisions,
        &MetadataSyncPatterns::default(),
    ));
    assert_eq!(hotplug.restart_required, RestartRequired::Remove);
    assert!(
        kinds(&hotplug).contains(&"patch-vmi-interfaces"),
        "{:?}",
        kinds(&hotplug)
    );
    // Changing the running interface's binding cannot be done live.
    let template = with_nic.spec.template.spec.as_mut().unwrap();
    template.domain.devices.interfaces[0] =
        serde_json::from_value(serde_json::json!({"name": "default", "bridge": {}})).unwrap();
    let changed = plan(&input(
        &with_nic,
        Some(&running),
        &revisions,
        &MetadataSyncPatterns::default(),
    ));
    assert!(matches!(changed.restart_required, RestartRequired::Set(_)));
}
