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
//!
//! A `blockDevice` disk (a `Block`-mode claim at `/dev/<volume>`) gets a `host_device` node
//! instead of a `file` one: QEMU's `file` driver refuses block devices.
//!
//! A disk with a `passedFile` is opened from the file the handler passed the launcher
//! (protocol `passFile`), never by path: its `file` node opens `/dev/fdset/N`, one of QEMU's
//! fd sets, which holds a copy of that descriptor. A boot disk's set is numbered like its
//! nodes (the disk's index) and filled at start by `-add-fd fd=…,set=N` ([`passed_file_args`]
//! — the launcher knows the descriptor numbers, this pure code does not); a disk attached live
//! gets its set from QMP `add-fd` (see `launcher/live.rs`).

use serde_json::json;

use super::{Args, ArgvError, absolute, escape, valid_device_name};
use crate::spec::{CacheMode, Disk, DiskBus, DiskFormat, IoMode, LauncherSpec};

/// q35's AHCI controller has six ports.
const SATA_PORTS: usize = 6;

/// Whether the domain gets the `virtio-scsi-pci` controller `scsi0`: for its SCSI disks, and
/// whenever it has room for hotplug, so that SCSI disks (virtctl's default bus) can be
/// attached live — as upstream's domains always carry one.
pub(crate) fn has_scsi_controller(spec: &LauncherSpec) -> bool {
    spec.hotplug_ports > 0 || spec.disks.iter().any(|d| d.bus == DiskBus::Scsi)
}

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let mut names = std::collections::BTreeSet::new();
    let mut sata_port = 0;
    let mut scsi_lun = 0;
    if has_scsi_controller(spec) {
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
        match &disk.passed_file {
            None => absolute("disk image", &disk.source_path)?,
            Some(key) if key.is_empty() => return Err(fail("the passed file's key is empty")),
            Some(_) if disk.create_size.is_some() => {
                return Err(fail("a passed file cannot be created (createSize)"));
            }
            Some(_) => {}
        }
        if disk.io == Some(IoMode::Native) && disk.cache != CacheMode::None {
            return Err(fail("io native needs cache none (O_DIRECT)"));
        }
        if disk.block_device && (disk.create_size.is_some() || disk.overlay_backing.is_some()) {
            return Err(fail("a block device is neither created nor overlaid"));
        }
        if let Some(backing) = &disk.overlay_backing {
            absolute("overlay backing", backing)?;
            if disk.format != DiskFormat::Qcow2 || disk.create_size.is_some() {
                return Err(fail("an overlay is a qcow2 image that is not created raw"));
            }
            if disk.passed_file.is_some() {
                return Err(fail("a passed file cannot be an overlay"));
            }
        }
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
    let fdset = disk.passed_file.as_ref().map(|_| index as u64);
    let (file, format) = block_nodes(disk, &index.to_string(), fdset);
    args.push_pair("-blockdev", file.to_string());
    args.push_pair("-blockdev", format.to_string());
}

/// The `-add-fd` arguments that give QEMU the passed files of the boot disks: each entry is
/// a disk's index in the spec and the descriptor number QEMU inherits for it (not
/// close-on-exec); the file goes into fd set `index`, which the disk's `file` node opens.
pub(crate) fn passed_file_args(inherited: &[(usize, i32)]) -> Vec<String> {
    inherited
        .iter()
        .flat_map(|(index, fd)| ["-add-fd".to_owned(), format!("fd={fd},set={index}")])
        .collect()
}

/// The `file` and format nodes of `disk` (`blockdev-add` arguments), named `file-<suffix>`
/// and `disk-<suffix>`. The `file` node opens fd set `fdset` when given (a passed file),
/// else the disk's `source_path`.
pub(crate) fn block_nodes(
    disk: &Disk,
    suffix: &str,
    fdset: Option<u64>,
) -> (serde_json::Value, serde_json::Value) {
    let index = suffix;
    let filename = match fdset {
        Some(set) => format!("/dev/fdset/{set}"),
        None => disk.source_path.clone(),
    };
    let read_only = disk.readonly || disk.cdrom;
    let cache = json!({"direct": disk.cache == CacheMode::None, "no-flush": false});
    // QEMU's `file` driver refuses a block device: `host_device` opens one.
    let protocol = if disk.block_device && fdset.is_none() {
        "host_device"
    } else {
        "file"
    };
    let mut file = json!({
        "driver": protocol,
        "filename": filename,
        "node-name": format!("file-{index}"),
        "cache": cache,
        "read-only": read_only,
        "discard": "unmap",
    });
    if let Some(io) = disk.io {
        file["aio"] = json!(match io {
            IoMode::Threads => "threads",
            IoMode::Native => "native",
        });
    }
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
/// Where a disk attached live sits: a virtio disk on a free `pcie-root-port`, a SCSI disk on a
/// LUN of `scsi0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HotplugSlot {
    /// The root port `pci.<n>`.
    RootPort(u32),
    /// The LUN of `scsi0.0`, target 0.
    ScsiLun(u32),
}

pub(crate) fn hotplug_device(disk: &Disk, drive: &str, slot: HotplugSlot) -> serde_json::Value {
    let mut device = match slot {
        HotplugSlot::RootPort(port) => json!({
            "driver": "virtio-blk-pci",
            "bus": format!("pci.{port}"),
        }),
        HotplugSlot::ScsiLun(lun) => json!({
            "driver": "scsi-hd",
            "bus": "scsi0.0",
            "channel": 0,
            "scsi-id": 0,
            "lun": lun,
        }),
    };
    device["id"] = json!(format!("ua-{}", disk.name));
    device["drive"] = json!(drive);
    device["write-cache"] = json!(if disk.cache == CacheMode::Writethrough {
        "off"
    } else {
        "on"
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
            passed_file: None,
            overlay_backing: None,
            block_device: false,
            io: None,
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
    fn a_passed_file_is_opened_from_the_fd_set_of_its_index_not_by_path() {
        let mut spec = minimal_spec();
        let mut hot = disk("hot", DiskBus::Virtio, false);
        hot.source_path = "claim hot".into();
        hot.passed_file = Some("vol1".into());
        spec.disks = vec![disk("root", DiskBus::Virtio, false), hot];
        let argv = qemu_argv(&spec).unwrap();
        assert!(
            argv.iter()
                .any(|a| a.contains(r#""filename":"/dev/fdset/1","node-name":"file-1""#)),
            "{argv:?}"
        );
        assert!(
            !argv.iter().any(|a| a.contains("claim hot")),
            "the source path only names a passed file: {argv:?}"
        );
        assert_eq!(
            passed_file_args(&[(1, 7)]),
            ["-add-fd".to_owned(), "fd=7,set=1".to_owned()]
        );
    }

    #[test]
    fn io_is_the_file_nodes_aio_and_native_needs_o_direct() {
        let mut spec = minimal_spec();
        let mut d = disk("d", DiskBus::Virtio, false);
        d.io = Some(IoMode::Native);
        spec.disks.push(d);
        assert!(
            qemu_argv(&spec)
                .unwrap()
                .iter()
                .any(|a| a.contains(r#""aio":"native""#)),
            "native AIO on the file node"
        );
        spec.disks[0].cache = CacheMode::Writethrough;
        assert!(matches!(
            qemu_argv(&spec),
            Err(ArgvError::Disk { reason, .. }) if reason.contains("O_DIRECT")
        ));
    }

    #[test]
    fn a_block_device_gets_a_host_device_node_and_is_never_created_or_overlaid() {
        let mut spec = minimal_spec();
        let mut block = disk("blk", DiskBus::Virtio, false);
        block.source_path = "/dev/blk".into();
        block.block_device = true;
        spec.disks = vec![block.clone(), disk("plain", DiskBus::Virtio, false)];
        let argv = qemu_argv(&spec).unwrap();
        assert!(
            argv.iter().any(|a| a
                .contains(r#""driver":"host_device","filename":"/dev/blk","node-name":"file-0""#)),
            "{argv:?}"
        );
        assert!(
            argv.iter().any(|a| a.contains(
                r#""driver":"file","filename":"/var/run/kubevirt-private/vmi-disks/plain/disk.img""#
            )),
            "{argv:?}"
        );
        block.create_size = Some(1 << 20);
        spec.disks = vec![block.clone()];
        assert!(qemu_argv(&spec).is_err());
        block.create_size = None;
        block.overlay_backing = Some("/dev/other".into());
        spec.disks = vec![block];
        assert!(qemu_argv(&spec).is_err());
    }

    #[test]
    fn an_overlay_is_a_qcow2_over_an_absolute_backing() {
        let mut spec = minimal_spec();
        let mut eph = disk("eph", DiskBus::Virtio, false);
        eph.source_path = "/var/run/kubevirt/disks/eph.qcow2".into();
        eph.overlay_backing = Some("/var/run/kubevirt-private/vmi-disks/eph/disk.img".into());
        spec.disks = vec![eph.clone()];
        assert!(
            matches!(qemu_argv(&spec), Err(ArgvError::Disk { reason, .. }) if reason.contains("qcow2")),
            "a raw overlay is refused"
        );
        eph.format = DiskFormat::Qcow2;
        spec.disks = vec![eph.clone()];
        let argv = qemu_argv(&spec).unwrap();
        assert!(
            argv.iter()
                .any(|a| a.contains(r#""driver":"qcow2","node-name":"disk-0""#)),
            "{argv:?}"
        );
        eph.overlay_backing = Some("relative/disk.img".into());
        spec.disks = vec![eph];
        assert!(qemu_argv(&spec).is_err());
    }

    #[test]
    fn a_passed_file_with_a_create_size_or_an_empty_key_is_refused() {
        let mut spec = minimal_spec();
        let mut d = disk("hot", DiskBus::Virtio, false);
        d.passed_file = Some("vol1".into());
        d.create_size = Some(1 << 20);
        spec.disks = vec![d.clone()];
        assert!(
            matches!(qemu_argv(&spec), Err(ArgvError::Disk { reason, .. }) if reason.contains("createSize"))
        );
        d.create_size = None;
        d.passed_file = Some(String::new());
        spec.disks = vec![d];
        assert!(
            matches!(qemu_argv(&spec), Err(ArgvError::Disk { reason, .. }) if reason.contains("key"))
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
