//! Helpers shared by the crate's tests: finding QEMU and the test guest, killing what a
//! test started even when it fails, and polling a condition with a deadline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `qemu-system-x86_64` on `PATH`, or why a test skips.
pub(crate) fn qemu_binary() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("qemu-system-x86_64"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)".to_owned()
        })
}

/// The test guest built by `scripts/build-test-guest.sh`, or why a test skips.
pub(crate) fn test_guest() -> Result<(PathBuf, PathBuf), String> {
    let dir = match std::env::var_os("KUBEVIRT_RS_TEST_GUEST") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
                .ok_or("neither XDG_CACHE_HOME nor HOME is set")?;
            cache.join("kubevirt-rs/guest")
        }
    };
    let kernel = dir.join("vmlinux");
    let initrd = dir.join("initramfs.cpio.gz");
    if kernel.is_file() && initrd.is_file() {
        Ok((kernel, initrd))
    } else {
        Err(format!(
            "no test guest in {} (run scripts/build-test-guest.sh)",
            dir.display()
        ))
    }
}

/// Kills a process group when dropped, so a failing test leaves no QEMU behind.
pub(crate) struct ProcessGroupGuard(pub(crate) i32);

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        if self.0 > 0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Polls `condition` every 20 ms until it holds or `timeout` passes.
pub(crate) async fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
