//! virt-launcher: runs one VMI's QEMU and reports on it.
//!
//! Data flow: virt-handler sends a [`spec::LauncherSpec`] over the per-VMI command socket
//! ([`protocol`], served by [`launcher::run_launcher`]); the spec becomes a QEMU command
//! line through the pure [`argv::qemu_argv`]; the launcher starts QEMU, talks to it over
//! [`qmp`] and turns QMP events and QEMU's exit into domain events for the handler.
//! [`fd_passing`] carries open files (hotplugged disk images) from the handler to the
//! launcher and on to QEMU over those sockets. [`accel`] decides between KVM and TCG;
//! [`safe_path`] opens host paths without following symlinks; [`private_fs`] creates
//! owner-only files, directories and sockets; [`log_rotation`] caps the serial console log;
//! [`overlay`] writes the empty qcow2 overlays a guest writes to over a pristine disk;
//! [`netsetup`] builds the masquerade binding (bridge, tap, nftables, DHCP) in the launcher
//! pod's network namespace. This crate never depends on Kubernetes crates.

pub mod accel;
pub mod argv;
pub mod fd_passing;
pub mod launcher;
pub mod netsetup;
pub mod overlay;
pub mod pod_layout;
pub use private_fs;
pub use private_fs::log_rotation;
pub mod protocol;
pub mod qga;
pub mod qmp;
pub mod safe_path;
pub mod spec;
pub mod unix_socket;

#[cfg(test)]
mod test_support;

pub use argv::{ArgvError, qemu_argv};
pub use launcher::{LauncherError, LauncherOptions, run_launcher};
pub use spec::LauncherSpec;
