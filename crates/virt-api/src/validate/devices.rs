//! Device rules: disks (`storage/admitters/disks.go`), disk ↔ volume mapping and boot order,
//! inputs, and the feature-gated devices (host devices, GPUs, sound, VSOCK, video, panic).

use std::collections::{BTreeMap, BTreeSet};

use kubevirt_api::v1::{Disk, DiskBus, VirtualMachineInstanceSpec, Volume};

use super::{Cause, FieldPath, reason};
use crate::config::{ClusterConfig, gates};

const MAX_SERIAL_LEN: usize = 256;
const MIN_BLOCK_SIZE: u32 = 512;
const MAX_BLOCK_SIZE: u32 = 2_097_152;

fn disk_target(disk: &Disk) -> Option<(&'static str, Option<&DiskBus>)> {
    if let Some(d) = &disk.disk {
        Some(("disk", d.bus.as_ref()))
    } else if let Some(l) = &disk.lun {
        Some(("lun", l.bus.as_ref()))
    } else {
        disk.cdrom.as_ref().map(|c| ("cdrom", c.bus.as_ref()))
    }
}

/// Whether `text` is a PCI address `dddd:bb:ss.f`.
pub(crate) fn is_pci_address(text: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    let Some((domain, rest)) = text.split_once(':') else {
        return false;
    };
    let Some((bus, rest)) = rest.split_once(':') else {
        return false;
    };
    let Some((slot, func)) = rest.split_once('.') else {
        return false;
    };
    hex(domain, 4)
        && hex(bus, 2)
        && hex(slot, 2)
        && func.len() == 1
        && func.chars().all(|c| ('0'..='7').contains(&c))
}

/// Disk rules of `ValidateDisks`; `field` is `<spec>.domain.devices.disks`.
pub fn validate_disks(field: &FieldPath, disks: &[Disk], c: &mut Vec<Cause>) {
    for (idx, disk) in disks.iter().enumerate() {
        let at = field.index(idx);
        if let Some(other) = disks[..idx].iter().position(|d| d.name == disk.name) {
            c.push(Cause::invalid(
                format!(
                    "{at} and {} must not have the same Name.",
                    field.index(other)
                ),
                at.child("name"),
            ));
        }
        if disk.kinds().len() > 1 {
            c.push(Cause::invalid(
                format!("{at} can only have a single target type defined"),
                &at,
            ));
        }
        if let Some(pci) = disk
            .disk
            .as_ref()
            .and_then(|d| d.pci_address.as_deref())
            .filter(|p| !p.is_empty())
        {
            let base = field
                .children(&["domain", "devices", "disks", "disk"])
                .index(idx);
            if disk.disk.as_ref().and_then(|d| d.bus.as_ref()) != Some(&DiskBus::Virtio) {
                c.push(Cause::invalid(
                    format!(
                        "disk {} - setting a PCI address is only possible with bus type virtio.",
                        base.child("name")
                    ),
                    base.child("pciAddress"),
                ));
            }
            if !is_pci_address(pci) {
                c.push(Cause::invalid(
                    format!(
                        "disk {} has malformed PCI address ({pci}).",
                        base.child("name")
                    ),
                    base.child("pciAddress"),
                ));
            }
        }
        if disk.boot_order == Some(0) {
            c.push(Cause::invalid(
                format!("{at} must have a boot order > 0, if supplied"),
                at.child("bootOrder"),
            ));
        }
        validate_bus(field, idx, disk, c);
        validate_disk_fields(field, idx, disk, c);
        validate_block_size(&at, disk, c);
    }
}

fn validate_disk_fields(field: &FieldPath, idx: usize, disk: &Disk, c: &mut Vec<Cause>) {
    let at = field.index(idx);
    if let Some(serial) = disk.serial.as_deref().filter(|s| !s.is_empty()) {
        if !serial
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "_.+-".contains(ch))
        {
            c.push(Cause::invalid(
                format!(
                    "{at} must be made up of the following characters [A-Za-z0-9_.+-], if specified"
                ),
                at.child("serial"),
            ));
        }
        if serial.chars().count() > MAX_SERIAL_LEN {
            c.push(Cause::invalid(
                format!(
                    "{at} must be less than or equal to {MAX_SERIAL_LEN} in length, if specified"
                ),
                at.child("serial"),
            ));
        }
    }
    if let Some(cache) = disk
        .cache
        .as_ref()
        .filter(|v| !v.is_known() && !v.as_str().is_empty())
    {
        c.push(Cause::invalid(
            format!("{} has invalid value {}", at.child("cache"), cache.as_str()),
            at.child("cache"),
        ));
    }
    if disk
        .io
        .as_ref()
        .is_some_and(|v| !v.is_known() && !v.as_str().is_empty())
    {
        c.push(Cause::invalid(
            format!(
                "Disk IO mode for {field} is not supported. Supported modes are: native, threads."
            ),
            field
                .children(&["domain", "devices", "disks"])
                .index(idx)
                .child("io"),
        ));
    }
    if let Some(p) = disk.error_policy.as_ref().filter(|v| !v.is_known()) {
        c.push(Cause::invalid(
            format!(
                "{} has invalid value \"{}\"",
                at.child("errorPolicy"),
                p.as_str()
            ),
            at.child("errorPolicy"),
        ));
    }
    for msg in super::misc::dns1123_label_errors(&disk.name) {
        c.push(Cause::invalid(
            msg,
            field
                .children(&["domain", "devices", "disks"])
                .index(idx)
                .child("name"),
        ));
    }
}

fn validate_bus(field: &FieldPath, idx: usize, disk: &Disk, c: &mut Vec<Cause>) {
    let Some((kind, Some(bus))) = disk_target(disk) else {
        return;
    };
    let at = field.index(idx);
    match bus {
        DiskBus::Other(b) if b == "ide" => c.push(Cause::invalid(
            "IDE bus is not supported",
            at.children(&[kind, "bus"]),
        )),
        DiskBus::Other(b) if b.is_empty() => {}
        DiskBus::Virtio if kind == "cdrom" => {
            c.push(Cause::invalid(
                "Bus type virtio is invalid for CD-ROM device",
                at.children(&["cdrom", "bus"]),
            ));
        }
        DiskBus::Sata if disk.disk.as_ref().is_some_and(|d| d.readonly == Some(true)) => {
            c.push(Cause::invalid(
                "sata hard-disks do not support read-only.",
                at.children(&["disk", "bus"]),
            ));
        }
        DiskBus::Other(b) => c.push(Cause::invalid(
            format!(
                "{at} is set with an unrecognized bus {b}, must be one of: [virtio scsi sata usb]"
            ),
            at.children(&[kind, "bus"]),
        )),
        _ => {}
    }
    if disk.dedicated_io_thread == Some(true) && *bus != DiskBus::Virtio {
        c.push(Cause::invalid(
            format!(
                "IOThreads are not supported for disks on a {} bus",
                bus.as_str()
            ),
            field.children(&["domain", "devices", "disks"]).index(idx),
        ));
    }
}

fn validate_block_size(at: &FieldPath, disk: &Disk, c: &mut Vec<Cause>) {
    let Some(bs) = &disk.block_size else { return };
    let Some(custom) = &bs.custom else { return };
    if bs
        .match_volume
        .as_ref()
        .is_some_and(|m| m.enabled != Some(false))
    {
        c.push(Cause::invalid(
            "Block size matching can't be enabled together with a custom value",
            at.child("blockSize"),
        ));
        return;
    }
    let (logical, physical) = (custom.logical.unwrap_or(0), custom.physical.unwrap_or(0));
    let base = at.children(&["blockSize", "custom"]);
    let sata = disk_target(disk).and_then(|(_, b)| b) == Some(&DiskBus::Sata);
    if logical > physical {
        c.push(Cause::invalid(
            format!("Logical size {logical} must be the same or less than the physical size of {physical}"),
            base.child("logical"),
        ));
    } else if sata && logical != MIN_BLOCK_SIZE {
        c.push(Cause::invalid(
            format!("Logical size {logical} must be {MIN_BLOCK_SIZE} for SATA devices"),
            base.child("logical"),
        ));
    } else if let Some(g) = custom
        .discard_granularity
        .filter(|g| logical != 0 && g % logical != 0)
    {
        c.push(Cause::invalid(
            format!("Discard granularity {g} must be multiples of logical size {logical}"),
            base.child("discardGranularity"),
        ));
    } else {
        for (name, size) in [("logical", logical), ("physical", physical)] {
            let msg = if size < MIN_BLOCK_SIZE {
                format!(
                    "Provided size of {size} is less than the supported minimum size of {MIN_BLOCK_SIZE}"
                )
            } else if size > MAX_BLOCK_SIZE {
                format!(
                    "Provided size of {size} is greater than the supported maximum size of {MAX_BLOCK_SIZE}"
                )
            } else if !size.is_power_of_two() {
                format!("Provided size of {size} is not a power of 2")
            } else {
                continue;
            };
            c.push(Cause::invalid(msg, base.child(name)));
        }
    }
}

/// Disk ↔ volume mapping (LUN and downwardMetrics constraints) and unique boot orders across
/// disks and interfaces.
pub fn validate_boot_order(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let volumes: BTreeMap<&str, &Volume> =
        spec.volumes.iter().map(|v| (v.name.as_str(), v)).collect();
    let disks_f = field.children(&["domain", "devices", "disks"]);
    let mut orders = BTreeSet::new();
    for (idx, disk) in spec.domain.devices.disks.iter().enumerate() {
        let at = disks_f.index(idx);
        let volume = volumes.get(disk.name.as_str());
        match volume {
            None if disk.cdrom.is_none() => {
                c.push(Cause::invalid(
                    format!("{} '{}' not found.", at.child("Name"), disk.name),
                    at.child("name"),
                ));
            }
            None if !cfg.gate(gates::DECLARATIVE_HOTPLUG_VOLUMES) => c.push(Cause::invalid(
                format!(
                    "{} feature gate not enabled, cannot define an empty CD-ROM disk",
                    gates::DECLARATIVE_HOTPLUG_VOLUMES
                ),
                at.child("name"),
            )),
            _ => {}
        }
        if let Some(v) = volume {
            let src = &v.volume_source;
            if disk.lun.is_some()
                && src.persistent_volume_claim.is_none()
                && src.data_volume.is_none()
            {
                c.push(Cause::invalid(
                    format!(
                        "{} can only be mapped to a DataVolume or PersistentVolumeClaim volume.",
                        at.child("lun")
                    ),
                    at.child("lun"),
                ));
            }
            if src.downward_metrics.is_some() {
                match &disk.disk {
                    None => c.push(Cause::required(
                        format!("DownwardMetrics volume must be mapped to a disk, but disk is not set on {}.", at.child("disk")),
                        at.child("disk"),
                    )),
                    Some(d) => {
                        if let Some(bus) = d.bus.as_ref().filter(|b| **b != DiskBus::Virtio && !b.as_str().is_empty()) {
                            c.push(Cause::invalid(
                                format!(
                                    "DownwardMetrics volume must be mapped to virtio bus, but {} is set to {}",
                                    at.children(&["disk", "bus"]),
                                    bus.as_str()
                                ),
                                at.children(&["disk", "bus"]),
                            ));
                        }
                    }
                }
            }
        }
        if let Some(order) = disk.boot_order
            && !orders.insert(order)
        {
            c.push(Cause::invalid(
                format!(
                    "Boot order for {} already set for a different device.",
                    at.child("bootOrder")
                ),
                at.child("bootOrder"),
            ));
        }
    }
    let ifaces_f = field.children(&["domain", "devices", "interfaces"]);
    for (idx, iface) in spec.domain.devices.interfaces.iter().enumerate() {
        let Some(order) = iface.boot_order else {
            continue;
        };
        let at = ifaces_f.index(idx);
        if order < 1 {
            c.push(Cause::invalid(
                format!(
                    "{} must have a boot order > 0, if supplied",
                    field.index(idx)
                ),
                field.index(idx).child("bootOrder"),
            ));
        } else if !orders.insert(order) {
            c.push(Cause::invalid(
                format!(
                    "Boot order for {} already set for a different device.",
                    at.child("bootOrder")
                ),
                at.child("bootOrder"),
            ));
        }
    }
}

/// Input devices: bus `usb`/`virtio`, type `tablet`.
pub fn validate_inputs(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let base = field.children(&["domain", "devices", "inputs"]);
    for (idx, input) in spec.domain.devices.inputs.iter().enumerate() {
        if !matches!(input.bus.as_deref(), None | Some("" | "usb" | "virtio")) {
            c.push(Cause::invalid(
                "Input device can have only virtio or usb bus.",
                base.index(idx).child("bus"),
            ));
        }
        if !matches!(input.type_.as_deref(), None | Some("" | "tablet")) {
            c.push(Cause::invalid(
                "Input device can have only tablet type.",
                base.index(idx).child("type"),
            ));
        }
    }
}

/// Devices that need a feature gate or have a closed set of models.
pub fn validate_feature_gated_devices(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let dev = &spec.domain.devices;
    let ramfbs = dev
        .gpus
        .iter()
        .filter(|g| {
            g.virtual_gpu_options
                .as_ref()
                .and_then(|o| o.display.as_ref())
                .is_some_and(|d| {
                    d.enabled != Some(false)
                        && d.ram_fb.as_ref().is_none_or(|r| r.enabled != Some(false))
                })
        })
        .count();
    if ramfbs > 1 {
        c.push(Cause::invalid(
            "configuring multiple displays with ramfb is not valid ",
            field.child("GPUs"),
        ));
    }
    if !dev.host_devices.is_empty() && !cfg.gate(gates::HOST_DEVICES) {
        c.push(Cause::invalid(
            "Host Devices feature gate is not enabled in kubevirt-config",
            field.child("HostDevices"),
        ));
    }
    if let Some(sound) = &dev.sound {
        if !matches!(sound.model.as_deref(), None | Some("" | "ich9" | "ac97")) {
            c.push(Cause::invalid(
                "Sound device type is not supported. Options: 'ich9' or 'ac97'",
                field.child("Sound"),
            ));
        }
        if sound.name.is_empty() {
            c.push(Cause::invalid(
                "Sound device requires a name field.",
                field.child("Sound"),
            ));
        }
    }
    if dev.autoattach_vsock == Some(true) && !cfg.gate(gates::VSOCK) {
        c.push(Cause::invalid(
            format!(
                "{} feature gate is not enabled in kubevirt-config",
                gates::VSOCK
            ),
            field.children(&["domain", "devices", "autoattachVSOCK"]),
        ));
    }
    if dev
        .disks
        .iter()
        .any(|d| d.lun.as_ref().is_some_and(|l| l.reservation == Some(true)))
        && !cfg.gate(gates::PERSISTENT_RESERVATION)
    {
        c.push(Cause::invalid(
            "persistent reservation is not enabled in kubevirt config",
            field.children(&["domain", "devices", "disks", "luns", "reservation"]),
        ));
    }
    if dev.downward_metrics.is_some() && !cfg.gate(gates::DOWNWARD_METRICS) {
        c.push(Cause::invalid(
            "downwardMetrics virtio serial is not allowed: DownwardMetrics feature gate is not enabled",
            field.children(&["domain", "devices", "downwardMetrics"]),
        ));
    }
    let storage: BTreeSet<&str> = spec
        .volumes
        .iter()
        .filter(|v| {
            v.volume_source.persistent_volume_claim.is_some()
                || v.volume_source.data_volume.is_some()
        })
        .map(|v| v.name.as_str())
        .collect();
    if dev
        .filesystems
        .iter()
        .any(|f| storage.contains(f.name.as_str()))
        && !cfg.gate(gates::VIRTIOFS_STORAGE)
    {
        c.push(Cause::invalid(
            "virtiofs is not allowed: virtiofs feature gate is not enabled for PVC",
            field.children(&["domain", "devices", "filesystems"]),
        ));
    }
    validate_other_devices(field, spec, cfg, c);
}

fn validate_other_devices(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let dev = &spec.domain.devices;
    if dev.video.is_some() && dev.autoattach_graphics_device == Some(false) {
        c.push(Cause::invalid(
            "Video configuration is not allowed when autoattachGraphicsDevice is set to false",
            field.child("video"),
        ));
    }
    let panic_f = field.children(&["domain", "devices", "panicDevices"]);
    let arch = spec
        .architecture
        .as_deref()
        .unwrap_or(&cfg.default_architecture);
    if !dev.panic_devices.is_empty() && arch == "s390x" {
        c.push(Cause::invalid(
            format!("custom panic devices are not supported on {arch} architecture"),
            &panic_f,
        ));
    }
    for (idx, p) in dev.panic_devices.iter().enumerate() {
        let model = p.model.as_deref().unwrap_or("");
        if !["hyperv", "isa", "pvpanic"].contains(&model) {
            c.push(Cause::new(
                reason::NOT_SUPPORTED,
                format!("invalid PanicDeviceModel({model})"),
                panic_f.index(idx).child("model"),
            ));
        }
    }
    if spec.domain.reboot_policy.is_some() && !cfg.gate(gates::REBOOT_POLICY) {
        c.push(Cause::invalid(
            format!(
                "RebootPolicy is specified but the {} feature gate is not enabled",
                gates::REBOOT_POLICY
            ),
            field.children(&["domain", "rebootPolicy"]),
        ));
    }
    if spec
        .domain
        .memory
        .as_ref()
        .is_some_and(|m| m.reserved_overhead.is_some())
        && !cfg.gate(gates::RESERVED_OVERHEAD_MEMLOCK)
    {
        c.push(Cause::invalid(
            "Reserved overhead memlock feature gate is not enabled in kubevirt-config",
            field.children(&["domain", "memory", "reservedOverhead"]),
        ));
    }
}
