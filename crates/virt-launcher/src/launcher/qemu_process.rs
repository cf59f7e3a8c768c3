//! How the launcher prepares QEMU's process before `exec`.
//!
//! - **QEMU dies with its launcher**: it is started with `PR_SET_PDEATHSIG` = `SIGKILL`, so the
//!   kernel kills it the moment the launcher dies, however it dies (`kill -9`, a crash, an OOM
//!   kill). Without it a dead launcher leaves QEMU running with nobody supervising it, after its
//!   pod is gone, holding its disks open.
//! - **QEMU's files are owner-only**: it runs with umask `077`, so the sockets it binds (QMP,
//!   serial console, VNC) and the files it creates (serial log) are `0600` whatever the
//!   launcher's umask.
//! - **QEMU inherits the passed files of its boot disks, and nothing else**: the launcher's
//!   descriptors are close-on-exec; [`inherit`] clears the flag on the chosen ones in the child
//!   only, so that `-add-fd fd=N` finds them (QEMU refuses a close-on-exec one).
//!
//! # Caveats
//! - Linux delivers the parent-death signal when the *thread* that forked the child exits. QEMU
//!   is spawned from a task on the launcher's multi-threaded tokio runtime, whose worker threads
//!   live as long as the runtime, that is as long as the launcher; never spawn QEMU from a
//!   `spawn_blocking` thread (those end when idle).
//! - Stopping the pod's process group still stops both; this only covers the launcher dying
//!   alone.

use std::io;

use nix::sys::signal::Signal;
use nix::sys::stat::{Mode, umask};
use nix::unistd::{Pid, getpid, getppid};

use crate::private_fs::CHILD_UMASK;

/// Makes the child of `command` receive `SIGKILL` when the launcher (this process) dies, and
/// gives it the umask `077`.
///
/// The child checks, after setting the signal, that its parent is still this process: a
/// launcher that died between `fork` and `prctl` would send no signal, so the exec is refused
/// instead (`ESRCH`) and QEMU never starts without a launcher.
#[allow(unsafe_code)]
pub(super) fn confine(command: &mut tokio::process::Command) {
    let launcher: Pid = getpid();
    // SAFETY: the closure runs in the forked child before `exec`. It only makes the system
    // calls `umask`, `prctl` and `getppid` (async-signal-safe), takes no lock and does not
    // allocate: errors are built from raw OS error numbers.
    unsafe {
        command.pre_exec(move || {
            umask(Mode::from_bits_truncate(CHILD_UMASK));
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if getppid() != launcher {
                return Err(io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Lets the child of `command` inherit the descriptors `fds` under their numbers: the
/// close-on-exec flag is cleared in the child only. The caller keeps them open until the
/// child has been spawned.
#[allow(unsafe_code)]
pub(super) fn inherit(command: &mut tokio::process::Command, fds: Vec<std::os::fd::RawFd>) {
    if fds.is_empty() {
        return;
    }
    // SAFETY: the closure runs in the forked child before `exec`. It only makes the system
    // call `fcntl` (async-signal-safe) on descriptors the parent holds open until the spawn
    // has returned, takes no lock and does not allocate.
    unsafe {
        command.pre_exec(move || {
            for fd in &fds {
                if nix::libc::fcntl(*fd, nix::libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Raises the child's soft limit of open files to the hard limit: passt holds one socket per
/// forwarded port and protocol (tens of thousands when it forwards every port).
#[allow(unsafe_code)]
pub(super) fn raise_open_files(command: &mut tokio::process::Command) {
    // SAFETY: the closure runs in the forked child before `exec`. It only makes the system
    // calls `getrlimit` and `setrlimit` (async-signal-safe), takes no lock and does not
    // allocate.
    unsafe {
        command.pre_exec(|| {
            let mut limit = nix::libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &raw mut limit) == 0 {
                limit.rlim_cur = limit.rlim_max;
                nix::libc::setrlimit(nix::libc::RLIMIT_NOFILE, &raw const limit);
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Command, Stdio};

    use super::*;

    /// Set in the environment of the helper process that plays the launcher.
    const HELPER_ENV: &str = "VIRT_LAUNCHER_QEMU_PROCESS_HELPER";
    const PID_PREFIX: &str = "fake-qemu-pid=";

    /// Not a test: the "launcher" of
    /// [`a_process_started_by_the_launcher_is_killed_when_the_launcher_dies`], run in a
    /// process of its own. It starts a fake QEMU (a shell that sleeps, sharing this process's
    /// stdout), prints its pid and waits to be killed.
    #[tokio::test]
    #[ignore = "helper process of the parent-death test, started by it"]
    async fn helper_launcher() {
        if std::env::var_os(HELPER_ENV).is_none() {
            return;
        }
        let mut qemu = tokio::process::Command::new("/bin/sh");
        qemu.args(["-c", "exec sleep 600"]);
        confine(&mut qemu);
        let child = qemu.spawn().expect("spawn the fake QEMU");
        println!("{PID_PREFIX}{}", child.id().expect("pid"));
        std::future::pending::<()>().await;
    }

    #[test]
    fn a_process_started_by_the_launcher_is_killed_when_the_launcher_dies() {
        let exe = std::env::current_exe().expect("test binary");
        let mut launcher = Command::new(exe)
            .args([
                "launcher::qemu_process::tests::helper_launcher",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HELPER_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the helper launcher");
        let mut out = BufReader::new(launcher.stdout.take().expect("stdout"));
        let mut qemu_pid = None;
        let mut line = String::new();
        while qemu_pid.is_none() {
            line.clear();
            if out.read_line(&mut line).expect("read helper output") == 0 {
                break;
            }
            // libtest prints the test's name on the same line.
            qemu_pid = line
                .split(PID_PREFIX)
                .nth(1)
                .and_then(|p| p.trim().parse::<i32>().ok());
        }
        let qemu_pid = qemu_pid.expect("the helper printed the fake QEMU's pid");
        launcher.kill().expect("kill the launcher");
        launcher.wait().expect("reap the launcher");
        // The fake QEMU shares the pipe: end of file means it has died too. A guard thread
        // kills it after a minute so a regression fails instead of hanging.
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let guard = std::thread::spawn(move || {
            let timeout = std::time::Duration::from_secs(60);
            let fired =
                finished.recv_timeout(timeout) == Err(std::sync::mpsc::RecvTimeoutError::Timeout);
            if fired {
                let _ = nix::sys::signal::kill(Pid::from_raw(qemu_pid), Signal::SIGKILL);
            }
            fired
        });
        let mut rest = Vec::new();
        let _ = out.read_to_end(&mut rest);
        let _ = done.send(());
        let survived = guard.join().expect("guard thread");
        assert!(!survived, "the fake QEMU outlived its launcher");
    }

    #[tokio::test]
    async fn only_the_descriptors_given_are_inherited() {
        use std::os::fd::AsRawFd;
        let (passed_file, kept_file) =
            (tempfile::tempfile().unwrap(), tempfile::tempfile().unwrap());
        let (passed, kept) = (passed_file.as_raw_fd(), kept_file.as_raw_fd());
        let mut child = tokio::process::Command::new("/bin/sh");
        child.args([
            "-c",
            &format!("test -e /proc/self/fd/{passed} && ! test -e /proc/self/fd/{kept}"),
        ]);
        inherit(&mut child, vec![passed]);
        let status = child.status().await.expect("run");
        assert!(status.success(), "{status}");
    }

    #[tokio::test]
    async fn qemu_creates_its_files_owner_only_whatever_the_launchers_umask() {
        crate::test_support::permissive_umask();
        let mut qemu = tokio::process::Command::new("/bin/sh");
        qemu.args(["-c", "umask"]).stdout(Stdio::piped());
        confine(&mut qemu);
        let out = qemu.output().await.expect("run");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0077");
    }
}
