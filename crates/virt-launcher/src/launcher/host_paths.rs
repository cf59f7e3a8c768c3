//! The host paths of a launcher spec: checked before QEMU may open them, and the claim disks
//! the launcher creates.
//!
//! With a base directory ([`super::LauncherOptions::base_dir`]), every host path of a spec
//! (disks, kernel, initrd, EFI variables, sockets, logs) must lie below it, or a disk below the
//! claim disks directory, reached without symlinks ([`crate::safe_path`]). A disk opened from a
//! passed file (`passedFile`) names no host path QEMU opens, so it is not checked; the launcher
//! was handed the open file instead ([`super::passed_files`]).

use std::path::Path;

use crate::safe_path::{SafePathError, check_beneath, check_parent_beneath};
use crate::spec::{Bootloader, LauncherSpec};

/// Every host path of the spec must be below `base` without symlinks; a disk may instead be
/// below `claims` (a disk to be created needs only its directory there). A disk opened from a
/// passed file has no host path to check.
pub(super) fn check(
    base: &Path,
    claims: Option<&Path>,
    spec: &LauncherSpec,
) -> Result<(), SafePathError> {
    for disk in spec.disks.iter().filter(|d| d.passed_file.is_none()) {
        let path = Path::new(&disk.source_path);
        match claims.filter(|c| path.starts_with(c)) {
            Some(claims) if disk.create_size.is_some() => {
                check_parent_beneath(claims, path)?;
            }
            Some(claims) => {
                check_beneath(claims, path)?;
            }
            None => {
                check_beneath(base, path)?;
            }
        }
    }
    if let Some(kernel) = &spec.firmware.kernel_boot {
        check_beneath(base, Path::new(&kernel.kernel_path))?;
        if let Some(initrd) = &kernel.initrd_path {
            check_beneath(base, Path::new(initrd))?;
        }
    }
    if let Bootloader::Efi(efi) = &spec.firmware.bootloader {
        check_beneath(base, Path::new(&efi.vars_path))?;
    }
    let paths = &spec.paths;
    for created in [
        &paths.serial_console_socket,
        &paths.serial_log,
        &paths.qmp_socket,
        &paths.pid_file,
    ] {
        check_parent_beneath(base, Path::new(created))?;
    }
    if let Some(graphics) = &spec.graphics {
        check_parent_beneath(base, Path::new(&graphics.vnc_socket))?;
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
}
