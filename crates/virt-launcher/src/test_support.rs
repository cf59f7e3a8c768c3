//! Helpers shared by the crate's tests: killing what a test started even when it fails,
//! polling a condition with a deadline, and a pipe that tells when a descriptor was closed.
//! QEMU and the test guest come from `test-prerequisites`.

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

/// A pipe: its read end reports end of file once every copy of the write end is closed, which
/// tells a test that a descriptor it passed on was closed.
pub(crate) fn pipe() -> (tokio::net::unix::pipe::Receiver, std::os::fd::OwnedFd) {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    let read = tokio::net::unix::pipe::Receiver::from_owned_fd(read).expect("pipe read end");
    (read, write)
}

/// Waits (up to 10 s) until every copy of the pipe's write end is closed.
pub(crate) async fn assert_closed(read: &mut tokio::net::unix::pipe::Receiver) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), read.read(&mut buf))
        .await
        .expect("a copy of the write end is still open")
        .expect("read the pipe");
    assert_eq!(n, 0, "end of file");
}
