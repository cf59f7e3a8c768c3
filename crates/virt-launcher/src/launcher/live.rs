//! Live changes to a running domain: what a `sync` of a started domain applies.
//!
//! The handler sends the whole spec on every change; [`plan`] compares it with the spec the
//! domain runs and yields the steps QEMU can take without a restart:
//!
//! | spec field | step | QMP |
//! |---|---|---|
//! | `cpu.sockets` raised (up to `maxSockets`) | plug the missing vCPUs | `query-hotpluggable-cpus`, `device_add` per vCPU |
//! | `memory.hotpluggedBytes` changed | resize the virtio-mem device | `qom-set virtio-mem0 requested-size` |
//! | a virtio disk added | attach it on a free `pcie-root-port` | (`add-fd`), `blockdev-add` ×2, `device_add` |
//! | a disk attached live removed | detach it | `device_del`, wait for `DEVICE_DELETED`, `blockdev-del` ×2, (`remove-fd`) |
//! | a bridge-bound interface added, removed, its link changed | [`super::live_nic`] | `netdev_add`/`device_add`, `device_del`/`netdev_del`, `set_link` |
//!
//! A disk with a passed file (`passedFile`) is handed to QEMU with `add-fd` (the descriptor
//! travels on the QMP socket) and opened as `/dev/fdset/<id>`; its fd set is removed after
//! the detach, and the launcher closes its own copy of the file.
//!
//! Everything else is what the domain booted with: a spec that changes it (fewer sockets,
//! another boot memory, another topology) is refused with a message saying a restart applies
//! it, and nothing is changed — the VM controller decides about `RestartRequired` from the
//! templates, the launcher only refuses what it cannot do. The guest onlines plugged vCPUs
//! and memory itself (udev in distributions); QEMU reports virtio-mem progress with
//! `MEMORY_DEVICE_SIZE_CHANGE`, which the supervisor turns into the domain's current memory.

use serde_json::{Value, json};

use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::argv::disks::{HotplugSlot, block_nodes, has_scsi_controller, hotplug_device};
use crate::argv::memory::{HOTPLUG_MEMORY_DEVICE, check_hotplugged};
use crate::argv::valid_device_name;
use crate::qmp::QmpClient;
use crate::spec::{Disk, DiskBus, LauncherSpec};

pub(super) use super::live_nic::AttachedNics;

/// How long a guest may take to release a disk after `device_del`.
const DETACH_TIMEOUT: Duration = Duration::from_secs(30);

/// One change to make on the running domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Plug vCPUs until `sockets` sockets are populated.
    PlugSockets {
        /// Sockets wanted.
        sockets: u32,
    },
    /// Ask the virtio-mem device for this many bytes.
    ResizeHotplugMemory {
        /// Bytes wanted on top of the boot memory.
        bytes: u64,
    },
    /// Attach a disk on a free root port.
    AttachDisk(Box<Disk>),
    /// Detach a disk attached live.
    DetachDisk(String),
    /// Attach a network interface on a free root port.
    AttachInterface(Box<crate::spec::Interface>),
    /// Detach a network interface attached live.
    DetachInterface(String),
    /// Set an interface's link up or down.
    SetLink {
        /// The interface.
        name: String,
        /// Up (else down).
        up: bool,
    },
}

/// A disk attached to the running domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AttachedDisk {
    /// The root port or SCSI LUN it took.
    pub(super) slot: HotplugSlot,
    /// The QEMU fd set holding its passed file, if it has one.
    pub(super) fdset: Option<u64>,
}

/// Disks attached to the running domain, by name.
pub(super) type AttachedDisks = BTreeMap<String, AttachedDisk>;

/// The steps from the running spec to the wanted one, or why they cannot be taken live.
pub(super) fn plan(
    running: &LauncherSpec,
    wanted: &LauncherSpec,
    attached: &AttachedDisks,
    nics: &AttachedNics,
) -> Result<Vec<Step>, String> {
    let (now, next) = (&running.cpu, &wanted.cpu);
    if (now.cores, now.threads, now.max_sockets) != (next.cores, next.threads, next.max_sockets) {
        return Err(
            "the vCPU topology (cores, threads, maxSockets) of a running domain changes only with a restart"
                .into(),
        );
    }
    let mut steps = Vec::new();
    if next.sockets < now.sockets {
        return Err(format!(
            "the domain runs {} sockets: a reduction to {} takes a restart",
            now.sockets, next.sockets
        ));
    }
    if next.sockets > now.sockets {
        let max = now.max_sockets.unwrap_or(now.sockets);
        if next.sockets > max {
            return Err(format!(
                "{} sockets exceed the domain's maxSockets {max}",
                next.sockets
            ));
        }
        steps.push(Step::PlugSockets {
            sockets: next.sockets,
        });
    }
    let (now, next) = (&running.memory, &wanted.memory);
    if (now.guest_bytes, now.max_guest_bytes) != (next.guest_bytes, next.max_guest_bytes) {
        return Err(
            "the boot memory and maxGuest of a running domain change only with a restart".into(),
        );
    }
    if next.hotplugged_bytes != now.hotplugged_bytes {
        check_hotplugged(wanted).map_err(|e| e.to_string())?;
        steps.push(Step::ResizeHotplugMemory {
            bytes: next.hotplugged_bytes,
        });
    }
    let on_ports = attached
        .values()
        .filter(|a| matches!(a.slot, HotplugSlot::RootPort(_)))
        .count()
        + nics.len();
    let mut free_ports = running
        .hotplug_ports
        .saturating_sub(u32::try_from(on_ports).unwrap_or(u32::MAX));
    disk_steps(running, wanted, attached, &mut free_ports, &mut steps)?;
    super::live_nic::steps(running, wanted, nics, &mut free_ports, &mut steps)?;
    Ok(steps)
}

/// Disks are compared by name: a new name is attached, a name gone is detached, and a disk
/// whose definition changed under the same name is refused (remove it, then add it).
fn disk_steps(
    running: &LauncherSpec,
    wanted: &LauncherSpec,
    attached: &AttachedDisks,
    free_ports: &mut u32,
    steps: &mut Vec<Step>,
) -> Result<(), String> {
    let find =
        |spec: &LauncherSpec, name: &str| spec.disks.iter().find(|d| d.name == name).cloned();
    for gone in running
        .disks
        .iter()
        .filter(|d| find(wanted, &d.name).is_none())
    {
        if !attached.contains_key(&gone.name) {
            return Err(format!(
                "disk {:?} was there at boot: removing it takes a restart",
                gone.name
            ));
        }
        steps.push(Step::DetachDisk(gone.name.clone()));
    }
    for disk in &wanted.disks {
        match find(running, &disk.name) {
            Some(now) if now == *disk => {}
            Some(_) => {
                return Err(format!(
                    "disk {:?} changed on the running domain: detach it first",
                    disk.name
                ));
            }
            None => {
                let scsi = disk.bus == DiskBus::Scsi && has_scsi_controller(running);
                if !(disk.bus == DiskBus::Virtio || scsi) || disk.cdrom {
                    return Err(format!(
                        "disk {:?}: only virtio and scsi disks can be attached to a running domain",
                        disk.name
                    ));
                }
                if !valid_device_name(&disk.name) {
                    return Err(format!(
                        "disk {:?}: the name is not usable as a device id",
                        disk.name
                    ));
                }
                if scsi {
                    steps.push(Step::AttachDisk(Box::new(disk.clone())));
                    continue;
                }
                if *free_ports == 0 {
                    return Err(format!(
                        "disk {:?}: no free hotplug port (the domain booted with {})",
                        disk.name, running.hotplug_ports
                    ));
                }
                *free_ports -= 1;
                steps.push(Step::AttachDisk(Box::new(disk.clone())));
            }
        }
    }
    Ok(())
}

/// Where `disk` goes on the running domain: the lowest root port (`pci.1` …) no attached disk
/// holds, or for a SCSI disk the lowest LUN neither a boot SCSI disk (they hold `0..n` in spec
/// order) nor an attached one holds.
pub(super) fn free_slot(
    running: &LauncherSpec,
    attached: &AttachedDisks,
    nics: &AttachedNics,
    disk: &Disk,
) -> Option<HotplugSlot> {
    let taken = |slot: HotplugSlot| {
        attached.values().any(|used| used.slot == slot)
            || matches!(slot, HotplugSlot::RootPort(port) if nics.values().any(|p| *p == port))
    };
    if disk.bus == DiskBus::Scsi {
        let boot = running
            .disks
            .iter()
            .filter(|d| d.bus == DiskBus::Scsi && !attached.contains_key(&d.name))
            .count();
        let boot = u32::try_from(boot).unwrap_or(u32::MAX);
        return (boot..MAX_SCSI_LUNS)
            .map(HotplugSlot::ScsiLun)
            .find(|slot| !taken(*slot));
    }
    (1..=running.hotplug_ports)
        .map(HotplugSlot::RootPort)
        .find(|slot| !taken(*slot))
}

/// The lowest root port neither an attached disk nor an attached interface holds.
pub(super) fn free_port(
    running: &LauncherSpec,
    attached: &AttachedDisks,
    nics: &AttachedNics,
) -> Option<u32> {
    (1..=running.hotplug_ports).find(|port| {
        !nics.values().any(|p| p == port)
            && !attached
                .values()
                .any(|a| a.slot == HotplugSlot::RootPort(*port))
    })
}

/// LUNs a virtio-scsi target offers (QEMU's `max_lun`).
const MAX_SCSI_LUNS: u32 = 16384;

/// Node names of a disk attached live.
fn hotplug_suffix(name: &str) -> String {
    format!("hp-{name}")
}

/// Attaches `disk` at `slot` ([`free_slot`]), opened from `passed` (its passed file) when
/// given. On an error, what was added is removed.
pub(super) async fn attach_disk(
    qmp: &QmpClient,
    disk: &Disk,
    passed: Option<BorrowedFd<'_>>,
    slot: HotplugSlot,
) -> Result<AttachedDisk, String> {
    let fail = |what: &str, e: crate::qmp::QmpError| {
        format!("attaching disk {:?}: {what}: {e}", disk.name)
    };
    let fdset = match passed {
        Some(fd) => Some(
            qmp.add_fd(fd, &format!("ua-{}", disk.name))
                .await
                .map_err(|e| fail("passing the file to QEMU", e))?,
        ),
        None => None,
    };
    let added = AttachedDisk { slot, fdset };
    if let Err(e) = add_nodes_and_device(qmp, disk, slot, fdset).await {
        if let Some(set) = fdset {
            let _ = qmp.remove_fd(set).await;
        }
        return Err(e);
    }
    Ok(added)
}

async fn add_nodes_and_device(
    qmp: &QmpClient,
    disk: &Disk,
    slot: HotplugSlot,
    fdset: Option<u64>,
) -> Result<(), String> {
    let suffix = hotplug_suffix(&disk.name);
    let (file, format) = block_nodes(disk, &suffix, fdset);
    let fail = |what: &str, e: crate::qmp::QmpError| {
        format!("attaching disk {:?}: {what}: {e}", disk.name)
    };
    qmp.blockdev_add(file)
        .await
        .map_err(|e| fail("file node", e))?;
    if let Err(e) = qmp.blockdev_add(format).await {
        let _ = qmp.blockdev_del(&format!("file-{suffix}")).await;
        return Err(fail("format node", e));
    }
    if let Err(e) = qmp
        .device_add(hotplug_device(disk, &format!("disk-{suffix}"), slot))
        .await
    {
        let _ = qmp.blockdev_del(&format!("disk-{suffix}")).await;
        let _ = qmp.blockdev_del(&format!("file-{suffix}")).await;
        return Err(fail("device", e));
    }
    Ok(())
}

/// Asks the guest to release disk `name`, waits for QEMU's `DEVICE_DELETED` and removes its
/// nodes, then its fd set (`fdset`, when it was opened from a passed file).
pub(super) async fn detach_disk(
    qmp: &QmpClient,
    name: &str,
    fdset: Option<u64>,
    mut deleted: broadcast::Receiver<String>,
) -> Result<(), String> {
    let id = format!("ua-{name}");
    qmp.device_del(&id)
        .await
        .map_err(|e| format!("detaching disk {name:?}: {e}"))?;
    let released = async {
        loop {
            match deleted.recv().await {
                Ok(device) if device == id => return true,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return false,
            }
        }
    };
    match tokio::time::timeout(DETACH_TIMEOUT, released).await {
        Ok(true) => {}
        Ok(false) => return Err(format!("detaching disk {name:?}: QEMU went away")),
        Err(_) => {
            return Err(format!(
                "detaching disk {name:?}: the guest did not release it within {} s",
                DETACH_TIMEOUT.as_secs()
            ));
        }
    }
    let suffix = hotplug_suffix(name);
    for node in [format!("disk-{suffix}"), format!("file-{suffix}")] {
        qmp.blockdev_del(&node)
            .await
            .map_err(|e| format!("detaching disk {name:?}: node {node}: {e}"))?;
    }
    if let Some(set) = fdset {
        qmp.remove_fd(set)
            .await
            .map_err(|e| format!("detaching disk {name:?}: fd set {set}: {e}"))?;
    }
    Ok(())
}

/// Asks the virtio-mem device to plug `bytes` into the guest.
pub(super) async fn resize_memory(qmp: &QmpClient, bytes: u64) -> Result<(), String> {
    qmp.execute(
        "qom-set",
        Some(json!({
            "path": HOTPLUG_MEMORY_DEVICE,
            "property": "requested-size",
            "value": bytes,
        })),
    )
    .await
    .map(drop)
    .map_err(|e| format!("resizing the hotplug memory: {e}"))
}

/// Plugs every vCPU QEMU offers in a socket below `sockets` that is still empty.
pub(super) async fn plug_sockets(qmp: &QmpClient, sockets: u32) -> Result<(), String> {
    let offered = qmp
        .execute("query-hotpluggable-cpus", None)
        .await
        .map_err(|e| format!("listing the hotpluggable vCPUs: {e}"))?;
    for slot in empty_slots_below(&offered, sockets) {
        qmp.device_add(slot)
            .await
            .map_err(|e| format!("plugging a vCPU: {e}"))?;
    }
    Ok(())
}

/// `device_add` arguments for the empty vCPU slots of `query-hotpluggable-cpus` whose socket
/// is below `sockets`, in socket/core/thread order, each with the id `vcpu-S-C-T`.
fn empty_slots_below(offered: &Value, sockets: u32) -> Vec<Value> {
    let id = |props: &Value, key: &str| props.get(key).and_then(Value::as_u64).unwrap_or(0);
    let mut slots: Vec<(u64, u64, u64, Value)> = offered
        .as_array()
        .into_iter()
        .flatten()
        .filter(|slot| slot.get("qom-path").is_none())
        .filter_map(|slot| {
            let props = slot.get("props")?;
            let driver = slot.get("type")?.as_str()?;
            let (s, c, t) = (
                id(props, "socket-id"),
                id(props, "core-id"),
                id(props, "thread-id"),
            );
            if s >= u64::from(sockets) {
                return None;
            }
            let mut args = json!({"driver": driver, "id": format!("vcpu-{s}-{c}-{t}")});
            for (key, value) in props.as_object()? {
                args[key] = value.clone();
            }
            Some((s, c, t, args))
        })
        .collect();
    slots.sort_by_key(|(s, c, t, _)| (*s, *c, *t));
    slots.into_iter().map(|(.., args)| args).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::argv::tests::minimal_spec;

    const MIB: u64 = 1024 * 1024;

    fn hotpluggable() -> LauncherSpec {
        let mut spec = minimal_spec();
        spec.cpu.sockets = 1;
        spec.cpu.max_sockets = Some(4);
        spec.memory.guest_bytes = 1024 * MIB;
        spec.memory.max_guest_bytes = Some(2048 * MIB);
        spec
    }

    #[test]
    fn more_sockets_and_more_memory_are_live_steps() {
        let running = hotpluggable();
        let mut wanted = running.clone();
        wanted.cpu.sockets = 2;
        wanted.memory.hotplugged_bytes = 128 * MIB;
        assert_eq!(
            plan(
                &running,
                &wanted,
                &AttachedDisks::new(),
                &AttachedNics::new()
            )
            .unwrap(),
            vec![
                Step::PlugSockets { sockets: 2 },
                Step::ResizeHotplugMemory { bytes: 128 * MIB }
            ]
        );
        assert_eq!(
            plan(
                &running,
                &running,
                &AttachedDisks::new(),
                &AttachedNics::new()
            )
            .unwrap(),
            vec![]
        );
    }

    #[test]
    fn what_only_a_restart_changes_is_refused_with_nothing_applied() {
        let mut running = hotpluggable();
        running.cpu.sockets = 2;
        let mut fewer = running.clone();
        fewer.cpu.sockets = 1;
        assert!(
            plan(
                &running,
                &fewer,
                &AttachedDisks::new(),
                &AttachedNics::new()
            )
            .unwrap_err()
            .contains("restart")
        );
        let mut beyond = running.clone();
        beyond.cpu.sockets = 5;
        assert!(
            plan(
                &running,
                &beyond,
                &AttachedDisks::new(),
                &AttachedNics::new()
            )
            .unwrap_err()
            .contains("maxSockets")
        );
        let mut boot = running.clone();
        boot.memory.guest_bytes = 2048 * MIB;
        assert!(
            plan(&running, &boot, &AttachedDisks::new(), &AttachedNics::new())
                .unwrap_err()
                .contains("restart")
        );
        let mut unaligned = running.clone();
        unaligned.memory.hotplugged_bytes = MIB;
        assert!(
            plan(
                &running,
                &unaligned,
                &AttachedDisks::new(),
                &AttachedNics::new()
            )
            .unwrap_err()
            .contains("block")
        );
    }

    fn disk(name: &str) -> Disk {
        Disk {
            name: name.into(),
            source_path: format!("/pod/{name}.img"),
            format: crate::spec::DiskFormat::Raw,
            bus: DiskBus::Virtio,
            cdrom: false,
            boot_order: None,
            serial: None,
            cache: crate::spec::CacheMode::None,
            readonly: false,
            create_size: None,
            passed_file: None,
            overlay_backing: None,
            block_device: false,
            io: None,
        }
    }

    #[test]
    fn disks_are_attached_by_new_name_and_only_live_ones_detached() {
        let mut running = hotpluggable();
        running.hotplug_ports = 2;
        running.disks = vec![disk("root")];
        let mut wanted = running.clone();
        wanted.disks.push(disk("data"));
        assert_eq!(
            plan(
                &running,
                &wanted,
                &AttachedDisks::new(),
                &AttachedNics::new()
            )
            .unwrap(),
            vec![Step::AttachDisk(Box::new(disk("data")))]
        );
        let attached = AttachedDisks::from([(
            "data".to_owned(),
            AttachedDisk {
                slot: HotplugSlot::RootPort(1),
                fdset: None,
            },
        )]);
        assert_eq!(
            plan(&wanted, &running, &attached, &AttachedNics::new()).unwrap(),
            vec![Step::DetachDisk("data".into())]
        );
        let mut no_root = running.clone();
        no_root.disks.clear();
        assert!(
            plan(&running, &no_root, &attached, &AttachedNics::new())
                .unwrap_err()
                .contains("restart")
        );
        let mut sata = wanted.clone();
        sata.disks[1].bus = DiskBus::Sata;
        assert!(
            plan(&running, &sata, &attached, &AttachedNics::new())
                .unwrap_err()
                .contains("virtio")
        );
        // SCSI disks go on LUNs of scsi0 and take no root port.
        let mut scsi = running.clone();
        scsi.disks.extend(["s1", "s2", "s3"].map(|n| Disk {
            bus: DiskBus::Scsi,
            ..disk(n)
        }));
        assert_eq!(
            plan(&running, &scsi, &AttachedDisks::new(), &AttachedNics::new())
                .unwrap()
                .len(),
            3
        );
        let mut two = wanted.clone();
        two.disks.push(disk("more"));
        two.disks.push(disk("most"));
        assert!(
            plan(&running, &two, &AttachedDisks::new(), &AttachedNics::new())
                .unwrap_err()
                .contains("no free hotplug port")
        );
    }

    #[test]
    fn scsi_disks_take_the_luns_after_the_boot_ones_and_virtio_disks_the_free_ports() {
        let scsi = |n: &str| Disk {
            bus: DiskBus::Scsi,
            ..disk(n)
        };
        let mut running = hotpluggable();
        running.hotplug_ports = 2;
        running.disks = vec![scsi("boot0"), scsi("boot1"), scsi("hot")];
        let attached = AttachedDisks::from([
            (
                "hot".to_owned(),
                AttachedDisk {
                    slot: HotplugSlot::ScsiLun(2),
                    fdset: None,
                },
            ),
            (
                "v".to_owned(),
                AttachedDisk {
                    slot: HotplugSlot::RootPort(1),
                    fdset: None,
                },
            ),
        ]);
        assert_eq!(
            free_slot(&running, &attached, &AttachedNics::new(), &scsi("next")),
            Some(HotplugSlot::ScsiLun(3))
        );
        assert_eq!(
            free_slot(&running, &attached, &AttachedNics::new(), &disk("next")),
            Some(HotplugSlot::RootPort(2))
        );
    }

    #[test]
    fn only_empty_slots_below_the_wanted_sockets_are_plugged_in_order() {
        // As QEMU 7.2 answers query-hotpluggable-cpus for -smp 1,sockets=4,maxcpus=4.
        let offered = json!([
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 3}, "vcpus-count": 1, "type": "max-x86_64-cpu"},
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 2}, "vcpus-count": 1, "type": "max-x86_64-cpu"},
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 1}, "vcpus-count": 1, "type": "max-x86_64-cpu"},
            {"props": {"core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 0}, "vcpus-count": 1, "qom-path": "/machine/unattached/device[0]", "type": "max-x86_64-cpu"}
        ]);
        assert_eq!(
            empty_slots_below(&offered, 3),
            vec![
                json!({"driver": "max-x86_64-cpu", "id": "vcpu-1-0-0", "core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 1}),
                json!({"driver": "max-x86_64-cpu", "id": "vcpu-2-0-0", "core-id": 0, "thread-id": 0, "node-id": 0, "socket-id": 2}),
            ]
        );
    }
}
