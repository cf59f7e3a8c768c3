//! Loop devices for the local provisioner's `Block`-mode volumes, through util-linux's
//! `losetup` (always installed: util-linux is essential on Debian): a volume's image file is
//! attached at provisioning, which is where a machine without loop devices says so, and every
//! device attached to it is detached when the volume is released.
//!
//! # Guarantees
//! - A file is attached once: an existing attachment is reused (`losetup --associated` matches
//!   the file by device and inode, not by name).
//!
//! # Caveats
//! - A device still open (a guest's QEMU) is detached by the kernel once it is closed
//!   (`losetup -d` sets auto-clear), which the pvc-protection finalizer makes moot here.

use std::path::{Path, PathBuf};

/// Runs `losetup args`; its stdout, or its stderr (or the spawn error) as the error.
async fn losetup(args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let output = tokio::process::Command::new("losetup")
        .args(args)
        .output()
        .await
        .map_err(|e| format!("running losetup: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        Err(if stderr.is_empty() {
            format!("losetup failed ({})", output.status)
        } else {
            stderr
        })
    }
}

/// The loop devices `file` is attached to.
///
/// # Errors
/// `losetup` could not be run or failed; the message says why.
pub async fn attached(file: &Path) -> Result<Vec<PathBuf>, String> {
    let out = losetup(&[
        "--list".as_ref(),
        "--noheadings".as_ref(),
        "--output".as_ref(),
        "NAME".as_ref(),
        "--associated".as_ref(),
        file.as_os_str(),
    ])
    .await?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("/dev/"))
        .map(PathBuf::from)
        .collect())
}

/// The loop device `file` is attached to, attaching it to a free one when it is not.
///
/// # Errors
/// No loop device could be set up (no `/dev/loop-control`, none free, no permission); the
/// message is `losetup`'s.
pub async fn attach(file: &Path) -> Result<PathBuf, String> {
    if let Some(device) = attached(file).await?.into_iter().next() {
        return Ok(device);
    }
    let out = losetup(&["--find".as_ref(), "--show".as_ref(), file.as_os_str()]).await?;
    let device = out.trim();
    if device.starts_with("/dev/") {
        Ok(PathBuf::from(device))
    } else {
        Err(format!("losetup named no device: {out:?}"))
    }
}

/// Detaches every loop device `file` is attached to (nothing when there is none, or when the
/// file is gone).
///
/// # Errors
/// A device could not be detached; the message is `losetup`'s.
pub async fn detach_all(file: &Path) -> Result<(), String> {
    if std::fs::symlink_metadata(file).is_err() {
        return Ok(());
    }
    for device in attached(file).await? {
        losetup(&["--detach".as_ref(), device.as_os_str()]).await?;
        tracing::info!(device = %device.display(), file = %file.display(), "detached the loop device");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether loop devices can be set up here (root with `/dev/loop-control`).
    fn loop_devices_work() -> bool {
        Path::new("/dev/loop-control").exists() && nix_is_root()
    }

    fn nix_is_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .map(|l| l.split_whitespace().nth(1) == Some("0"))
            })
            .unwrap_or(false)
    }

    #[tokio::test]
    async fn a_file_that_cannot_be_attached_is_an_error_with_losetups_reason() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = attach(&tmp.path().join("missing.img"))
            .await
            .expect_err("nothing to attach");
        assert!(
            err.contains("missing.img") || err.contains("losetup"),
            "the reason names the file or losetup: {err}"
        );
    }

    #[tokio::test]
    async fn a_file_is_attached_once_and_all_its_devices_are_detached() {
        if !loop_devices_work() {
            eprintln!("skipped: loop devices need root and /dev/loop-control");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("block.img");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(4 << 20))
            .expect("image");
        assert!(attached(&file).await.expect("listed").is_empty());
        let device = attach(&file).await.expect("attached");
        assert_eq!(attach(&file).await.expect("again"), device, "reused");
        assert_eq!(attached(&file).await.expect("listed"), vec![device.clone()]);
        detach_all(&file).await.expect("detached");
        assert!(attached(&file).await.expect("listed").is_empty());
        detach_all(&tmp.path().join("gone.img"))
            .await
            .expect("nothing to do");
    }
}
