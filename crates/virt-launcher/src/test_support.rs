//! Helpers shared by the crate's tests: killing what a test started even when it fails, and
//! polling a condition with a deadline. QEMU and the test guest come from `test-prerequisites`.

use std::time::{Duration, Instant};

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

/// The permission bits of `path` (without following a final symlink).
pub(crate) fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

/// Clears the umask of this test process (nextest runs each test in its own process).
pub(crate) fn permissive_umask() {
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
}
