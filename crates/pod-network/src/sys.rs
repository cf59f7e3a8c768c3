//! The few system calls that need `unsafe`: the interface-flags ioctl that brings `lo` up and
//! the `pre_exec` hook that moves a child into a network namespace.
//!
//! Everything else in the crate goes through `nix`'s safe wrappers.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::libc;
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};

/// Sets `IFF_UP` on the loopback interface of the calling thread's network namespace.
pub(crate) fn set_loopback_up() -> io::Result<()> {
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: `ifreq` is a plain C struct of arrays, integers and a union of such; all-zero
    // is a valid value of it.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo") {
        *slot = *byte as libc::c_char;
    }
    // SAFETY: `sock` is an open socket and `request` a valid, NUL-terminated `ifreq` that
    // lives across the call; SIOCGIFFLAGS writes only `ifr_flags` inside it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS just filled in the `ifru_flags` member of the union.
    unsafe { request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above; SIOCSIFFLAGS only reads `request`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves the calling thread into the network namespace `netns` (`setns(fd, CLONE_NEWNET)`).
///
/// This is a single system call: it allocates nothing and takes no lock, so it is
/// async-signal-safe and may run between `fork` and `exec` (see [`join_in_child`]). In a
/// multi-threaded process it changes only the calling thread.
pub fn enter(netns: BorrowedFd<'_>) -> io::Result<()> {
    setns(netns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Makes `command`'s child join the network namespace `netns` before it executes its program.
///
/// Open `netns` with [`NetworkNamespace::enter_fd`](crate::NetworkNamespace::enter_fd) before
/// spawning: the hook that runs in the forked child then only calls [`enter`]. The descriptor
/// is close-on-exec, so the program does not inherit it; it is closed in this process when
/// `command` is dropped.
pub fn join_in_child(command: &mut Command, netns: OwnedFd) {
    // SAFETY: the hook runs in the child between fork and exec, where only async-signal-safe
    // work is allowed. It calls setns(2) on a descriptor opened before the fork and turns the
    // errno into an `io::Error` without allocating (`from_raw_os_error`).
    unsafe {
        command.pre_exec(move || enter(netns.as_fd()));
    }
}
