//! The block device of a file-backed `Block` volume: the loop device the file is attached to,
//! attached now when it is not (after a reboot, or a volume made by hand), as kubelet attaches
//! a loop device to a block volume whose path is a regular file. Through util-linux's
//! `losetup` (essential on Debian); the volume's owner (the local provisioner) detaches it when
//! the volume is released.

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

/// The loop device `file` is attached to (matched by device and inode), attaching it to a
/// free one when it is attached to none.
///
/// # Errors
/// `losetup` failed (no loop devices, none free, no permission); the message is its own.
pub async fn device_for(file: &Path) -> Result<PathBuf, String> {
    let listed = losetup(&[
        "--list".as_ref(),
        "--noheadings".as_ref(),
        "--output".as_ref(),
        "NAME".as_ref(),
        "--associated".as_ref(),
        file.as_os_str(),
    ])
    .await?;
    if let Some(device) = listed
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("/dev/"))
    {
        return Ok(PathBuf::from(device));
    }
    let out = losetup(&["--find".as_ref(), "--show".as_ref(), file.as_os_str()]).await?;
    let device = out.trim();
    if device.starts_with("/dev/") {
        tracing::info!(%device, file = %file.display(), "attached a block volume's image");
        Ok(PathBuf::from(device))
    } else {
        Err(format!("losetup named no device: {out:?}"))
    }
}
