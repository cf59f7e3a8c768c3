//! `pool.kubevirt.io/v1beta1`: the VirtualMachinePool kind.
//!
//! VM names are `<pool>-<index>`; the revision of the template is stored in the label
//! [`crate::constants::VM_POOL_REVISION_NAME_LABEL`].

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;
use crate::v1::conditions::Condition;
use crate::v1::replicaset::ReplicaSetConditionType;
use crate::v1::vm::VirtualMachineSpec;

/// API group of pools.
pub const GROUP: &str = "pool.kubevirt.io";
/// API version of pools served and stored.
pub const VERSION: &str = "v1beta1";
/// Finalizer the pool controller puts on pools.
pub const POOL_FINALIZER: &str = "pool.kubevirt.io/finalizer";

string_enum! {
    /// Order in which VMs are picked for scale-in or update.
    pub enum SortPolicy {
        /// By ascending index.
        AscendingOrder = "AscendingOrder",
        /// By descending index.
        DescendingOrder = "DescendingOrder",
        /// Newest first.
        Newest = "Newest",
        /// Oldest first.
        Oldest = "Oldest",
        /// Random order.
        Random = "Random",
    }
}

string_enum! {
    /// What is preserved of a VM removed by scale-in.
    pub enum StatePreservation {
        /// Nothing; the VM is deleted.
        Disabled = "Disabled",
        /// The VM is stopped and kept.
        Offline = "Offline",
        /// The VM is kept running.
        Online = "Online",
    }
}

/// A condition of a pool (`ReplicaFailure`, `ReplicaPaused`).
pub type VirtualMachinePoolCondition = Condition<ReplicaSetConditionType>;

/// Spec of a VM pool: keep `replicas` VMs from a template.
//
// `kube` derives the `VirtualMachinePool` object (`metadata`, `spec`, `status`) from this spec.
// Each printcolumn repeats `type_ = …`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "pool.kubevirt.io",
    version = "v1beta1",
    kind = "VirtualMachinePool",
    doc = "Keeps a number of VirtualMachines created from a template.",
    namespaced,
    status = "VirtualMachinePoolStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "vmpool",
    shortname = "vmpools",
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
        description = "Number of desired VirtualMachines",
        json_path = ".spec.replicas"
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        description = "Number of managed and not final or deleted VirtualMachines",
        json_path = ".status.replicas"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        description = "Number of managed VirtualMachines which are ready to receive traffic",
        json_path = ".status.readyReplicas"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSpec {
    /// Desired number of VMs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Selects the VMs this pool owns.
    pub selector: LabelSelector,
    /// Template of the VMs.
    pub virtual_machine_template: VirtualMachineTemplateSpec,
    /// Stop reconciling.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Per-VM naming of referenced ConfigMaps and Secrets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name_generation: Option<VirtualMachinePoolNameGeneration>,
    /// Maximum unavailable VMs during updates (number or percentage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// How VMs are removed when scaling in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale_in_strategy: Option<VirtualMachinePoolScaleInStrategy>,
    /// How VMs are updated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<VirtualMachinePoolUpdateStrategy>,
    /// Replace VMs that keep failing to start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autohealing: Option<VirtualMachinePoolAutohealingStrategy>,
}

/// A VM template: metadata and spec of the VMs a pool creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineTemplateSpec {
    /// Metadata given to the created VMs.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// Spec of the created VMs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<VirtualMachineSpec>,
}

/// Per-VM naming of referenced ConfigMaps and Secrets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolNameGeneration {
    /// Append the VM index to ConfigMap names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub append_index_to_config_map_refs: Option<bool>,
    /// Append the VM index to Secret names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub append_index_to_secret_refs: Option<bool>,
}

/// How VMs are removed when scaling in; one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolScaleInStrategy {
    /// No particular order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<VirtualMachinePoolUnmanagedStrategy>,
    /// Remove when convenient.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opportunistic: Option<VirtualMachinePoolOpportunisticScaleInStrategy>,
    /// Remove immediately, in a selected order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proactive: Option<VirtualMachinePoolProactiveScaleInStrategy>,
}

/// Opportunistic scale-in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolOpportunisticScaleInStrategy {
    /// `Disabled`, `Offline` or `Online`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_preservation: Option<StatePreservation>,
}

/// Proactive scale-in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolProactiveScaleInStrategy {
    /// Which VMs go first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection_policy: Option<VirtualMachinePoolSelectionPolicy>,
    /// `Disabled`, `Offline` or `Online`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_preservation: Option<StatePreservation>,
}

/// Which VMs are picked first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSelectionPolicy {
    /// `AscendingOrder`, `DescendingOrder`, `Newest`, `Oldest` or `Random`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort_policy: Option<SortPolicy>,
    /// Prefer VMs matching these.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selectors: Option<VirtualMachinePoolSelectors>,
}

/// Selectors of preferred VMs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSelectors {
    /// VM labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    /// Node of the VM.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_selector_requirement_matcher: Vec<NodeSelectorRequirement>,
}

/// How VMs are updated; one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolUpdateStrategy {
    /// Not updated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<VirtualMachinePoolUnmanagedStrategy>,
    /// Updated on their next restart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opportunistic: Option<VirtualMachinePoolUnmanagedStrategy>,
    /// Updated immediately.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proactive: Option<VirtualMachinePoolProactiveUpdateStrategy>,
}

/// Proactive update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolProactiveUpdateStrategy {
    /// Which VMs go first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selection_policy: Option<VirtualMachinePoolSelectionPolicy>,
}

/// Marker of a strategy without settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolUnmanagedStrategy {}

/// Replacement of VMs that keep failing to start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolAutohealingStrategy {
    /// Failed starts before replacement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_up_failure_threshold: Option<u32>,
    /// Minimum failing duration before replacement (e.g. `5m`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_failing_to_start_duration: Option<String>,
}

/// Observed state of a VM pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolStatus {
    /// VMs managed and not deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// VMs ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<VirtualMachinePoolCondition>,
    /// Label selector in string form, for the scale subresource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
}
