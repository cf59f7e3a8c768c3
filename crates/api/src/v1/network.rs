//! Guest network interfaces (`spec.domain.devices.interfaces`) and the networks they connect to
//! (`spec.networks`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;

/// The pod interface upstream gives a secondary Multus network (since KubeVirt 1.1): `pod` +
/// the first 11 hex digits of the SHA-256 of the network name (15 bytes with `-nic` taken
/// off `pod`).
pub fn hashed_pod_interface_name(network: &str) -> String {
    use sha2::{Digest as _, Sha256};
    let hex: String = Sha256::digest(network.as_bytes())
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("pod{}", &hex[..11])
}

/// The in-pod names of the bridge binding on secondary pod interface `pod_interface`
/// (upstream's: `pod` stripped, then `k6t-…` the bridge, `tap…` the tap, `…-nic` the
/// renamed pod interface).
pub fn secondary_bridge_names(pod_interface: &str) -> (String, String, String) {
    let trimmed = pod_interface.strip_prefix("pod").unwrap_or(pod_interface);
    (
        format!("k6t-{trimmed}"),
        format!("tap{trimmed}"),
        format!("{trimmed}-nic"),
    )
}

string_enum! {
    /// Desired link state of an interface.
    pub enum InterfaceState {
        /// Not set: the interface is up.
        Unset = "",
        /// The interface is removed (hot-unplug).
        Absent = "absent",
        /// Link up.
        Up = "up",
        /// Link down.
        Down = "down",
    }
}

/// Name of the pod network used by the defaults: `default`.
pub const DEFAULT_NETWORK_NAME: &str = "default";

impl InterfaceBindingMethod {
    /// The JSON names of the core binding methods set, e.g. `["masquerade"]`. Valid interfaces
    /// have at most one.
    #[must_use]
    pub fn set_methods(&self) -> Vec<&'static str> {
        let candidates = [
            ("bridge", self.bridge.is_some()),
            ("slirp", self.slirp.is_some()),
            ("masquerade", self.masquerade.is_some()),
            ("sriov", self.sriov.is_some()),
            ("macvtap", self.macvtap.is_some()),
            ("passt", self.passt.is_some()),
            ("passtBinding", self.passt_binding.is_some()),
        ];
        candidates
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect()
    }
}

/// A network interface of the guest; exactly one binding method.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Name; matches a network.
    pub name: String,
    /// NIC model, e.g. `virtio`, `e1000`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Core binding method (inline).
    #[serde(flatten)]
    pub binding_method: InterfaceBindingMethod,
    /// A network binding plugin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<PluginBinding>,
    /// Ports to forward (masquerade).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    /// Port ranges to forward.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_ranges: Vec<PortRange>,
    /// MAC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    /// Boot order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    /// PCI address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// DHCP options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhcp_options: Option<DhcpOptions>,
    /// Tag exposed through device metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// ACPI index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi_index: Option<i32>,
    /// `absent`, `up` or `down`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<InterfaceState>,
}

/// Core binding methods, inline in an interface.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceBindingMethod {
    /// Bridge binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge: Option<InterfaceBridge>,
    /// Deprecated slirp binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slirp: Option<InterfaceEmpty>,
    /// Masquerade (NAT) binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masquerade: Option<InterfaceMasquerade>,
    /// SR-IOV binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sriov: Option<InterfaceSriov>,
    /// Deprecated macvtap binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub macvtap: Option<InterfaceEmpty>,
    /// Deprecated passt binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passt: Option<InterfaceEmpty>,
    /// passt binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passt_binding: Option<InterfacePasstBinding>,
}

/// Marker: bridge binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceBridge {}

/// Marker: masquerade binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceMasquerade {}

/// Marker: SR-IOV binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceSriov {}

/// Marker: passt binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfacePasstBinding {}

/// Marker of a deprecated binding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceEmpty {}

/// A network binding plugin by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginBinding {
    /// Plugin name, as registered in the KubeVirt configuration.
    pub name: String,
}

/// A port to forward.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP` or `UDP` (defaults to `TCP`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Port number.
    #[serde(default)]
    pub port: i32,
}

/// A port range to forward.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortRange {
    /// Protocol.
    pub protocol: String,
    /// First port.
    #[serde(default)]
    pub start: i32,
    /// Last port.
    #[serde(default)]
    pub end: i32,
}

/// Extra DHCP options offered to the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpOptions {
    /// Boot file name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_file_name: Option<String>,
    /// TFTP server name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tftp_server_name: Option<String>,
    /// NTP servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ntp_servers: Vec<String>,
    /// Private options (224-254).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private_options: Vec<DhcpPrivateOption>,
}

/// A private DHCP option.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpPrivateOption {
    /// Option number.
    #[serde(default)]
    pub option: i32,
    /// Option value.
    pub value: String,
}

/// A network the VMI connects to; exactly one source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Name; matches an interface.
    pub name: String,
    /// Network source (inline).
    #[serde(flatten)]
    pub network_source: NetworkSource,
}

/// Source of a network: `pod`, `multus` or `resourceClaim`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSource {
    /// The pod network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodNetwork>,
    /// A Multus secondary network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multus: Option<MultusNetwork>,
    /// A DRA claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_claim: Option<ClaimRequest>,
}

/// The pod network.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodNetwork {
    /// IPv4 CIDR of the VM network (masquerade).
    #[serde(rename = "vmNetworkCIDR", skip_serializing_if = "Option::is_none")]
    pub vm_network_cidr: Option<String>,
    /// IPv6 CIDR of the VM network (masquerade).
    #[serde(rename = "vmIPv6NetworkCIDR", skip_serializing_if = "Option::is_none")]
    pub vm_i_pv6_network_cidr: Option<String>,
}

/// A Multus network.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultusNetwork {
    /// NetworkAttachmentDefinition name, optionally `namespace/name`.
    pub network_name: String,
    /// Whether this is the pod's default network.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<bool>,
}

/// A DRA claim and request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRequest {
    /// Claim name in `spec.resourceClaims`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Request name in the claim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_name: Option<String>,
}
