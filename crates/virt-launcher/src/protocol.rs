//! The handler↔launcher protocol, version 1 (described for humans in
//! `docs/launcher-protocol.md`).
//!
//! One unix socket per VMI; the launcher listens, virt-handler connects. Messages are
//! JSON objects, one per line. Both sides first send `{"hello":{"version":1}}`; a side
//! that does not speak the peer's version closes the connection. Then the handler sends
//! commands carrying an `id`, each answered by exactly one acknowledgement with that id
//! (`ok` or `error`); the launcher sends `domain` events whenever the domain changes and
//! once right after the hello, so a handler that reconnects learns the current state.
//! One command, `passFile`, travels with an open file descriptor (`SCM_RIGHTS`, see
//! [`crate::fd_passing`]): the handler hands over a disk image the launcher may not open
//! by path.
//!
//! [`DownMessage`] is what the handler sends, [`UpMessage`] what the launcher sends;
//! [`LauncherClient`] is a minimal handler-side client.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::spec::LauncherSpec;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// File next to the launcher socket where the launcher leaves the domain's final state
/// (JSON [`DomainStatus`]) before it exits, so a handler that missed the final event (it was
/// restarting, or another client collected the event) still learns how the domain ended.
pub const FINAL_STATE_FILE: &str = "domain-final.json";

/// A malformed or unexpected protocol message, or a broken connection.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// The line is not a protocol message.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The peer speaks another version.
    #[error("peer speaks protocol version {peer}, this side speaks {PROTOCOL_VERSION}")]
    Version {
        /// The peer's version.
        peer: u32,
    },
    /// Reading or writing the socket failed.
    #[error("launcher socket I/O failed")]
    Io(#[source] std::io::Error),
    /// The peer closed the connection.
    #[error("the connection closed")]
    Closed,
}

/// `{"hello":{"version":N}}`; the launcher's hello also carries its pod interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hello {
    /// Protocol version.
    pub version: u32,
    /// The launcher's pod interface (`eth0`), present only when the launcher runs in a
    /// network namespace of its own; the handler then chooses the masquerade binding and
    /// reports the pod IP in `status.interfaces`. Older peers ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_interface: Option<PodInterface>,
    /// The UID of the VMI the launcher runs (its `--uid`), present in the launcher's hello
    /// when it was started for one. The handler finds a launcher through
    /// `status.activePods`, which whoever may patch the VMI's status writes: it only talks
    /// to a launcher whose reported UID is the VMI's, so a key naming another VMI's pod never
    /// gets this VMI's spec. Older peers ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmi_uid: Option<String>,
}

impl Hello {
    /// The hello of this protocol version, without a pod interface.
    pub fn current() -> Self {
        Self {
            version: PROTOCOL_VERSION,
            pod_interface: None,
            vmi_uid: None,
        }
    }
}

/// The pod's network interface as the launcher sees it in its network namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodInterface {
    /// Interface name (`eth0`).
    pub name: String,
    /// Its MAC address.
    pub mac: String,
    /// Its global addresses, IPv4 first (the pod IPs).
    pub ip_addresses: Vec<String>,
    /// Its MTU.
    pub mtu: u32,
}

/// A command from the handler.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Start the domain described by the spec; when it already runs, apply what may change
    /// live (vCPU sockets, hotplugged memory) and leave everything else as it booted.
    Sync(Box<LauncherSpec>),
    /// ACPI power-down; kill QEMU when the guest has not powered off after the grace period.
    Shutdown {
        /// Seconds to wait for the guest before killing QEMU.
        grace_period_seconds: u64,
    },
    /// Kill QEMU now.
    Kill,
    /// Pause the vCPUs.
    Pause,
    /// Resume the vCPUs.
    Unpause,
    /// Report the domain's state (the ack carries it).
    Status,
    /// Start the domain described by the spec as the target of a live migration: QEMU
    /// listens for the incoming migration on the unix socket `socket` (a path as the launcher
    /// sees it) and the domain is `Paused` (reason `Migration`) until the migration ends;
    /// then it runs on (`Running`, reason `Migrated`). Newer than version 1's first revision:
    /// an older launcher answers with an error.
    Receive {
        /// The domain.
        spec: Box<LauncherSpec>,
        /// Where QEMU listens for the migration stream.
        socket: String,
        /// Block migration: where QEMU serves `block_disks` over NBD (a unix socket).
        block_socket: Option<String>,
        /// The disks (spec names) the source copies.
        block_disks: Vec<String>,
        /// The source may switch the migration to post-copy (`allowPostCopy`): the incoming
        /// QEMU needs `postcopy-ram` too. Newer than the first revision of `receive`: an older
        /// launcher ignores it (and a post-copy switch then fails the migration).
        post_copy: bool,
    },
    /// Live-migrate the running domain to `uri` (QEMU's URI, e.g. `unix:/path`); progress is
    /// reported in [`DomainStatus::migration`]. After success QEMU quits and the domain ends
    /// `Shutoff`, reason `Migrated`.
    Migrate {
        /// Where the migration stream goes.
        uri: String,
        /// Abort when the remaining data has not shrunk for this long (0: never).
        progress_timeout_seconds: u64,
        /// Abort when the migration has not completed after this long (0: never).
        completion_timeout_seconds: u64,
        /// Cap of the migration stream in bytes per second (0: QEMU's default).
        bandwidth_bytes_per_second: u64,
        /// Block migration: the target's NBD server (QEMU's URI-less unix socket path) that
        /// `block_disks` are mirrored to before the memory goes.
        block_socket: Option<String>,
        /// The disks (spec names) to copy.
        block_disks: Vec<String>,
        /// Let QEMU throttle the guest's vCPUs so that the migration converges
        /// (`allowAutoConverge`).
        auto_converge: bool,
        /// Switch to post-copy instead of aborting once the completion timeout has passed
        /// (`allowPostCopy`); reported in [`MigrationInfo::post_copy`].
        post_copy: bool,
    },
    /// Abort the running outgoing migration (QMP `migrate_cancel`).
    CancelMigration,
    /// Keep the open file that travels with this line (one descriptor, `SCM_RIGHTS`) under
    /// `key`, for the disks whose [`crate::spec::Disk::passed_file`] names it; a file passed
    /// earlier under the same key is closed. Sent with [`LauncherClient::pass_file`] (or
    /// [`crate::fd_passing::send_with_fd`]); a line without a descriptor is refused. Newer
    /// than version 1's first revision: an older launcher answers with an error.
    PassFile {
        /// The name the spec uses for the file.
        key: String,
    },
    /// What the guest agent reports now: the ack carries a [`GuestAgentInfo`], the users and
    /// filesystems asked of the agent for this command, the rest as last polled. An error
    /// when the agent is not connected. Newer than version 1's first revision.
    GuestAgentInfo,
    /// Reboot the guest from inside: through the guest agent when it is connected (its
    /// `guest-shutdown` in mode `reboot`), else by pressing the ACPI power button and
    /// resetting the machine once the guest has shut down (libvirt's fake reboot). Newer than
    /// version 1's first revision.
    SoftReboot,
    /// The agent's `guest-ping` (a `guestAgentPing` probe); an error when the agent is not
    /// connected or does not answer. Newer than version 1's first revision.
    GuestPing,
    /// Run a command in the guest through the agent (`guest-exec`, an `exec` probe) and wait
    /// up to `timeout_seconds` for it; the ack carries a [`GuestExecResult`]. Newer than
    /// version 1's first revision.
    GuestExec {
        /// The program and its arguments.
        command: Vec<String>,
        /// How long to wait for it to exit.
        timeout_seconds: u64,
    },
    /// What the domain has used so far, read from QEMU and the kernel when asked: the ack
    /// carries a [`DomainStats`]. An error when no QEMU runs. Newer than version 1's first
    /// revision.
    DomainStats,
    /// Freeze the guest's filesystems through the agent (`guest-fsfreeze-freeze`) and thaw
    /// them by itself after `unfreeze_timeout_seconds` unless [`Command::Unfreeze`] came
    /// first; a frozen guest is left frozen (the timer restarts). Refused while the domain
    /// migrates. Newer than version 1's first revision.
    Freeze {
        /// When to thaw without being asked (0: never).
        unfreeze_timeout_seconds: u64,
    },
    /// Thaw the guest's filesystems (`guest-fsfreeze-thaw`); a thawed guest is left as it
    /// is. Newer than version 1's first revision.
    Unfreeze,
}

/// Counters of one domain, as the handler's `/metrics` serves them
/// ([`Command::DomainStats`]). Times are seconds, sizes bytes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainStats {
    /// CPU time of the whole QEMU process in user mode (`/proc/<pid>/stat`).
    pub cpu_user_seconds: f64,
    /// CPU time of the whole QEMU process in kernel mode.
    pub cpu_system_seconds: f64,
    /// Each vCPU (`query-cpus-fast`), by index.
    #[serde(default)]
    pub vcpus: Vec<VcpuStats>,
    /// QEMU's resident set (`VmRSS`).
    pub memory_resident_bytes: u64,
    /// The guest's memory as the domain defines it (boot memory plus plugged memory).
    pub memory_domain_bytes: u64,
    /// Each tap-backed interface, counted from the guest's side.
    #[serde(default)]
    pub interfaces: Vec<InterfaceStats>,
    /// Each disk (`query-blockstats`).
    #[serde(default)]
    pub disks: Vec<DiskStats>,
    /// The outgoing live migration's progress while one runs (`query-migrate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationStats>,
    /// The guest's mounted filesystems with their sizes, as its agent reports them
    /// (`guest-get-fsinfo`; none without a connected, thawed agent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystems: Vec<GuestFilesystem>,
}

/// An outgoing live migration's memory transfer as `query-migrate` reports it (libvirt's job
/// info fields upstream's handler exports).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStats {
    /// Guest memory to migrate (`ram.total`).
    pub data_total_bytes: u64,
    /// What is left (`ram.remaining`).
    pub data_remaining_bytes: u64,
    /// What was sent (`ram.transferred`).
    pub data_processed_bytes: u64,
    /// Memory the guest dirties per second (`ram.dirty-pages-rate` × `ram.page-size`).
    pub dirty_rate_bytes_per_second: u64,
    /// Transfer rate (`ram.mbps`, in bytes per second).
    pub transfer_rate_bytes_per_second: u64,
}

/// One vCPU thread's time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VcpuStats {
    /// `cpu-index`.
    pub id: u32,
    /// Time it ran (user and kernel mode, `/proc/<pid>/task/<tid>/stat`).
    pub running_seconds: f64,
    /// Time it was runnable but waited for a host CPU (`schedstat`).
    pub delay_seconds: f64,
}

/// One interface's traffic as the guest sees it: what it received is what its tap sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// The interface's name in the VMI.
    pub name: String,
    /// Bytes the guest received.
    pub receive_bytes: u64,
    /// Packets the guest received.
    pub receive_packets: u64,
    /// Receive errors.
    pub receive_errors: u64,
    /// Packets dropped on the way in.
    pub receive_dropped: u64,
    /// Bytes the guest sent.
    pub transmit_bytes: u64,
    /// Packets the guest sent.
    pub transmit_packets: u64,
    /// Transmit errors.
    pub transmit_errors: u64,
    /// Packets dropped on the way out.
    pub transmit_dropped: u64,
}

/// One disk's I/O (QEMU's block statistics).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskStats {
    /// The disk's name in the VMI.
    pub name: String,
    /// Read requests.
    pub read_operations: u64,
    /// Write requests.
    pub write_operations: u64,
    /// Flush requests.
    pub flush_operations: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Time spent on reads.
    pub read_seconds: f64,
    /// Time spent on writes.
    pub write_seconds: f64,
    /// Time spent on flushes.
    pub flush_seconds: f64,
}

/// How a command run through the guest agent ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestExecResult {
    /// Its exit code.
    pub exit_code: i32,
    /// What it wrote to stdout and stderr.
    #[serde(default)]
    pub output: String,
}

/// A message from the handler to the launcher.
#[derive(Debug, Clone, PartialEq)]
pub enum DownMessage {
    /// Version handshake.
    Hello(Hello),
    /// A command to acknowledge.
    Command {
        /// Chosen by the handler, echoed in the ack.
        id: u64,
        /// What to do.
        command: Command,
    },
}

/// Life-cycle state of the domain (libvirt's names, as upstream reports them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DomainState {
    /// No QEMU yet (before the first `sync`).
    Pending,
    /// QEMU runs the guest.
    Running,
    /// The vCPUs are stopped.
    Paused,
    /// QEMU has exited in an orderly way.
    Shutoff,
    /// QEMU died, failed to start or the guest panicked.
    Crashed,
}

/// Why the domain is in its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateReason {
    /// Nothing more specific.
    Unknown,
    /// QEMU started and the guest is booting or running.
    Booted,
    /// Paused by a `pause` command.
    User,
    /// Paused or stopped by QEMU itself (I/O error, debugger …).
    Emulator,
    /// The guest powered off (ACPI power-down or its own `poweroff`).
    GuestShutdown,
    /// QEMU was told to quit or was killed on request.
    Destroyed,
    /// QEMU exited unexpectedly or was killed by someone else.
    QemuExited,
    /// Resumed by an `unpause` command (or QEMU resumed on its own).
    Unpaused,
    /// QEMU could not be started or exited before it was up.
    FailedToStart,
    /// The guest reported a kernel panic.
    Panicked,
    /// Paused while an incoming migration fills the domain (libvirt's `migration`).
    Migration,
    /// Running after an incoming migration, or shut off after an outgoing one.
    Migrated,
}

/// A snapshot of the domain, sent as a `domain` event and in `status`/`sync` acks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainStatus {
    /// Current state.
    pub state: DomainState,
    /// Why.
    pub reason: StateReason,
    /// QEMU's pid while it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qemu_pid: Option<u32>,
    /// When QEMU was started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// QEMU's exit code, once it exited normally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Detail for the user, e.g. QEMU's last error line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The vCPU topology plugged in now (CPU hotplug raises `sockets`); set once QEMU runs.
    /// Older peers ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuTopology>,
    /// The guest memory now; set once QEMU runs. Older peers ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<GuestMemory>,
    /// The outgoing live migration, once one was asked for. Older peers ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationInfo>,
    /// The guest agent, once the guest opened its channel. Older peers ignore the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent: Option<Box<GuestAgent>>,
}

/// The guest agent of a running domain, as the launcher last polled it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgent {
    /// The guest has the agent's channel open (upstream's channel state `connected`).
    pub connected: bool,
    /// The agent's version (`guest-info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The commands the agent offers (`guest-info`); empty until it answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_commands: Vec<GuestAgentCommand>,
    /// `guest-get-host-name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// `guest-get-osinfo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<GuestOs>,
    /// `guest-get-timezone` as upstream shows it: `<zone>, <offset seconds>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// `guest-network-get-interfaces`, loopback left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<GuestInterface>,
    /// `frozen` while the guest's filesystems are frozen ([`Command::Freeze`]); absent when
    /// thawed (upstream's `status.fsFreezeStatus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_freeze_status: Option<String>,
}

/// One command of the guest agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentCommand {
    /// Its name, e.g. `guest-ping`.
    pub name: String,
    /// Whether the agent lets it run.
    pub enabled: bool,
}

/// The guest's operating system (`guest-get-osinfo`; every field optional, as the agent's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestOs {
    /// `name`, e.g. "Debian GNU/Linux".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `kernel-release` (`uname -r`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    /// `version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `pretty-name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretty_name: Option<String>,
    /// `version-id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    /// `kernel-version` (`uname -v`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_version: Option<String>,
    /// `machine` (`uname -m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// `id`, e.g. `debian`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// A network interface as the guest sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestInterface {
    /// Its name in the guest (`eth0`).
    pub name: String,
    /// Its MAC address, lower case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its addresses without prefix length, IPv4 first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
}

/// The answer to [`Command::GuestAgentInfo`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentInfo {
    /// What the domain status carries.
    #[serde(flatten)]
    pub agent: GuestAgent,
    /// `guest-get-users`.
    #[serde(default)]
    pub users: Vec<GuestUser>,
    /// `guest-get-fsinfo`.
    #[serde(default)]
    pub filesystems: Vec<GuestFilesystem>,
}

/// A user logged in to the guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestUser {
    /// The user name.
    pub name: String,
    /// The login domain (Windows guests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Login time, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_time: Option<f64>,
}

impl Eq for GuestUser {}

/// A mounted filesystem of the guest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestFilesystem {
    /// The device name (`vda1`).
    pub disk_name: String,
    /// Where it is mounted.
    pub mount_point: String,
    /// Its type (`ext4`).
    pub file_system_type: String,
    /// Bytes used, when the agent knows.
    #[serde(default)]
    pub used_bytes: u64,
    /// Bytes in total, when the agent knows.
    #[serde(default)]
    pub total_bytes: u64,
    /// The disks under it: `(serial, bus type)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<GuestFilesystemDisk>,
}

/// A disk under a guest filesystem.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestFilesystemDisk {
    /// The disk's serial, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// `virtio`, `scsi`, `sata` …
    pub bus_type: String,
}

/// Where an outgoing live migration stands (upstream keeps this in the domain's metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationJobState {
    /// Data is being sent.
    Active,
    /// The target has the domain; the source's QEMU quits.
    Completed,
    /// The migration failed or was aborted; the domain runs on here.
    Failed,
}

/// An outgoing live migration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationInfo {
    /// Where it stands.
    pub state: MigrationJobState,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// An abort was asked for (`cancelMigration`).
    #[serde(default)]
    pub abort_requested: bool,
    /// The migration switched to post-copy (the guest runs on the target, which fetches the
    /// rest of its memory on demand).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub post_copy: bool,
}

/// vCPU topology of a running domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuTopology {
    /// Sockets plugged in.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

/// Guest memory of a running domain, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestMemory {
    /// Memory the guest booted with.
    pub at_boot_bytes: u64,
    /// Memory the guest has now: at boot plus what its virtio-mem device has plugged.
    pub current_bytes: u64,
    /// What the last `sync` asked for (at boot plus the virtio-mem device's requested size);
    /// the guest plugs it at its own pace, so `current_bytes` follows.
    pub requested_bytes: u64,
}

impl DomainStatus {
    /// The status before the first `sync`.
    pub fn pending() -> Self {
        Self {
            state: DomainState::Pending,
            reason: StateReason::Unknown,
            qemu_pid: None,
            started_at: None,
            exit_code: None,
            message: None,
            cpu: None,
            memory: None,
            migration: None,
            guest_agent: None,
        }
    }

    /// Whether the domain has ended for good (Shutoff or Crashed).
    pub fn is_final(&self) -> bool {
        matches!(self.state, DomainState::Shutoff | DomainState::Crashed)
    }
}

/// A message from the launcher to the handler.
#[derive(Debug, Clone, PartialEq)]
pub enum UpMessage {
    /// Version handshake.
    Hello(Hello),
    /// The answer to command `id`: `ok` with a value or `error` with a message.
    Ack {
        /// The command's id.
        id: u64,
        /// The outcome.
        result: Result<Value, String>,
    },
    /// The domain changed (or: this is its state after the hello).
    Domain(DomainStatus),
    /// Something went wrong outside any command (e.g. QMP lost).
    Error(String),
    /// Something the handler records as an Event on the VMI (upstream's launcher sends these
    /// through its notify client: `GuestAgentPingFailed`, …). Handlers older than the message
    /// skip it as malformed.
    Event(LauncherEvent),
}

/// An Event for the VMI, as the launcher reports it ([`UpMessage::Event`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LauncherEvent {
    /// A warning (else a normal Event).
    #[serde(default)]
    pub warning: bool,
    /// The Event's reason (`GuestAgentPingFailed`).
    pub reason: String,
    /// Its message.
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ErrorBody {
    message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShutdownBody {
    grace_period_seconds: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SyncBody {
    spec: Box<LauncherSpec>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReceiveBody {
    spec: Box<LauncherSpec>,
    socket: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    block_socket: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    block_disks: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    post_copy: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MigrateBody {
    uri: String,
    #[serde(default)]
    progress_timeout_seconds: u64,
    #[serde(default)]
    completion_timeout_seconds: u64,
    #[serde(default)]
    bandwidth_bytes_per_second: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    block_socket: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    block_disks: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    auto_converge: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    post_copy: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PassFileBody {
    key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GuestExecBody {
    command: Vec<String>,
    timeout_seconds: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FreezeBody {
    unfreeze_timeout_seconds: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Empty {}

/// Both directions on the wire: exactly one of the optional keys besides `id` is set.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hello: Option<Hello>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sync: Option<SyncBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shutdown: Option<ShutdownBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kill: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pause: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unpause: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    receive: Option<ReceiveBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    migrate: Option<MigrateBody>,
    #[serde(
        rename = "cancelMigration",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    cancel_migration: Option<Empty>,
    #[serde(rename = "passFile", default, skip_serializing_if = "Option::is_none")]
    pass_file: Option<PassFileBody>,
    #[serde(
        rename = "guestAgentInfo",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    guest_agent_info: Option<Empty>,
    #[serde(
        rename = "softReboot",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    soft_reboot: Option<Empty>,
    #[serde(rename = "guestPing", default, skip_serializing_if = "Option::is_none")]
    guest_ping: Option<Empty>,
    #[serde(rename = "guestExec", default, skip_serializing_if = "Option::is_none")]
    guest_exec: Option<GuestExecBody>,
    #[serde(
        rename = "domainStats",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    domain_stats: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    freeze: Option<FreezeBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unfreeze: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ok: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ErrorBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    domain: Option<DomainStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    event: Option<LauncherEvent>,
}

impl Wire {
    fn set_keys(&self) -> usize {
        [
            self.hello.is_some(),
            self.sync.is_some(),
            self.shutdown.is_some(),
            self.kill.is_some(),
            self.pause.is_some(),
            self.unpause.is_some(),
            self.status.is_some(),
            self.receive.is_some(),
            self.migrate.is_some(),
            self.cancel_migration.is_some(),
            self.pass_file.is_some(),
            self.guest_agent_info.is_some(),
            self.soft_reboot.is_some(),
            self.guest_ping.is_some(),
            self.guest_exec.is_some(),
            self.domain_stats.is_some(),
            self.freeze.is_some(),
            self.unfreeze.is_some(),
            self.ok.is_some(),
            self.error.is_some(),
            self.domain.is_some(),
            self.event.is_some(),
        ]
        .iter()
        .filter(|set| **set)
        .count()
    }

    fn parse(line: &str) -> Result<Self, ProtocolError> {
        let wire: Self =
            serde_json::from_str(line).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
        match wire.set_keys() {
            1 => Ok(wire),
            n => Err(ProtocolError::Malformed(format!(
                "expected one message key, found {n}"
            ))),
        }
    }

    fn line(&self) -> String {
        // Serializing plain structs and JSON values cannot fail.
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }
}

impl DownMessage {
    /// The `id` of a command line this side cannot decode (a command or spec field of a newer
    /// protocol revision), so it can be answered with an error instead of left unanswered.
    pub fn undecodable_command_id(line: &str) -> Option<u64> {
        serde_json::from_str::<Value>(line)
            .ok()?
            .get("id")?
            .as_u64()
    }

    /// Decodes one line.
    ///
    /// # Errors
    /// [`ProtocolError::Malformed`] for anything but a handler message.
    pub fn decode(line: &str) -> Result<Self, ProtocolError> {
        let w = Wire::parse(line)?;
        if let Some(hello) = w.hello {
            return Ok(Self::Hello(hello));
        }
        let id =
            w.id.ok_or_else(|| ProtocolError::Malformed("command without id".into()))?;
        let command = if let Some(sync) = w.sync {
            Command::Sync(sync.spec)
        } else if let Some(s) = w.shutdown {
            Command::Shutdown {
                grace_period_seconds: s.grace_period_seconds,
            }
        } else if w.kill.is_some() {
            Command::Kill
        } else if w.pause.is_some() {
            Command::Pause
        } else if w.unpause.is_some() {
            Command::Unpause
        } else if w.status.is_some() {
            Command::Status
        } else if let Some(r) = w.receive {
            Command::Receive {
                spec: r.spec,
                socket: r.socket,
                block_socket: r.block_socket,
                block_disks: r.block_disks,
                post_copy: r.post_copy,
            }
        } else if let Some(m) = w.migrate {
            Command::Migrate {
                uri: m.uri,
                progress_timeout_seconds: m.progress_timeout_seconds,
                completion_timeout_seconds: m.completion_timeout_seconds,
                bandwidth_bytes_per_second: m.bandwidth_bytes_per_second,
                block_socket: m.block_socket,
                block_disks: m.block_disks,
                auto_converge: m.auto_converge,
                post_copy: m.post_copy,
            }
        } else if w.cancel_migration.is_some() {
            Command::CancelMigration
        } else if let Some(p) = w.pass_file {
            Command::PassFile { key: p.key }
        } else if w.guest_agent_info.is_some() {
            Command::GuestAgentInfo
        } else if w.soft_reboot.is_some() {
            Command::SoftReboot
        } else if w.guest_ping.is_some() {
            Command::GuestPing
        } else if let Some(e) = w.guest_exec {
            Command::GuestExec {
                command: e.command,
                timeout_seconds: e.timeout_seconds,
            }
        } else if w.domain_stats.is_some() {
            Command::DomainStats
        } else if let Some(f) = w.freeze {
            Command::Freeze {
                unfreeze_timeout_seconds: f.unfreeze_timeout_seconds,
            }
        } else if w.unfreeze.is_some() {
            Command::Unfreeze
        } else {
            return Err(ProtocolError::Malformed("not a handler message".into()));
        };
        Ok(Self::Command { id, command })
    }

    /// Encodes as one line, newline included.
    pub fn encode(&self) -> String {
        let mut w = Wire::default();
        match self {
            Self::Hello(hello) => w.hello = Some(hello.clone()),
            Self::Command { id, command } => {
                w.id = Some(*id);
                match command {
                    Command::Sync(spec) => w.sync = Some(SyncBody { spec: spec.clone() }),
                    Command::Shutdown {
                        grace_period_seconds,
                    } => {
                        w.shutdown = Some(ShutdownBody {
                            grace_period_seconds: *grace_period_seconds,
                        });
                    }
                    Command::Kill => w.kill = Some(Empty {}),
                    Command::Pause => w.pause = Some(Empty {}),
                    Command::Unpause => w.unpause = Some(Empty {}),
                    Command::Status => w.status = Some(Empty {}),
                    Command::Receive {
                        spec,
                        socket,
                        block_socket,
                        block_disks,
                        post_copy,
                    } => {
                        w.receive = Some(ReceiveBody {
                            spec: spec.clone(),
                            socket: socket.clone(),
                            block_socket: block_socket.clone(),
                            block_disks: block_disks.clone(),
                            post_copy: *post_copy,
                        });
                    }
                    Command::Migrate {
                        uri,
                        progress_timeout_seconds,
                        completion_timeout_seconds,
                        bandwidth_bytes_per_second,
                        block_socket,
                        block_disks,
                        auto_converge,
                        post_copy,
                    } => {
                        w.migrate = Some(MigrateBody {
                            uri: uri.clone(),
                            progress_timeout_seconds: *progress_timeout_seconds,
                            completion_timeout_seconds: *completion_timeout_seconds,
                            bandwidth_bytes_per_second: *bandwidth_bytes_per_second,
                            block_socket: block_socket.clone(),
                            block_disks: block_disks.clone(),
                            auto_converge: *auto_converge,
                            post_copy: *post_copy,
                        });
                    }
                    Command::CancelMigration => w.cancel_migration = Some(Empty {}),
                    Command::PassFile { key } => {
                        w.pass_file = Some(PassFileBody { key: key.clone() });
                    }
                    Command::GuestAgentInfo => w.guest_agent_info = Some(Empty {}),
                    Command::SoftReboot => w.soft_reboot = Some(Empty {}),
                    Command::GuestPing => w.guest_ping = Some(Empty {}),
                    Command::GuestExec {
                        command,
                        timeout_seconds,
                    } => {
                        w.guest_exec = Some(GuestExecBody {
                            command: command.clone(),
                            timeout_seconds: *timeout_seconds,
                        });
                    }
                    Command::DomainStats => w.domain_stats = Some(Empty {}),
                    Command::Freeze {
                        unfreeze_timeout_seconds,
                    } => {
                        w.freeze = Some(FreezeBody {
                            unfreeze_timeout_seconds: *unfreeze_timeout_seconds,
                        });
                    }
                    Command::Unfreeze => w.unfreeze = Some(Empty {}),
                }
            }
        }
        w.line()
    }
}

impl UpMessage {
    /// Decodes one line.
    ///
    /// # Errors
    /// [`ProtocolError::Malformed`] for anything but a launcher message.
    pub fn decode(line: &str) -> Result<Self, ProtocolError> {
        let w = Wire::parse(line)?;
        if let (None, Some(event)) = (w.id, w.event.clone()) {
            return Ok(Self::Event(event));
        }
        match (w.id, w.hello, w.ok, w.error, w.domain) {
            (None, Some(hello), None, None, None) => Ok(Self::Hello(hello)),
            (Some(id), None, Some(value), None, None) => Ok(Self::Ack {
                id,
                result: Ok(value),
            }),
            (Some(id), None, None, Some(e), None) => Ok(Self::Ack {
                id,
                result: Err(e.message),
            }),
            (None, None, None, Some(e), None) => Ok(Self::Error(e.message)),
            (None, None, None, None, Some(domain)) => Ok(Self::Domain(domain)),
            _ => Err(ProtocolError::Malformed("not a launcher message".into())),
        }
    }

    /// Encodes as one line, newline included.
    pub fn encode(&self) -> String {
        let mut w = Wire::default();
        match self {
            Self::Hello(hello) => w.hello = Some(hello.clone()),
            Self::Ack { id, result } => {
                w.id = Some(*id);
                match result {
                    Ok(value) => w.ok = Some(value.clone()),
                    Err(message) => {
                        w.error = Some(ErrorBody {
                            message: message.clone(),
                        })
                    }
                }
            }
            Self::Domain(status) => w.domain = Some(status.clone()),
            Self::Event(event) => w.event = Some(event.clone()),
            Self::Error(message) => {
                w.error = Some(ErrorBody {
                    message: message.clone(),
                })
            }
        }
        w.line()
    }
}

/// A minimal handler-side connection: sends commands, waits for their acks, and queues
/// the domain events that arrive meanwhile.
#[derive(Debug)]
pub struct LauncherClient {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    next_id: u64,
    queued: std::collections::VecDeque<UpMessage>,
    hello: Hello,
}

impl LauncherClient {
    /// Connects and exchanges hellos.
    ///
    /// # Errors
    /// [`ProtocolError::Io`] when the socket does not accept, [`ProtocolError::Version`]
    /// when the launcher speaks another version.
    pub async fn connect(path: &Path) -> Result<Self, ProtocolError> {
        let stream = crate::unix_socket::connect(path)
            .await
            .map_err(ProtocolError::Io)?;
        let (read, writer) = stream.into_split();
        let mut client = Self {
            reader: BufReader::new(read),
            writer,
            next_id: 1,
            queued: Default::default(),
            hello: Hello::current(),
        };
        client.send(&DownMessage::Hello(Hello::current())).await?;
        match client.read().await? {
            UpMessage::Hello(
                hello @ Hello {
                    version: PROTOCOL_VERSION,
                    ..
                },
            ) => {
                client.hello = hello;
                Ok(client)
            }
            UpMessage::Hello(Hello { version, .. }) => {
                Err(ProtocolError::Version { peer: version })
            }
            other => Err(ProtocolError::Malformed(format!(
                "expected hello, got {other:?}"
            ))),
        }
    }

    /// The launcher's hello (its pod interface, the UID of its VMI).
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Sends `command` and returns its ack (`Err(message)` when the launcher refused it).
    ///
    /// # Errors
    /// [`ProtocolError`] when the connection fails.
    pub async fn request(
        &mut self,
        command: Command,
    ) -> Result<Result<Value, String>, ProtocolError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&DownMessage::Command { id, command }).await?;
        self.ack_of(id).await
    }

    /// Sends `passFile` for `key` with `file`'s descriptor in the same `sendmsg` as the
    /// line's first bytes, and returns its ack (`Err(message)` when the launcher refused it,
    /// as one from before `passFile` does).
    ///
    /// # Errors
    /// [`ProtocolError`] when the connection fails.
    pub async fn pass_file(
        &mut self,
        key: &str,
        file: &std::fs::File,
    ) -> Result<Result<Value, String>, ProtocolError> {
        use std::os::fd::AsFd;
        let id = self.next_id;
        self.next_id += 1;
        let line = DownMessage::Command {
            id,
            command: Command::PassFile {
                key: key.to_owned(),
            },
        }
        .encode();
        crate::fd_passing::send_with_fd(self.writer.as_ref(), line.as_bytes(), file.as_fd())
            .await
            .map_err(ProtocolError::Io)?;
        self.ack_of(id).await
    }

    /// Reads until the ack of command `id`, queueing what comes before it.
    async fn ack_of(&mut self, id: u64) -> Result<Result<Value, String>, ProtocolError> {
        loop {
            match self.read().await? {
                UpMessage::Ack { id: acked, result } if acked == id => return Ok(result),
                other => self.queued.push_back(other),
            }
        }
    }

    /// The next event (domain or error), queued or from the socket.
    ///
    /// # Errors
    /// [`ProtocolError::Closed`] when the launcher has gone.
    pub async fn next_event(&mut self) -> Result<UpMessage, ProtocolError> {
        match self.queued.pop_front() {
            Some(message) => Ok(message),
            None => self.read().await,
        }
    }

    async fn send(&mut self, message: &DownMessage) -> Result<(), ProtocolError> {
        self.writer
            .write_all(message.encode().as_bytes())
            .await
            .map_err(ProtocolError::Io)
    }

    async fn read(&mut self) -> Result<UpMessage, ProtocolError> {
        let mut line = String::new();
        match self
            .reader
            .read_line(&mut line)
            .await
            .map_err(ProtocolError::Io)?
        {
            0 => Err(ProtocolError::Closed),
            _ => UpMessage::decode(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_has_the_documented_shape() {
        let line = DownMessage::Hello(Hello::current()).encode();
        assert_eq!(line, "{\"hello\":{\"version\":1}}\n");
        assert_eq!(
            UpMessage::decode(&line).unwrap(),
            UpMessage::Hello(Hello::current())
        );
    }

    #[test]
    fn a_launcher_hello_carries_the_pod_interface() {
        let hello = Hello {
            pod_interface: Some(PodInterface {
                name: "eth0".into(),
                mac: "0a:58:0a:f5:00:07".into(),
                ip_addresses: vec!["10.245.0.7".into()],
                mtu: 1500,
            }),
            ..Hello::current()
        };
        let line = UpMessage::Hello(hello.clone()).encode();
        assert_eq!(
            line,
            "{\"hello\":{\"version\":1,\"podInterface\":{\"name\":\"eth0\",\"mac\":\"0a:58:0a:f5:00:07\",\"ipAddresses\":[\"10.245.0.7\"],\"mtu\":1500}}}\n"
        );
        assert_eq!(UpMessage::decode(&line).unwrap(), UpMessage::Hello(hello));
    }

    #[test]
    fn a_launcher_hello_carries_the_uid_of_its_vmi() {
        let hello = Hello {
            vmi_uid: Some("6f1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b".into()),
            ..Hello::current()
        };
        let line = UpMessage::Hello(hello.clone()).encode();
        assert_eq!(
            line,
            "{\"hello\":{\"version\":1,\"vmiUid\":\"6f1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b\"}}\n"
        );
        assert_eq!(UpMessage::decode(&line).unwrap(), UpMessage::Hello(hello));
    }

    #[test]
    fn commands_round_trip_with_their_ids() {
        for command in [
            Command::Shutdown {
                grace_period_seconds: 30,
            },
            Command::Kill,
            Command::Pause,
            Command::Unpause,
            Command::Status,
            Command::Migrate {
                uri: "unix:/var/run/kubevirt/migration-source.sock".into(),
                progress_timeout_seconds: 150,
                completion_timeout_seconds: 300,
                bandwidth_bytes_per_second: 1 << 20,
                block_socket: Some("/var/run/kubevirt/migration-source-block.sock".into()),
                block_disks: vec!["scratch".into()],
                auto_converge: true,
                post_copy: true,
            },
            Command::CancelMigration,
            Command::PassFile { key: "vol1".into() },
            Command::GuestAgentInfo,
            Command::SoftReboot,
            Command::GuestPing,
            Command::GuestExec {
                command: vec!["cat".into(), "/etc/os-release".into()],
                timeout_seconds: 2,
            },
            Command::DomainStats,
            Command::Freeze {
                unfreeze_timeout_seconds: 300,
            },
            Command::Unfreeze,
        ] {
            let message = DownMessage::Command { id: 7, command };
            assert_eq!(DownMessage::decode(&message.encode()).unwrap(), message);
        }
        assert_eq!(
            DownMessage::Command {
                id: 3,
                command: Command::Shutdown {
                    grace_period_seconds: 5
                }
            }
            .encode(),
            "{\"id\":3,\"shutdown\":{\"gracePeriodSeconds\":5}}\n"
        );
    }

    #[test]
    fn pass_file_has_the_documented_shape() {
        let message = DownMessage::Command {
            id: 12,
            command: Command::PassFile { key: "vol1".into() },
        };
        let line = message.encode();
        assert_eq!(line, "{\"id\":12,\"passFile\":{\"key\":\"vol1\"}}\n");
        assert_eq!(DownMessage::decode(&line).unwrap(), message);
        assert!(
            DownMessage::decode(r#"{"id":1,"passFile":{}}"#).is_err(),
            "a key is required"
        );
        assert!(DownMessage::decode(r#"{"id":1,"passFile":{"key":"a","fd":3}}"#).is_err());
    }

    #[test]
    fn acks_and_error_events_are_told_apart_by_the_id() {
        let ack = UpMessage::decode(r#"{"id":4,"error":{"message":"no domain"}}"#).unwrap();
        assert_eq!(
            ack,
            UpMessage::Ack {
                id: 4,
                result: Err("no domain".into())
            }
        );
        let event = UpMessage::decode(r#"{"error":{"message":"QMP lost"}}"#).unwrap();
        assert_eq!(event, UpMessage::Error("QMP lost".into()));
    }

    #[test]
    fn a_command_of_a_newer_protocol_revision_still_has_an_id_to_answer() {
        let line = r#"{"id":7,"resize":{"disk":"vda"}}"#;
        assert!(DownMessage::decode(line).is_err());
        assert_eq!(DownMessage::undecodable_command_id(line), Some(7));
        assert_eq!(DownMessage::undecodable_command_id("not json"), None);
    }

    #[test]
    fn domain_events_use_camel_case_names() {
        let status = DomainStatus {
            state: DomainState::Shutoff,
            reason: StateReason::GuestShutdown,
            qemu_pid: Some(42),
            started_at: Some("2026-11-29T12:00:00Z".into()),
            exit_code: Some(0),
            message: None,
            cpu: Some(CpuTopology {
                sockets: 2,
                cores: 1,
                threads: 1,
            }),
            memory: None,
            migration: Some(MigrationInfo {
                state: MigrationJobState::Failed,
                started_at: "2026-11-29T12:00:00Z".into(),
                ended_at: Some("2026-11-29T12:00:05Z".into()),
                failure_reason: Some("Live migration has been aborted".into()),
                abort_requested: true,
                post_copy: false,
            }),
            guest_agent: Some(Box::new(GuestAgent {
                connected: true,
                version: Some("7.2.0".into()),
                ..GuestAgent::default()
            })),
        };
        let line = UpMessage::Domain(status.clone()).encode();
        assert!(
            line.contains(r#""guestAgent":{"connected":true,"version":"7.2.0"}"#),
            "{line}"
        );
        assert!(
            line.contains(r#""migration":{"state":"Failed","startedAt""#),
            "{line}"
        );
        assert!(
            line.contains(r#""state":"Shutoff","reason":"GuestShutdown","qemuPid":42"#),
            "{line}"
        );
        assert_eq!(UpMessage::decode(&line).unwrap(), UpMessage::Domain(status));
    }

    #[test]
    fn an_event_for_the_handler_round_trips() {
        let event = UpMessage::Event(LauncherEvent {
            warning: true,
            reason: "GuestAgentPingFailed".into(),
            message: "GuestAgentPing probe failed for VMI v".into(),
        });
        let line = event.encode();
        assert_eq!(
            line,
            "{\"event\":{\"warning\":true,\"reason\":\"GuestAgentPingFailed\",\"message\":\"GuestAgentPing probe failed for VMI v\"}}\n"
        );
        assert_eq!(UpMessage::decode(&line).unwrap(), event);
    }

    #[test]
    fn a_message_with_two_keys_or_an_unknown_key_is_malformed() {
        assert!(DownMessage::decode(r#"{"id":1,"kill":{},"pause":{}}"#).is_err());
        assert!(DownMessage::decode(r#"{"id":1,"reboot":{}}"#).is_err());
        assert!(
            DownMessage::decode(r#"{"kill":{}}"#).is_err(),
            "commands need an id"
        );
    }
}
