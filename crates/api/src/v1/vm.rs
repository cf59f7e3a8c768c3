//! The VirtualMachine kind: spec (run strategy, template, DataVolume templates), status
//! (printable status, state change requests, start failures) and [`VirtualMachineSpec::run_strategy`].

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::subresources::{AddVolumeOptions, RemoveVolumeOptions};
use super::vmi::VirtualMachineInstanceTemplateSpec;
use super::vmi_status::{ChangedBlockTrackingStatus, StorageMigratedVolumeInfo};
use crate::string_enum::string_enum;

string_enum! {
    /// How a VM keeps its VMI running.
    pub enum RunStrategy {
        /// Placeholder for an unset strategy (`""`).
        Unknown = "",
        /// A VMI always runs; it is restarted when it stops.
        Always = "Always",
        /// No VMI runs.
        Halted = "Halted",
        /// Started and stopped only through the subresources.
        Manual = "Manual",
        /// Restarted only when it fails.
        RerunOnFailure = "RerunOnFailure",
        /// Runs once; not restarted.
        Once = "Once",
        /// Waits as the receiver of a decentralized migration.
        WaitAsReceiver = "WaitAsReceiver",
    }
}

string_enum! {
    /// Human readable status of a VM (`status.printableStatus`).
    pub enum PrintableStatus {
        /// No VMI exists.
        Stopped = "Stopped",
        /// Resources such as DataVolumes are being provisioned.
        Provisioning = "Provisioning",
        /// The VMI is starting.
        Starting = "Starting",
        /// The VMI runs.
        Running = "Running",
        /// The VMI is paused.
        Paused = "Paused",
        /// The VMI is stopping.
        Stopping = "Stopping",
        /// The VM is being deleted.
        Terminating = "Terminating",
        /// The VMI keeps failing; restarts are backed off.
        CrashLoopBackOff = "CrashLoopBackOff",
        /// The VMI is migrating.
        Migrating = "Migrating",
        /// The state cannot be determined.
        Unknown = "Unknown",
        /// The launcher pod cannot be scheduled.
        ErrorUnschedulable = "ErrorUnschedulable",
        /// An image cannot be pulled.
        ErrImagePull = "ErrImagePull",
        /// Pulling an image is backed off.
        ImagePullBackOff = "ImagePullBackOff",
        /// A PVC does not exist.
        ErrorPvcNotFound = "ErrorPvcNotFound",
        /// A DataVolume failed.
        DataVolumeError = "DataVolumeError",
        /// Waiting for a PVC to be bound.
        WaitingForVolumeBinding = "WaitingForVolumeBinding",
        /// Waiting as a migration receiver.
        WaitingForReceiver = "WaitingForReceiver",
    }
}

string_enum! {
    /// Condition types of a VM. VMI condition types copied onto the VM decode as
    /// [`Other`](Self::Other) unless listed here.
    pub enum VirtualMachineConditionType {
        /// Creating or deleting the VMI failed.
        Failure = "Failure",
        /// The VMI is ready.
        Ready = "Ready",
        /// The VMI is paused.
        Paused = "Paused",
        /// A spec change needs a restart.
        RestartRequired = "RestartRequired",
        /// Manual recovery is required.
        ManualRecoveryRequired = "ManualRecoveryRequired",
    }
}

/// A condition of a VM.
pub type VirtualMachineCondition = Condition<VirtualMachineConditionType>;

string_enum! {
    /// Action of a state change request.
    pub enum StateChangeRequestAction {
        /// Start the VMI.
        Start = "Start",
        /// Stop the VMI.
        Stop = "Stop",
    }
}

/// Key in a start request's `data` that asks for a paused start.
pub const START_REQUEST_DATA_PAUSED_KEY: &str = "paused";
/// Value of [`START_REQUEST_DATA_PAUSED_KEY`] that asks for a paused start.
pub const START_REQUEST_DATA_PAUSED_TRUE: &str = "true";

string_enum! {
    /// How volume changes of a running VM are applied.
    pub enum UpdateVolumesStrategy {
        /// By storage migration.
        Migration = "Migration",
        /// By replacement on restart.
        Replacement = "Replacement",
    }
}

string_enum! {
    /// Phase of a memory dump.
    pub enum MemoryDumpPhase {
        /// Associating the PVC.
        Associating = "Associating",
        /// Dumping.
        InProgress = "InProgress",
        /// Unmounting the PVC.
        Unmounting = "Unmounting",
        /// Done.
        Completed = "Completed",
        /// Dissociating the PVC.
        Dissociating = "Dissociating",
        /// Failed.
        Failed = "Failed",
    }
}

/// Error of [`VirtualMachineSpec::run_strategy`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunStrategyError {
    /// Both `running` and `runStrategy` are set.
    #[error("running and runstrategy are mutually exclusive")]
    MutuallyExclusive,
}

impl VirtualMachineSpec {
    /// The effective run strategy: `runStrategy` if set, else `Always` for `running: true`, else
    /// `Halted` (also when neither is set). Setting both is an error.
    ///
    /// # Errors
    ///
    /// [`RunStrategyError::MutuallyExclusive`] when both `running` and `runStrategy` are set.
    pub fn run_strategy(&self) -> Result<RunStrategy, RunStrategyError> {
        match (self.running, &self.run_strategy) {
            (Some(_), Some(_)) => Err(RunStrategyError::MutuallyExclusive),
            (Some(true), None) => Ok(RunStrategy::Always),
            (Some(false) | None, None) => Ok(RunStrategy::Halted),
            (None, Some(strategy)) => Ok(strategy.clone()),
        }
    }
}

impl VirtualMachine {
    /// The effective run strategy of the spec; see [`VirtualMachineSpec::run_strategy`].
    ///
    /// # Errors
    ///
    /// [`RunStrategyError::MutuallyExclusive`] when both `running` and `runStrategy` are set.
    pub fn run_strategy(&self) -> Result<RunStrategy, RunStrategyError> {
        self.spec.run_strategy()
    }
}

/// Spec of a VirtualMachine: a VMI template and how it should run.
//
// `kube` derives the `VirtualMachine` object (`metadata`, `spec`, `status`) from this spec.
// Each printcolumn repeats `type_ = …`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachine",
    doc = "A virtual machine that may be stopped: it holds the template of its VirtualMachineInstance and mirrors the instance state in its status.",
    namespaced,
    status = "VirtualMachineStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "vm",
    shortname = "vms",
    category = "all",
    label("kubevirt.io", ""),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Status",
        type_ = "string",
        description = "Human Readable Status",
        json_path = ".status.printableStatus"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Deprecated: `true` means `runStrategy: Always`, `false` means `Halted`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
    /// How the VMI is kept running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    /// Instance type providing resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instancetype: Option<InstancetypeMatcher>,
    /// Preference providing defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preference: Option<PreferenceMatcher>,
    /// Template of the VMI.
    pub template: VirtualMachineInstanceTemplateSpec,
    /// DataVolumes created with the VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_volume_templates: Vec<DataVolumeTemplateSpec>,
    /// `Migration` or `Replacement`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_volumes_strategy: Option<UpdateVolumesStrategy>,
}

/// Reference to a (cluster) instance type.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeMatcher {
    /// Name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Kind, e.g. `VirtualMachineClusterInstancetype`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// ControllerRevision holding the captured spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// Infer from the labels of this volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infer_from_volume: Option<String>,
    /// `Reject` or `Ignore`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infer_from_volume_failure_policy: Option<String>,
}

/// Reference to a (cluster) preference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceMatcher {
    /// Name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Kind, e.g. `VirtualMachineClusterPreference`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// ControllerRevision holding the captured spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision_name: Option<String>,
    /// Infer from the labels of this volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infer_from_volume: Option<String>,
    /// `Reject` or `Ignore`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infer_from_volume_failure_policy: Option<String>,
}

/// A DataVolume created with a VM. The CDI spec is kept as opaque JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeTemplateSpec {
    /// API version (`cdi.kubevirt.io/v1beta1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Kind (`DataVolume`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Metadata of the DataVolume.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// CDI DataVolumeSpec.
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    pub spec: serde_json::Map<String, serde_json::Value>,
    /// Placeholder status.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
}

/// Observed state of a VirtualMachine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Name of the snapshot in progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_in_progress: Option<String>,
    /// Name of the restore in progress.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_in_progress: Option<String>,
    /// A VMI exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    /// The VMI is running and ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Human readable status.
    #[schemars(extend("default" = "Stopped"))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub printable_status: Option<PrintableStatus>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<VirtualMachineCondition>,
    /// Pending start/stop requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_change_requests: Vec<VirtualMachineStateChangeRequest>,
    /// Pending volume hotplug requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_requests: Vec<VirtualMachineVolumeRequest>,
    /// Snapshot support per volume.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_snapshot_statuses: Vec<VolumeSnapshotStatus>,
    /// Crash-loop back-off state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<VirtualMachineStartFailure>,
    /// Memory dump request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_dump_request: Option<VirtualMachineMemoryDumpRequest>,
    /// Generation last reflected in the VMI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Generation of the VM spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desired_generation: Option<i64>,
    /// Run strategy last acted on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    /// Volume update state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_update_state: Option<VolumeUpdateState>,
    /// Changed block tracking state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_block_tracking: Option<ChangedBlockTrackingStatus>,
    /// Instance type in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instancetype_ref: Option<InstancetypeStatusRef>,
    /// Preference in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preference_ref: Option<InstancetypeStatusRef>,
}

/// A request to start or stop the VMI.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStateChangeRequest {
    /// `Start` or `Stop`.
    pub action: StateChangeRequestAction,
    /// Data; `paused: "true"` starts paused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, String>,
    /// UID of the VMI the request is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// A volume hotplug request: add or remove.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineVolumeRequest {
    /// Add a volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_volume_options: Option<AddVolumeOptions>,
    /// Remove a volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remove_volume_options: Option<RemoveVolumeOptions>,
}

/// Snapshot support of a volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    /// Volume name.
    pub name: String,
    /// Whether snapshots are supported.
    #[serde(default)]
    pub enabled: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Crash-loop back-off state of a VM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStartFailure {
    /// Consecutive failed starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_fail_count: Option<i32>,
    /// UID of the last failed VMI.
    #[serde(rename = "lastFailedVMIUID", skip_serializing_if = "Option::is_none")]
    pub last_failed_vmi_uid: Option<String>,
    /// No new start before this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_timestamp: Option<Time>,
}

/// A memory dump request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineMemoryDumpRequest {
    /// PVC receiving the dump.
    pub claim_name: String,
    /// Phase.
    pub phase: MemoryDumpPhase,
    /// Remove the association.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remove: Option<bool>,
    /// Start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    /// End.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<Time>,
    /// Dump file name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    /// Message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Volume update state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeUpdateState {
    /// Volume migration state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_migration_state: Option<VolumeMigrationState>,
}

/// Volumes being migrated.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMigrationState {
    /// The volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrated_volumes: Vec<StorageMigratedVolumeInfo>,
}

/// Instance type or preference in use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeStatusRef {
    /// Name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Captured revision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_revision_ref: Option<ControllerRevisionRef>,
    /// Volume it was inferred from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infer_from_volume: Option<String>,
    /// `Reject` or `Ignore`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infer_from_volume_failure_policy: Option<String>,
}

/// A ControllerRevision reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerRevisionRef {
    /// Name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(running: Option<bool>, run_strategy: Option<RunStrategy>) -> VirtualMachineSpec {
        VirtualMachineSpec {
            running,
            run_strategy,
            ..VirtualMachineSpec::default()
        }
    }

    #[test]
    fn running_and_run_strategy_together_are_rejected() {
        let err = spec(Some(true), Some(RunStrategy::Always))
            .run_strategy()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "running and runstrategy are mutually exclusive"
        );
    }

    #[test]
    fn neither_running_nor_run_strategy_means_halted() {
        assert_eq!(spec(None, None).run_strategy(), Ok(RunStrategy::Halted));
    }

    #[test]
    fn running_true_means_always_and_false_means_halted() {
        assert_eq!(
            spec(Some(true), None).run_strategy(),
            Ok(RunStrategy::Always)
        );
        assert_eq!(
            spec(Some(false), None).run_strategy(),
            Ok(RunStrategy::Halted)
        );
    }

    #[test]
    fn run_strategy_alone_is_returned_as_is() {
        assert_eq!(
            spec(None, Some(RunStrategy::RerunOnFailure)).run_strategy(),
            Ok(RunStrategy::RerunOnFailure)
        );
        let unknown = spec(None, Some(RunStrategy::from("Sometimes")));
        assert_eq!(
            unknown.run_strategy(),
            Ok(RunStrategy::Other("Sometimes".into()))
        );
    }

    #[test]
    fn printable_status_round_trips_upstream_strings() {
        let status: VirtualMachineStatus =
            serde_json::from_value(serde_json::json!({"printableStatus": "ErrorUnschedulable"}))
                .unwrap();
        assert_eq!(
            status.printable_status,
            Some(PrintableStatus::ErrorUnschedulable)
        );
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"printableStatus": "ErrorUnschedulable"})
        );
    }
}
