//! The host paths of a launcher spec: checked before QEMU may open them, and the disks the
//! launcher creates (a filesystem claim's missing `disk.img`, an ephemeral volume's overlay).
//!
//! With a base directory ([`super::LauncherOptions::base_dir`]), every host path of a spec
//! (disks, kernel, initrd, EFI variables, sockets, logs) must lie below it, or a disk below the
//! claim disks directory, reached without symlinks ([`crate::safe_path`]). A disk opened from a
//! passed file (`passedFile`) names no host path QEMU opens, so it is not checked; the launcher
//! was handed the open file instead ([`super::passed_files`]). A `blockDevice` disk, and an
//! overlay's backing that is not below the claim disks directory, must be a block device
//! directly in `/dev` (where the node gives the launcher a `Block`-mode claim).

use std::path::Path;

use crate::safe_path::{check_beneath, check_parent_beneath};
use crate::spec::{Bootloader, LauncherSpec};

/// Every host path of the spec must be below `base` without symlinks; a disk may instead be
/// below `claims` (a disk to be created needs only its directory there), or be a block
/// device directly in `/dev`. A disk opened from a passed file has no host path to check.
pub(super) fn check(base: &Path, claims: Option<&Path>, spec: &LauncherSpec) -> Result<(), String> {
    let text = |e: crate::safe_path::SafePathError| e.to_string();
    for disk in spec.disks.iter().filter(|d| d.passed_file.is_none()) {
        let path = Path::new(&disk.source_path);
        if disk.block_device {
            check_block_device(&disk.name, path)?;
            continue;
        }
        if let Some(backing) = &disk.overlay_backing {
            check_backing(&disk.name, claims, Path::new(backing))?;
            // The overlay itself is created in the launcher directory.
            check_parent_beneath(base, path).map_err(text)?;
            continue;
        }
        match claims.filter(|c| path.starts_with(c)) {
            Some(claims) if disk.create_size.is_some() => {
                check_parent_beneath(claims, path).map_err(text)?;
            }
            Some(claims) => {
                check_beneath(claims, path).map_err(text)?;
            }
            None => {
                check_beneath(base, path).map_err(text)?;
            }
        }
    }
    if let Some(kernel) = &spec.firmware.kernel_boot {
        check_beneath(base, Path::new(&kernel.kernel_path)).map_err(text)?;
        if let Some(initrd) = &kernel.initrd_path {
            check_beneath(base, Path::new(initrd)).map_err(text)?;
        }
    }
    if let Bootloader::Efi(efi) = &spec.firmware.bootloader {
        check_beneath(base, Path::new(&efi.vars_path)).map_err(text)?;
    }
    let paths = &spec.paths;
    for created in [
        &paths.serial_console_socket,
        &paths.serial_log,
        &paths.qmp_socket,
        &paths.pid_file,
    ] {
        check_parent_beneath(base, Path::new(created)).map_err(text)?;
    }
    if let Some(graphics) = &spec.graphics {
        check_parent_beneath(base, Path::new(&graphics.vnc_socket)).map_err(text)?;
    }
    Ok(())
}

/// `path` is a block device (not a symlink to one) directly in `/dev`.
fn check_block_device(disk: &str, path: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    let directly_in_dev = path.parent() == Some(Path::new("/dev"))
        && path
            .file_name()
            .is_some_and(|n| n != "." && n != ".." && !n.is_empty());
    let is_block =
        || std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if directly_in_dev && is_block() {
        Ok(())
    } else {
        Err(format!(
            "disk {disk:?}: {} is not a block device directly in /dev",
            path.display()
        ))
    }
}

/// An overlay's backing: an existing image below `claims` reached without symlinks, or a
/// block device directly in `/dev`. A missing image is named as such: upstream requires an
/// ephemeral volume's claim to hold its disk image.
fn check_backing(disk: &str, claims: Option<&Path>, backing: &Path) -> Result<(), String> {
    if backing.starts_with("/dev") {
        return check_block_device(disk, backing);
    }
    let Some(claims) = claims.filter(|c| backing.starts_with(c)) else {
        return Err(format!(
            "disk {disk:?}: the overlay's backing {} is not below the claim disks directory",
            backing.display()
        ));
    };
    if std::fs::symlink_metadata(backing).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Err(format!(
            "disk {disk:?}: {} does not exist: the claim of an ephemeral volume must hold its disk image",
            backing.display()
        ));
    }
    check_beneath(claims, backing)
        .map(drop)
        .map_err(|e| format!("disk {disk:?}: {e}"))?;
    let regular = std::fs::symlink_metadata(backing).is_ok_and(|m| m.is_file());
    if regular {
        Ok(())
    } else {
        Err(format!(
            "disk {disk:?}: the overlay's backing {} is not a regular file",
            backing.display()
        ))
    }
}

/// Creates the directory of each overlay disk that is missing (the launcher directory's
/// `disks/`, which virt-handler makes only for files it writes itself), so that [`check`]
/// can check it. Only plain absolute paths (no `..`) are created.
pub(super) fn create_overlay_dirs(spec: &LauncherSpec) -> Result<(), String> {
    for disk in spec.disks.iter().filter(|d| d.overlay_backing.is_some()) {
        let path = Path::new(&disk.source_path);
        let plain = path.is_absolute()
            && path
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir));
        let Some(parent) = path.parent().filter(|_| plain) else {
            return Err(format!(
                "disk {:?}: {} is not a plain absolute path",
                disk.name, disk.source_path
            ));
        };
        crate::private_fs::create_dir_all(parent)
            .map_err(|e| format!("disk {:?}: creating {}: {e}", disk.name, parent.display()))?;
    }
    Ok(())
}

/// Creates each missing overlay disk (`overlayBacking`: an ephemeral volume) as an empty
/// qcow2 over its backing, sized as the backing, mode `0600`, never through a symlink; an
/// existing overlay (a restarted launcher of the same pod) is kept with what the guest wrote.
/// The backing is checked as [`check`] does, so a missing `disk.img` is named even without a
/// base directory.
pub(super) fn create_overlays(claims: Option<&Path>, spec: &LauncherSpec) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    for disk in &spec.disks {
        let Some(backing) = &disk.overlay_backing else {
            continue;
        };
        let fail = |what: &str, e: std::io::Error| format!("disk {:?}: {what}: {e}", disk.name);
        let path = Path::new(&disk.source_path);
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_file() => continue,
            Ok(_) => {
                return Err(format!(
                    "disk {:?}: {} exists and is not a regular file",
                    disk.name, disk.source_path
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail(&disk.source_path, e)),
        }
        check_backing(&disk.name, claims, Path::new(backing))?;
        let size = crate::overlay::virtual_size(Path::new(backing), false)
            .map_err(|e| fail(&format!("measuring {backing}"), e))?;
        let bytes = crate::overlay::overlay_bytes(backing, "raw", size)
            .map_err(|e| fail("the overlay header", e))?;
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".preparing");
        let temporary = std::path::PathBuf::from(temporary);
        let _ = std::fs::remove_file(&temporary);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&temporary)
            .and_then(|mut file| {
                file.write_all(&bytes)?;
                file.sync_all()
            })
            .and_then(|()| std::fs::rename(&temporary, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temporary);
            return Err(fail(&format!("writing the overlay {}", path.display()), e));
        }
        tracing::info!(disk = %disk.name, overlay = %path.display(), %backing, size, "created the ephemeral volume's overlay");
    }
    Ok(())
}

/// Creates each missing disk that has a `create_size` (a filesystem claim's `disk.img`) as a
/// sparse file of that size, mode `0600`, never through a symlink; only below `claims`.
pub(super) fn create_claim_disks(claims: Option<&Path>, spec: &LauncherSpec) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    for disk in &spec.disks {
        let Some(size) = disk.create_size else {
            continue;
        };
        let path = Path::new(&disk.source_path);
        if !claims.is_some_and(|c| path.starts_with(c)) {
            return Err(format!(
                "disk {:?}: {} is not below the claim disks directory; it cannot be created",
                disk.name, disk.source_path
            ));
        }
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path);
        match created {
            Ok(file) => {
                file.set_len(size)
                    .map_err(|e| format!("disk {:?}: sizing {}: {e}", disk.name, path.display()))?;
                tracing::info!(disk = %disk.name, path = %path.display(), size, "created the claim's disk image");
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let regular =
                    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file());
                if !regular {
                    return Err(format!(
                        "disk {:?}: {} exists and is not a regular file",
                        disk.name,
                        path.display()
                    ));
                }
            }
            Err(e) => {
                return Err(format!(
                    "disk {:?}: creating {}: {e}",
                    disk.name,
                    path.display()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with(disks: &[crate::spec::Disk], dir: &Path) -> LauncherSpec {
        let path = |name: &str| dir.join(name).display().to_string();
        serde_json::from_value(serde_json::json!({
            "vmi": {"name": "v", "namespace": "ns", "uid": "u"},
            "machineType": "q35", "accel": "tcg",
            "cpu": {"sockets": 1, "cores": 1, "threads": 1, "model": "host-model"},
            "memory": {"guestBytes": 134217728},
            "firmware": {"bootloader": "bios"},
            "disks": disks,
            "interfaces": [], "hotplugPorts": 0,
            "paths": {"serialConsoleSocket": path("s.sock"), "serialLog": path("s.log"),
                      "qmpSocket": path("q.sock"), "pidFile": path("q.pid")}
        }))
        .unwrap()
    }

    fn claim_disk(path: &Path, create_size: Option<u64>) -> crate::spec::Disk {
        serde_json::from_value(serde_json::json!({
            "name": "d", "sourcePath": path.display().to_string(), "createSize": create_size
        }))
        .unwrap()
    }

    #[test]
    fn a_missing_claim_disk_is_created_sparse_once_and_only_below_the_claims_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let (pod, claims) = (tmp.path().join("pod"), tmp.path().join("claims"));
        std::fs::create_dir_all(&pod).unwrap();
        std::fs::create_dir_all(claims.join("d")).unwrap();
        let image = claims.join("d/disk.img");
        let spec = spec_with(&[claim_disk(&image, Some(64 << 20))], &pod);
        check(&pod, Some(&claims), &spec).unwrap();
        create_claim_disks(Some(&claims), &spec).unwrap();
        let meta = std::fs::metadata(&image).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        // Sparse: nothing written yet.
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&meta) < 64,
            "{meta:?}"
        );
        // An existing image is kept as it is (the data survives restarts).
        std::fs::write(&image, b"guest data").unwrap();
        create_claim_disks(Some(&claims), &spec).unwrap();
        assert_eq!(std::fs::read(&image).unwrap(), b"guest data");

        // Not below the claims directory: refused, nothing created.
        let outside = pod.join("other.img");
        let spec = spec_with(&[claim_disk(&outside, Some(1 << 20))], &pod);
        assert!(create_claim_disks(Some(&claims), &spec).is_err());
        assert!(create_claim_disks(None, &spec).is_err());
        assert!(!outside.exists());

        // A symlink where the image should be is not followed.
        std::fs::create_dir_all(claims.join("l")).unwrap();
        let target = tmp.path().join("elsewhere.img");
        std::os::unix::fs::symlink(&target, claims.join("l/disk.img")).unwrap();
        let spec = spec_with(
            &[claim_disk(&claims.join("l/disk.img"), Some(1 << 20))],
            &pod,
        );
        assert!(check(&pod, Some(&claims), &spec).is_err());
        assert!(create_claim_disks(Some(&claims), &spec).is_err());
        assert!(!target.exists());
    }

    #[test]
    fn a_disk_from_a_passed_file_is_not_checked_by_its_path() {
        let tmp = tempfile::tempdir().unwrap();
        let pod = tmp.path().join("pod");
        std::fs::create_dir_all(&pod).unwrap();
        let outside = tmp.path().join("elsewhere.img");
        std::fs::write(&outside, b"").unwrap();
        let mut disk = claim_disk(&outside, None);
        let spec = spec_with(std::slice::from_ref(&disk), &pod);
        assert!(check(&pod, None, &spec).is_err(), "by path: refused");
        disk.passed_file = Some("vol1".into());
        let spec = spec_with(&[disk], &pod);
        check(&pod, None, &spec).unwrap();
    }

    fn overlay_disk(path: &Path, backing: &Path) -> crate::spec::Disk {
        serde_json::from_value(serde_json::json!({
            "name": "eph", "sourcePath": path.display().to_string(), "format": "qcow2",
            "overlayBacking": backing.display().to_string(),
        }))
        .unwrap()
    }

    #[test]
    fn an_ephemeral_overlay_is_made_once_over_the_claims_image_which_must_exist() {
        let tmp = tempfile::tempdir().unwrap();
        let (pod, claims) = (tmp.path().join("pod"), tmp.path().join("claims"));
        std::fs::create_dir_all(&pod).unwrap();
        std::fs::create_dir_all(claims.join("eph")).unwrap();
        let image = claims.join("eph/disk.img");
        std::fs::write(&image, vec![7u8; 3 << 20]).unwrap();
        let overlay = pod.join("disks/eph.qcow2");
        let spec = spec_with(&[overlay_disk(&overlay, &image)], &pod);
        create_overlay_dirs(&spec).unwrap();
        check(&pod, Some(&claims), &spec).unwrap();
        create_overlays(Some(&claims), &spec).unwrap();
        assert_eq!(
            crate::overlay::virtual_size(&overlay, true).unwrap(),
            3 << 20
        );
        let header = std::fs::read(&overlay).unwrap();
        let name = image.display().to_string();
        assert!(
            header.windows(name.len()).any(|w| w == name.as_bytes()),
            "the header names the claim's image by its absolute path"
        );
        assert_eq!(std::fs::read(&image).unwrap(), vec![7u8; 3 << 20]);
        // An existing overlay keeps what the guest wrote (a restarted launcher).
        std::fs::write(&overlay, b"guest writes").unwrap();
        create_overlays(Some(&claims), &spec).unwrap();
        assert_eq!(std::fs::read(&overlay).unwrap(), b"guest writes");

        // A claim without its image: named, nothing created.
        std::fs::create_dir_all(claims.join("empty")).unwrap();
        let none = pod.join("disks/none.qcow2");
        let spec = spec_with(&[overlay_disk(&none, &claims.join("empty/disk.img"))], &pod);
        let err = check(&pod, Some(&claims), &spec).unwrap_err();
        assert!(
            err.contains("does not exist") && err.contains("must hold its disk image"),
            "{err}"
        );
        let err = create_overlays(Some(&claims), &spec).unwrap_err();
        assert!(err.contains("does not exist"), "{err}");
        assert!(!none.exists());

        // A backing outside the claims, or reached through a symlink: refused.
        let outside = tmp.path().join("host.img");
        std::fs::write(&outside, b"host").unwrap();
        let spec = spec_with(&[overlay_disk(&none, &outside)], &pod);
        assert!(check(&pod, Some(&claims), &spec).is_err());
        assert!(create_overlays(Some(&claims), &spec).is_err());
        std::os::unix::fs::symlink(&outside, claims.join("empty/disk.img")).unwrap();
        let spec = spec_with(&[overlay_disk(&none, &claims.join("empty/disk.img"))], &pod);
        assert!(check(&pod, Some(&claims), &spec).is_err());
        assert!(create_overlays(Some(&claims), &spec).is_err());
        assert!(!none.exists());
    }

    #[test]
    fn a_block_disk_must_be_a_block_device_directly_in_dev() {
        use std::os::unix::fs::FileTypeExt;
        assert!(
            check_block_device("d", Path::new("/dev/null")).is_err(),
            "a character device"
        );
        assert!(check_block_device("d", Path::new("/tmp")).is_err());
        assert!(check_block_device("d", Path::new("/dev/../dev/loop0")).is_err());
        let loop0 = Path::new("/dev/loop0");
        if std::fs::symlink_metadata(loop0).is_ok_and(|m| m.file_type().is_block_device()) {
            check_block_device("d", loop0).unwrap();
            let tmp = tempfile::tempdir().unwrap();
            let mut disk = claim_disk(loop0, None);
            disk.block_device = true;
            check(tmp.path(), None, &spec_with(&[disk], tmp.path())).unwrap();
        }
    }
}
