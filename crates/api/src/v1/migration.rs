//! The VirtualMachineInstanceMigration kind.
//!
//! The migration state in its status is the VMI's [`VirtualMachineInstanceMigrationState`], whose
//! UID field is spelled `migrationUid`; the decentralized source/target states spell it
//! `migrationUID`, as upstream does.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::vmi_status::VirtualMachineInstanceMigrationState;
use crate::string_enum::string_enum;

string_enum! {
    /// Phase of a migration.
    pub enum MigrationPhase {
        /// Not set yet (`""`).
        Unset = "",
        /// Accepted, waiting to start.
        Pending = "Pending",
        /// The target pod is being scheduled.
        Scheduling = "Scheduling",
        /// The target pod is scheduled.
        Scheduled = "Scheduled",
        /// The target handler prepares the target.
        PreparingTarget = "PreparingTarget",
        /// The target is ready to receive.
        TargetReady = "TargetReady",
        /// Memory is being transferred.
        Running = "Running",
        /// The migration completed.
        Succeeded = "Succeeded",
        /// The migration failed.
        Failed = "Failed",
        /// Waiting for the other side of a decentralized migration.
        WaitingForSync = "WaitingForSync",
        /// Synchronising with the other side of a decentralized migration.
        Synchronizing = "Synchronizing",
    }
}

impl MigrationPhase {
    /// Whether the phase is final: `Succeeded` or `Failed`.
    #[must_use]
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

string_enum! {
    /// Condition types of a migration (lower camel case, as upstream).
    pub enum MigrationConditionType {
        /// An abort was requested.
        AbortRequested = "migrationAbortRequested",
        /// The target pod was rejected by a resource quota.
        RejectedByResourceQuota = "migrationRejectedByResourceQuota",
        /// Blocked by utility volumes.
        BlockedByUtilityVolumes = "migrationBlockedByUtilityVolumes",
        /// A decentralized migration is blocked.
        DecentralizedMigrationBlocked = "decentralizedMigrationBlocked",
        /// Blocked by a backup.
        BlockedByBackup = "migrationBlockedByBackup",
    }
}

/// A condition of a migration.
pub type VirtualMachineInstanceMigrationCondition = Condition<MigrationConditionType>;

string_enum! {
    /// Priority of a migration; only virt-controller may set it.
    pub enum MigrationPriority {
        /// System critical.
        SystemCritical = "system-critical",
        /// Triggered by a user.
        UserTriggered = "user-triggered",
        /// System maintenance (e.g. node drain).
        SystemMaintenance = "system-maintenance",
    }
}

impl VirtualMachineInstanceMigrationSpec {
    /// Whether this is a decentralized migration: exactly one of `sendTo` and `receive` is set.
    #[must_use]
    pub fn is_decentralized(&self) -> bool {
        self.send_to.is_some() != self.receive.is_some()
    }
}

/// Spec of a migration: which VMI to move.
//
// `kube` derives the `VirtualMachineInstanceMigration` object (`metadata`, `spec`, `status`) from this spec.
// Each printcolumn repeats `type_ = …`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstanceMigration",
    doc = "A request to live-migrate a VirtualMachineInstance to another node.",
    namespaced,
    status = "VirtualMachineInstanceMigrationStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "vmim",
    shortname = "vmims",
    category = "all",
    label("kubevirt.io", ""),
    printcolumn(
        name = "Phase",
        type_ = "string",
        description = "The current phase of VM instance migration",
        json_path = ".status.phase"
    ),
    printcolumn(
        name = "VMI",
        type_ = "string",
        description = "The name of the VMI to perform the migration on",
        json_path = ".spec.vmiName"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationSpec {
    /// Name of the VMI to migrate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vmi_name: Option<String>,
    /// Extra node selector for the target pod; the VMI's selectors win.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub added_node_selector: BTreeMap<String, String>,
    /// Decentralized migration: this side sends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_to: Option<VirtualMachineInstanceMigrationSource>,
    /// Decentralized migration: this side receives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receive: Option<VirtualMachineInstanceMigrationTarget>,
    /// `system-critical`, `user-triggered` or `system-maintenance`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<MigrationPriority>,
}

/// Sending side of a decentralized migration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationSource {
    /// Shared migration id.
    #[serde(rename = "migrationID")]
    pub migration_id: String,
    /// URL of the receiving side.
    #[serde(rename = "connectURL")]
    pub connect_url: String,
}

/// Receiving side of a decentralized migration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationTarget {
    /// Shared migration id.
    #[serde(rename = "migrationID")]
    pub migration_id: String,
}

/// Observed state of a migration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationStatus {
    /// Phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<MigrationPhase>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<VirtualMachineInstanceMigrationCondition>,
    /// When each phase was entered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transition_timestamps: Vec<VirtualMachineInstanceMigrationPhaseTransitionTimestamp>,
    /// Copy of the VMI's migration state at finalisation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_state: Option<VirtualMachineInstanceMigrationState>,
    /// Synchronisation addresses (decentralized migration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub synchronization_addresses: Vec<String>,
}

/// When a migration phase was entered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationPhaseTransitionTimestamp {
    /// The phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<MigrationPhase>,
    /// When it was entered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_transition_timestamp: Option<Time>,
}
