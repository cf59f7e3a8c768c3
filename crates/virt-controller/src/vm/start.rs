//! Building the VMI a VM starts, and the ControllerRevision that records the started spec.
//!
//! The VMI takes the template's metadata and spec; its name is always the VM's name (the
//! template's name or generateName are ignored), it gets a controller owner reference to the
//! VM with `blockOwnerDeletion`, the finalizer `kubevirt.io/virtualMachineControllerFinalize`,
//! the annotation `kubevirt.io/vm-generation` with the VM generation it was built from, and
//! `status.virtualMachineRevisionName` naming the revision `revision-start-vm-<uid>-<gen>`
//! whose data is `{"spec": <VM spec>}`. A template without a firmware UUID gets upstream's
//! stable one (a SHA-1 based UUIDv5 of the VM name); every volume without a disk or
//! filesystem gets a disk of the same name.
//!
//! Not built (yet) compared to upstream: instancetypes/preferences, DataVolumes, default
//! input devices and network interfaces, changed block tracking, memory-dump volumes.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kubevirt_api::constants::{
    API_VERSION, CREATE_MIGRATION_TARGET_ANNOTATION, VM_CONTROLLER_FINALIZER,
    VM_GENERATION_ANNOTATION,
};
use kubevirt_api::v1::{
    Disk, Firmware, RunStrategy, START_REQUEST_DATA_PAUSED_KEY, START_REQUEST_DATA_PAUSED_TRUE,
    StartStrategy, StateChangeRequestAction, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstanceSpec, VirtualMachineInstanceStatus, VirtualMachineSpec,
};
use serde_json::json;
use uuid::Uuid;

/// Name prefix of the start revisions of a VM.
pub const START_REVISION_PREFIX: &str = "revision-start-vm-";

/// Namespace of upstream's legacy firmware UUIDs.
const FIRMWARE_UUID_NAMESPACE: Uuid = Uuid::from_u128(0x6a1a_24a1_4061_4607_8bf4_a396_3d0c_5895);

/// The name of the start revision of VM `uid` at `generation`.
pub fn revision_name(vm_uid: &str, generation: i64) -> String {
    format!("{START_REVISION_PREFIX}{vm_uid}-{generation}")
}

/// The generation in a revision name: the number after its last `-`.
pub fn revision_generation(name: &str) -> Option<i64> {
    name.rsplit_once('-').and_then(|(_, n)| n.parse().ok())
}

/// Upstream's stable firmware UUID of a VM without one: UUIDv5 (SHA-1) of its name.
pub fn legacy_firmware_uuid(name: &str) -> String {
    Uuid::new_v5(&FIRMWARE_UUID_NAMESPACE, name.as_bytes()).to_string()
}

/// The controller owner reference of objects owned by `vm`.
pub fn owner_reference(vm: &VirtualMachine) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: "VirtualMachine".to_owned(),
        name: vm.metadata.name.clone().unwrap_or_default(),
        uid: vm.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The revision recording the spec `vm` is started with.
pub fn build_revision(vm: &VirtualMachine) -> ControllerRevision {
    let generation = vm.metadata.generation.unwrap_or_default();
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(uid, generation)),
            namespace: vm.metadata.namespace.clone(),
            owner_references: Some(vec![owner_reference(vm)]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(json!({ "spec": vm.spec }))),
        revision: generation,
    }
}

/// The VM spec stored in a start revision, if it decodes.
pub fn revision_spec(revision: &ControllerRevision) -> Option<VirtualMachineSpec> {
    let data = revision.data.as_ref()?.0.get("spec")?.clone();
    serde_json::from_value(data).ok()
}

/// Whether the first state change request asks for a paused start.
fn paused_start(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .and_then(|s| s.state_change_requests.first())
        .is_some_and(|r| {
            r.action == StateChangeRequestAction::Start
                && r.data
                    .get(START_REQUEST_DATA_PAUSED_KEY)
                    .map(String::as_str)
                    == Some(START_REQUEST_DATA_PAUSED_TRUE)
        })
}

/// Adds a disk named after every volume that has neither a disk nor a filesystem.
fn add_missing_disks(spec: &mut VirtualMachineInstanceSpec) {
    let devices = &spec.domain.devices;
    let known: BTreeSet<String> = devices
        .disks
        .iter()
        .map(|d| d.name.clone())
        .chain(devices.filesystems.iter().map(|f| f.name.clone()))
        .collect();
    let missing: Vec<Disk> = spec
        .volumes
        .iter()
        .filter(|v| !known.contains(&v.name))
        .map(|v| Disk {
            name: v.name.clone(),
            ..Disk::default()
        })
        .collect();
    spec.domain.devices.disks.extend(missing);
}

/// The VMI that starting `vm` creates, recording `revision` as its start revision.
pub fn build_vmi(vm: &VirtualMachine, revision: &str) -> VirtualMachineInstance {
    let template = &vm.spec.template;
    let mut meta = template.metadata.clone().unwrap_or_default();
    meta.name.clone_from(&vm.metadata.name);
    meta.generate_name = None;
    meta.namespace.clone_from(&vm.metadata.namespace);
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.owner_references = Some(vec![owner_reference(vm)]);
    let mut finalizers = meta.finalizers.take().unwrap_or_default();
    if !finalizers.iter().any(|f| f == VM_CONTROLLER_FINALIZER) {
        finalizers.push(VM_CONTROLLER_FINALIZER.to_owned());
    }
    meta.finalizers = Some(finalizers);
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(
        VM_GENERATION_ANNOTATION.to_owned(),
        vm.metadata.generation.unwrap_or_default().to_string(),
    );
    if vm.spec.run_strategy == Some(RunStrategy::WaitAsReceiver) {
        annotations.insert(
            CREATE_MIGRATION_TARGET_ANNOTATION.to_owned(),
            "true".to_owned(),
        );
    }

    let mut spec = template.spec.clone().unwrap_or_default();
    if paused_start(vm) {
        spec.start_strategy = Some(StartStrategy::Paused);
    }
    let firmware = spec.domain.firmware.get_or_insert_with(Firmware::default);
    if firmware.uuid.as_deref().unwrap_or_default().is_empty() {
        let name = vm.metadata.name.as_deref().unwrap_or_default();
        firmware.uuid = Some(legacy_firmware_uuid(name));
    }
    add_missing_disks(&mut spec);

    VirtualMachineInstance {
        metadata: meta,
        spec,
        status: Some(VirtualMachineInstanceStatus {
            virtual_machine_revision_name: Some(revision.to_owned()),
            ..VirtualMachineInstanceStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubevirt_api::v1::{
        ContainerDiskSource, VirtualMachineInstanceTemplateSpec, VirtualMachineStateChangeRequest,
        VirtualMachineStatus, Volume, VolumeSource,
    };
    use std::collections::BTreeMap;

    fn vm() -> VirtualMachine {
        let mut vm = VirtualMachine::new(
            "vm-cirros",
            VirtualMachineSpec {
                run_strategy: Some(RunStrategy::Always),
                template: VirtualMachineInstanceTemplateSpec {
                    metadata: Some(ObjectMeta {
                        name: Some("ignored".into()),
                        labels: Some(BTreeMap::from([(
                            "kubevirt.io/vm".into(),
                            "vm-cirros".into(),
                        )])),
                        annotations: Some(BTreeMap::from([(
                            "kubevirt.io/ignitiondata".into(),
                            "{}".into(),
                        )])),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(VirtualMachineInstanceSpec {
                        volumes: vec![Volume {
                            name: "containerdisk".into(),
                            volume_source: VolumeSource {
                                container_disk: Some(ContainerDiskSource::default()),
                                ..VolumeSource::default()
                            },
                        }],
                        ..VirtualMachineInstanceSpec::default()
                    }),
                },
                ..VirtualMachineSpec::default()
            },
        );
        vm.metadata.namespace = Some("default".into());
        vm.metadata.uid = Some("vm-uid".into());
        vm.metadata.generation = Some(3);
        vm.metadata.annotations = Some(BTreeMap::from([("vm-level".into(), "x".into())]));
        vm
    }

    #[test]
    fn the_vmi_carries_name_metadata_owner_finalizer_and_generation() {
        let vm = vm();
        let vmi = build_vmi(&vm, &revision_name("vm-uid", 3));
        let meta = &vmi.metadata;
        assert_eq!(meta.name.as_deref(), Some("vm-cirros"));
        assert_eq!(meta.namespace.as_deref(), Some("default"));
        assert_eq!(meta.labels.as_ref().unwrap()["kubevirt.io/vm"], "vm-cirros");
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations["kubevirt.io/ignitiondata"], "{}");
        assert_eq!(annotations[VM_GENERATION_ANNOTATION], "3");
        assert!(
            !annotations.contains_key("vm-level"),
            "VM-level annotations are not copied"
        );
        assert_eq!(
            meta.owner_references.as_deref(),
            Some(&[owner_reference(&vm)][..])
        );
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(
            meta.finalizers.as_deref(),
            Some(&[VM_CONTROLLER_FINALIZER.to_owned()][..])
        );
        assert_eq!(
            vmi.status.unwrap().virtual_machine_revision_name.as_deref(),
            Some("revision-start-vm-vm-uid-3")
        );
    }

    #[test]
    fn the_firmware_uuid_is_stable_unless_the_template_sets_one() {
        let mut vm = vm();
        let a = build_vmi(&vm, "r")
            .spec
            .domain
            .firmware
            .unwrap()
            .uuid
            .unwrap();
        let b = build_vmi(&vm, "r")
            .spec
            .domain
            .firmware
            .unwrap()
            .uuid
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a, legacy_firmware_uuid("vm-cirros"));
        assert_eq!(Uuid::parse_str(&a).unwrap().get_version_num(), 5);
        let spec = vm.spec.template.spec.as_mut().unwrap();
        spec.domain.firmware = Some(Firmware {
            uuid: Some("5d307ca9-b3ef-428c-8861-06e72d69f223".into()),
            ..Firmware::default()
        });
        let c = build_vmi(&vm, "r")
            .spec
            .domain
            .firmware
            .unwrap()
            .uuid
            .unwrap();
        assert_eq!(c, "5d307ca9-b3ef-428c-8861-06e72d69f223");
    }

    #[test]
    fn every_volume_without_a_disk_gets_one() {
        let vmi = build_vmi(&vm(), "r");
        let names: Vec<&str> = vmi
            .spec
            .domain
            .devices
            .disks
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, ["containerdisk"]);
    }

    #[test]
    fn a_paused_start_request_and_wait_as_receiver_shape_the_vmi() {
        let mut vm = vm();
        vm.spec.run_strategy = Some(RunStrategy::WaitAsReceiver);
        vm.status = Some(VirtualMachineStatus {
            state_change_requests: vec![VirtualMachineStateChangeRequest {
                action: StateChangeRequestAction::Start,
                data: BTreeMap::from([("paused".into(), "true".into())]),
                uid: None,
            }],
            ..VirtualMachineStatus::default()
        });
        let vmi = build_vmi(&vm, "r");
        assert_eq!(vmi.spec.start_strategy, Some(StartStrategy::Paused));
        assert_eq!(
            vmi.metadata.annotations.unwrap()[CREATE_MIGRATION_TARGET_ANNOTATION],
            "true"
        );
    }

    #[test]
    fn the_revision_holds_the_vm_spec_and_its_generation_is_parsed_back() {
        let vm = vm();
        let rev = build_revision(&vm);
        assert_eq!(
            rev.metadata.name.as_deref(),
            Some("revision-start-vm-vm-uid-3")
        );
        assert_eq!(rev.revision, 3);
        assert_eq!(revision_spec(&rev), Some(vm.spec.clone()));
        assert_eq!(revision_generation("revision-start-vm-vm-uid-3"), Some(3));
        assert_eq!(revision_generation("no-number-x"), None);
    }
}
