//! The launcher directory, named once: every file that the launcher, QEMU, virt-handler and
//! the `guest-console-log` container share. In a launcher pod it is the `public` volume
//! mounted at `/var/run/kubevirt`; virt-handler reaches the same files at the node path of
//! that volume. Both build their paths from a [`PodLayout`] of the directory as they see it.

use std::path::{Path, PathBuf};

/// Where a launcher pod's compute container sees each claim-backed volume, under the
/// volume's name (`kubevirt_api::constants::VMI_DISKS_DIR`; as upstream, a filesystem claim
/// holds the disk as [`CLAIM_DISK_IMAGE`]).
pub const CLAIM_DISKS_DIR: &str = "/var/run/kubevirt-private/vmi-disks";
/// The disk image file in a filesystem claim.
pub const CLAIM_DISK_IMAGE: &str = "disk.img";

/// The launcher's command socket (docs/launcher-protocol.md).
pub const LAUNCHER_SOCKET: &str = "launcher.sock";
/// The guest's first serial port (the console `virtctl console` attaches to).
pub const SERIAL_CONSOLE_SOCKET: &str = "serial0.sock";
/// The serial console's log: the node serves `<container>.log` files, so this is what
/// `kubectl logs POD -c guest-console-log` shows.
pub const SERIAL_LOG: &str = "guest-console-log.log";
/// QEMU's VNC server.
pub const VNC_SOCKET: &str = "vnc.sock";
/// QEMU's QMP monitor.
pub const QMP_SOCKET: &str = "qmp.sock";
/// The guest agent's channel (QEMU serves it; the launcher is its one client). As short as
/// `qmp.sock`: QEMU binds it itself, and a unix socket path must fit in 107 bytes.
pub const GUEST_AGENT_SOCKET: &str = "qga.sock";
/// The passt binding's socket (passt binds it, QEMU connects). Short for `sun_path`.
pub const PASST_SOCKET: &str = "passt.sock";
/// passt's log.
pub const PASST_LOG: &str = "passt.log";
/// QEMU's pid file.
pub const PID_FILE: &str = "qemu.pid";
/// QEMU's stdout and stderr.
pub const QEMU_LOG: &str = "qemu.log";
/// Where a migration target's QEMU listens for the incoming migration (virt-handler's
/// migration proxy connects to it).
pub const MIGRATION_TARGET_SOCKET: &str = "migration-target.sock";
/// Where a migration source's QEMU sends the migration (virt-handler's migration proxy
/// listens on it).
pub const MIGRATION_SOURCE_SOCKET: &str = "migration-source.sock";
/// Where a migration target's QEMU serves its disks over NBD for a block migration.
pub const MIGRATION_TARGET_BLOCK_SOCKET: &str = "migration-target-block.sock";
/// Where a migration source's QEMU mirrors its disks to (virt-handler's proxy listens).
pub const MIGRATION_SOURCE_BLOCK_SOCKET: &str = "migration-source-block.sock";

/// The files of one launcher directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLayout {
    dir: PathBuf,
}

impl PodLayout {
    /// The layout of the launcher directory `dir` (as the caller sees it).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PodLayout { dir: dir.into() }
    }

    /// The directory itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn launcher_socket(&self) -> PathBuf {
        self.dir.join(LAUNCHER_SOCKET)
    }

    pub fn serial_console_socket(&self) -> PathBuf {
        self.dir.join(SERIAL_CONSOLE_SOCKET)
    }

    pub fn serial_log(&self) -> PathBuf {
        self.dir.join(SERIAL_LOG)
    }

    pub fn vnc_socket(&self) -> PathBuf {
        self.dir.join(VNC_SOCKET)
    }

    pub fn qmp_socket(&self) -> PathBuf {
        self.dir.join(QMP_SOCKET)
    }

    pub fn guest_agent_socket(&self) -> PathBuf {
        self.dir.join(GUEST_AGENT_SOCKET)
    }

    pub fn passt_socket(&self) -> PathBuf {
        self.dir.join(PASST_SOCKET)
    }

    pub fn passt_log(&self) -> PathBuf {
        self.dir.join(PASST_LOG)
    }

    pub fn pid_file(&self) -> PathBuf {
        self.dir.join(PID_FILE)
    }

    pub fn qemu_log(&self) -> PathBuf {
        self.dir.join(QEMU_LOG)
    }

    pub fn migration_target_socket(&self) -> PathBuf {
        self.dir.join(MIGRATION_TARGET_SOCKET)
    }

    pub fn migration_source_socket(&self) -> PathBuf {
        self.dir.join(MIGRATION_SOURCE_SOCKET)
    }

    pub fn migration_target_block_socket(&self) -> PathBuf {
        self.dir.join(MIGRATION_TARGET_BLOCK_SOCKET)
    }

    pub fn migration_source_block_socket(&self) -> PathBuf {
        self.dir.join(MIGRATION_SOURCE_BLOCK_SOCKET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_in_the_directory_and_distinct() {
        let layout = PodLayout::new("/var/run/kubevirt");
        let files = [
            layout.launcher_socket(),
            layout.serial_console_socket(),
            layout.serial_log(),
            layout.vnc_socket(),
            layout.qmp_socket(),
            layout.guest_agent_socket(),
            layout.passt_socket(),
            layout.passt_log(),
            layout.pid_file(),
            layout.qemu_log(),
            layout.migration_target_socket(),
            layout.migration_source_socket(),
            layout.migration_target_block_socket(),
            layout.migration_source_block_socket(),
        ];
        for f in &files {
            assert_eq!(f.parent(), Some(layout.dir()), "{f:?}");
        }
        let distinct: std::collections::BTreeSet<_> = files.iter().collect();
        assert_eq!(distinct.len(), files.len());
    }
}
