//! Bodies of the `subresources.kubevirt.io` requests (start, stop, migrate, addvolume, …) and
//! the guest agent responses. None of these are stored objects.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::devices::Disk;
use super::vmi_status::VirtualMachineInstanceGuestOsInfo;
use super::volumes::HotplugVolumeSource;

/// Body of the `start` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartOptions {
    /// Start the guest paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Dry-run modes (`All`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// Body of the `stop` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopOptions {
    /// Grace period override in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<i64>,
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// Body of the `restart` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartOptions {
    /// Only 0 (force) or unset is accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_period_seconds: Option<i64>,
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// Body of the `pause` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PauseOptions {
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// Body of the `unpause` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnpauseOptions {
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// Body of the `migrate` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrateOptions {
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
    /// Extra node selector for the target pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub added_node_selector: BTreeMap<String, String>,
}

/// Body of the `evacuate/cancel` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvacuateCancelOptions {
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
    /// Node whose evacuation is cancelled.
    pub evacuation_node_name: String,
}

/// Body of the `addvolume` subresource and of a VM volume request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddVolumeOptions {
    /// Volume name.
    pub name: String,
    /// Disk to attach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<Disk>,
    /// Source of the volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_source: Option<HotplugVolumeSource>,
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// Body of the `removevolume` subresource and of a VM volume request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoveVolumeOptions {
    /// Volume name.
    pub name: String,
    /// Dry-run modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dry_run: Vec<String>,
}

/// Query of the `vnc/screenshot` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScreenshotOptions {
    /// Move the cursor to wake the display.
    #[serde(default)]
    pub move_cursor: bool,
}

/// Query of the `vsock` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VsockOptions {
    /// Guest port.
    #[serde(default)]
    pub target_port: u32,
    /// Wrap the stream in TLS.
    #[serde(rename = "useTLS", skip_serializing_if = "Option::is_none")]
    pub use_tls: Option<bool>,
}

/// Response of the `guestosinfo` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceGuestAgentInfo {
    /// Guest agent version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_agent_version: Option<String>,
    /// Commands the agent supports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_commands: Vec<GuestAgentCommandInfo>,
    /// Guest hostname.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Guest OS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub os: Option<VirtualMachineInstanceGuestOsInfo>,
    /// Guest time zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Logged-in users.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_list: Vec<VirtualMachineInstanceGuestOsUser>,
    /// Filesystems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_info: Option<VirtualMachineInstanceFileSystemInfo>,
    /// `frozen` or empty.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_freeze_status: Option<String>,
}

/// A guest agent command.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentCommandInfo {
    /// Command name.
    pub name: String,
    /// Whether it is enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Response of the `userlist` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceGuestOsUserList {
    /// Users.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<VirtualMachineInstanceGuestOsUser>,
}

/// A logged-in guest user.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceGuestOsUser {
    /// User name.
    pub user_name: String,
    /// Domain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Login time (seconds since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login_time: Option<f64>,
}

/// Filesystems of the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceFileSystemInfo {
    /// Filesystems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<VirtualMachineInstanceFileSystem>,
}

/// Response of the `filesystemlist` subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceFileSystemList {
    /// Filesystems.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<VirtualMachineInstanceFileSystem>,
}

/// A guest filesystem.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceFileSystem {
    /// Disk name.
    pub disk_name: String,
    /// Mount point.
    pub mount_point: String,
    /// Filesystem type.
    pub file_system_type: String,
    /// Used bytes.
    #[serde(default)]
    pub used_bytes: i64,
    /// Total bytes.
    #[serde(default)]
    pub total_bytes: i64,
    /// Disks backing it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk: Vec<VirtualMachineInstanceFileSystemDisk>,
}

/// A disk backing a guest filesystem.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceFileSystemDisk {
    /// Serial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Bus type.
    pub bus_type: String,
}
