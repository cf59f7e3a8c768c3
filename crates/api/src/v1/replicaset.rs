//! The VirtualMachineInstanceReplicaSet kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::vmi::VirtualMachineInstanceTemplateSpec;
use crate::string_enum::string_enum;

/// Maximum number of VMIs a replica set creates or deletes in one pass.
pub const BURST_REPLICAS: usize = 250;

string_enum! {
    /// Condition types of a replica set (also used by pools).
    pub enum ReplicaSetConditionType {
        /// Creating or deleting a replica failed.
        ReplicaFailure = "ReplicaFailure",
        /// Reconciling is paused.
        ReplicaPaused = "ReplicaPaused",
    }
}

/// A condition of a replica set.
pub type VirtualMachineInstanceReplicaSetCondition = Condition<ReplicaSetConditionType>;

/// Spec of a VMI replica set: keep `replicas` VMIs from a template.
//
// `kube` derives the `VirtualMachineInstanceReplicaSet` object (`metadata`, `spec`, `status`) from this spec.
// Each printcolumn repeats `type_ = …`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstanceReplicaSet",
    doc = "Keeps a number of VirtualMachineInstances created from a template running.",
    namespaced,
    status = "VirtualMachineInstanceReplicaSetStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "vmirs",
    shortname = "vmirss",
    category = "all",
    label("kubevirt.io", ""),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.labelSelector"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        description = "Number of desired VirtualMachineInstances",
        json_path = ".spec.replicas"
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        description = "Number of managed and not final or deleted VirtualMachineInstances",
        json_path = ".status.replicas"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        description = "Number of managed VirtualMachineInstances which are ready to receive traffic",
        json_path = ".status.readyReplicas"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceReplicaSetSpec {
    /// Desired number of VMIs (defaults to 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Selects the VMIs this replica set owns.
    pub selector: LabelSelector,
    /// Template of the VMIs.
    pub template: VirtualMachineInstanceTemplateSpec,
    /// Stop reconciling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// Observed state of a VMI replica set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceReplicaSetStatus {
    /// VMIs managed and not final or deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// VMIs ready to receive traffic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<VirtualMachineInstanceReplicaSetCondition>,
    /// Label selector in string form, for the scale subresource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
}
