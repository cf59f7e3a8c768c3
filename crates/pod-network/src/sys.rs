//! The few system calls that need `unsafe`: the interface ioctls (flags, to bring `lo` up or a
//! bridge down, and bridge deletion) and the `pre_exec` hook that moves a child into a network
//! namespace.
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

/// `SIOCBRDELBR` of `<linux/sockios.h>` (the `libc` crate has it only for Android).
const SIOCBRDELBR: libc::c_ulong = 0x89a1;

/// An interface name as the kernel's ioctls take it: at most `IFNAMSIZ - 1` bytes, NUL-padded.
fn if_name(name: &str) -> io::Result<[libc::c_char; libc::IFNAMSIZ]> {
    let mut buf = [0 as libc::c_char; libc::IFNAMSIZ];
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for (slot, byte) in buf.iter_mut().zip(name.as_bytes()) {
        *slot = *byte as libc::c_char;
    }
    Ok(buf)
}

fn control_socket() -> io::Result<OwnedFd> {
    Ok(socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?)
}

/// Sets or clears `IFF_UP` on the interface `name` of the calling thread's network namespace.
pub(crate) fn set_link_up(name: &str, up: bool) -> io::Result<()> {
    let sock = control_socket()?;
    // SAFETY: `ifreq` is a plain C struct of arrays, integers and a union of such; all-zero
    // is a valid value of it.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    request.ifr_name = if_name(name)?;
    // SAFETY: `sock` is an open socket and `request` a valid, NUL-terminated `ifreq` that
    // lives across the call; SIOCGIFFLAGS writes only `ifr_flags` inside it.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS just filled in the `ifru_flags` member of the union.
    unsafe {
        if up {
            request.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        } else {
            request.ifr_ifru.ifru_flags &= !(libc::IFF_UP as libc::c_short);
        }
    }
    // SAFETY: as above; SIOCSIFFLAGS only reads `request`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &request) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Deletes the Linux bridge `name` (which must be down) of the calling thread's network
/// namespace, as `brctl delbr` does. The kernel refuses an interface that is not a bridge.
pub(crate) fn delete_bridge(name: &str) -> io::Result<()> {
    let sock = control_socket()?;
    let name = if_name(name)?;
    // SAFETY: `sock` is an open socket; SIOCBRDELBR reads a NUL-terminated name of at most
    // IFNAMSIZ bytes from the pointer, and `name` is such an array that outlives the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCBRDELBR as _, name.as_ptr()) } < 0 {
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
