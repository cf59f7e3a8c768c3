//! A node's pod network and the CNI network configuration list it renders.
//!
//! One [`CniNetwork`] per node: a Linux bridge (plugin `bridge`) that is the pods' gateway,
//! addresses from the node's pod CIDR handed out by `host-local` (reservations are files under
//! its data directory), masquerading of traffic leaving the CIDR, and optionally the `portmap`
//! plugin chained after it for hostPorts. [`CniNetwork::config_list`] is the standard
//! configuration list those plugins read; [`crate::exec`] runs them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The CNI specification version of the rendered configuration. The Debian
/// `containernetworking-plugins` 1.1.1 support 0.1.0 through 1.0.0.
pub const CNI_VERSION: &str = "1.0.0";

/// Where Debian's `containernetworking-plugins` installs the plugins.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/cni";

/// Where `host-local` keeps its reservations unless told otherwise (one directory per network).
pub const DEFAULT_IPAM_DATA_DIR: &str = "/var/lib/cni/networks";

/// Where ADD results are cached for DEL and CHECK, as other CNI runtimes do.
pub const DEFAULT_RESULT_CACHE_DIR: &str = "/var/lib/cni/results";

/// An IPv4 network in CIDR notation, e.g. `10.244.0.0/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    network: Ipv4Addr,
    prefix_len: u8,
}

/// The text is not an IPv4 CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IPv4 CIDR such as 10.244.0.0/24")]
pub struct InvalidCidr(pub String);

impl Ipv4Cidr {
    /// The network of `address/prefix_len` (host bits cleared); `None` when `prefix_len > 32`.
    pub fn new(address: Ipv4Addr, prefix_len: u8) -> Option<Self> {
        let mask = mask(prefix_len)?;
        Some(Self {
            network: Ipv4Addr::from_bits(address.to_bits() & mask),
            prefix_len,
        })
    }

    /// The /24 network of `address`.
    pub(crate) fn slash_24(address: Ipv4Addr) -> Self {
        Self {
            network: Ipv4Addr::from_bits(address.to_bits() & 0xffff_ff00),
            prefix_len: 24,
        }
    }

    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        self.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    /// Whether `ip` is inside the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (ip, mask(self.prefix_len)) {
            (IpAddr::V4(ip), Some(mask)) => ip.to_bits() & mask == self.network.to_bits(),
            _ => false,
        }
    }

    /// The first address after the network address, the usual gateway.
    pub fn first_host(&self) -> Ipv4Addr {
        Ipv4Addr::from_bits(self.network.to_bits().wrapping_add(1))
    }
}

fn mask(prefix_len: u8) -> Option<u32> {
    match prefix_len {
        0 => Some(0),
        1..=32 => Some(u32::MAX << (32 - prefix_len)),
        _ => None,
    }
}

impl FromStr for Ipv4Cidr {
    type Err = InvalidCidr;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidCidr(text.to_owned());
        let (address, prefix_len) = text.split_once('/').ok_or_else(invalid)?;
        let address = address.parse().map_err(|_| invalid())?;
        let prefix_len = prefix_len.parse().map_err(|_| invalid())?;
        Self::new(address, prefix_len).ok_or_else(invalid)
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

/// A transport protocol of a [`PortMapping`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    #[default]
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

/// A hostPort: traffic to `host_port` on the node goes to `container_port` in the pod. This is
/// the `runtimeConfig.portMappings` entry of the `portmap` plugin.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// The node's port.
    pub host_port: u16,
    /// The pod's port.
    pub container_port: u16,
    /// The protocol.
    pub protocol: Protocol,
    /// Only traffic to this node address is forwarded; every address when `None`.
    #[serde(rename = "hostIP", default, skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<IpAddr>,
}

impl PortMapping {
    /// A TCP mapping on every node address.
    pub fn tcp(host_port: u16, container_port: u16) -> Self {
        Self {
            host_port,
            container_port,
            protocol: Protocol::Tcp,
            host_ip: None,
        }
    }
}

/// A node's pod network: a bridge, the pod CIDR and the plugins' directories.
///
/// Fields are public; [`CniNetwork::new`] fills in the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniNetwork {
    /// The network's name: `host-local` keeps its reservations under `<ipam_data_dir>/<name>`
    /// and the masquerade rules carry it.
    pub name: String,
    /// The Linux bridge the pods' veths attach to (at most 15 bytes). The `bridge` plugin
    /// creates it on the first ADD and never removes it.
    pub bridge: String,
    /// The node's pod CIDR.
    pub subnet: Ipv4Cidr,
    /// The pods' default gateway, the bridge's address when `is_gateway`.
    pub gateway: Ipv4Addr,
    /// `host-local`'s data directory.
    pub ipam_data_dir: PathBuf,
    /// Where the plugin programs are (`CNI_PATH`).
    pub plugin_dir: PathBuf,
    /// Where ADD results are cached for DEL and CHECK (`prevResult`).
    pub result_cache_dir: PathBuf,
    /// Masquerade traffic from the pods to outside the pod CIDR (`ipMasq`).
    pub ip_masq: bool,
    /// Give the bridge the gateway address and route the pods through it (`isGateway`).
    pub is_gateway: bool,
    /// Chain the `portmap` plugin, for hostPorts. Also turns on `hairpinMode`, so a pod can
    /// reach itself through its own hostPort.
    pub port_map: bool,
}

impl CniNetwork {
    /// A network on `bridge` for `subnet`, gateway at its first address, with `ipMasq`,
    /// `isGateway` and `portmap`, and the default directories.
    pub fn new(name: impl Into<String>, bridge: impl Into<String>, subnet: Ipv4Cidr) -> Self {
        Self {
            name: name.into(),
            bridge: bridge.into(),
            gateway: subnet.first_host(),
            subnet,
            ipam_data_dir: DEFAULT_IPAM_DATA_DIR.into(),
            plugin_dir: DEFAULT_PLUGIN_DIR.into(),
            result_cache_dir: DEFAULT_RESULT_CACHE_DIR.into(),
            ip_masq: true,
            is_gateway: true,
            port_map: true,
        }
    }

    /// The network configuration list (a `.conflist`), as a JSON value.
    pub fn config_list(&self) -> Value {
        let mut plugins = vec![json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": self.is_gateway,
            "ipMasq": self.ip_masq,
            "hairpinMode": self.port_map,
            "ipam": {
                "type": "host-local",
                "dataDir": self.ipam_data_dir,
                "ranges": [[{
                    "subnet": self.subnet.to_string(),
                    "gateway": self.gateway.to_string(),
                }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
            },
        })];
        if self.port_map {
            plugins.push(json!({
                "type": "portmap",
                "capabilities": { "portMappings": true },
                "snat": true,
            }));
        }
        json!({
            "cniVersion": CNI_VERSION,
            "name": self.name,
            "plugins": plugins,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cidr_is_parsed_normalised_and_printed() {
        let cidr: Ipv4Cidr = "10.244.3.7/24".parse().unwrap();
        assert_eq!(cidr.to_string(), "10.244.3.0/24");
        assert_eq!(cidr.first_host(), Ipv4Addr::new(10, 244, 3, 1));
        assert!(cidr.contains("10.244.3.200".parse().unwrap()));
        assert!(!cidr.contains("10.244.4.1".parse().unwrap()));
        assert!(!cidr.contains("fd00::1".parse().unwrap()));
        for bad in ["10.244.0.0", "10.244.0.0/33", "x/24", "10.244.0.0/"] {
            assert!(bad.parse::<Ipv4Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_config_list_chains_bridge_and_portmap() {
        let mut net = CniNetwork::new("pods", "kvrs0", "10.244.0.0/24".parse().unwrap());
        net.ipam_data_dir = "/data".into();
        assert_eq!(
            net.config_list(),
            json!({
                "cniVersion": "1.0.0",
                "name": "pods",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "kvrs0",
                        "isGateway": true,
                        "ipMasq": true,
                        "hairpinMode": true,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": "/data",
                            "ranges": [[{ "subnet": "10.244.0.0/24", "gateway": "10.244.0.1" }]],
                            "routes": [{ "dst": "0.0.0.0/0" }],
                        },
                    },
                    { "type": "portmap", "capabilities": { "portMappings": true }, "snat": true },
                ],
            })
        );
    }

    #[test]
    fn without_portmap_the_list_has_only_the_bridge() {
        let mut net = CniNetwork::new("pods", "kvrs0", "10.244.0.0/24".parse().unwrap());
        net.port_map = false;
        net.ip_masq = false;
        let list = net.config_list();
        let plugins = list["plugins"].as_array().unwrap();
        assert_eq!(plugins.len(), 1);
        assert_eq!(plugins[0]["ipMasq"], false);
        assert_eq!(plugins[0]["hairpinMode"], false);
    }

    #[test]
    fn a_port_mapping_is_serialised_as_portmap_reads_it() {
        let mut mapping = PortMapping::tcp(8080, 80);
        assert_eq!(
            serde_json::to_value(&mapping).unwrap(),
            json!({ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" })
        );
        mapping.host_ip = Some("127.0.0.1".parse().unwrap());
        mapping.protocol = Protocol::Udp;
        assert_eq!(
            serde_json::to_value(&mapping).unwrap(),
            json!({ "hostPort": 8080, "containerPort": 80, "protocol": "udp", "hostIP": "127.0.0.1" })
        );
    }
}
