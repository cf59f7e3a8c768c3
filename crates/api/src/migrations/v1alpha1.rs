//! `migrations.kubevirt.io/v1alpha1`: the MigrationPolicy kind, cluster-scoped.
//!
//! A policy selects VMIs by their labels and their namespace's labels
//! ([`Selectors`]), and overlays the cluster's migration configuration for the migrations of
//! the VMIs it selects. Which policy a VMI gets is decided when a migration is handed over
//! (virt-controller's `migration::policy`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::v1::conditions::Condition;

/// API group of migration policies.
pub const GROUP: &str = "migrations.kubevirt.io";
/// API version of migration policies served and stored.
pub const VERSION: &str = "v1alpha1";

/// Labels that must all be present with these values (upstream's `LabelSelector`, a plain
/// map, not Kubernetes' selector type).
pub type LabelSelector = BTreeMap<String, String>;

/// Which VMIs a policy applies to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Selectors {
    /// Labels of the VMI's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Labels of the VMI.
    #[serde(
        default,
        rename = "virtualMachineInstanceSelector",
        skip_serializing_if = "Option::is_none"
    )]
    pub virtual_machine_instance_selector: Option<LabelSelector>,
}

/// What a policy sets for the migrations of the VMIs it selects; unset fields keep the
/// cluster's configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "migrations.kubevirt.io",
    version = "v1alpha1",
    kind = "MigrationPolicy",
    plural = "migrationpolicies",
    doc = "Migration settings for the VMIs it selects.",
    status = "MigrationPolicyStatus",
    derive = "Default",
    derive = "PartialEq",
    category = "all",
    label("kubevirt.io", "")
)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPolicySpec {
    /// The VMIs the policy applies to.
    pub selectors: Option<Selectors>,
    /// Whether QEMU may throttle the guest's vCPUs so that the migration converges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_auto_converge: Option<bool>,
    /// Bandwidth limit of each migration (`0` is unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_per_migration: Option<Quantity>,
    /// Seconds per GiB of guest memory a migration may take before it is aborted.
    #[serde(
        default,
        rename = "completionTimeoutPerGiB",
        skip_serializing_if = "Option::is_none"
    )]
    pub completion_timeout_per_gi_b: Option<i64>,
    /// Whether the migration may switch to post-copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_post_copy: Option<bool>,
    /// Whether the migration may disrupt the workload (pause it or switch to post-copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_workload_disruption: Option<bool>,
    /// The longest pause of the guest at the switch-over, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_downtime_ms: Option<u64>,
}

/// Status of a migration policy (upstream keeps only conditions).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPolicyStatus {
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition<String>>,
}
