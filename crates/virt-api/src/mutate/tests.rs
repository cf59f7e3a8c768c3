//! Mutator tests: VMI defaults field by field, VM and migration defaults, and the JSON patch of
//! a mutation applied to the submitted object.

use serde_json::{Value, json};

use super::*;
use crate::config::ClusterConfig;
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};

fn vmi(spec: &Value) -> VirtualMachineInstance {
    serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "t", "namespace": "default"}, "spec": spec})).unwrap()
}

fn mutated(spec: &Value) -> Value {
    let mut v = vmi(spec);
    mutate_vmi_create(&mut v, &ClusterConfig::default()).unwrap();
    serde_json::to_value(v).unwrap()
}

fn minimal() -> Value {
    json!({
        "domain": {"devices": {}, "resources": {"requests": {"memory": "128Mi"}}},
        "volumes": [{"name": "root", "containerDisk": {"image": "quay.io/x/fedora:latest"}}, {"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config"}}]
    })
}

#[test]
fn vmi_defaults_match_upstream_field_by_field() {
    let v = mutated(&minimal());
    let spec = &v["spec"];
    assert_eq!(spec["architecture"], "amd64");
    assert_eq!(spec["domain"]["machine"]["type"], "q35");
    assert_eq!(
        spec["domain"]["cpu"],
        json!({"cores": 1, "sockets": 1, "threads": 1, "maxSockets": 4, "model": "host-model"})
    );
    assert_eq!(spec["domain"]["memory"]["guest"], "128Mi");
    assert_eq!(
        spec["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "bridge": {}}])
    );
    assert_eq!(spec["networks"], json!([{"name": "default", "pod": {}}]));
    assert_eq!(
        spec["domain"]["devices"]["disks"],
        json!([{"name": "root", "disk": {"bus": "sata"}}, {"name": "ci", "disk": {"bus": "sata"}}])
    );
    assert_eq!(
        spec["volumes"][0]["containerDisk"]["imagePullPolicy"],
        "Always"
    );
    assert!(uuid::Uuid::parse_str(spec["domain"]["firmware"]["uuid"].as_str().unwrap()).is_ok());
    assert_eq!(spec["domain"]["features"], json!({}));
    assert_eq!(
        v["metadata"]["finalizers"],
        json!(["kubevirt.io/foregroundDeleteVirtualMachine"])
    );
    assert_eq!(
        v["metadata"]["annotations"]["kubevirt.io/pci-topology-version"],
        "v3"
    );
    assert_eq!(
        v["metadata"]["annotations"]["kubevirt.io/latest-observed-api-version"],
        "v1"
    );
    assert_eq!(
        v["metadata"]["annotations"]["kubevirt.io/storage-observed-api-version"],
        "v1"
    );
    assert_eq!(v["status"]["phase"], "Pending");
    assert_eq!(
        v["status"]["phaseTransitionTimestamps"][0]["phase"],
        "Pending"
    );
    assert_eq!(v["status"]["runtimeUser"], 107);
    assert_eq!(
        v["status"]["memory"],
        json!({"guestAtBoot": "128Mi", "guestCurrent": "128Mi", "guestRequested": "128Mi"})
    );
    assert_eq!(
        v["status"]["currentCPUTopology"],
        json!({"cores": 1, "sockets": 1, "threads": 1})
    );
    assert!(
        spec["domain"]["memory"].get("maxGuest").is_none(),
        "128Mi guests are below the 1Gi hotplug minimum"
    );
}

#[test]
fn memory_hotplug_limit_is_four_times_an_aligned_guest() {
    let v = mutated(&json!({"domain": {"devices": {}, "memory": {"guest": "2Gi"}}}));
    assert_eq!(v["spec"]["domain"]["memory"]["maxGuest"], "8Gi");
}

#[test]
fn cpu_limit_sets_sockets_and_request() {
    let v = mutated(
        &json!({"domain": {"devices": {}, "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}}),
    );
    assert_eq!(v["spec"]["domain"]["cpu"]["sockets"], 2);
    assert_eq!(v["spec"]["domain"]["cpu"]["maxSockets"], 8);
    assert_eq!(v["spec"]["domain"]["resources"]["requests"]["cpu"], "2");
    assert_eq!(v["spec"]["domain"]["memory"]["guest"], "1Gi");
}

#[test]
fn existing_interfaces_features_and_timers_get_their_defaults_only() {
    let v = mutated(&json!({
        "domain": {
            "devices": {"interfaces": [{"name": "n", "masquerade": {}}], "disks": [{"name": "c", "cdrom": {}}], "inputs": [{"name": "t"}]},
            "features": {"acpi": {}, "hyperv": {"spinlocks": {}}},
            "clock": {"timer": {"hpet": {}, "rtc": {"present": false}}},
            "memory": {"guest": "1Gi"}
        },
        "networks": [{"name": "n", "pod": {}}],
        "volumes": [{"name": "c", "containerDisk": {"image": "x@sha256:1"}}]
    }));
    let d = &v["spec"]["domain"];
    assert_eq!(
        d["devices"]["interfaces"],
        json!([{"name": "n", "masquerade": {}}])
    );
    assert_eq!(
        d["devices"]["disks"][0]["cdrom"],
        json!({"bus": "sata", "readonly": true, "tray": "closed"})
    );
    assert_eq!(
        d["devices"]["inputs"][0],
        json!({"name": "t", "bus": "usb", "type": "tablet"})
    );
    assert_eq!(d["features"]["acpi"], json!({"enabled": true}));
    assert_eq!(
        d["features"]["hyperv"]["spinlocks"],
        json!({"enabled": true, "spinlocks": 4096})
    );
    assert_eq!(
        d["clock"]["timer"],
        json!({"hpet": {"present": true}, "rtc": {"present": false}})
    );
    assert_eq!(
        v["spec"]["volumes"][0]["containerDisk"]["imagePullPolicy"],
        "IfNotPresent"
    );
}

#[test]
fn autoattach_pod_interface_false_adds_no_network() {
    let v = mutated(
        &json!({"domain": {"devices": {"autoattachPodInterface": false}, "memory": {"guest": "1Gi"}}}),
    );
    assert!(v["spec"].get("networks").is_none());
    assert!(v["spec"]["domain"]["devices"].get("interfaces").is_none());
}

#[test]
fn bridge_default_is_refused_when_bridge_on_pod_network_is_not_permitted() {
    let cfg = ClusterConfig {
        permit_bridge_interface_on_pod_network: false,
        ..ClusterConfig::default()
    };
    let mut v = vmi(&minimal());
    assert_eq!(
        mutate_vmi_create(&mut v, &cfg),
        Err(DefaultsError::BridgeNotPermitted)
    );
    assert_eq!(
        DefaultsError::BridgeNotPermitted.to_string(),
        "bridge interface is not enabled in kubevirt-config"
    );
}

#[test]
fn the_patch_of_a_vmi_mutation_applies_to_the_submitted_object() {
    let before = serde_json::to_value(vmi(&minimal())).unwrap();
    let after = mutated(&minimal());
    let ops = diff(&before, &after);
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
    let mut doc = before.clone();
    json_patch::patch(&mut doc, &patch).unwrap();
    assert_eq!(doc, after);
}

#[test]
fn vm_create_gets_a_random_firmware_uuid_and_serial() {
    let mut vm: VirtualMachine = serde_json::from_value(json!({
        "metadata": {"name": "vm"},
        "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}
    }))
    .unwrap();
    mutate_vm_create(&mut vm, &ClusterConfig::default());
    let v = serde_json::to_value(&vm).unwrap();
    let fw = &v["spec"]["template"]["spec"]["domain"]["firmware"];
    assert!(uuid::Uuid::parse_str(fw["uuid"].as_str().unwrap()).is_ok());
    assert!(uuid::Uuid::parse_str(fw["serial"].as_str().unwrap()).is_ok());
    assert_ne!(fw["uuid"], fw["serial"]);
    assert_eq!(
        v["spec"]["template"]["spec"]["domain"]["machine"]["type"],
        "q35"
    );
    assert_eq!(
        v["spec"]["template"]["metadata"]["annotations"]["kubevirt.io/pci-topology-version"],
        "v3"
    );
}

#[test]
fn migration_create_gets_the_vmi_label_and_finalizer() {
    let mut m: VirtualMachineInstanceMigration =
        serde_json::from_value(json!({"metadata": {"name": "m"}, "spec": {"vmiName": "t"}}))
            .unwrap();
    mutate_migration_create(&mut m);
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(v["metadata"]["labels"]["kubevirt.io/vmi-name"], "t");
    assert_eq!(
        v["metadata"]["finalizers"],
        json!(["kubevirt.io/migrationJobFinalize"])
    );
}

#[test]
fn the_crs_cpu_model_is_the_default_of_vmis_without_one() {
    let kv: kubevirt_api::v1::KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {"cpuModel": "Haswell-noTSX"}}
    }))
    .unwrap();
    let cfg = ClusterConfig::from_kubevirt(Some(&kv));
    let model = |spec: &Value, cfg: &ClusterConfig| {
        let mut v = vmi(spec);
        mutate_vmi_create(&mut v, cfg).unwrap();
        v.spec.domain.cpu.and_then(|c| c.model).unwrap_or_default()
    };
    assert_eq!(model(&minimal(), &cfg), "Haswell-noTSX");
    let mut own = minimal();
    own["domain"]["cpu"] = json!({"model": "host-passthrough"});
    assert_eq!(
        model(&own, &cfg),
        "host-passthrough",
        "the VMI's own model wins"
    );
    assert_eq!(model(&minimal(), &ClusterConfig::default()), "host-model");
    let empty: kubevirt_api::v1::KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {"cpuModel": ""}}
    }))
    .unwrap();
    assert_eq!(
        model(&minimal(), &ClusterConfig::from_kubevirt(Some(&empty))),
        "host-model",
        "an empty cpuModel is no model"
    );
}
