//! The VirtualMachineInstance kind: spec, probes, access credentials, and the VMI template
//! embedded in VMs, replica sets and pools. The status lives in [`super::vmi_status`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, ExecAction, HTTPGetAction, PodDNSConfig, TCPSocketAction, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::domain::DomainSpec;
use super::network::Network;
use super::vmi_status::VirtualMachineInstanceStatus;
use super::volumes::Volume;
use crate::string_enum::string_enum;

string_enum! {
    /// What happens to a VMI when its node is drained.
    pub enum EvictionStrategy {
        /// The VMI is stopped.
        None = "None",
        /// The VMI is live-migrated; eviction is blocked if it cannot be.
        LiveMigrate = "LiveMigrate",
        /// The VMI is live-migrated if it can be, stopped otherwise.
        LiveMigrateIfPossible = "LiveMigrateIfPossible",
        /// An external component handles the eviction.
        External = "External",
    }
}

string_enum! {
    /// How a VMI starts.
    pub enum StartStrategy {
        /// The guest starts paused.
        Paused = "Paused",
    }
}

string_enum! {
    /// Kind of a utility volume.
    pub enum UtilityVolumeType {
        /// Target of a memory dump.
        MemoryDump = "MemoryDump",
        /// Target of a backup.
        Backup = "Backup",
    }
}

/// Grace period used when `terminationGracePeriodSeconds` is not set.
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;

/// A VMI template: metadata and spec of the VMIs a VM, replica set or pool creates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceTemplateSpec {
    /// Metadata given to the created VMIs.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    pub metadata: Option<ObjectMeta>,
    /// Spec of the created VMIs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<VirtualMachineInstanceSpec>,
}

/// Spec of a VirtualMachineInstance: the virtual hardware and its placement.
//
// `kube` derives the `VirtualMachineInstance` object (`metadata`, `spec`, `status`) from this spec.
// Each printcolumn repeats `type_ = …`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstance",
    doc = "A virtual machine running (or about to run) in a launcher pod.",
    namespaced,
    status = "VirtualMachineInstanceStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "vmi",
    shortname = "vmis",
    category = "all",
    label("kubevirt.io", ""),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.interfaces[0].ipAddress"
    ),
    printcolumn(name = "NodeName", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Live-Migratable",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='LiveMigratable')].status",
        priority = 1
    ),
    printcolumn(
        name = "Paused",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Paused')].status",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceSpec {
    /// Priority class of the launcher pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// The virtual hardware.
    pub domain: DomainSpec,
    /// Node selector of the launcher pod.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Affinity of the launcher pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Scheduler of the launcher pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// Service account of the launcher pod (the token is not exposed to the guest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Tolerations of the launcher pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Topology spread constraints of the launcher pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// What to do when the node is drained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_strategy: Option<EvictionStrategy>,
    /// `Paused` starts the guest paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_strategy: Option<StartStrategy>,
    /// Grace period for a guest shutdown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// Volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Liveness probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Probe>,
    /// Readiness probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Probe>,
    /// Guest hostname; defaults to the VMI name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Subdomain for a FQDN together with a headless service.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    /// Networks the interfaces connect to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<Network>,
    /// DNS policy of the launcher pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<String>,
    /// DNS settings of the launcher pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_config: Option<PodDNSConfig>,
    /// Credentials injected into the guest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_credentials: Vec<AccessCredential>,
    /// CPU architecture, e.g. `amd64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// DRA claims.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_claims: Vec<VirtualMachineInstanceResourceClaim>,
    /// Volumes for utilities (memory dump, backup).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub utility_volumes: Vec<UtilityVolume>,
}

/// A DRA claim of a VMI.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceResourceClaim {
    /// Name referenced by devices.
    pub name: String,
    /// An existing ResourceClaim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_claim_name: Option<String>,
    /// A ResourceClaimTemplate to instantiate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_claim_template_name: Option<String>,
}

/// A volume used by a utility rather than the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UtilityVolume {
    /// Name.
    pub name: String,
    /// PVC name.
    pub claim_name: String,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// `MemoryDump` or `Backup`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub type_: Option<UtilityVolumeType>,
}

/// A probe: one handler plus timing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// Run a command in the guest (through the guest agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecAction>,
    /// Ping the guest agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_agent_ping: Option<GuestAgentPing>,
    /// HTTP GET against the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HTTPGetAction>,
    /// TCP connect to the guest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TCPSocketAction>,
    /// Delay before the first probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i32>,
    /// Timeout (defaults to 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// Period (defaults to 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<i32>,
    /// Successes to pass (defaults to 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<i32>,
    /// Failures to fail (defaults to 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i32>,
}

/// Marker: ping the guest agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentPing {}

/// A credential injected into the guest: `sshPublicKey` or `userPassword`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessCredential {
    /// SSH public keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh_public_key: Option<SshPublicKeyAccessCredential>,
    /// User passwords.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_password: Option<UserPasswordAccessCredential>,
}

/// SSH public keys from a Secret.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKeyAccessCredential {
    /// Where the keys come from.
    pub source: SshPublicKeyAccessCredentialSource,
    /// How the keys reach the guest.
    pub propagation_method: SshPublicKeyAccessCredentialPropagationMethod,
}

/// Source of SSH public keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKeyAccessCredentialSource {
    /// A Secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<AccessCredentialSecretSource>,
}

/// How SSH keys reach the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKeyAccessCredentialPropagationMethod {
    /// Through cloud-init ConfigDrive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_drive: Option<AccessCredentialMarker>,
    /// Through cloud-init NoCloud.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_cloud: Option<AccessCredentialMarker>,
    /// Through the guest agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qemu_guest_agent: Option<QemuGuestAgentSshPublicKeyAccessCredentialPropagation>,
}

/// Guest agent propagation of SSH keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QemuGuestAgentSshPublicKeyAccessCredentialPropagation {
    /// Users whose authorized keys are written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
}

/// User passwords from a Secret.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserPasswordAccessCredential {
    /// Where the passwords come from.
    pub source: UserPasswordAccessCredentialSource,
    /// How the passwords reach the guest.
    pub propagation_method: UserPasswordAccessCredentialPropagationMethod,
}

/// Source of user passwords.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserPasswordAccessCredentialSource {
    /// A Secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<AccessCredentialSecretSource>,
}

/// How passwords reach the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserPasswordAccessCredentialPropagationMethod {
    /// Through the guest agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qemu_guest_agent: Option<AccessCredentialMarker>,
}

/// A Secret holding credentials.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessCredentialSecretSource {
    /// Secret name.
    pub secret_name: String,
}

/// Marker: a propagation method without settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessCredentialMarker {}
