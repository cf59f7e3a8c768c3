//! Status of a VirtualMachineInstance: phases, conditions, interfaces, volume status and the
//! migration state shared with VirtualMachineInstanceMigration.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::domain::Machine;
use super::kubevirt::MigrationConfiguration;
use crate::string_enum::string_enum;

string_enum! {
    /// Lifecycle phase of a VMI.
    pub enum VirtualMachineInstancePhase {
        /// Not set yet (`""`).
        Unset = "",
        /// Accepted, waiting for the launcher pod.
        Pending = "Pending",
        /// The launcher pod is being scheduled.
        Scheduling = "Scheduling",
        /// The launcher pod is on a node; the handler takes over.
        Scheduled = "Scheduled",
        /// The guest runs.
        Running = "Running",
        /// The guest shut down successfully.
        Succeeded = "Succeeded",
        /// The guest or its pod failed.
        Failed = "Failed",
        /// Waiting for a decentralized migration source to synchronise.
        WaitingForSync = "WaitingForSync",
        /// The state cannot be determined.
        Unknown = "Unknown",
    }
}

impl VirtualMachineInstancePhase {
    /// Whether the phase is final: `Succeeded` or `Failed`.
    #[must_use]
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// Whether the VMI has not been processed yet: `Pending` or unset.
    #[must_use]
    pub fn is_unprocessed(&self) -> bool {
        matches!(self, Self::Pending | Self::Unset)
    }
}

string_enum! {
    /// Condition types of a VMI. Pod condition types (e.g. `PodScheduled`) are copied verbatim
    /// and decode as [`Other`](Self::Other).
    pub enum VirtualMachineInstanceConditionType {
        /// The VMI is being provisioned (e.g. DataVolumes importing).
        Provisioning = "Provisioning",
        /// The guest is running and ready.
        Ready = "Ready",
        /// The handler failed to synchronise the VMI.
        Synchronized = "Synchronized",
        /// The guest is paused.
        Paused = "Paused",
        /// The guest agent is connected.
        AgentConnected = "AgentConnected",
        /// Access credentials are synchronised into the guest.
        AccessCredentialsSynchronized = "AccessCredentialsSynchronized",
        /// The guest agent version is not supported.
        AgentVersionNotSupported = "AgentVersionNotSupported",
        /// The VMI can be live-migrated.
        LiveMigratable = "LiveMigratable",
        /// A vCPU hotplug is pending.
        HotVcpuChange = "HotVCPUChange",
        /// A memory hotplug is pending.
        HotMemoryChange = "HotMemoryChange",
        /// A volume update is pending.
        VolumesChange = "VolumesChange",
        /// All DataVolumes are ready.
        DataVolumesReady = "DataVolumesReady",
        /// The storage can be live-migrated.
        StorageLiveMigratable = "StorageLiveMigratable",
        /// A decentralized live migration failed.
        DecentralizedLiveMigrationFailure = "DecentralizedLiveMigrationFailure",
        /// The VMI must be migrated.
        MigrationRequired = "MigrationRequired",
        /// An eviction was requested.
        EvictionRequested = "EvictionRequested",
        /// The guest runs without hardware virtualisation.
        SoftwareEmulation = "SoftwareEmulation",
        /// Pod condition copied from the launcher pod.
        PodScheduled = "PodScheduled",
    }
}

/// A condition of a VMI.
pub type VirtualMachineInstanceCondition = Condition<VirtualMachineInstanceConditionType>;

/// Ready-condition reason: the launcher pod is terminating.
pub const POD_TERMINATING_REASON: &str = "PodTerminating";
/// Ready-condition reason: the launcher pod does not exist.
pub const POD_NOT_EXISTS_REASON: &str = "PodNotExists";
/// Ready-condition reason: the launcher pod has no Ready condition.
pub const POD_CONDITION_MISSING_REASON: &str = "PodConditionMissing";
/// Ready-condition reason: the guest is not running.
pub const GUEST_NOT_RUNNING_REASON: &str = "GuestNotRunning";

string_enum! {
    /// How a VMI is migrated.
    pub enum MigrationMethod {
        /// Disks are copied too.
        BlockMigration = "BlockMigration",
        /// Only memory and device state are copied.
        LiveMigration = "LiveMigration",
    }
}

string_enum! {
    /// Transport of a migration.
    pub enum MigrationTransport {
        /// Over unix sockets proxied by the handlers.
        Unix = "Unix",
    }
}

string_enum! {
    /// Phase of a volume (hotplug and memory dump volumes).
    pub enum VolumePhase {
        /// Waiting.
        Pending = "Pending",
        /// The PVC is bound.
        Bound = "Bound",
        /// Attached to the node.
        AttachedToNode = "AttachedToNode",
        /// Mounted into the launcher pod.
        MountedToPod = "MountedToPod",
        /// Ready in the guest.
        Ready = "Ready",
        /// Being detached.
        Detaching = "Detaching",
        /// Unmounted from the launcher pod.
        UnMountedFromPod = "UnMountedFromPod",
        /// Memory dump completed.
        MemoryDumpCompleted = "MemoryDumpCompleted",
        /// Memory dump in progress.
        MemoryDumpInProgress = "MemoryDumpInProgress",
        /// Memory dump failed.
        MemoryDumpFailed = "MemoryDumpFailed",
    }
}

string_enum! {
    /// State of changed block tracking.
    pub enum ChangedBlockTrackingState {
        /// Not set.
        Undefined = "",
        /// Takes effect after a restart.
        PendingRestart = "PendingRestart",
        /// Being set up.
        Initializing = "Initializing",
        /// Enabled.
        Enabled = "Enabled",
        /// Disabled.
        Disabled = "Disabled",
        /// The IncrementalBackup feature gate is off.
        IncrementalBackupFeatureGateDisabled = "IncrementalBackupFeatureGateDisabled",
    }
}

string_enum! {
    /// Result of a migration abort.
    pub enum MigrationAbortStatus {
        /// The abort succeeded.
        Succeeded = "Succeeded",
        /// The abort failed.
        Failed = "Failed",
        /// The abort is in progress.
        Aborting = "Aborting",
    }
}

string_enum! {
    /// Mode of a running migration.
    pub enum MigrationMode {
        /// Pre-copy.
        PreCopy = "PreCopy",
        /// Post-copy.
        PostCopy = "PostCopy",
        /// The source is paused to converge.
        Paused = "Paused",
    }
}

impl VirtualMachineInstanceStatus {
    /// The condition of `type_`, if present.
    #[must_use]
    pub fn condition(
        &self,
        type_: &VirtualMachineInstanceConditionType,
    ) -> Option<&VirtualMachineInstanceCondition> {
        super::conditions::find_condition(&self.conditions, type_)
    }

    /// Whether the volume status records the claim of volume `name` as `Block`-mode
    /// (virt-controller writes each claim's `persistentVolumeClaimInfo` before hand-off, so
    /// the launcher pod's template and virt-handler's launcher spec read the same answer).
    #[must_use]
    pub fn claim_is_block(&self, name: &str) -> bool {
        self.volume_status
            .iter()
            .filter(|v| v.name == name)
            .filter_map(|v| v.persistent_volume_claim_info.as_ref())
            .any(|i| i.volume_mode.as_deref() == Some("Block"))
    }
}

/// Observed state of a VirtualMachineInstance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    /// Node the VMI runs on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Short reason for the current phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<VirtualMachineInstanceCondition>,
    /// Lifecycle phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<VirtualMachineInstancePhase>,
    /// When each phase was entered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transition_timestamps: Vec<VirtualMachineInstancePhaseTransitionTimestamp>,
    /// Interfaces as seen by the guest and the pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<VirtualMachineInstanceNetworkInterface>,
    /// Guest OS details from the guest agent.
    #[serde(rename = "guestOSInfo", skip_serializing_if = "Option::is_none")]
    pub guest_os_info: Option<VirtualMachineInstanceGuestOsInfo>,
    /// State of the current or last migration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_state: Option<VirtualMachineInstanceMigrationState>,
    /// `BlockMigration` or `LiveMigration`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_method: Option<MigrationMethod>,
    /// Transport of the migration (`Unix`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_transport: Option<MigrationTransport>,
    /// QoS class of the launcher pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
    /// Launcher image the VMI runs with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launcher_container_image_version: Option<String>,
    /// Node being evacuated, set while an eviction migration is pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evacuation_node_name: Option<String>,
    /// Launcher pods of this VMI: pod UID to node name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub active_pods: BTreeMap<String, String>,
    /// Per-volume status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_status: Vec<VolumeStatus>,
    /// Checksums of the kernel and initrd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_boot_status: Option<KernelBootStatus>,
    /// `frozen` while the guest filesystems are frozen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_freeze_status: Option<String>,
    /// Hints for scheduling (TSC frequency).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_hints: Option<TopologyHints>,
    /// ControllerRevision of the VM spec the VMI was created from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_machine_revision_name: Option<String>,
    /// UID the launcher runs as (always serialised, 107 for non-root, 0 for root).
    #[serde(default)]
    pub runtime_user: u64,
    /// VSOCK context id.
    #[serde(rename = "VSOCKCID", skip_serializing_if = "Option::is_none")]
    pub vsock_cid: Option<u32>,
    /// SELinux context of the launcher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selinux_context: Option<String>,
    /// The machine type actually used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    /// The CPU topology actually used.
    #[serde(rename = "currentCPUTopology", skip_serializing_if = "Option::is_none")]
    pub current_cpu_topology: Option<CpuTopology>,
    /// Memory actually used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStatus>,
    /// Volumes being migrated to other PVCs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrated_volumes: Vec<StorageMigratedVolumeInfo>,
    /// Changed block tracking state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_block_tracking: Option<ChangedBlockTrackingStatus>,
}

/// When a phase was entered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstancePhaseTransitionTimestamp {
    /// The phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<VirtualMachineInstancePhase>,
    /// When it was entered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_transition_timestamp: Option<Time>,
}

/// Scheduling hints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyHints {
    /// TSC frequency of the node the VMI started on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tsc_frequency: Option<i64>,
}

/// An interface as reported by the guest agent and the pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceNetworkInterface {
    /// Primary IP address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// MAC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Interface name from the spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// All IP addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    /// Interface name inside the pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_interface_name: Option<String>,
    /// Interface name inside the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// Sources of this information, e.g. `domain, guest-agent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info_source: Option<String>,
    /// Number of queues.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_count: Option<i32>,
    /// `up` or `down`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_state: Option<String>,
}

/// Guest OS details.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceGuestOsInfo {
    /// Name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Kernel release.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_release: Option<String>,
    /// Version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Pretty name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pretty_name: Option<String>,
    /// Version id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    /// Kernel version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_version: Option<String>,
    /// Machine architecture.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// OS id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// A CPU topology.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuTopology {
    /// Cores per socket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Threads per core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

/// Memory of the running guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStatus {
    /// Memory at boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_at_boot: Option<Quantity>,
    /// Memory currently visible to the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_current: Option<Quantity>,
    /// Memory requested (hotplug target).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_requested: Option<Quantity>,
    /// Overhead memory of the launcher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_overhead: Option<Quantity>,
}

/// A volume migrated from one PVC to another.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageMigratedVolumeInfo {
    /// Volume name.
    pub volume_name: String,
    /// Source PVC.
    #[serde(rename = "sourcePVCInfo", skip_serializing_if = "Option::is_none")]
    pub source_pvc_info: Option<PersistentVolumeClaimInfo>,
    /// Destination PVC.
    #[serde(rename = "destinationPVCInfo", skip_serializing_if = "Option::is_none")]
    pub destination_pvc_info: Option<PersistentVolumeClaimInfo>,
}

/// Details of a PVC backing a volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimInfo {
    /// PVC name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Access modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_modes: Vec<String>,
    /// `Filesystem` or `Block`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
    /// Capacity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// Requests.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    /// Whether the image is preallocated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preallocated: Option<bool>,
    /// Filesystem overhead as a decimal fraction string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filesystem_overhead: Option<String>,
}

/// Status of one volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// Volume name.
    pub name: String,
    /// Target device in the guest, e.g. `vda`.
    pub target: String,
    /// Phase (hotplug and memory dump volumes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<VolumePhase>,
    /// Reason of the phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// PVC details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_info: Option<PersistentVolumeClaimInfo>,
    /// Attachment pod of a hotplug volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotplug_volume: Option<HotplugVolumeStatus>,
    /// Size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// Memory dump details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_dump_volume: Option<DomainMemoryDumpInfo>,
    /// Container disk details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_disk_volume: Option<ContainerDiskInfo>,
}

/// Attachment pod of a hotplug volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeStatus {
    /// Pod name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_pod_name: Option<String>,
    /// Pod UID.
    #[serde(rename = "attachPodUID", skip_serializing_if = "Option::is_none")]
    pub attach_pod_uid: Option<String>,
}

/// Memory dump details.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainMemoryDumpInfo {
    /// Start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    /// End.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<Time>,
    /// PVC receiving the dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// File name of the dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_file_name: Option<String>,
}

/// Container disk details.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDiskInfo {
    /// Checksum of the image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u32>,
}

/// Kernel boot details.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootStatus {
    /// Kernel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_info: Option<KernelInfo>,
    /// Initrd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd_info: Option<KernelInfo>,
}

/// Checksum of a boot artefact.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelInfo {
    /// Checksum.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checksum: Option<u32>,
}

/// Changed block tracking state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangedBlockTrackingStatus {
    /// State.
    pub state: ChangedBlockTrackingState,
    /// Backup in progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_status: Option<VirtualMachineInstanceBackupStatus>,
}

/// A backup of the VMI.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceBackupStatus {
    /// Backup name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_name: Option<String>,
    /// Start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    /// End.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<Time>,
    /// Completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<bool>,
    /// Failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<bool>,
    /// Message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_msg: Option<String>,
    /// Checkpoint name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_name: Option<String>,
    /// Volumes included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VirtualMachineInstanceBackupVolumeInfo>,
    /// Quiesce status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiesce_status: Option<String>,
}

/// A volume of a backup.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceBackupVolumeInfo {
    /// Volume name.
    pub volume_name: String,
}

/// State of a migration, on the VMI and on the migration object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationState {
    /// Start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    /// End.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<Time>,
    /// When the target domain became ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_node_domain_ready_timestamp: Option<Time>,
    /// Whether the target domain was detected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_node_domain_detected: Option<bool>,
    /// Address of the target handler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_node_address: Option<String>,
    /// Ports of the target for direct migration.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub target_direct_migration_node_ports: BTreeMap<String, i32>,
    /// Target node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    /// Target pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_pod: Option<String>,
    /// Attachment pod on the target.
    #[serde(
        rename = "targetAttachmentPodUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_attachment_pod_uid: Option<String>,
    /// Source node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_node: Option<String>,
    /// Source pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_pod: Option<String>,
    /// Completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<bool>,
    /// Failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<bool>,
    /// An abort was requested.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort_requested: Option<bool>,
    /// `Succeeded`, `Failed` or `Aborting`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort_status: Option<MigrationAbortStatus>,
    /// Why the migration failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// UID of the migration object (JSON name `migrationUid`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_uid: Option<String>,
    /// `PreCopy`, `PostCopy` or `Paused`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<MigrationMode>,
    /// MigrationPolicy applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_policy_name: Option<String>,
    /// Configuration used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_configuration: Option<MigrationConfiguration>,
    /// CPUs on the target.
    #[serde(
        rename = "targetCPUSet",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub target_cpu_set: Vec<i32>,
    /// Node topology of the target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_node_topology: Option<String>,
    /// Persistent state PVC on the source.
    #[serde(
        rename = "sourcePersistentStatePVCName",
        skip_serializing_if = "Option::is_none"
    )]
    pub source_persistent_state_pvc_name: Option<String>,
    /// Persistent state PVC on the target.
    #[serde(
        rename = "targetPersistentStatePVCName",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_persistent_state_pvc_name: Option<String>,
    /// Source side (decentralized migration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_state: Option<VirtualMachineInstanceMigrationSourceState>,
    /// Target side (decentralized migration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_state: Option<VirtualMachineInstanceMigrationTargetState>,
    /// `Pod` or `Migration`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_network_type: Option<String>,
    /// Memory overhead on the target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_memory_overhead: Option<Quantity>,
}

/// Source side of a decentralized migration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationSourceState {
    /// Node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// UID of the migration object (JSON name `migrationUID`).
    #[serde(rename = "migrationUID", skip_serializing_if = "Option::is_none")]
    pub migration_uid: Option<String>,
    /// Domain name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_name: Option<String>,
    /// Domain namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_namespace: Option<String>,
    /// Synchronisation address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_address: Option<String>,
    /// Persistent state PVC.
    #[serde(
        rename = "persistentStatePVCName",
        skip_serializing_if = "Option::is_none"
    )]
    pub persistent_state_pvc_name: Option<String>,
    /// SELinux context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selinux_context: Option<String>,
    /// VMI UID.
    #[serde(
        rename = "virtualMachineInstanceUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub virtual_machine_instance_uid: Option<String>,
    /// Node selectors of the source.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selectors: BTreeMap<String, String>,
}

/// Target side of a decentralized migration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationTargetState {
    /// Node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// UID of the migration object (JSON name `migrationUID`).
    #[serde(rename = "migrationUID", skip_serializing_if = "Option::is_none")]
    pub migration_uid: Option<String>,
    /// Domain name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_name: Option<String>,
    /// Domain namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_namespace: Option<String>,
    /// Synchronisation address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_address: Option<String>,
    /// Persistent state PVC.
    #[serde(
        rename = "persistentStatePVCName",
        skip_serializing_if = "Option::is_none"
    )]
    pub persistent_state_pvc_name: Option<String>,
    /// SELinux context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selinux_context: Option<String>,
    /// VMI UID.
    #[serde(
        rename = "virtualMachineInstanceUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub virtual_machine_instance_uid: Option<String>,
    /// When the target domain became ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_ready_timestamp: Option<Time>,
    /// Whether the target domain was detected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_detected: Option<bool>,
    /// Address of the target handler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_address: Option<String>,
    /// Ports for direct migration.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub direct_migration_node_ports: BTreeMap<String, i32>,
    /// Attachment pod.
    #[serde(rename = "attachmentPodUID", skip_serializing_if = "Option::is_none")]
    pub attachment_pod_uid: Option<String>,
    /// CPUs on the target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_set: Vec<i32>,
    /// Node topology.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_topology: Option<String>,
}
