//! Table tests: one case per VMI create rule family (§5.2), VM rules, update rules, migrations,
//! replica sets and pools; each asserts upstream's message and field path.

use serde_json::{Value, json};

use super::*;
use crate::config::ClusterConfig;
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};

fn base_vmi() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {
            "domain": {
                "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                "resources": {"requests": {"memory": "128Mi"}}
            },
            "volumes": [{"name": "root", "containerDisk": {"image": "x"}}]
        }
    })
}

/// Merges `patch` into `doc` (objects merged, everything else replaced; `null` deletes).
fn merge(doc: &mut Value, patch: &Value) {
    match (doc, patch) {
        (Value::Object(d), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    d.remove(k);
                } else {
                    merge(d.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (d, p) => *d = p.clone(),
    }
}

fn vmi_causes_with(patch: &Value, cfg: &ClusterConfig) -> Vec<Cause> {
    let mut doc = base_vmi();
    merge(&mut doc, patch);
    let vmi: VirtualMachineInstance = serde_json::from_value(doc).unwrap();
    validate_vmi_create(&vmi, cfg, false)
}

fn vmi_causes(patch: &Value) -> Vec<Cause> {
    vmi_causes_with(patch, &ClusterConfig::default())
}

#[track_caller]
fn assert_cause(causes: &[Cause], field: &str, message: &str) {
    assert!(
        causes
            .iter()
            .any(|c| c.field == field && c.message == message),
        "no cause {field:?} / {message:?} in {causes:#?}"
    );
}

#[test]
fn the_base_vmi_is_valid() {
    assert_eq!(vmi_causes(&json!({})), vec![]);
}

fn check_cases(cases: Vec<(Value, &str, &str)>) {
    for (patch, field, message) in cases {
        assert_cause(&vmi_causes(&patch), field, message);
    }
}

#[test]
fn compute_rules_report_upstream_messages_and_fields() {
    check_cases(vec![
        // 1. feature gates
        (
            json!({"spec": {"volumes": [{"name": "root", "hostDisk": {"path": "/d", "type": "Disk"}}]}}),
            "spec.volumes[0]",
            "HostDisk feature gate is not enabled",
        ),
        (
            json!({"spec": {"volumes": [{"name": "root", "hostDisk": {"path": "disk.img", "type": "Disk"}}]}}),
            "spec.volumes[0].hostDisk.path",
            "spec.volumes[0].hostDisk.path must be an absolute path, got 'disk.img'",
        ),
        // 2. hostname
        (
            json!({"spec": {"hostname": "-bad"}}),
            "spec.hostname",
            "spec.hostname does not conform to the kubernetes DNS_LABEL rules : a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ),
        // 3. memory
        (
            json!({"spec": {"domain": {"resources": {"requests": {"memory": "100"}}}}}),
            "spec.domain.resources.requests.memory",
            "spec.domain.resources.requests.memory '100': must be greater than or equal to 1M.",
        ),
        (
            json!({"spec": {"domain": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}}}),
            "spec.domain.resources.requests.memory",
            "spec.domain.resources.requests.memory '2Gi' is greater than spec.domain.resources.limits.memory '1Gi'",
        ),
        // 4. hugepages
        (
            json!({"spec": {"domain": {"memory": {"hugepages": {"pageSize": "2Mi"}}, "resources": {"requests": {"memory": "3Mi"}}}}}),
            "spec.domain.resources.requests.memory",
            "spec.domain.resources.requests.memory '3Mi' is not a multiple of the page size spec.domain.memory.hugepages.pageSize '2Mi'",
        ),
        // 6. machine type
        (
            json!({"spec": {"domain": {"machine": {"type": "pc-i440fx"}}}}),
            "spec.domain.machine.type",
            "spec.domain.machine.type is not supported: pc-i440fx (allowed values: [q35* pc-q35*])",
        ),
        // 7. ACPI
        (
            json!({"spec": {"domain": {"firmware": {"acpi": {}}}}}),
            "spec.acpi",
            "ACPI was set but no SLIC nor MSDM volume reference was set",
        ),
        (
            json!({"spec": {"domain": {"firmware": {"acpi": {"slicNameRef": "nope"}}}}}),
            "spec.acpi.slicNameRef",
            "spec.acpi does not have a matching Volume.",
        ),
        // 8. CPU
        (
            json!({"spec": {"domain": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}}}),
            "spec.domain.resources.requests.cpu",
            "spec.domain.resources.requests.cpu '2' is greater than spec.domain.resources.limits.cpu '1'",
        ),
        (
            json!({"spec": {"domain": {"cpu": {"dedicatedCpuPlacement": true, "threads": 3}}}}),
            "spec.domain.cpu.dedicatedCpuPlacement",
            "Not more than two threads must be provided at spec.domain.cpu.threads (got 3) when DedicatedCPUPlacement is true",
        ),
        // 9. isolateEmulatorThread
        (
            json!({"spec": {"domain": {"cpu": {"isolateEmulatorThread": true}}}}),
            "spec.domain.cpu.isolateEmulatorThread",
            "IsolateEmulatorThread should be only set in combination with DedicatedCPUPlacement",
        ),
        // 10. CPU feature policy
        (
            json!({"spec": {"domain": {"cpu": {"features": [{"name": "vmx", "policy": "bogus"}]}}}}),
            "spec.domain.cpu.features[0].policy",
            "CPU feature vmx uses policy bogus that is not supported.",
        ),
        // 11. sockets > maxSockets
        (
            json!({"spec": {"domain": {"cpu": {"sockets": 4, "maxSockets": 2}}}}),
            "spec.domain.cpu.sockets",
            "Number of sockets in CPU topology is greater than the maximum sockets allowed",
        ),
        // 12. start strategy
        (
            json!({"spec": {"startStrategy": "Running"}}),
            "spec.startStrategy",
            "spec.startStrategy is set with an unrecognized option: Running",
        ),
        // 13. topology spread
        (
            json!({"spec": {"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}}),
            "spec.topologySpreadConstraints[0].maxSkew",
            "spec.topologySpreadConstraints[0].maxSkew: Invalid value: 0: must be greater than zero",
        ),
    ]);
}

#[test]
fn network_device_and_firmware_rules_report_upstream_messages_and_fields() {
    let disks_and = |extra: Value| json!({"spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}, extra]}}}});
    check_cases(vec![
        // 14. network
        (
            json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}}}}),
            "spec.domain.devices.interfaces[0].name",
            "spec.domain.devices.interfaces[0].name 'default' not found.",
        ),
        (
            json!({"spec": {"networks": [{"name": "n", "pod": {}}], "domain": {"devices": {"interfaces": [{"name": "n", "bridge": {}, "masquerade": {}}]}}}}),
            "spec.domain.devices.interfaces[0]",
            "logical n interface must have exactly one binding method or binding plugin",
        ),
        // 15. boot order
        (
            json!({"spec": {"volumes": [{"name": "root", "containerDisk": {"image": "x"}}, {"name": "b", "containerDisk": {"image": "y"}}], "domain": {"devices": {"disks": [{"name": "root", "bootOrder": 1}, {"name": "b", "bootOrder": 1}]}}}}),
            "spec.domain.devices.disks[1].bootOrder",
            "Boot order for spec.domain.devices.disks[1].bootOrder already set for a different device.",
        ),
        // 16. inputs
        (
            json!({"spec": {"domain": {"devices": {"inputs": [{"name": "i", "bus": "ps2", "type": "tablet"}]}}}}),
            "spec.domain.devices.inputs[0].bus",
            "Input device can have only virtio or usb bus.",
        ),
        (
            json!({"spec": {"domain": {"devices": {"inputs": [{"name": "i", "bus": "usb", "type": "keyboard"}]}}}}),
            "spec.domain.devices.inputs[0].type",
            "Input device can have only tablet type.",
        ),
        // 17. IO threads
        (
            json!({"spec": {"domain": {"ioThreadsPolicy": "bogus"}}}),
            "spec.domain.ioThreadsPolicy",
            "Invalid IOThreadsPolicy (bogus)",
        ),
        // 18. probes
        (
            json!({"spec": {"readinessProbe": {"initialDelaySeconds": 1}}}),
            "spec.readinessProbe",
            "either spec.readinessProbe.tcpSocket, spec.readinessProbe.exec or spec.readinessProbe.httpGet must be set if a spec.readinessProbe is specified",
        ),
        (
            json!({"spec": {"readinessProbe": {"tcpSocket": {"port": 22}}}}),
            "spec.readinessProbe.tcpSocket",
            "spec.readinessProbe.tcpSocket is only allowed if the Pod Network is attached",
        ),
        // 19. disks
        (
            json!({"spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "ide"}}]}}}}),
            "spec.domain.devices.disks[0].disk.bus",
            "IDE bus is not supported",
        ),
        (
            json!({"spec": {"domain": {"devices": {"disks": [{"name": "root", "cdrom": {"bus": "virtio"}}]}}}}),
            "spec.domain.devices.disks[0].cdrom.bus",
            "Bus type virtio is invalid for CD-ROM device",
        ),
        (
            json!({"spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "sata", "readonly": true}}]}}}}),
            "spec.domain.devices.disks[0].disk.bus",
            "sata hard-disks do not support read-only.",
        ),
        (
            json!({"spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "floppy"}}]}}}}),
            "spec.domain.devices.disks[0].disk.bus",
            "spec.domain.devices.disks[0] is set with an unrecognized bus floppy, must be one of: [virtio scsi sata usb]",
        ),
        (
            json!({"spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {}, "cdrom": {}}]}}}}),
            "spec.domain.devices.disks[0]",
            "spec.domain.devices.disks[0] can only have a single target type defined",
        ),
        (
            disks_and(json!({"name": "root", "disk": {}})),
            "spec.domain.devices.disks[1].name",
            "spec.domain.devices.disks[1] and spec.domain.devices.disks[0] must not have the same Name.",
        ),
        // 20. firmware
        (
            json!({"spec": {"domain": {"firmware": {"bootloader": {"bios": {}, "efi": {}}}, "features": {"smm": {}}}}}),
            "spec.domain.firmware.bootloader",
            "spec.domain.firmware.bootloader has both EFI and BIOS configured, but they are mutually exclusive.",
        ),
        (
            json!({"spec": {"domain": {"firmware": {"bootloader": {"efi": {}}}}}}),
            "spec.domain",
            "spec.domain has EFI SecureBoot enabled. SecureBoot requires SMM, which is currently disabled.",
        ),
    ]);
}

#[test]
fn volume_credential_dns_and_metadata_rules_report_upstream_messages_and_fields() {
    check_cases(vec![
        // 21. volumes
        (
            json!({"spec": {"volumes": [{"name": "root", "containerDisk": {"image": "x"}}, {"name": "root", "containerDisk": {"image": "y"}}]}}),
            "spec.volumes[1].name",
            "spec.volumes[1] and spec.volumes[0] must not have the same Name.",
        ),
        (
            json!({"spec": {"volumes": [{"name": "root", "containerDisk": {"image": "x"}, "emptyDisk": {"capacity": "1Gi"}}]}}),
            "spec.volumes[0]",
            "spec.volumes[0] must have exactly one source type set",
        ),
        (
            json!({"spec": {"volumes": [{"name": "root", "cloudInitNoCloud": {}}]}}),
            "spec.volumes[0].cloudInitNoCloud",
            "spec.volumes[0].cloudInitNoCloud must have at least one userdatasource or one networkdatasource set.",
        ),
        // 22. volumes need disks
        (
            json!({"spec": {"domain": {"devices": {"disks": []}}}}),
            "spec.domain.volumes[0].name",
            "spec.domain.volumes[0].name 'root' not found.",
        ),
        // 23. access credentials
        (
            json!({"spec": {"accessCredentials": [{"sshPublicKey": {"source": {"secret": {"secretName": "k"}}, "propagationMethod": {"noCloud": {}}}}]}}),
            "spec.accessCredentials[0].sshPublicKey.propagationMethod",
            "spec.accessCredentials[0] requires a noCloud volume to exist when the noCloud propagationMethod is in use.",
        ),
        // 24. DNS
        (
            json!({"spec": {"dnsPolicy": "None"}}),
            "spec.dnsConfig",
            "must provide `dnsConfig` when `dnsPolicy` is None",
        ),
        // 25. eviction strategy
        (
            json!({"spec": {"evictionStrategy": "Sometimes"}}),
            "spec.evictionStrategy",
            "spec.evictionStrategy is set with an unrecognized option: Sometimes",
        ),
        // 26. devices
        (
            json!({"spec": {"domain": {"devices": {"sound": {"name": "s", "model": "sb16"}}}}}),
            "spec.Sound",
            "Sound device type is not supported. Options: 'ich9' or 'ac97'",
        ),
        (
            json!({"spec": {"domain": {"devices": {"autoattachVSOCK": true}}}}),
            "spec.domain.devices.autoattachVSOCK",
            "VSOCK feature gate is not enabled in kubevirt-config",
        ),
        (
            json!({"spec": {"domain": {"firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0"}}}}}),
            "spec.domain.firmware.kernelBoot.kernelArgs",
            "kernel arguments cannot be provided without an external kernel",
        ),
        // 27. mandatory memory
        (
            json!({"spec": {"domain": {"resources": null}}}),
            "",
            "no memory requested, at least one of 'spec.domain.memory.guest', 'spec.domain.memory.hugepages.pageSize' or 'spec.domain.resources.requests.memory' must be set",
        ),
        // 28. reserved labels
        (
            json!({"metadata": {"labels": {"kubevirt.io/nodeName": "n1"}}}),
            "metadata.labels",
            "creation of the following reserved kubevirt.io/ labels on a VMI object is prohibited",
        ),
        // 29. utility volumes and architecture
        (
            json!({"spec": {"utilityVolumes": [{"name": "u", "claimName": "c"}]}}),
            "spec.utilityVolumes",
            "cannot create VMI with utility volumes in spec, utility volumes can only be added via hotplug",
        ),
        (
            json!({"spec": {"architecture": "riscv64"}}),
            "spec.architecture",
            "unsupported architecture: riscv64",
        ),
    ]);
}

#[test]
fn memory_is_compared_by_exact_value_whatever_the_spelling() {
    // 1.5Gi is 1536Mi: neither greater than the limit nor off the 2Mi page size.
    let patch = json!({"spec": {"domain": {
        "memory": {"hugepages": {"pageSize": "2Mi"}},
        "resources": {"requests": {"memory": "1.5Gi"}, "limits": {"memory": "1536Mi"}}}}});
    assert_eq!(vmi_causes(&patch), vec![]);
    let patch = json!({"spec": {"domain": {
        "resources": {"requests": {"memory": "1.1G"}, "limits": {"memory": "1100M"}}}}});
    assert_eq!(vmi_causes(&patch), vec![]);
}

#[test]
fn a_malformed_quantity_gets_kubernetes_format_message() {
    let patch = json!({"spec": {"domain": {"resources": {"requests": {"memory": "1Zi"}}}}});
    assert_cause(
        &vmi_causes(&patch),
        "spec.domain.resources.requests.memory",
        "spec.domain.resources.requests.memory: Invalid value: \"1Zi\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
    );
}

#[test]
fn guest_memory_above_the_limit_is_refused_with_the_stage_rollout() {
    let cfg = ClusterConfig {
        vm_rollout_strategy: "Stage".into(),
        ..ClusterConfig::default()
    };
    let patch = json!({"spec": {"domain": {"memory": {"guest": "2Gi"}, "resources": {"limits": {"memory": "1Gi"}}}}});
    assert_cause(
        &vmi_causes_with(&patch, &cfg),
        "spec.domain.memory.guest",
        "spec.domain.memory.guest '2Gi' must be equal to or less than the memory limit spec.domain.resources.limits.memory '1Gi'",
    );
}

#[test]
fn an_enabled_feature_gate_lets_the_gated_volume_through() {
    let mut cfg = ClusterConfig::default();
    cfg.feature_gates.insert("HostDisk".into());
    let patch = json!({"spec": {"volumes": [{"name": "root", "hostDisk": {"path": "/d", "type": "Disk"}}]}});
    assert_eq!(vmi_causes_with(&patch, &cfg), vec![]);
}

#[test]
fn the_passt_binding_is_beta_on_the_pod_network_only() {
    let passt = |network: Value| {
        json!({"spec": {"networks": [network],
            "domain": {"devices": {"interfaces": [{"name": "n", "passtBinding": {}}]}}}})
    };
    let on_pod = passt(json!({"name": "n", "pod": {}}));
    assert_eq!(vmi_causes(&on_pod), vec![], "Beta: on by default");
    let mut cfg = ClusterConfig::default();
    cfg.disabled_feature_gates.insert("PasstBinding".into());
    assert_cause(
        &vmi_causes_with(&on_pod, &cfg),
        "spec.domain.devices.interfaces[0].name",
        "PasstBinding feature gate is not enabled",
    );
    let on_multus = passt(json!({"name": "n", "multus": {"networkName": "other"}}));
    assert_cause(
        &vmi_causes(&on_multus),
        "spec.domain.devices.interfaces[0].name",
        "PasstBinding interface only implemented with pod network",
    );
}

#[test]
fn kubevirt_service_accounts_may_set_reserved_labels() {
    let mut doc = base_vmi();
    merge(
        &mut doc,
        &json!({"metadata": {"labels": {"kubevirt.io/nodeName": "n1"}}}),
    );
    let vmi: VirtualMachineInstance = serde_json::from_value(doc).unwrap();
    assert!(validate_vmi_create(&vmi, &ClusterConfig::default(), true).is_empty());
}

fn vm(patch: &Value) -> VirtualMachine {
    let mut doc = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "vm", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": base_vmi()["spec"].clone()}}
    });
    merge(&mut doc, patch);
    serde_json::from_value(doc).unwrap()
}

#[test]
fn vm_rules_cover_run_strategy_template_and_template_spec() {
    let cfg = ClusterConfig::default();
    assert_eq!(validate_vm(&vm(&json!({})), &cfg), vec![]);
    assert_cause(
        &validate_vm(&vm(&json!({"spec": {"running": true}})), &cfg),
        "spec.running",
        "Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead",
    );
    assert_cause(
        &validate_vm(&vm(&json!({"spec": {"runStrategy": null}})), &cfg),
        "spec.running",
        "RunStrategy must be specified",
    );
    assert_cause(
        &validate_vm(&vm(&json!({"spec": {"runStrategy": "Sometimes"}})), &cfg),
        "spec.runStrategy",
        "Invalid RunStrategy (Sometimes)",
    );
    assert_cause(
        &validate_vm(
            &vm(&json!({"spec": {"runStrategy": "WaitAsReceiver"}})),
            &cfg,
        ),
        "spec.runStrategy",
        "Invalid RunStrategy (WaitAsReceiver), DecentralizedLiveMigration feature gate is not enabled in kubevirt resource",
    );
    assert_cause(
        &validate_vm(&vm(&json!({"spec": {"template": {"spec": null}}})), &cfg),
        "spec.template",
        "missing virtual machine template.",
    );
    assert_cause(
        &validate_vm(
            &vm(&json!({"spec": {"template": {"spec": {"hostname": "-x"}}}})),
            &cfg,
        ),
        "spec.template.spec.hostname",
        "spec.template.spec.hostname does not conform to the kubernetes DNS_LABEL rules : a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
    );
}

#[test]
fn vm_template_is_validated_after_defaults_so_volumes_without_disks_pass() {
    let v = vm(&json!({"spec": {"template": {"spec": {"domain": {"devices": {"disks": []}}}}}}));
    assert_eq!(validate_vm(&v, &ClusterConfig::default()), vec![]);
}

#[test]
fn vm_volume_requests_need_exactly_one_operation() {
    let v = vm(
        &json!({"status": {"volumeRequests": [{}, {"addVolumeOptions": {"name": "a"}, "removeVolumeOptions": {"name": "a"}}]}}),
    );
    let causes = validate_vm(&v, &ClusterConfig::default());
    assert_cause(
        &causes,
        "Status.volumeRequests",
        "VolumeRequests require one of either addVolumeOptions or removeVolumeOptions to be set",
    );
    assert_cause(
        &causes,
        "Status.volumeRequests",
        "VolumeRequests require either addVolumeOptions or removeVolumeOptions to be set, not both",
    );
}

fn vmi_from(patch: &Value) -> VirtualMachineInstance {
    let mut doc = base_vmi();
    merge(&mut doc, patch);
    serde_json::from_value(doc).unwrap()
}

#[test]
fn users_may_not_change_a_vmi_spec_or_reserved_labels() {
    let old = vmi_from(&json!({}));
    let new = vmi_from(&json!({"spec": {"hostname": "other"}}));
    assert_cause(
        &validate_vmi_update(&old, &new, false),
        "",
        "update of VMI object is restricted",
    );
    let labelled = vmi_from(&json!({"metadata": {"labels": {"kubevirt.io/nodeName": "n2"}}}));
    assert_cause(
        &validate_vmi_update(&old, &labelled, false),
        "",
        "modification of the following reserved kubevirt.io/ labels on a VMI object is prohibited",
    );
    let plain_label = vmi_from(&json!({"metadata": {"labels": {"app": "x"}}}));
    assert!(validate_vmi_update(&old, &plain_label, false).is_empty());
}

#[test]
fn kubevirt_service_accounts_may_not_change_max_sockets_or_permanent_volumes() {
    let old = vmi_from(&json!({"spec": {"domain": {"cpu": {"sockets": 1, "maxSockets": 4}}}}));
    let new = vmi_from(&json!({"spec": {"domain": {"cpu": {"sockets": 1, "maxSockets": 8}}}}));
    assert_cause(
        &validate_vmi_update(&old, &new, true),
        "",
        "CPU topology maxSockets changed",
    );
    let sockets = vmi_from(&json!({"spec": {"domain": {"cpu": {"sockets": 2, "maxSockets": 4}}}}));
    assert!(validate_vmi_update(&old, &sockets, true).is_empty());
    let swapped = vmi_from(
        &json!({"spec": {"domain": {"cpu": {"sockets": 1, "maxSockets": 4}}, "volumes": [{"name": "root", "containerDisk": {"image": "other"}}]}}),
    );
    assert_cause(
        &validate_vmi_update(&old, &swapped, true),
        "",
        "permanent volume root, changed",
    );
}

fn migration(patch: &Value) -> VirtualMachineInstanceMigration {
    let mut doc = json!({"metadata": {"name": "m", "namespace": "default", "uid": "u1"}, "spec": {"vmiName": "t"}});
    merge(&mut doc, patch);
    serde_json::from_value(doc).unwrap()
}

#[test]
fn migrations_need_an_existing_unfinished_vmi_without_another_migration() {
    let cfg = ClusterConfig::default();
    let vmi = vmi_from(&json!({"status": {"phase": "Running"}}));
    let ctx = |vmi, others| migration::MigrationContext {
        vmi,
        others,
        user_is_virt_controller: false,
    };
    assert!(validate_migration(&migration(&json!({})), ctx(Some(&vmi), &[]), &cfg).is_empty());
    assert_cause(
        &validate_migration(
            &migration(&json!({"spec": {"vmiName": null}})),
            ctx(Some(&vmi), &[]),
            &cfg,
        ),
        "spec.vmiName",
        "vmiName is missing",
    );
    assert_cause(
        &validate_migration(&migration(&json!({})), ctx(None, &[]), &cfg),
        "",
        "the VMI \"default/t\" does not exist",
    );
    let done = vmi_from(&json!({"status": {"phase": "Succeeded"}}));
    assert_cause(
        &validate_migration(&migration(&json!({})), ctx(Some(&done), &[]), &cfg),
        "",
        "Cannot migrate VMI in finalized state.",
    );
    let other = [migration(&json!({"metadata": {"uid": "u0"}}))];
    assert_cause(
        &validate_migration(&migration(&json!({})), ctx(Some(&vmi), &other), &cfg),
        "",
        "in-flight migration detected. Active migration job (u0) is currently already in progress for VMI t.",
    );
    let unmigratable = vmi_from(
        &json!({"status": {"phase": "Running", "conditions": [{"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable", "message": "no"}]}}),
    );
    assert_cause(
        &validate_migration(&migration(&json!({})), ctx(Some(&unmigratable), &[]), &cfg),
        "",
        "Cannot migrate VMI, Reason: DisksNotLiveMigratable, Message: no",
    );
}

#[test]
fn migration_spec_is_immutable() {
    let old = migration(&json!({}));
    let new = migration(&json!({"spec": {"vmiName": "other"}}));
    assert_cause(
        &validate_migration_update(&old, &new),
        "",
        "update of Migration object's spec is restricted",
    );
}

#[test]
fn replica_set_selector_must_match_the_template_labels() {
    let rs: kubevirt_api::v1::VirtualMachineInstanceReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "rs"},
        "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {"metadata": {"labels": {"app": "b"}}, "spec": base_vmi()["spec"].clone()}}
    }))
    .unwrap();
    assert_cause(
        &validate_replicaset(&rs, &ClusterConfig::default()),
        "spec.selector",
        "selector does not match labels.",
    );
}

#[test]
fn pool_max_unavailable_must_be_a_valid_percentage() {
    let pool: kubevirt_api::pool::v1beta1::VirtualMachinePool = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "selector": {"matchLabels": {"app": "a"}},
            "maxUnavailable": "150%",
            "virtualMachineTemplate": {"metadata": {"labels": {"app": "a"}}, "spec": {"runStrategy": "Always", "template": {"spec": base_vmi()["spec"].clone()}}}
        }
    }))
    .unwrap();
    assert_cause(
        &validate_pool(&pool, None, &ClusterConfig::default()),
        "spec.maxUnavailable",
        "maxUnavailable percentage value 150 must be between 1 and 100",
    );
}
