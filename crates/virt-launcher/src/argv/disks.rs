//! Disks: a `file` node, a format node and a guest device per disk.
//!
//! | bus      | device (disk / cdrom)         | controller                         |
//! |----------|-------------------------------|------------------------------------|
//! | `virtio` | `virtio-blk-pci` / refused    | its own PCIe function              |
//! | `sata`   | `ide-hd` / `ide-cd`           | q35's built-in AHCI, ports `ide.0`–`ide.5` |
//! | `scsi`   | `scsi-hd` / `scsi-cd`         | one `virtio-scsi-pci` (`scsi0`)    |
//!
//! Cache modes: `none` opens the image with O_DIRECT and keeps the guest's write cache;
//! `writethrough` uses the host page cache and turns the guest's write cache off;
//! `writeback` uses the page cache with the guest's write cache on. The format node
//! carries `read-only` for read-only disks and CD-ROMs.

use serde_json::json;

use super::{Args, ArgvError, absolute, escape, valid_device_name};
use crate::spec::{CacheMode, Disk, DiskBus, DiskFormat, LauncherSpec};

/// q35's AHCI controller has six ports.
const SATA_PORTS: usize = 6;

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let mut names = std::collections::BTreeSet::new();
    let mut sata_port = 0;
    let mut scsi_lun = 0;
    if spec.disks.iter().any(|d| d.bus == DiskBus::Scsi) {
        args.push_pair("-device", "virtio-scsi-pci,id=scsi0");
    }
    for (index, disk) in spec.disks.iter().enumerate() {
        let fail = |reason: &str| ArgvError::Disk {
            name: disk.name.clone(),
            reason: reason.to_owned(),
        };
        if !valid_device_name(&disk.name) {
            return Err(fail("the name is not usable as a device id"));
        }
        if !names.insert(disk.name.as_str()) {
            return Err(fail("the name is used twice"));
        }
        absolute("disk image", &disk.source_path)?;
        push_nodes(index, disk, args);
        let mut device = match (disk.bus, disk.cdrom) {
            (DiskBus::Virtio, false) => "virtio-blk-pci".to_owned(),
            (DiskBus::Virtio, true) => return Err(fail("a CD-ROM cannot use the virtio bus")),
            (DiskBus::Sata, cdrom) => {
                if sata_port == SATA_PORTS {
                    return Err(fail("more than six SATA disks"));
                }
                sata_port += 1;
                let driver = if cdrom { "ide-cd" } else { "ide-hd" };
                format!("{driver},bus=ide.{}", sata_port - 1)
            }
            (DiskBus::Scsi, cdrom) => {
                scsi_lun += 1;
                let driver = if cdrom { "scsi-cd" } else { "scsi-hd" };
                format!(
                    "{driver},bus=scsi0.0,channel=0,scsi-id=0,lun={}",
                    scsi_lun - 1
                )
            }
            (DiskBus::Usb, _) => return Err(fail("the usb bus is not supported")),
        };
        device.push_str(&format!(",id=ua-{},drive=disk-{index}", disk.name));
        if !disk.cdrom {
            let write_cache = if disk.cache == CacheMode::Writethrough {
                "off"
            } else {
                "on"
            };
            device.push_str(&format!(",write-cache={write_cache}"));
        }
        if let Some(serial) = &disk.serial {
            device.push_str(&format!(",serial={}", escape(serial)));
        }
        if let Some(order) = disk.boot_order {
            device.push_str(&format!(",bootindex={order}"));
        }
        args.push_pair("-device", device);
    }
    Ok(())
}

fn push_nodes(index: usize, disk: &Disk, args: &mut Args) {
    let (file, format) = block_nodes(disk, &index.to_string());
    args.push_pair("-blockdev", file.to_string());
    args.push_pair("-blockdev", format.to_string());
}

/// The `file` and format nodes of `disk` (`blockdev-add` arguments), named `file-<suffix>`
/// and `disk-<suffix>`.
pub(crate) fn block_nodes(disk: &Disk, suffix: &str) -> (serde_json::Value, serde_json::Value) {
    let index = suffix;
    let read_only = disk.readonly || disk.cdrom;
    let cache = json!({"direct": disk.cache == CacheMode::None, "no-flush": false});
    let file = json!({
        "driver": "file",
        "filename": disk.source_path,
        "node-name": format!("file-{index}"),
        "cache": cache,
        "read-only": read_only,
        "discard": "unmap",
    });
    let format = json!({
        "driver": match disk.format { DiskFormat::Raw => "raw", DiskFormat::Qcow2 => "qcow2" },
        "node-name": format!("disk-{index}"),
        "file": format!("file-{index}"),
        "read-only": read_only,
        "cache": cache,
    });
    (file, format)
}

/// The `device_add` arguments of a virtio disk hot-added on root port `port`.
pub(crate) fn hotplug_device(disk: &Disk, drive: &str, port: u32) -> serde_json::Value {
    let mut device = json!({
        "driver": "virtio-blk-pci",
        "id": format!("ua-{}", disk.name),
        "drive": drive,
        "bus": format!("pci.{port}"),
        "write-cache": if disk.cache == CacheMode::Writethrough { "off" } else { "on" },
    });
    if let Some(serial) = &disk.serial {
        device["serial"] = json!(serial);
    }
    device
}

#[cfg(test)]
mod tests {
    use super::super::{qemu_argv, tests::minimal_spec};
    use super::*;

    fn disk(name: &str, bus: DiskBus, cdrom: bool) -> Disk {
        Disk {
            name: name.into(),
            source_path: format!("/var/run/kubevirt-private/vmi-disks/{name}/disk.img"),
            format: DiskFormat::Raw,
            bus,
            cdrom,
            boot_order: None,
            serial: None,
            cache: CacheMode::None,
            readonly: false,
            create_size: None,
        }
    }

    #[test]
    fn a_virtio_cdrom_is_refused() {
        let mut spec = minimal_spec();
        spec.disks = vec![disk("iso", DiskBus::Virtio, true)];
        assert!(
            matches!(qemu_argv(&spec), Err(ArgvError::Disk { reason, .. }) if reason.contains("virtio"))
        );
    }

    #[test]
    fn usb_disks_are_refused_with_the_disk_name() {
        let mut spec = minimal_spec();
        spec.disks = vec![disk("stick", DiskBus::Usb, false)];
        assert_eq!(
            qemu_argv(&spec).unwrap_err().to_string(),
            "disk \"stick\": the usb bus is not supported"
        );
    }

    #[test]
    fn a_seventh_sata_disk_is_refused() {
        let mut spec = minimal_spec();
        spec.disks = (0..7)
            .map(|i| disk(&format!("d{i}"), DiskBus::Sata, false))
            .collect();
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Disk { name, .. }) if name == "d6"));
    }

    #[test]
    fn duplicate_disk_names_are_refused() {
        let mut spec = minimal_spec();
        spec.disks = vec![
            disk("a", DiskBus::Virtio, false),
            disk("a", DiskBus::Sata, false),
        ];
        assert!(
            matches!(qemu_argv(&spec), Err(ArgvError::Disk { reason, .. }) if reason.contains("twice"))
        );
    }

    #[test]
    fn a_path_with_a_comma_stays_intact_inside_blockdev_json() {
        let mut spec = minimal_spec();
        let mut d = disk("a", DiskBus::Virtio, false);
        d.source_path = "/images/a,b.img".into();
        spec.disks = vec![d];
        let argv = qemu_argv(&spec).unwrap();
        assert!(
            argv.iter()
                .any(|a| a.contains(r#""filename":"/images/a,b.img""#)),
            "{argv:?}"
        );
    }
}
