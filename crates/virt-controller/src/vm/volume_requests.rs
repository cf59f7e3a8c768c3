//! The VM's `status.volumeRequests` applied (upstream `handleVolumeRequests` and
//! `trimDoneVolumeRequests`, reference §2.2 step 11).
//!
//! `virtctl addvolume --persist` / `removevolume --persist` append a request to the VM status
//! (virt-api's subresource). Each reconcile applies every request, in order, to the VM
//! template — and, while a VMI runs and is not being deleted, adds a requested volume the VMI
//! lacks or removes one it has. A request leaves the status once the template (and the VMI,
//! when there is one) reflect it.
//!
//! Both writes are JSON Patches that `test` the lists they replace, so a concurrent edit of the
//! template or another hotplug makes them fail and the next reconcile starts over from what is
//! there; upstream `Update`s the whole VM and patches the VMI the same way.

use kubevirt_api::v1::{
    AddVolumeOptions, Disk, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceSpec,
    VirtualMachineStatus, VirtualMachineVolumeRequest, Volume, VolumeSource,
};
use serde_json::{Value, json};

/// The writes the volume requests of a VM need now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeRequestPlan {
    /// JSON Patch of the VM template's volumes and disks.
    pub template_ops: Vec<Value>,
    /// JSON Patch of the running VMI's volumes and disks.
    pub vmi_ops: Vec<Value>,
}

fn requests(vm: &VirtualMachine) -> &[VirtualMachineVolumeRequest] {
    vm.status
        .as_ref()
        .map_or(&[], |s: &VirtualMachineStatus| s.volume_requests.as_slice())
}

/// The volume an add request creates: its name and the hotplug source (PVC or DataVolume).
fn added_volume(options: &AddVolumeOptions) -> Volume {
    let source = options.volume_source.clone().unwrap_or_default();
    Volume {
        name: options.name.clone(),
        volume_source: VolumeSource {
            persistent_volume_claim: source.persistent_volume_claim,
            data_volume: source.data_volume,
            ..VolumeSource::default()
        },
    }
}

fn has_volume(spec: &VirtualMachineInstanceSpec, name: &str) -> bool {
    spec.volumes.iter().any(|v| v.name == name)
}

fn has_disk(spec: &VirtualMachineInstanceSpec, name: &str) -> bool {
    spec.domain.devices.disks.iter().any(|d| d.name == name)
}

/// Upstream's `ApplyVolumeRequestOnVMISpec`: an add appends the volume and its disk (named
/// as the volume) unless a volume of that name exists; a remove drops the volume and the
/// disk of that name.
pub fn apply(spec: &mut VirtualMachineInstanceSpec, request: &VirtualMachineVolumeRequest) {
    if let Some(add) = &request.add_volume_options {
        if has_volume(spec, &add.name) {
            return;
        }
        spec.volumes.push(added_volume(add));
        if let Some(disk) = &add.disk {
            spec.domain.devices.disks.push(Disk {
                name: add.name.clone(),
                ..disk.clone()
            });
        }
    } else if let Some(remove) = &request.remove_volume_options {
        spec.volumes.retain(|v| v.name != remove.name);
        spec.domain.devices.disks.retain(|d| d.name != remove.name);
    }
}

/// Whether `spec` reflects `request`: the volume and its disk are there (add), or neither is
/// (remove).
fn reflected(spec: &VirtualMachineInstanceSpec, request: &VirtualMachineVolumeRequest) -> bool {
    if let Some(add) = &request.add_volume_options {
        has_volume(spec, &add.name) && has_disk(spec, &add.name)
    } else if let Some(remove) = &request.remove_volume_options {
        !has_volume(spec, &remove.name) && !has_disk(spec, &remove.name)
    } else {
        // Neither add nor remove (virt-api refuses such a request): nothing to wait for.
        true
    }
}

/// The guarded replacement of `prefix`'s `volumes` and `domain/devices/disks` lists of `old`
/// by those of `new`, or nothing when they are equal.
fn list_ops(
    prefix: &str,
    old: &VirtualMachineInstanceSpec,
    new: &VirtualMachineInstanceSpec,
    resource_version: Option<&str>,
) -> Vec<Value> {
    let mut guard = None;
    let mut ops = Vec::new();
    let mut list = |path: String, old: Value, new: Value| {
        if old == new {
            return;
        }
        // An empty list reads back as absent or as `[]`, which a `test` cannot tell apart:
        // `add` replaces either, and the object's resourceVersion guards it instead.
        let empty = old.as_array().is_none_or(Vec::is_empty);
        if empty {
            if let Some(rv) = resource_version {
                guard.get_or_insert_with(
                    || json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
                );
            }
        } else {
            ops.push(json!({"op": "test", "path": path, "value": old}));
        }
        ops.push(json!({"op": if empty { "add" } else { "replace" }, "path": path, "value": new}));
    };
    let json = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
    list(
        format!("{prefix}/volumes"),
        json(serde_json::to_value(&old.volumes)),
        json(serde_json::to_value(&new.volumes)),
    );
    list(
        format!("{prefix}/domain/devices/disks"),
        json(serde_json::to_value(&old.domain.devices.disks)),
        json(serde_json::to_value(&new.domain.devices.disks)),
    );
    if let Some(guard) = guard {
        ops.insert(0, guard);
    }
    ops
}

/// What the VM's volume requests ask of the template and of `vmi` now.
pub fn plan(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> VolumeRequestPlan {
    let requests = requests(vm);
    if requests.is_empty() {
        return VolumeRequestPlan::default();
    }
    let template = vm.spec.template.spec.clone().unwrap_or_default();
    let mut wanted = template.clone();
    for request in requests {
        apply(&mut wanted, request);
    }
    let mut plan = VolumeRequestPlan {
        template_ops: list_ops(
            "/spec/template/spec",
            &template,
            &wanted,
            vm.metadata.resource_version.as_deref(),
        ),
        vmi_ops: Vec::new(),
    };
    if let Some(vmi) = vmi.filter(|v| v.metadata.deletion_timestamp.is_none()) {
        let mut next = vmi.spec.clone();
        for request in requests {
            apply(&mut next, request);
        }
        plan.vmi_ops = list_ops(
            "/spec",
            &vmi.spec,
            &next,
            vmi.metadata.resource_version.as_deref(),
        );
    }
    plan
}

/// Drops the requests the template and the VMI (when there is one) already reflect.
pub fn trim_done(
    status: &mut VirtualMachineStatus,
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
) {
    if status.volume_requests.is_empty() {
        return;
    }
    let empty = VirtualMachineInstanceSpec::default();
    let template = vm.spec.template.spec.as_ref().unwrap_or(&empty);
    status.volume_requests.retain(|request| {
        let done = reflected(template, request) && vmi.is_none_or(|v| reflected(&v.spec, request));
        !done
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm_with(requests: Value, volumes: Value) -> VirtualMachine {
        let mut vm = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm", "namespace": "default", "resourceVersion": "7"},
            "spec": {"template": {"spec": {
                "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
            }}},
        });
        vm["spec"]["template"]["spec"]["volumes"] = volumes;
        vm["status"] = json!({});
        vm["status"]["volumeRequests"] = requests;
        serde_json::from_value(vm).unwrap()
    }

    fn root() -> Value {
        json!([{"name": "root", "containerDisk": {"image": "img"}}])
    }

    fn add(name: &str) -> Value {
        json!({"addVolumeOptions": {"name": name, "disk": {"name": name, "disk": {"bus": "scsi"}},
            "volumeSource": {"persistentVolumeClaim": {"claimName": name, "hotpluggable": true}}}})
    }

    fn vmi_of(vm: &VirtualMachine) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "default"},
            "spec": vm.spec.template.spec,
        }))
        .unwrap()
    }

    #[test]
    fn an_add_request_reaches_the_template_and_the_running_vmi_guarded() {
        let vm = vm_with(json!([add("data")]), root());
        let vmi = vmi_of(&vm);
        let plan = plan(&vm, Some(&vmi));
        let template_paths: Vec<&str> = plan
            .template_ops
            .iter()
            .map(|o| o["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            template_paths,
            [
                "/spec/template/spec/volumes",
                "/spec/template/spec/volumes",
                "/spec/template/spec/domain/devices/disks",
                "/spec/template/spec/domain/devices/disks",
            ]
        );
        assert_eq!(plan.template_ops[0]["op"], "test");
        assert_eq!(plan.template_ops[0]["value"], root());
        let volumes = &plan.template_ops[1]["value"];
        assert_eq!(volumes[1]["name"], "data");
        assert_eq!(volumes[1]["persistentVolumeClaim"]["hotpluggable"], true);
        assert_eq!(plan.template_ops[3]["value"][1]["name"], "data");
        assert_eq!(plan.template_ops[3]["value"][1]["disk"]["bus"], "scsi");
        // The VMI gets the same lists at its own paths.
        assert_eq!(plan.vmi_ops[1]["path"], "/spec/volumes");
        assert_eq!(plan.vmi_ops[1]["value"], plan.template_ops[1]["value"]);
    }

    #[test]
    fn an_applied_request_plans_nothing_and_is_trimmed_once_the_vmi_has_it_too() {
        let mut vm = vm_with(json!([add("data")]), root());
        let mut spec = vm.spec.template.spec.clone().unwrap();
        apply(&mut spec, &vm.status.as_ref().unwrap().volume_requests[0]);
        vm.spec.template.spec = Some(spec);
        let stale_vmi = vmi_with_spec_of(&vm_with(json!([]), root()));
        let plan_now = plan(&vm, Some(&stale_vmi));
        assert!(plan_now.template_ops.is_empty());
        assert!(
            !plan_now.vmi_ops.is_empty(),
            "the VMI still lacks the volume"
        );

        let mut status = vm.status.clone().unwrap();
        trim_done(&mut status, &vm, Some(&stale_vmi));
        assert_eq!(status.volume_requests.len(), 1, "kept until the VMI has it");
        trim_done(&mut status, &vm, Some(&vmi_of(&vm)));
        assert!(status.volume_requests.is_empty());
        let mut status = vm.status.clone().unwrap();
        trim_done(&mut status, &vm, None);
        assert!(
            status.volume_requests.is_empty(),
            "a stopped VM needs the template only"
        );
    }

    fn vmi_with_spec_of(vm: &VirtualMachine) -> VirtualMachineInstance {
        vmi_of(vm)
    }

    #[test]
    fn a_remove_request_drops_volume_and_disk_and_an_add_then_remove_ends_without_it() {
        let volumes = json!([{"name": "root", "containerDisk": {"image": "img"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "data", "hotpluggable": true}}]);
        let mut vm = vm_with(json!([{"removeVolumeOptions": {"name": "data"}}]), volumes);
        vm.spec
            .template
            .spec
            .as_mut()
            .unwrap()
            .domain
            .devices
            .disks
            .push(serde_json::from_value(json!({"name": "data", "disk": {}})).unwrap());
        let plan_now = plan(&vm, None);
        assert_eq!(plan_now.template_ops[1]["value"], root());
        assert_eq!(
            plan_now.template_ops[3]["value"].as_array().unwrap().len(),
            1
        );
        assert!(plan_now.vmi_ops.is_empty(), "no VMI, no VMI patch");

        let vm = vm_with(
            json!([add("data"), {"removeVolumeOptions": {"name": "data"}}]),
            root(),
        );
        assert!(plan(&vm, None).template_ops.is_empty());
    }

    #[test]
    fn a_deleting_vmi_is_left_alone_and_an_empty_template_list_is_added() {
        let vm = vm_with(json!([add("data")]), json!([]));
        let mut vmi = vmi_of(&vm);
        vmi.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let plan_now = plan(&vm, Some(&vmi));
        assert!(plan_now.vmi_ops.is_empty());
        assert_eq!(
            plan_now.template_ops[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(plan_now.template_ops[1]["op"], "add");
        assert_eq!(
            plan_now.template_ops[1]["path"],
            "/spec/template/spec/volumes"
        );
    }
}
