//! The `LiveMigratable` and `StorageLiveMigratable` conditions, as upstream's
//! `calculateLiveMigrationCondition` and `calculateLiveStorageMigrationCondition`.
//!
//! Checks this handler can make from the VMI alone, in upstream's order: the pod network's
//! interface, host devices and GPUs, SEV/TDX, Hyper-V passthrough, then (for
//! `LiveMigratable` only) the volumes ([`volume_check`]: unshared claims and host disks).
//!
//! # Caveats
//! - Network binding plugins are not read from the cluster configuration, so a plugin
//!   binding counts as not migratable; a single GPU counts as the `VGPULiveMigration`
//!   feature gate being off.
//! - The CPU host-model and TSC-frequency checks are not made (the handler has no node
//!   labels here).

use kubevirt_api::v1::VirtualMachineInstance;
use serde_json::{Value, json};

/// Upstream `AllowPodBridgeNetworkLiveMigrationAnnotation`.
const ALLOW_POD_BRIDGE_MIGRATION: &str = "kubevirt.io/allow-pod-bridge-network-live-migration";

/// Upstream's `VerifyVMIMigratable`: `Err(message)` when the pod network's interface
/// cannot be migrated.
fn network_blocker(vmi: &VirtualMachineInstance) -> Result<(), String> {
    let ifaces = &vmi.spec.domain.devices.interfaces;
    if ifaces.is_empty() {
        return Ok(());
    }
    let Some(pod) = vmi
        .spec
        .networks
        .iter()
        .find(|n| n.network_source.pod.is_some())
    else {
        return Ok(());
    };
    let Some(primary) = ifaces.iter().find(|i| i.name == pod.name) else {
        return Err(format!(
            "no primary interface found for network {}",
            pod.name
        ));
    };
    let method = &primary.binding_method;
    let allowed_bridge = method.bridge.is_some()
        && vmi
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ALLOW_POD_BRIDGE_MIGRATION));
    if method.masquerade.is_some() || method.passt_binding.is_some() || allowed_bridge {
        return Ok(());
    }
    Err("cannot migrate VMI which does not use masquerade or a migratable plugin to connect to the pod network".into())
}

/// Upstream's `vmiContainsNonMigratablePCIHostDevices`.
fn host_device_blocker(vmi: &VirtualMachineInstance) -> Option<&'static str> {
    let devices = &vmi.spec.domain.devices;
    if !devices.host_devices.is_empty() {
        return Some("VMI specifies non-migratable generic PCI host device");
    }
    match devices.gpus.len() {
        0 => None,
        1 => Some("VMI specifies a GPU but feature gate VGPULiveMigration is not enabled"),
        _ => Some("VMI specifies too many GPUs"),
    }
}

/// `(reason, message)` of every check that fails, in upstream's order, disks excluded.
fn blockers(vmi: &VirtualMachineInstance) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Err(message) = network_blocker(vmi) {
        out.push(("InterfaceNotLiveMigratable", message));
    }
    if let Some(message) = host_device_blocker(vmi) {
        out.push(("HostDeviceNotLiveMigratable", message.to_owned()));
    }
    let security = vmi.spec.domain.launch_security.as_ref();
    if security.is_some_and(|s| s.sev.is_some()) {
        out.push(("SEVNotLiveMigratable", "VMI uses SEV".to_owned()));
    } else if security.is_some_and(|s| s.tdx.is_some()) {
        out.push(("TDXNotLiveMigratable", "VMI uses TDX".to_owned()));
    }
    let tsc = kubevirt_api::tsc::tsc_requirement(vmi);
    if tsc == kubevirt_api::tsc::TscRequirement::RequiredForMigration
        && kubevirt_api::tsc::hinted_frequency(vmi).is_none()
    {
        out.push(("NoTSCFrequencyNotLiveMigratable", tsc.reason().to_owned()));
    }
    let passthrough = vmi
        .spec
        .domain
        .features
        .as_ref()
        .and_then(|f| f.hyperv_passthrough.as_ref())
        .is_some_and(|h| h.enabled == Some(true));
    if passthrough {
        out.push((
            "HypervPassthroughNotLiveMigratable",
            "VMI uses hyperv passthrough".to_owned(),
        ));
    }
    out
}

fn cond(type_: &str, blocker: Option<(&str, String)>) -> Value {
    match blocker {
        None => json!({"type": type_, "status": "True"}),
        Some((reason, message)) => {
            json!({"type": type_, "status": "False", "reason": reason, "message": message})
        }
    }
}

/// The `LiveMigratable` condition: the first failing check, as upstream (no timestamps, as
/// upstream's condition carries none).
pub fn live_migratable(vmi: &VirtualMachineInstance) -> Value {
    let (_, disks) = volume_check(vmi);
    let first = blockers(vmi)
        .into_iter()
        .next()
        .or_else(|| disks.map(|message| ("DisksNotLiveMigratable", message)));
    cond("LiveMigratable", first)
}

/// Upstream's `checkVolumesForMigration`: whether a migration must copy local disks (block
/// migration), and why the volumes cannot migrate at all, if they cannot. Claims must be
/// shared (`ReadWriteMany`, read from the claim info the VMI controller writes into
/// `status.volumeStatus`; the local provisioner's node-local claims are not), a `hostDisk` must
/// be `shared`; virtiofs filesystems and read-only CD-ROMs need nothing; every other volume
/// (containerDisk, emptyDisk, cloud-init, ephemeral …) is copied by a block migration.
pub fn volume_check(vmi: &VirtualMachineInstance) -> (bool, Option<String>) {
    let (local, error) = volumes_to_copy(vmi);
    (!local.is_empty(), error)
}

/// The volumes a block migration copies (see [`volume_check`]) and why the VMI's volumes
/// cannot migrate, if they cannot.
pub fn volumes_to_copy(vmi: &VirtualMachineInstance) -> (Vec<String>, Option<String>) {
    let not_shared = |claim: &str| {
        format!(
            "cannot migrate VMI: PVC {claim} is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
        )
    };
    let status_of = |name: &str| {
        vmi.status
            .as_ref()?
            .volume_status
            .iter()
            .find(|v| v.name == name)?
            .persistent_volume_claim_info
            .as_ref()
    };
    let shared = |info: &kubevirt_api::v1::PersistentVolumeClaimInfo| {
        info.access_modes.iter().any(|m| m == "ReadWriteMany")
    };
    let devices = &vmi.spec.domain.devices;
    let mut local = Vec::new();
    for volume in &vmi.spec.volumes {
        let source = &volume.volume_source;
        if let Some(claim) = source.claim_name() {
            match status_of(&volume.name) {
                None => {
                    return (
                        local,
                        Some(format!(
                            "cannot migrate VMI: Unable to determine if PVC {claim} is shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
                        )),
                    );
                }
                Some(info) if !shared(info) => return (local, Some(not_shared(claim))),
                Some(_) => {}
            }
        } else if let Some(host_disk) = &source.host_disk {
            if let Some(info) = status_of(&volume.name) {
                if !shared(info) {
                    let claim = info.claim_name.as_deref().unwrap_or_default();
                    return (local, Some(not_shared(claim)));
                }
                continue;
            }
            if host_disk.shared != Some(true) {
                return (
                    local,
                    Some("cannot migrate VMI with non-shared HostDisk".to_owned()),
                );
            }
        } else {
            let virtiofs = devices.filesystems.iter().any(|f| f.name == volume.name);
            let read_only_cdrom = devices.disks.iter().any(|d| {
                d.name == volume.name && d.cdrom.as_ref().is_some_and(|c| c.readonly != Some(false))
            });
            if !virtiofs && !read_only_cdrom {
                local.push(volume.name.clone());
            }
        }
    }
    (local, None)
}

/// `status.migrationMethod`: `BlockMigration` when local disks must be copied, else
/// `LiveMigration`.
pub fn migration_method(vmi: &VirtualMachineInstance) -> &'static str {
    if volume_check(vmi).0 {
        "BlockMigration"
    } else {
        "LiveMigration"
    }
}

pub fn storage_live_migratable(vmi: &VirtualMachineInstance) -> Value {
    let all = blockers(vmi);
    let joined = (!all.is_empty()).then(|| {
        let message = all
            .iter()
            .map(|(r, m)| format!("{r}: {m}"))
            .collect::<Vec<_>>()
            .join(", ");
        ("NotMigratable", message)
    });
    cond("StorageLiveMigratable", joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(spec: &Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "metadata": {"name": "demo", "namespace": "default"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn pod_vmi(interface: &Value) -> VirtualMachineInstance {
        vmi(&json!({
            "domain": {"devices": {"interfaces": [interface]}},
            "networks": [{"name": "default", "pod": {}}]
        }))
    }

    #[test]
    fn unshared_claims_block_migration_and_local_disks_need_a_block_migration() {
        let with = |access: &str| {
            let mut v = vmi(&json!({
                "domain": {"devices": {"disks": [{"name": "root", "disk": {}}]}},
                "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "data"}}]
            }));
            v.status = Some(
                serde_json::from_value(json!({"volumeStatus": [{"name": "root", "target": "",
                "persistentVolumeClaimInfo": {"claimName": "data", "accessModes": [access]}}]}))
                .unwrap(),
            );
            v
        };
        let local = live_migratable(&with("ReadWriteOnce"));
        assert_eq!(local["reason"], "DisksNotLiveMigratable");
        assert_eq!(
            local["message"],
            "cannot migrate VMI: PVC data is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
        );
        assert_eq!(live_migratable(&with("ReadWriteMany"))["status"], "True");
        assert_eq!(migration_method(&with("ReadWriteMany")), "LiveMigration");
        let container_disk = vmi(&json!({
            "domain": {"devices": {"disks": [{"name": "root", "disk": {}}]}},
            "volumes": [{"name": "root", "containerDisk": {"image": "i"}}]
        }));
        assert_eq!(live_migratable(&container_disk)["status"], "True");
        assert_eq!(migration_method(&container_disk), "BlockMigration");
        assert_eq!(
            migration_method(&vmi(&json!({"domain": {"devices": {}}}))),
            "LiveMigration"
        );
    }

    #[test]
    fn a_migratable_vmi_gets_true_conditions_without_reason_message_or_times() {
        let v = pod_vmi(&json!({"name": "default", "masquerade": {}}));
        assert_eq!(
            live_migratable(&v),
            json!({"type": "LiveMigratable", "status": "True"})
        );
        assert_eq!(
            storage_live_migratable(&v),
            json!({"type": "StorageLiveMigratable", "status": "True"})
        );
    }

    #[test]
    fn the_pod_network_needs_its_interface_and_a_bridge_needs_the_allow_annotation() {
        let missing = pod_vmi(&json!({"name": "other", "masquerade": {}}));
        assert_eq!(
            live_migratable(&missing)["message"],
            "no primary interface found for network default"
        );
        let mut bridge = pod_vmi(&json!({"name": "default", "bridge": {}}));
        assert_eq!(
            live_migratable(&bridge)["reason"],
            "InterfaceNotLiveMigratable"
        );
        bridge.metadata.annotations = Some(
            [(ALLOW_POD_BRIDGE_MIGRATION.to_owned(), String::new())]
                .into_iter()
                .collect(),
        );
        assert_eq!(live_migratable(&bridge)["status"], "True");
    }

    #[test]
    fn live_migratable_reports_the_first_blocker_and_storage_all_but_disks() {
        let v = vmi(&json!({
            "domain": {
                "devices": {
                    "interfaces": [{"name": "default", "bridge": {}}],
                    "hostDevices": [{"name": "h", "deviceName": "example.com/dev"}]
                },
                "launchSecurity": {"sev": {}}
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [{"name": "hd", "hostDisk": {"path": "/d.img", "type": "Disk"}}]
        }));
        let live = live_migratable(&v);
        assert_eq!(live["status"], "False");
        assert_eq!(live["reason"], "InterfaceNotLiveMigratable");
        let storage = storage_live_migratable(&v);
        assert_eq!(storage["reason"], "NotMigratable");
        assert_eq!(
            storage["message"],
            "InterfaceNotLiveMigratable: cannot migrate VMI which does not use masquerade or a \
             migratable plugin to connect to the pod network, HostDeviceNotLiveMigratable: VMI \
             specifies non-migratable generic PCI host device, SEVNotLiveMigratable: VMI uses SEV"
        );
        let disk_only = vmi(&json!({
            "domain": {"devices": {}},
            "volumes": [{"name": "hd", "hostDisk": {"path": "/d.img", "type": "Disk"}}]
        }));
        assert_eq!(
            live_migratable(&disk_only),
            json!({"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable",
                   "message": "cannot migrate VMI with non-shared HostDisk"})
        );
        assert_eq!(storage_live_migratable(&disk_only)["status"], "True");
    }

    #[test]
    fn reenlightenment_without_a_hinted_tsc_frequency_cannot_migrate() {
        let spec = json!({"domain": {"devices": {}, "features": {"hyperv": {"reenlightenment": {"enabled": true}}}}});
        let cond = live_migratable(&vmi(&spec));
        assert_eq!(cond["reason"], "NoTSCFrequencyNotLiveMigratable");
        assert_eq!(
            cond["message"],
            "HyperV Reenlightenment VMIs cannot migrate when TSC Frequency is not exposed on the cluster: guest timers might be inconsistent"
        );
        let mut hinted = vmi(&spec);
        hinted.status.get_or_insert_default().topology_hints =
            Some(kubevirt_api::v1::TopologyHints {
                tsc_frequency: Some(2_000_000_000),
            });
        assert_eq!(live_migratable(&hinted)["status"], "True");
    }

    #[test]
    fn gpus_block_migration_as_upstream_with_the_vgpu_gate_off() {
        let gpus = |n: usize| {
            let list: Vec<Value> = (0..n)
                .map(|i| json!({"name": format!("g{i}"), "deviceName": "nvidia.com/x"}))
                .collect();
            vmi(&json!({"domain": {"devices": {"gpus": list}}}))
        };
        assert_eq!(
            live_migratable(&gpus(1))["message"],
            "VMI specifies a GPU but feature gate VGPULiveMigration is not enabled"
        );
        assert_eq!(
            live_migratable(&gpus(2))["message"],
            "VMI specifies too many GPUs"
        );
    }
}
