//! Performing the [`FileAction`]s of a [`super::PreparedSpec`] in the pod directory:
//! copies, links, sparse files, qcow2 overlays ([`super::overlay`]) and cloud-init disks,
//! each written under a temporary name and renamed, and left alone once it exists.

use std::path::{Path, PathBuf};

use virt_launcher::spec::DiskFormat;

use super::{FileAction, SpecError, overlay};

/// Whether files in `dir` can be opened with `O_DIRECT` (false on tmpfs).
pub fn supports_direct_io(dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let probe = dir.join(".direct-io-probe");
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Performs `files` in order; a target that exists already is left as it is.
///
/// # Errors
/// [`SpecError::Prepare`] or [`SpecError::Tool`] for the first action that fails.
pub fn prepare_files(files: &[FileAction]) -> Result<(), SpecError> {
    for action in files {
        let target = action.target();
        if std::fs::symlink_metadata(target).is_ok() {
            continue;
        }
        let io = |source| SpecError::Prepare {
            path: target.to_owned(),
            source,
        };
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut temporary = target.to_owned().into_os_string();
        temporary.push(".preparing");
        let temporary = PathBuf::from(temporary);
        let _ = std::fs::remove_file(&temporary);
        match action {
            FileAction::Copy { from, .. } => {
                std::fs::copy(from, &temporary).map_err(io)?;
            }
            FileAction::Link { from, .. } => {
                if std::fs::hard_link(from, &temporary).is_err() {
                    std::fs::copy(from, &temporary).map_err(io)?;
                }
            }
            FileAction::Share { from, .. } => {
                std::fs::hard_link(from, &temporary).map_err(|e| {
                    io(std::io::Error::new(
                        e.kind(),
                        format!(
                            "{} cannot be shared with the pod directory (a copy would not keep the guest's writes): {e}",
                            from.display()
                        ),
                    ))
                })?;
            }
            FileAction::Sparse { size, .. } => {
                let file = std::fs::File::create(&temporary).map_err(io)?;
                file.set_len(*size).map_err(io)?;
            }
            FileAction::CloudInit { files, .. } => build_cidata(&temporary, files)?,
            FileAction::ConfigIso { label, source, .. } => {
                build_config_iso(&temporary, label.as_deref(), source)?;
            }
            FileAction::ConfigDrive { files, .. } => build_config_drive(&temporary, files)?,
            FileAction::Overlay {
                backing,
                backing_format,
                ..
            } => {
                let qcow2 = *backing_format == DiskFormat::Qcow2;
                let size = overlay::virtual_size(backing, qcow2).map_err(io)?;
                let relative = target
                    .parent()
                    .and_then(|dir| backing.strip_prefix(dir).ok())
                    .map(|r| r.display().to_string())
                    .ok_or_else(|| {
                        SpecError::Invalid(format!(
                            "the backing disk {} is not beside its overlay",
                            backing.display()
                        ))
                    })?;
                let format = if qcow2 { "qcow2" } else { "raw" };
                overlay::write_overlay(&temporary, &relative, format, size).map_err(io)?;
            }
        }
        std::fs::rename(&temporary, target).map_err(io)?;
    }
    Ok(())
}

fn run_tool(program: &str, args: &[&std::ffi::OsStr]) -> Result<(), SpecError> {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| SpecError::Tool {
            program: program.to_owned(),
            message: e.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(SpecError::Tool {
            program: program.to_owned(),
            message: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

/// The files of a kubelet volume directory (configMap, secret, downwardAPI): each top-level
/// name but the atomic writer's `..data` and timestamped directories, resolved through its
/// link and required to stay inside the directory; `(name, path)` sorted by name.
pub(super) fn volume_files(source: &Path) -> Result<Vec<(String, PathBuf)>, SpecError> {
    let io = |source_err, path: &Path| SpecError::Prepare {
        path: path.to_owned(),
        source: source_err,
    };
    let root = std::fs::canonicalize(source).map_err(|e| io(e, source))?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&root).map_err(|e| io(e, &root))? {
        let entry = entry.map_err(|e| io(e, &root))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") {
            continue;
        }
        let resolved = std::fs::canonicalize(entry.path()).map_err(|e| io(e, &entry.path()))?;
        if !resolved.starts_with(&root) {
            return Err(SpecError::Invalid(format!(
                "{} leaves its volume directory",
                entry.path().display()
            )));
        }
        files.push((name, resolved));
    }
    files.sort();
    Ok(files)
}

/// `genisoimage` writing an ISO 9660 image with Joliet and Rock Ridge (as upstream) to
/// `image`, its volume id `label` when given, of `paths` (graft points or directories).
fn genisoimage(
    image: &Path,
    label: Option<&str>,
    paths: Vec<std::ffi::OsString>,
) -> Result<(), SpecError> {
    let mut args: Vec<std::ffi::OsString> = vec!["-quiet".into(), "-output".into(), image.into()];
    if let Some(label) = label {
        args.push("-volid".into());
        args.push(label.into());
    }
    for flag in ["-joliet", "-rock", "-graft-points"] {
        args.push(flag.into());
    }
    args.extend(paths);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsString::as_os_str).collect();
    run_tool("genisoimage", &args)
}

/// An OpenStack config drive (label `config-2`) holding `files` at their relative paths,
/// staged beside the image.
fn build_config_drive(image: &Path, files: &[(String, String)]) -> Result<(), SpecError> {
    let staging = image.with_extension("d");
    let io = |source| SpecError::Prepare {
        path: staging.clone(),
        source,
    };
    let plain = |relative: &str| {
        Path::new(relative)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
    };
    if let Some((relative, _)) = files.iter().find(|(relative, _)| !plain(relative)) {
        return Err(SpecError::Invalid(format!(
            "config drive file {relative:?} is not a plain relative path"
        )));
    }
    let _ = std::fs::remove_dir_all(&staging);
    for (relative, content) in files {
        let local = staging.join(relative);
        if let Some(parent) = local.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&local, content).map_err(io)?;
    }
    let built = genisoimage(image, Some("config-2"), vec![staging.clone().into()]);
    let _ = std::fs::remove_dir_all(&staging);
    built
}

/// An ISO 9660 image of the volume's files, its volume id `label` when given.
fn build_config_iso(image: &Path, label: Option<&str>, source: &Path) -> Result<(), SpecError> {
    let files = volume_files(source)?;
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    for (name, path) in &files {
        // Graft points escape `=` and `\` in names.
        let name = name.replace('\\', "\\\\").replace('=', "\\=");
        let mut graft = std::ffi::OsString::from(format!("{name}="));
        graft.push(path);
        args.push(graft);
    }
    if files.is_empty() {
        // genisoimage wants at least one path: an empty directory gives an empty image.
        args.push(format!("={}", source.display()).into());
    }
    genisoimage(image, label, args)
}

/// A 2 MiB FAT image labelled `cidata` with the NoCloud files.
fn build_cidata(image: &Path, files: &[(String, String)]) -> Result<(), SpecError> {
    let staging = image.with_extension("d");
    let io = |source| SpecError::Prepare {
        path: staging.clone(),
        source,
    };
    std::fs::create_dir_all(&staging).map_err(io)?;
    run_tool(
        "mkfs.vfat",
        &[
            "-n".as_ref(),
            "cidata".as_ref(),
            "-C".as_ref(),
            image.as_os_str(),
            "2048".as_ref(),
        ],
    )?;
    for (name, content) in files {
        let local = staging.join(name);
        std::fs::write(&local, content).map_err(io)?;
        let dest = format!("::{name}");
        run_tool(
            "mcopy",
            &[
                "-o".as_ref(),
                "-i".as_ref(),
                image.as_os_str(),
                local.as_os_str(),
                dest.as_ref(),
            ],
        )?;
    }
    let _ = std::fs::remove_dir_all(&staging);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_shared_file_is_the_same_inode_and_never_a_copy() {
        let disk_side = tempfile::tempdir().unwrap();
        let from = disk_side.path().join("host.img");
        std::fs::write(&from, b"host disk").unwrap();
        let to = disk_side.path().join("pod/disks/d.img");
        prepare_files(&[FileAction::Share {
            from: from.clone(),
            to: to.clone(),
        }])
        .unwrap();
        let (a, b) = (
            std::fs::metadata(&from).unwrap(),
            std::fs::metadata(&to).unwrap(),
        );
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));

        // Across filesystems (a tmpfs against the temporary directory's) it fails and leaves
        // nothing behind, where a `Link` would copy.
        let shm = Path::new("/dev/shm");
        let memory = tempfile::tempdir_in(shm).unwrap();
        let elsewhere = memory.path().join("host.img");
        std::fs::write(&elsewhere, b"host disk").unwrap();
        let other_fs = std::fs::metadata(memory.path()).unwrap().dev() != a.dev();
        assert!(
            other_fs,
            "/dev/shm is another filesystem than the temporary directory"
        );
        let to = disk_side.path().join("pod/disks/e.img");
        let err = prepare_files(&[FileAction::Share {
            from: elsewhere,
            to: to.clone(),
        }])
        .unwrap_err();
        assert!(
            err.to_string().contains("cannot be shared")
                || format!("{err:?}").contains("cannot be shared"),
            "{err:?}"
        );
        assert!(!to.exists());
    }

    /// A kubelet volume directory as its atomic writer lays it out: `..<timestamp>/` with the
    /// files, `..data` pointing at it, one link per key.
    fn kubelet_volume(dir: &Path, files: &[(&str, &str)]) {
        let stamp = dir.join("..2026_12_06_10_00_00.000000001");
        std::fs::create_dir_all(&stamp).unwrap();
        for (name, content) in files {
            std::fs::write(stamp.join(name), content).unwrap();
        }
        std::os::unix::fs::symlink("..2026_12_06_10_00_00.000000001", dir.join("..data")).unwrap();
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
    }

    #[test]
    fn a_config_iso_holds_the_volumes_keys_under_its_label_and_nothing_from_outside() {
        let tool = test_prerequisites::command("genisoimage", "genisoimage");
        if test_prerequisites::available(tool).is_none() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("kubernetes.io~configmap/cfg");
        kubelet_volume(
            &source,
            &[("greeting", "hello from the map\n"), ("a=b", "odd name\n")],
        );
        let image = tmp.path().join("pod/disks/cfg.iso");
        prepare_files(&[FileAction::ConfigIso {
            path: image.clone(),
            label: Some("CFGLABEL".into()),
            source: source.clone(),
        }])
        .unwrap();
        let bytes = std::fs::read(&image).unwrap();
        // The primary volume descriptor (sector 16) holds the volume id at offset 40.
        let volume_id = &bytes[16 * 2048 + 40..16 * 2048 + 72];
        assert_eq!(String::from_utf8_lossy(volume_id).trim_end(), "CFGLABEL");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("hello from the map"));
        assert!(text.contains("odd name"));
        assert!(
            !text.contains("..data"),
            "the atomic writer's links stay out"
        );

        // A key that leads out of the volume directory is refused, nothing is written.
        let outside = tmp.path().join("secret.txt");
        std::fs::write(&outside, "not yours").unwrap();
        let evil = tmp.path().join("kubernetes.io~configmap/evil");
        std::fs::create_dir_all(&evil).unwrap();
        std::os::unix::fs::symlink(&outside, evil.join("key")).unwrap();
        let evil_image = tmp.path().join("pod/disks/evil.iso");
        let err = prepare_files(&[FileAction::ConfigIso {
            path: evil_image.clone(),
            label: None,
            source: evil,
        }])
        .unwrap_err();
        assert!(
            err.to_string().contains("leaves its volume directory"),
            "{err}"
        );
        assert!(!evil_image.exists());
    }

    #[test]
    fn a_config_drive_is_labelled_config_2_and_takes_only_plain_relative_paths() {
        let tool = test_prerequisites::command("genisoimage", "genisoimage");
        if test_prerequisites::available(tool).is_none() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("disks/cd.iso");
        prepare_files(&[FileAction::ConfigDrive {
            path: image.clone(),
            files: vec![(
                "openstack/latest/user_data".into(),
                "drive user data\n".into(),
            )],
        }])
        .unwrap();
        let bytes = std::fs::read(&image).unwrap();
        let volume_id = &bytes[16 * 2048 + 40..16 * 2048 + 72];
        assert_eq!(String::from_utf8_lossy(volume_id).trim_end(), "config-2");
        assert!(String::from_utf8_lossy(&bytes).contains("drive user data"));
        assert!(
            !tmp.path().join("disks/cd.d").exists(),
            "the staging is gone"
        );

        let escape = tmp.path().join("disks/bad.iso");
        let err = prepare_files(&[FileAction::ConfigDrive {
            path: escape.clone(),
            files: vec![("../outside".into(), "x".into())],
        }])
        .unwrap_err();
        assert!(err.to_string().contains("plain relative path"), "{err}");
        assert!(!escape.exists() && !tmp.path().join("outside").exists());
    }
}
