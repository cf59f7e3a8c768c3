//! Fixtures shared by the VM controller tests, and tests of claiming and finalizers.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kubevirt_api::v1::{
    RunStrategy, VirtualMachineInstancePhase as Phase, VirtualMachineInstanceSpec,
    VirtualMachineInstanceStatus, VirtualMachineInstanceTemplateSpec, VirtualMachineSpec,
    VirtualMachineStatus,
};
use std::collections::BTreeMap;

pub(super) mod fixtures {
    use super::*;

    pub fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap()
    }

    pub fn time(offset_secs: i64) -> Time {
        Time(
            now()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(offset_secs))
                .unwrap(),
        )
    }

    /// VM `default/testvm` (uid `vm-uid`, generation 1) with the controller finalizer, a
    /// firmware UUID and the given run strategy; `status.runStrategy` records the same strategy.
    pub fn vm(strategy: RunStrategy) -> VirtualMachine {
        let mut spec = VirtualMachineInstanceSpec::default();
        spec.domain.firmware = Some(kubevirt_api::v1::Firmware {
            uuid: Some(crate::vm::start::legacy_firmware_uuid("testvm")),
            ..kubevirt_api::v1::Firmware::default()
        });
        let mut vm = VirtualMachine::new(
            "testvm",
            VirtualMachineSpec {
                run_strategy: Some(strategy.clone()),
                template: VirtualMachineInstanceTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(BTreeMap::from([("app".into(), "testvm".into())])),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(spec),
                },
                ..VirtualMachineSpec::default()
            },
        );
        vm.metadata.namespace = Some("default".into());
        vm.metadata.uid = Some("vm-uid".into());
        vm.metadata.generation = Some(1);
        vm.metadata.finalizers = Some(vec![VM_CONTROLLER_FINALIZER.into()]);
        vm.status = Some(VirtualMachineStatus {
            run_strategy: Some(strategy),
            ..VirtualMachineStatus::default()
        });
        vm
    }

    /// The VMI of [`vm`] (uid `vmi-uid`) in `phase`, started from generation 1.
    pub fn vmi(phase: Phase) -> VirtualMachineInstance {
        let mut vmi = VirtualMachineInstance::new("testvm", VirtualMachineInstanceSpec::default());
        vmi.metadata.namespace = Some("default".into());
        vmi.metadata.uid = Some("vmi-uid".into());
        vmi.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "kubevirt.io/v1".into(),
            kind: "VirtualMachine".into(),
            name: "testvm".into(),
            uid: "vm-uid".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        vmi.metadata.finalizers = Some(vec![VM_CONTROLLER_FINALIZER.into()]);
        vmi.metadata.annotations = Some(BTreeMap::from([(
            kubevirt_api::constants::VM_GENERATION_ANNOTATION.into(),
            "1".into(),
        )]));
        vmi.metadata.labels = Some(BTreeMap::from([("app".into(), "testvm".into())]));
        vmi.status = Some(VirtualMachineInstanceStatus {
            phase: Some(phase),
            ..VirtualMachineInstanceStatus::default()
        });
        vmi
    }
}

use fixtures::{time, vm, vmi};

#[test]
fn claiming_keeps_owned_adopts_orphans_and_ignores_foreign_or_deleting_vmis() {
    let owned = vmi(Phase::Running);
    let mut orphan = vmi(Phase::Running);
    orphan.metadata.owner_references = None;
    let mut foreign = vmi(Phase::Running);
    foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
    let mut deleting_orphan = orphan.clone();
    deleting_orphan.metadata.deletion_timestamp = Some(time(0));
    let mut deleting_vm = vm(RunStrategy::Always);
    deleting_vm.metadata.deletion_timestamp = Some(time(0));
    let cases = [
        ("owned", vm(RunStrategy::Always), &owned, Claim::Owned),
        ("orphan", vm(RunStrategy::Always), &orphan, Claim::Adopt),
        ("foreign", vm(RunStrategy::Always), &foreign, Claim::Ignore),
        (
            "deleting orphan",
            vm(RunStrategy::Always),
            &deleting_orphan,
            Claim::Ignore,
        ),
        (
            "orphan of a deleting vm",
            deleting_vm,
            &orphan,
            Claim::Ignore,
        ),
    ];
    for (name, vm, vmi, want) in cases {
        assert_eq!(claim(&vm, vmi), want, "{name}");
    }
}

#[test]
fn a_vmi_wakes_its_controlling_vm_and_an_orphan_the_vm_of_its_name() {
    let mut owned = vmi(Phase::Running);
    owned.metadata.name = Some("vmi-name".into());
    assert_eq!(vm_key_of_vmi(&owned).as_deref(), Some("default/testvm"));
    owned.metadata.owner_references = None;
    assert_eq!(vm_key_of_vmi(&owned).as_deref(), Some("default/vmi-name"));
    owned.metadata.owner_references = Some(vec![OwnerReference {
        kind: "VirtualMachineInstanceReplicaSet".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    assert_eq!(vm_key_of_vmi(&owned), None);
}

#[test]
fn the_controller_finalizer_leaves_only_a_final_vmi() {
    assert_eq!(vmi_finalizer_ops(&vmi(Phase::Running)), None);
    let mut failed = vmi(Phase::Failed);
    failed.metadata.finalizers = Some(vec!["other".into(), VM_CONTROLLER_FINALIZER.into()]);
    let ops = vmi_finalizer_ops(&failed).unwrap();
    assert_eq!(
        ops,
        [
            json!({"op": "test", "path": "/metadata/finalizers/1", "value": VM_CONTROLLER_FINALIZER}),
            json!({"op": "remove", "path": "/metadata/finalizers/1"}),
        ],
        "ours by position: the other finalizer may change meanwhile"
    );
    failed.metadata.finalizers = Some(vec!["other".into()]);
    assert_eq!(vmi_finalizer_ops(&failed), None);
}

#[test]
fn a_waiting_for_sync_vmi_loses_the_controller_finalizer_only_while_deleted() {
    let mut waiting = vmi(Phase::WaitingForSync);
    assert_eq!(vmi_finalizer_ops(&waiting), None);
    waiting.metadata.deletion_timestamp = Some(time(0));
    let ops = vmi_finalizer_ops(&waiting).unwrap();
    assert_eq!(
        ops[1],
        json!({"op": "remove", "path": "/metadata/finalizers/0"})
    );
}

#[test]
fn expectations_view_reports_pending_creations_and_deletions_without_expiry() {
    let e = Expectations::new();
    assert_eq!(ExpectView::of(&e, "default/testvm"), ExpectView::idle());
    e.expect_creations("default/testvm", 1);
    let view = ExpectView::of(&e, "default/testvm");
    assert!(!view.satisfied && view.creations_pending && !view.deletions_pending);
    e.creation_observed("default/testvm");
    e.expect_deletions("default/testvm", &["default/testvm".into()]);
    let view = ExpectView::of(&e, "default/testvm");
    assert!(!view.satisfied && view.deletions_pending);
}

#[test]
fn vmi_events_lower_the_vm_expectations_once_per_object() {
    use crate::runtime::informer::Change;
    let e = Arc::new(Expectations::new());
    let observe = observe_vmi(Arc::clone(&e), |key, uid| {
        key == "default/testvm" && uid == "vm-uid"
    });
    e.expect_creations("default/testvm", 1);
    let created = vmi(Phase::Pending);
    observe(&Change::Added(&created));
    assert!(e.satisfied("default/testvm"));
    e.expect_deletions("default/testvm", &["default/testvm".into()]);
    let mut deleting = created.clone();
    deleting.metadata.deletion_timestamp = Some(time(0));
    observe(&Change::Updated {
        old: &created,
        new: &deleting,
    });
    assert!(e.satisfied("default/testvm"));
    // The final delete event of the same object does not lower the count again.
    observe(&Change::Deleted(&deleting));
    assert_eq!(e.pending("default/testvm").unwrap().del, 0);
}

#[test]
fn orphan_vmis_and_vmis_of_uncached_vms_lower_no_expectations() {
    use crate::runtime::informer::Change;
    let e = Arc::new(Expectations::new());
    let observe = observe_vmi(Arc::clone(&e), |key, uid| {
        key == "default/testvm" && uid == "vm-uid"
    });
    e.expect_creations("default/testvm", 1);
    let mut orphan = vmi(Phase::Pending);
    orphan.metadata.owner_references = None;
    observe(&Change::Added(&orphan));
    let mut of_recreated_vm = vmi(Phase::Pending);
    of_recreated_vm.metadata.owner_references.as_mut().unwrap()[0].uid = "old-vm-uid".into();
    observe(&Change::Added(&of_recreated_vm));
    assert_eq!(e.pending("default/testvm").unwrap().add, 1);
    e.expect_deletions("default/testvm", &["default/testvm".into()]);
    observe(&Change::Deleted(&orphan));
    assert_eq!(e.pending("default/testvm").unwrap().del, 1);
}

#[test]
fn adoption_fails_the_reconcile_when_the_fresh_vm_is_deleting_or_replaced() {
    let cached = vm(RunStrategy::Always);
    assert!(adoption_recheck(&cached, &cached).is_ok());
    let mut deleting = cached.clone();
    deleting.metadata.deletion_timestamp = Some(time(0));
    let err = adoption_recheck(&cached, &deleting).unwrap_err();
    assert!(matches!(err, VmError::AdoptRecheck(_)));
    assert_eq!(
        err.to_string(),
        "default/testvm has just been deleted at 2023-11-14T22:13:20Z"
    );
    let mut replaced = cached.clone();
    replaced.metadata.uid = Some("new-uid".into());
    assert_eq!(
        adoption_recheck(&cached, &replaced)
            .unwrap_err()
            .to_string(),
        "original VirtualMachine default/testvm is gone: got uid new-uid, wanted vm-uid"
    );
}

#[test]
fn only_a_vm_without_the_current_api_version_annotation_needs_it() {
    let mut vm = vm(RunStrategy::Always);
    assert!(needs_api_version_annotations(&vm));
    vm.metadata.annotations = Some(BTreeMap::from([(
        LATEST_OBSERVED_API_VERSION_ANNOTATION.into(),
        "v1".into(),
    )]));
    assert!(!needs_api_version_annotations(&vm));
}

#[test]
fn controller_errors_carry_upstream_reasons() {
    let err = VmError::Sync(SyncFailure::new("FailedCreate", "boom"));
    assert_eq!(err.reason(), "FailedCreate");
    assert_eq!(err.to_string(), "boom");
}

#[tokio::test]
async fn changed_sync_patterns_reenqueue_every_cached_vm() {
    let (tx, rx) = watch::channel(MetadataSyncPatterns::default());
    let informer = Informer::<VirtualMachine>::new();
    let handle = informer.handle();
    let stream = futures::stream::iter(vec![
        Ok(watcher::Event::Init),
        Ok(watcher::Event::InitApply(vm(RunStrategy::Always))),
        Ok(watcher::Event::InitDone),
    ]);
    informer.run_stream(stream).await;
    let queue = WorkQueue::<String>::new("test");
    let task = tokio::spawn(requeue_on_config_change(rx, handle, queue.clone()));
    tx.send_replace(MetadataSyncPatterns {
        labels: SyncPatterns::parse_flag("ops.example.com/*").0,
        ..MetadataSyncPatterns::default()
    });
    assert_eq!(queue.get().await.as_deref(), Some("default/testvm"));
    drop(tx);
    task.await.unwrap();
}

#[test]
fn the_claims_a_vm_waits_for_include_its_ephemeral_volumes_claims() {
    let mut vm = fixtures::vm(RunStrategy::Always);
    let template = vm.spec.template.spec.get_or_insert_default();
    template.volumes = serde_json::from_value(serde_json::json!([
        {"name": "a", "persistentVolumeClaim": {"claimName": "pvc-a"}},
        {"name": "b", "ephemeral": {"persistentVolumeClaim": {"claimName": "pvc-b"}}},
        {"name": "c", "dataVolume": {"name": "dv-c"}},
        {"name": "d", "containerDisk": {"image": "x"}},
    ]))
    .unwrap();
    assert_eq!(
        template_claims(&vm),
        ["default/pvc-a", "default/pvc-b", "default/dv-c"]
    );
}
