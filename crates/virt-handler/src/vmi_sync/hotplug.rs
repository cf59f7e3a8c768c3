//! virt-handler's part of volume hotplug: from an attachment pod on this node to a disk the
//! launcher holds.
//!
//! Data flow: virt-controller's attachment pod (`hp-volume-…`) mounts the claim at
//! `/path/<volume>` and listens on `/path/hp.sock`, in its emptyDir; once the VMI's volume
//! status says `AttachedToNode` with the pod's UID, [`open_disk`] reaches that socket through
//! the kubelet's pod directory, learns the container's pid from the connection
//! (`SO_PEERCRED`) and opens `disk.img` through `/proc/<pid>/root` — the claim as the
//! attachment container's mount namespace has it — creating it sparse when the claim is new
//! (as the launcher does for claims mounted at start). The worker passes the open file to
//! the launcher (`passFile`, docs/launcher-protocol.md) and records `MountedToPod`; the next
//! spec carries the disk with `passedFile`, the launcher attaches it, and the acknowledged
//! sync makes the volume `Ready`. A volume removed from the spec leaves the next spec, and the
//! launcher detaches it.
//!
//! Upstream instead bind-mounts the attachment pod's disk into the launcher's
//! `hotplug-disks` directory (mount propagation and a mount-namespace walk); a passed file
//! needs neither, and the launcher still opens nothing outside its own directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kubevirt_api::v1::{VirtualMachineInstance, VolumePhase};
use serde_json::{Value, json};

use crate::launcher_spec::is_hotplug_volume;

use kubevirt_api::constants::{
    HOTPLUG_ATTACHMENT_DIR, HOTPLUG_ATTACHMENT_SOCKET, HOTPLUG_ATTACHMENT_VOLUME,
};
use virt_launcher::pod_layout::CLAIM_DISK_IMAGE;

/// The phases virt-handler gives hotplug volumes (upstream's reasons and messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerPhase {
    /// The launcher holds the disk's file.
    MountedToPod,
    /// The domain has the disk.
    Ready,
}

impl HandlerPhase {
    fn status(self, volume: &str) -> (VolumePhase, &'static str, String) {
        match self {
            HandlerPhase::MountedToPod => (
                VolumePhase::MountedToPod,
                "VolumeMountedToPod",
                format!("Volume {volume} has been mounted in virt-launcher pod"),
            ),
            HandlerPhase::Ready => (
                VolumePhase::Ready,
                "VolumeReady",
                format!("Successfully attach hotplugged volume {volume} to VM"),
            ),
        }
    }
}

/// A hotplug volume whose attachment pod is ready and whose file the launcher lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToAttach {
    /// The volume (and disk) name.
    pub volume: String,
    /// The attachment pod's UID.
    pub attach_pod_uid: String,
    /// Attach read-only.
    pub read_only: bool,
}

/// The VMI's hotplug volumes that are `AttachedToNode` with a ready attachment pod.
pub fn to_attach(vmi: &VirtualMachineInstance) -> Vec<ToAttach> {
    let statuses = vmi.status.iter().flat_map(|s| s.volume_status.iter());
    statuses
        .filter(|s| s.phase == Some(VolumePhase::AttachedToNode))
        .filter_map(|s| {
            let uid = s.hotplug_volume.as_ref()?.attach_pod_uid.clone()?;
            let volume = vmi
                .spec
                .volumes
                .iter()
                .find(|v| v.name == s.name && is_hotplug_volume(v))?;
            let read_only = volume
                .volume_source
                .persistent_volume_claim
                .as_ref()
                .and_then(|p| p.read_only)
                == Some(true);
            Some(ToAttach {
                volume: s.name.clone(),
                attach_pod_uid: uid,
                read_only,
            })
        })
        .collect()
}

/// The hotplug disks of a spec (those the launcher opens from passed files).
pub fn spec_hotplug_disks(spec: &virt_launcher::spec::LauncherSpec) -> Vec<String> {
    spec.disks
        .iter()
        .filter(|d| d.passed_file.is_some())
        .map(|d| d.name.clone())
        .collect()
}

/// A name usable as one path component: no separators, not `.` or `..`, not empty.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// The attachment pod's socket below the kubelet's pod directory.
pub fn attachment_socket(kubelet_pods_dir: &Path, pod_uid: &str) -> Option<PathBuf> {
    super::worker::is_canonical_uuid(pod_uid).then(|| {
        kubelet_pods_dir
            .join(pod_uid)
            .join("volumes/kubernetes.io~empty-dir")
            .join(HOTPLUG_ATTACHMENT_VOLUME)
            .join(HOTPLUG_ATTACHMENT_SOCKET)
    })
}

/// Opens the disk image of `volume` in the attachment pod `pod_uid` (see the module docs),
/// creating a missing one as a sparse file of `create_size` bytes.
///
/// # Errors
/// A message naming what failed: a bad UID or name, the socket, the pid, the file (a
/// symlink or anything but a regular file or block device is refused).
pub async fn open_disk(
    kubelet_pods_dir: &Path,
    attach: &ToAttach,
    create_size: Option<u64>,
) -> Result<std::fs::File, String> {
    if !plain_name(&attach.volume) {
        return Err(format!(
            "volume name {:?} is not a plain name",
            attach.volume
        ));
    }
    let socket = attachment_socket(kubelet_pods_dir, &attach.attach_pod_uid).ok_or_else(|| {
        format!(
            "attachment pod UID {:?} is not a UID",
            attach.attach_pod_uid
        )
    })?;
    let stream = virt_launcher::unix_socket::connect(&socket)
        .await
        .map_err(|e| {
            format!(
                "connecting to the attachment pod at {}: {e}",
                socket.display()
            )
        })?;
    let pid = stream
        .peer_cred()
        .ok()
        .and_then(|c| c.pid())
        .filter(|pid| *pid > 0)
        .ok_or("the attachment pod's socket does not tell its pid")?;
    drop(stream);
    let path = PathBuf::from(format!("/proc/{pid}/root"))
        .join(HOTPLUG_ATTACHMENT_DIR.trim_start_matches('/'))
        .join(&attach.volume)
        .join(CLAIM_DISK_IMAGE);
    let read_only = attach.read_only;
    tokio::task::spawn_blocking(move || open_image(&path, read_only, create_size))
        .await
        .map_err(|e| format!("opening the disk: {e}"))?
}

/// Opens `path` without following a symlink at its end; creates it (sparse, `0600`) when it
/// is missing and `create_size` is known.
fn open_image(
    path: &Path,
    read_only: bool,
    create_size: Option<u64>,
) -> Result<std::fs::File, String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path)
    };
    let file = match open() {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !read_only => {
            let size = create_size.ok_or_else(|| {
                format!(
                    "{} is missing and the claim's size is unknown",
                    path.display()
                )
            })?;
            let created = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
            created
                .set_len(size)
                .map_err(|e| format!("sizing {}: {e}", path.display()))?;
            created
        }
        Err(e) => return Err(format!("opening {}: {e}", path.display())),
    };
    let kind = file
        .metadata()
        .map_err(|e| format!("reading {}: {e}", path.display()))?
        .file_type();
    if !(kind.is_file() || kind.is_block_device()) {
        return Err(format!(
            "{} is neither a file nor a block device",
            path.display()
        ));
    }
    Ok(file)
}

/// The volume status with `phases` applied to the hotplug volumes still in the spec, never
/// moving one back from `Ready`; `None` when nothing changes.
pub fn volume_status_with(
    vmi: &VirtualMachineInstance,
    status: &Value,
    phases: &BTreeMap<String, HandlerPhase>,
) -> Option<Value> {
    let mut list = status["volumeStatus"].as_array().cloned()?;
    let mut changed = false;
    for entry in &mut list {
        let Some(name) = entry["name"].as_str().map(str::to_owned) else {
            continue;
        };
        let Some(phase) = phases.get(&name) else {
            continue;
        };
        if !vmi.spec.volumes.iter().any(|v| v.name == name) {
            continue;
        }
        let current = entry["phase"].as_str().unwrap_or_default();
        let allowed = match phase {
            HandlerPhase::MountedToPod => current == "AttachedToNode",
            HandlerPhase::Ready => matches!(current, "AttachedToNode" | "MountedToPod"),
        };
        if !allowed {
            continue;
        }
        let (phase, reason, message) = phase.status(&name);
        entry["phase"] = json!(phase.as_str());
        entry["reason"] = json!(reason);
        entry["message"] = json!(message);
        changed = true;
    }
    changed |= fill_targets(vmi, &mut list);
    changed.then_some(Value::Array(list))
}

/// Upstream's device names (`makeDeviceName`): `vd` for virtio disks, `sd` for SATA, SCSI and
/// USB, then `a`…`z`, `aa`…; a name once given stays (the volume status keeps it) and a new
/// disk takes the lowest free one of its bus, in the order of the spec's disks.
#[must_use]
pub fn device_names(
    disks: &[kubevirt_api::v1::Disk],
    existing: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    use kubevirt_api::v1::DiskBus;
    let prefix = |d: &kubevirt_api::v1::Disk| {
        let bus = d
            .disk
            .as_ref()
            .and_then(|t| t.bus.clone())
            .or_else(|| d.cdrom.as_ref().and_then(|t| t.bus.clone()))
            .or_else(|| d.lun.as_ref().and_then(|t| t.bus.clone()))
            .unwrap_or(if d.cdrom.is_some() {
                DiskBus::Sata
            } else if d.lun.is_some() {
                DiskBus::Scsi
            } else {
                DiskBus::Virtio
            });
        if bus == DiskBus::Virtio { "vd" } else { "sd" }
    };
    let letters = |mut i: usize| {
        let mut out = Vec::new();
        loop {
            out.push(b'a' + u8::try_from(i % 26).unwrap_or(0));
            if i < 26 {
                break;
            }
            i = i / 26 - 1;
        }
        out.reverse();
        String::from_utf8(out).unwrap_or_default()
    };
    let mut names: BTreeMap<String, String> = disks
        .iter()
        .filter_map(|d| Some((d.name.clone(), existing.get(&d.name)?.clone())))
        .collect();
    for disk in disks {
        if names.contains_key(&disk.name) {
            continue;
        }
        let prefix = prefix(disk);
        let free = (0..26 * 27)
            .map(|i| format!("{prefix}{}", letters(i)))
            .find(|n| !names.values().any(|used| used == n));
        if let Some(free) = free {
            names.insert(disk.name.clone(), free);
        }
    }
    names
}

/// Gives every volume of the running domain its device name (`target`): the boot-time ones
/// at once, a hotplugged one once it is `Ready`. True when an entry changed.
fn fill_targets(vmi: &VirtualMachineInstance, list: &mut [Value]) -> bool {
    let existing: BTreeMap<String, String> = list
        .iter()
        .filter_map(|e| {
            let target = e["target"].as_str().filter(|t| !t.is_empty())?;
            Some((e["name"].as_str()?.to_owned(), target.to_owned()))
        })
        .collect();
    let names = device_names(&vmi.spec.domain.devices.disks, &existing);
    let mut changed = false;
    for entry in list {
        let Some(name) = entry["name"].as_str() else {
            continue;
        };
        let hotplugged = entry.get("hotplugVolume").is_some();
        if !entry["target"].as_str().unwrap_or_default().is_empty()
            || (hotplugged && entry["phase"] != "Ready")
        {
            continue;
        }
        if let Some(target) = names.get(name) {
            entry["target"] = json!(target);
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(status: Value) -> VirtualMachineInstance {
        let mut vmi = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "default"},
            "spec": {"domain": {"devices": {}}, "volumes": [
                {"name": "root", "containerDisk": {"image": "i"}},
                {"name": "hot", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}},
            ]},
        });
        vmi["status"] = status;
        serde_json::from_value(vmi).unwrap()
    }

    const UID: &str = "0f1e2d3c-4b5a-6978-8a9b-abcdefabcdef";

    #[test]
    fn only_attached_volumes_with_a_ready_pod_are_to_attach() {
        let waiting = vmi(json!({"volumeStatus": [
            {"name": "hot", "target": "", "phase": "AttachedToNode", "hotplugVolume": {"attachPodName": "hp"}}]}));
        assert!(
            to_attach(&waiting).is_empty(),
            "no UID: the pod's container is not ready"
        );
        let ready = vmi(json!({"volumeStatus": [
            {"name": "hot", "target": "", "phase": "AttachedToNode",
             "hotplugVolume": {"attachPodName": "hp", "attachPodUID": UID}},
            {"name": "root", "target": "", "phase": "AttachedToNode",
             "hotplugVolume": {"attachPodName": "hp", "attachPodUID": UID}}]}));
        assert_eq!(
            to_attach(&ready),
            [ToAttach {
                volume: "hot".into(),
                attach_pod_uid: UID.into(),
                read_only: false
            }],
            "root is no hotplug volume"
        );
    }

    #[test]
    fn devices_are_named_per_bus_as_upstream_and_a_given_name_stays() {
        let disks: Vec<kubevirt_api::v1::Disk> = serde_json::from_value(json!([
            {"name": "root", "disk": {"bus": "virtio"}},
            {"name": "cloud", "disk": {}},
            {"name": "iso", "cdrom": {}},
            {"name": "hot", "disk": {"bus": "scsi"}},
        ]))
        .unwrap();
        let names = device_names(&disks, &BTreeMap::new());
        let got: Vec<(&str, &str)> = ["root", "cloud", "iso", "hot"]
            .iter()
            .map(|n| (*n, names[*n].as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("root", "vda"),
                ("cloud", "vdb"),
                ("iso", "sda"),
                ("hot", "sdb")
            ]
        );
        // `iso` was once named sdc: it keeps it, and the next SCSI disk takes sda.
        let kept = device_names(&disks, &[("iso".to_owned(), "sdc".to_owned())].into());
        assert_eq!((kept["iso"].as_str(), kept["hot"].as_str()), ("sdc", "sda"));
        let many: Vec<kubevirt_api::v1::Disk> = (0..28)
            .map(|i| serde_json::from_value(json!({"name": format!("d{i}"), "disk": {}})).unwrap())
            .collect();
        let names = device_names(&many, &BTreeMap::new());
        assert_eq!(
            (
                names["d25"].as_str(),
                names["d26"].as_str(),
                names["d27"].as_str()
            ),
            ("vdz", "vdaa", "vdab")
        );
    }

    #[test]
    fn the_socket_is_found_only_for_a_real_uid() {
        let dir = Path::new("/pods");
        assert_eq!(
            attachment_socket(dir, UID).unwrap(),
            Path::new("/pods")
                .join(UID)
                .join("volumes/kubernetes.io~empty-dir/hotplug-disks/hp.sock")
        );
        assert!(attachment_socket(dir, "../etc").is_none());
    }

    #[test]
    fn phases_move_forward_only_and_only_for_volumes_in_the_spec() {
        let vmi = vmi(json!({"volumeStatus": [
            {"name": "hot", "target": "", "phase": "AttachedToNode"},
            {"name": "gone", "target": "", "phase": "Detaching"}]}));
        let status = serde_json::to_value(&vmi.status).unwrap();
        let phases = BTreeMap::from([
            ("hot".to_owned(), HandlerPhase::MountedToPod),
            ("gone".to_owned(), HandlerPhase::Ready),
        ]);
        let list = volume_status_with(&vmi, &status, &phases).unwrap();
        assert_eq!(list[0]["phase"], "MountedToPod");
        assert_eq!(
            list[0]["message"],
            "Volume hot has been mounted in virt-launcher pod"
        );
        assert_eq!(list[1]["phase"], "Detaching");
        let ready = BTreeMap::from([("hot".to_owned(), HandlerPhase::Ready)]);
        let mut status = status;
        status["volumeStatus"] = list;
        let list = volume_status_with(&vmi, &status, &ready).unwrap();
        assert_eq!(list[0]["phase"], "Ready");
        assert_eq!(list[0]["reason"], "VolumeReady");
        status["volumeStatus"] = list;
        let back = BTreeMap::from([("hot".to_owned(), HandlerPhase::MountedToPod)]);
        assert!(
            volume_status_with(&vmi, &status, &back).is_none(),
            "never back from Ready"
        );
    }

    #[test]
    fn a_missing_image_is_created_sparse_and_a_symlink_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("disk.img");
        let file = open_image(&image, false, Some(1 << 20)).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 1 << 20);
        assert!(
            open_image(&tmp.path().join("other.img"), false, None).is_err(),
            "size unknown"
        );
        let link = tmp.path().join("link.img");
        std::os::unix::fs::symlink(&image, &link).unwrap();
        assert!(open_image(&link, false, None).is_err());
    }
}
