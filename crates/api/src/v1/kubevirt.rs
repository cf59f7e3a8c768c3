//! The KubeVirt installation kind and the cluster-wide configuration
//! (`spec.configuration`) every component reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, LocalObjectReference, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::conditions::Condition;
use super::vmi::EvictionStrategy;
use crate::string_enum::string_enum;

string_enum! {
    /// Phase of the installation.
    pub enum KubeVirtPhase {
        /// Not set yet.
        Unset = "",
        /// Being deployed.
        Deploying = "Deploying",
        /// Deployed.
        Deployed = "Deployed",
        /// Being deleted.
        Deleting = "Deleting",
        /// Deleted.
        Deleted = "Deleted",
    }
}

string_enum! {
    /// Condition types of the installation.
    pub enum KubeVirtConditionType {
        /// Resources are synchronised.
        Synchronized = "Synchronized",
        /// Resources are created.
        Created = "Created",
        /// The installation is available.
        Available = "Available",
        /// The installation is progressing.
        Progressing = "Progressing",
        /// The installation is degraded.
        Degraded = "Degraded",
    }
}

/// A condition of the installation.
pub type KubeVirtCondition = Condition<KubeVirtConditionType>;

impl KubeVirtConfiguration {
    /// Whether `gate` is listed in `developerConfiguration.featureGates` and not in
    /// `disabledFeatureGates`.
    #[must_use]
    pub fn feature_gate_enabled(&self, gate: &str) -> bool {
        self.developer_configuration.as_ref().is_some_and(|d| {
            d.feature_gates.iter().any(|g| g == gate)
                && !d.disabled_feature_gates.iter().any(|g| g == gate)
        })
    }
}

/// Spec of the KubeVirt installation object.
//
// `kube` derives the `KubeVirt` object (`metadata`, `spec`, `status`) from this spec.
// Each printcolumn repeats `type_ = …`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "KubeVirt",
    doc = "The KubeVirt installation and its cluster-wide configuration.",
    namespaced,
    status = "KubeVirtStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "kv",
    shortname = "kvs",
    category = "all",
    label("operator.kubevirt.io", ""),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase")
)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtSpec {
    /// Image tag of the components.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_tag: Option<String>,
    /// Registry of the component images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_registry: Option<String>,
    /// Pull policy of the component images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Pull secrets of the component images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// Namespace of Prometheus.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor_namespace: Option<String>,
    /// Namespace for the ServiceMonitor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_monitor_namespace: Option<String>,
    /// Service account of Prometheus.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub monitor_account: Option<String>,
    /// How VMIs are moved to new launcher images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload_update_strategy: Option<KubeVirtWorkloadUpdateStrategy>,
    /// `RemoveWorkloads` or `BlockUninstallIfWorkloadsExist`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uninstall_strategy: Option<String>,
    /// Certificate rotation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate_rotate_strategy: Option<KubeVirtCertificateRotateStrategy>,
    /// Product version label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub product_version: Option<String>,
    /// Product name label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub product_name: Option<String>,
    /// Product component label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub product_component: Option<String>,
    /// Port of the synchronization controller (defaults to 9185).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub synchronization_port: Option<String>,
    /// Cluster-wide configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub configuration: Option<KubeVirtConfiguration>,
    /// Placement of the control-plane components.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infra: Option<ComponentConfig>,
    /// Placement of the node components.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workloads: Option<ComponentConfig>,
    /// Patches and flags for the components.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customize_components: Option<CustomizeComponents>,
}

/// How VMIs are moved to new launcher images.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtWorkloadUpdateStrategy {
    /// `LiveMigrate` and/or `Evict`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_update_methods: Vec<String>,
    /// VMIs evicted per batch (defaults to 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_eviction_size: Option<i32>,
    /// Interval between batches (defaults to `1m0s`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_eviction_interval: Option<String>,
}

/// Certificate rotation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtCertificateRotateStrategy {
    /// Self-signed certificates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_signed: Option<KubeVirtSelfSignConfiguration>,
}

/// Lifetimes of the self-signed certificates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtSelfSignConfiguration {
    /// Deprecated: CA lifetime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_rotate_interval: Option<String>,
    /// Deprecated: certificate lifetime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_rotate_interval: Option<String>,
    /// Deprecated: CA overlap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_overlap_interval: Option<String>,
    /// CA lifetime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<CertConfig>,
    /// Server certificate lifetime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<CertConfig>,
}

/// Lifetime of a certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertConfig {
    /// Lifetime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    /// Renew this long before expiry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

/// Placement of a group of components.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentConfig {
    /// Node placement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_placement: Option<NodePlacement>,
    /// Replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u8>,
}

/// Node placement of components.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    /// Node selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Affinity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// Patches and extra flags for the components.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizeComponents {
    /// Patches applied to generated resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<CustomizeComponentsPatch>,
    /// Extra command-line flags per component.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<Flags>,
}

/// A patch applied to a generated resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizeComponentsPatch {
    /// Resource name.
    pub resource_name: String,
    /// Resource type, e.g. `Deployment`.
    pub resource_type: String,
    /// The patch.
    pub patch: String,
    /// `json`, `merge` or `strategic`.
    pub type_: String,
}

/// Extra command-line flags per component (flag name to value).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    /// virt-api flags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub api: BTreeMap<String, String>,
    /// virt-controller flags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub controller: BTreeMap<String, String>,
    /// virt-handler flags.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub handler: BTreeMap<String, String>,
}

/// Observed state of the installation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtStatus {
    /// `Deploying`, `Deployed`, `Deleting` or `Deleted`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<KubeVirtPhase>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<KubeVirtCondition>,
    /// Operator version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operator_version: Option<String>,
    /// Registry being deployed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_kube_virt_registry: Option<String>,
    /// Version being deployed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_kube_virt_version: Option<String>,
    /// Configuration being deployed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_deployment_config: Option<String>,
    /// Id of the configuration being deployed.
    #[serde(rename = "targetDeploymentID", skip_serializing_if = "Option::is_none")]
    pub target_deployment_id: Option<String>,
    /// Registry deployed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_kube_virt_registry: Option<String>,
    /// Version deployed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_kube_virt_version: Option<String>,
    /// Configuration deployed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_deployment_config: Option<String>,
    /// Id of the configuration deployed.
    #[serde(
        rename = "observedDeploymentID",
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_deployment_id: Option<String>,
    /// VMIs running an outdated launcher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outdated_virtual_machine_instance_workloads: Option<i32>,
    /// Generation observed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Default architecture of VMIs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_architecture: Option<String>,
    /// Generations of the deployed resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<GenerationStatus>,
    /// Synchronization controller addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub synchronization_addresses: Vec<String>,
}

/// Generation of a deployed resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GenerationStatus {
    /// Group.
    pub group: String,
    /// Resource.
    pub resource: String,
    /// Namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// Last generation seen.
    #[serde(default)]
    pub last_generation: i64,
    /// Hash of the applied spec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

/// Cluster-wide KubeVirt configuration. Rarely used nested sections are kept as opaque JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtConfiguration {
    /// Default CPU model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    /// Default CPU request per vCPU (defaults to `100m`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_request: Option<Quantity>,
    /// Feature gates and developer switches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub developer_configuration: Option<DeveloperConfiguration>,
    /// Allowed machine types.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub emulated_machines: Vec<String>,
    /// Pull policy of the launcher image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Live migration settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migrations: Option<MigrationConfiguration>,
    /// Default machine type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// Network settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfiguration>,
    /// Path of the OVMF firmware.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ovmf_path: Option<String>,
    /// SELinux type of the launcher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selinux_launcher_type: Option<String>,
    /// Runtime class of launcher pods.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_runtime_class: Option<String>,
    /// SMBIOS defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smbios: Option<SmBiosConfiguration>,
    /// Per-architecture defaults.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture_configuration: Option<serde_json::Value>,
    /// Cluster-wide eviction strategy (defaults to `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_strategy: Option<EvictionStrategy>,
    /// Multiplier of the memory overhead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub additional_guest_memory_overhead_ratio: Option<String>,
    /// Resources of support containers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub support_container_resources: Vec<serde_json::Value>,
    /// Supported guest agent versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_guest_agent_versions: Vec<String>,
    /// Balloon statistics period in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_balloon_stats_period: Option<u32>,
    /// Host devices VMIs may use.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permitted_host_devices: Option<serde_json::Value>,
    /// Mediated device configuration.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mediated_devices_configuration: Option<serde_json::Value>,
    /// Minimum CPU model.
    #[serde(rename = "minCPUModel", skip_serializing_if = "Option::is_none")]
    pub min_cpu_model: Option<String>,
    /// CPU models not to use.
    #[serde(
        rename = "obsoleteCPUModels",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub obsolete_cpu_models: BTreeMap<String, bool>,
    /// Maximum VMIs per node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_machine_instances_per_node: Option<i32>,
    /// virt-api client settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_configuration: Option<ReloadableComponentConfiguration>,
    /// Webhook client settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_configuration: Option<ReloadableComponentConfiguration>,
    /// virt-controller client settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller_configuration: Option<ReloadableComponentConfiguration>,
    /// virt-handler client settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler_configuration: Option<ReloadableComponentConfiguration>,
    /// TLS settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_configuration: Option<TlsConfiguration>,
    /// Seccomp settings.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seccomp_configuration: Option<serde_json::Value>,
    /// Storage class of persistent VM state (TPM, EFI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_state_storage_class: Option<String>,
    /// VM options.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_machine_options: Option<serde_json::Value>,
    /// KSM settings.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ksm_configuration: Option<serde_json::Value>,
    /// Namespaces whose VMIs get CPU limits.
    #[serde(
        rename = "autoCPULimitNamespaceLabelSelector",
        skip_serializing_if = "Option::is_none"
    )]
    pub auto_cpu_limit_namespace_label_selector: Option<LabelSelector>,
    /// Hotplug limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_update_configuration: Option<LiveUpdateConfiguration>,
    /// `Stage` or `LiveUpdate` (nil means `LiveUpdate`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_rollout_strategy: Option<String>,
    /// Common instance types deployment.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub common_instancetypes_deployment: Option<serde_json::Value>,
    /// virt-template deployment.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virt_template_deployment: Option<serde_json::Value>,
    /// Instance type settings.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instancetype: Option<serde_json::Value>,
    /// Hypervisors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hypervisors: Vec<serde_json::Value>,
    /// Where changed block tracking is enabled.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_block_tracking_label_selectors: Option<serde_json::Value>,
    /// SCSI persistent reservation settings.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_reservation_configuration: Option<serde_json::Value>,
    /// Confidential computing settings.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confidential_compute: Option<serde_json::Value>,
    /// `AggregateToDefault` or `Manual`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role_aggregation_strategy: Option<String>,
}

/// Feature gates and developer switches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeveloperConfiguration {
    /// Enabled feature gates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_gates: Vec<String>,
    /// Disabled feature gates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disabled_feature_gates: Vec<String>,
    /// Tolerated PVC shortfall.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvc_tolerate_less_space_up_to_percent: Option<i32>,
    /// Bytes kept free on PVCs.
    #[serde(
        rename = "minimumReservePVCBytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub minimum_reserve_pvc_bytes: Option<u64>,
    /// Memory overcommit percentage (defaults to 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_overcommit: Option<i32>,
    /// Node selectors of launcher pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selectors: BTreeMap<String, String>,
    /// Run guests with software emulation when KVM is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_emulation: Option<bool>,
    /// CPU allocation ratio (defaults to 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_allocation_ratio: Option<i32>,
    /// Minimum TSC frequency.
    #[serde(
        rename = "minimumClusterTSCFrequency",
        skip_serializing_if = "Option::is_none"
    )]
    pub minimum_cluster_tsc_frequency: Option<i64>,
    /// Disk verification limits.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_verification: Option<serde_json::Value>,
    /// Log verbosity per component.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_verbosity: Option<LogVerbosity>,
    /// Enable the cluster profiler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_profiler: Option<bool>,
}

/// Log verbosity per component.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogVerbosity {
    /// virt-api.
    #[serde(rename = "virtAPI", skip_serializing_if = "Option::is_none")]
    pub virt_api: Option<u32>,
    /// virt-controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virt_controller: Option<u32>,
    /// virt-handler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virt_handler: Option<u32>,
    /// virt-launcher.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virt_launcher: Option<u32>,
    /// virt-operator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virt_operator: Option<u32>,
    /// virt-synchronization-controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virt_synchronization_controller: Option<u32>,
    /// Per node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_verbosity: BTreeMap<String, u32>,
}

/// Live migration settings; also the applied configuration of a migration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationConfiguration {
    /// Taint that triggers evacuation (defaults to `kubevirt.io/drain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_drain_taint_key: Option<String>,
    /// Outbound migrations per node (defaults to 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_outbound_migrations_per_node: Option<u32>,
    /// Migrations per cluster (defaults to 5).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_migrations_per_cluster: Option<u32>,
    /// Allow auto-converge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_auto_converge: Option<bool>,
    /// Bandwidth cap (defaults to `0Mi`, unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth_per_migration: Option<Quantity>,
    /// Completion timeout per GiB (defaults to 150).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_timeout_per_gi_b: Option<i64>,
    /// Maximum downtime (defaults to 900).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_downtime_ms: Option<u64>,
    /// Progress timeout (defaults to 150).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress_timeout: Option<i64>,
    /// Wait for utility volumes (defaults to 150).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub utility_volumes_timeout: Option<i64>,
    /// Allow unsafe migrations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsafe_migration_override: Option<bool>,
    /// Allow post-copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_post_copy: Option<bool>,
    /// Allow pausing the workload to converge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_workload_disruption: Option<bool>,
    /// Disable TLS of the migration stream.
    #[serde(rename = "disableTLS", skip_serializing_if = "Option::is_none")]
    pub disable_tls: Option<bool>,
    /// Dedicated migration network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Keep the SELinux level on the target.
    #[serde(
        rename = "matchSELinuxLevelOnMigration",
        skip_serializing_if = "Option::is_none"
    )]
    pub match_se_linux_level_on_migration: Option<bool>,
    /// Experimental options.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experimental: Option<serde_json::Value>,
}

/// Network settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfiguration {
    /// Binding of the default interface (defaults to `bridge`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_network_interface: Option<String>,
    /// Deprecated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit_slirp_interface: Option<bool>,
    /// Allow bridge binding on the pod network (defaults to true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit_bridge_interface_on_pod_network: Option<bool>,
    /// Network binding plugins by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub binding: BTreeMap<String, InterfaceBindingPlugin>,
}

/// A network binding plugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceBindingPlugin {
    /// Sidecar image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar_image: Option<String>,
    /// NetworkAttachmentDefinition of the plugin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_attachment_definition: Option<String>,
    /// `tap` or `managedTap`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain_attachment_type: Option<String>,
    /// Migration behaviour.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration: Option<serde_json::Value>,
    /// `device-info`.
    #[serde(rename = "downwardAPI", skip_serializing_if = "Option::is_none")]
    pub downward_api: Option<String>,
    /// Extra compute resources of the launcher.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_resource_overhead: Option<serde_json::Value>,
}

/// SMBIOS defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SmBiosConfiguration {
    /// Manufacturer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<String>,
    /// Product.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// SKU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sku: Option<String>,
    /// Family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
}

/// Client settings of a component.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReloadableComponentConfiguration {
    /// REST client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rest_client: Option<RestClientConfiguration>,
}

/// REST client settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestClientConfiguration {
    /// Rate limiter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<RateLimiter>,
}

/// Rate limiter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimiter {
    /// Token bucket.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_bucket_rate_limiter: Option<TokenBucketRateLimiter>,
}

/// Token bucket rate limiter.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenBucketRateLimiter {
    /// Queries per second.
    pub qps: f64,
    /// Burst.
    #[serde(default)]
    pub burst: i32,
}

/// TLS settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfiguration {
    /// Minimum TLS version, e.g. `VersionTLS12`.
    #[serde(rename = "minTLSVersion", skip_serializing_if = "Option::is_none")]
    pub min_tls_version: Option<String>,
    /// Cipher suites.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ciphers: Vec<String>,
}

/// Hotplug limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LiveUpdateConfiguration {
    /// Ratio of maximum to initial resources (defaults to 4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_hotplug_ratio: Option<u32>,
    /// Maximum CPU sockets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cpu_sockets: Option<u32>,
    /// Maximum guest memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_guest: Option<Quantity>,
}
