//! Network rules (`pkg/network/admitter`): networks ↔ interfaces pairing, one pod network, one
//! binding per interface, names, models, MAC/PCI addresses, ports and interface states.

use std::collections::{BTreeMap, BTreeSet};

use kubevirt_api::v1::{InterfaceState, Network, VirtualMachineInstanceSpec};

use super::{Cause, FieldPath, devices::is_pci_address, reason};
use crate::config::{ClusterConfig, gates};

const MODELS: &[&str] = &[
    "e1000", "e1000e", "igb", "ne2k_pci", "pcnet", "rtl8139", "virtio",
];

fn mac_error(mac: &str) -> Option<String> {
    if mac.is_empty() {
        return None;
    }
    let sep = if mac.contains('-') {
        '-'
    } else if mac.contains('.') {
        '.'
    } else {
        ':'
    };
    let ok = if sep == '.' {
        let groups: Vec<&str> = mac.split('.').collect();
        matches!(groups.len(), 3 | 4 | 10)
            && groups
                .iter()
                .all(|g| g.len() == 4 && g.chars().all(|c| c.is_ascii_hexdigit()))
    } else {
        let groups: Vec<&str> = mac.split(sep).collect();
        matches!(groups.len(), 6 | 8 | 20)
            && groups
                .iter()
                .all(|g| g.len() == 2 && g.chars().all(|c| c.is_ascii_hexdigit()))
    };
    if !ok {
        return Some(format!("malformed MAC address ({mac})"));
    }
    let bytes = mac.chars().filter(char::is_ascii_hexdigit).count() / 2;
    (bytes > 6).then(|| format!("too long MAC address ({mac})"))
}

/// The network validator (`Validate`); `field` is the spec path.
pub fn validate_networks(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let nets_f = field.child("networks");
    let ifaces_f = field.children(&["domain", "devices", "interfaces"]);
    let pod_nets = spec
        .networks
        .iter()
        .filter(|n| n.network_source.pod.is_some())
        .count();
    let multus_defaults = spec
        .networks
        .iter()
        .filter(|n| {
            n.network_source
                .multus
                .as_ref()
                .is_some_and(|m| m.default == Some(true))
        })
        .count();
    if pod_nets > 1 {
        let f = field.child("interfaces");
        c.push(Cause::new(
            reason::DUPLICATE,
            format!("more than one interface is connected to a pod network in {f}"),
            f,
        ));
    }
    if multus_defaults > 1 {
        c.push(Cause::invalid(
            "Multus CNI should only have one default network",
            &nets_f,
        ));
    }
    if pod_nets > 0 && multus_defaults > 0 {
        c.push(Cause::invalid(
            "Pod network cannot be defined when Multus default network is defined",
            &nets_f,
        ));
    }
    for (idx, net) in spec.networks.iter().enumerate() {
        let s = &net.network_source;
        let count = usize::from(s.pod.is_some())
            + usize::from(s.multus.is_some())
            + usize::from(s.resource_claim.is_some());
        if count == 0 {
            c.push(Cause::required(
                "should have a network type",
                nets_f.index(idx),
            ));
        } else if count > 1 {
            c.push(Cause::required(
                "should have only one network type",
                nets_f.index(idx),
            ));
        }
        if s.multus.as_ref().is_some_and(|m| m.network_name.is_empty()) {
            c.push(Cause::required(
                "CNI delegating plugin must have a networkName",
                nets_f.index(idx),
            ));
        }
    }
    let networks: BTreeMap<&str, &Network> =
        spec.networks.iter().map(|n| (n.name.as_str(), n)).collect();
    validate_states_and_bindings(&ifaces_f, spec, cfg, &networks, c);
    validate_names(&nets_f, &ifaces_f, spec, &networks, c);
    validate_interface_fields(&ifaces_f, spec, &networks, c);
}

fn validate_states_and_bindings(
    ifaces_f: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    networks: &BTreeMap<&str, &Network>,
    c: &mut Vec<Cause>,
) {
    let ifaces = &spec.domain.devices.interfaces;
    let default_net = spec.networks.iter().find(|n| {
        n.network_source.pod.is_some()
            || n.network_source
                .multus
                .as_ref()
                .is_some_and(|m| m.default == Some(true))
    });
    for (idx, iface) in ifaces.iter().enumerate() {
        let at = ifaces_f.index(idx);
        let state = iface
            .state
            .as_ref()
            .filter(|s| **s != InterfaceState::Unset);
        if let Some(state) = state {
            if !state.is_known() {
                c.push(Cause::invalid(
                    format!(
                        "logical {} interface state value is unsupported: {}",
                        iface.name,
                        state.as_str()
                    ),
                    at.child("state"),
                ));
            } else if iface.binding_method.sriov.is_some()
                && matches!(state, InterfaceState::Down | InterfaceState::Up)
            {
                c.push(Cause::invalid(
                    format!(
                        "{:?} interface's state {:?} is not supported for SR-IOV NICs",
                        iface.name,
                        state.as_str()
                    ),
                    at.child("state"),
                ));
            }
            if *state == InterfaceState::Absent && iface.binding_method.bridge.is_none() {
                c.push(Cause::invalid(
                    format!(
                        "{:?} interface's state {:?} is supported only for bridge binding",
                        iface.name,
                        state.as_str()
                    ),
                    at.child("state"),
                ));
            }
            if *state == InterfaceState::Absent && default_net.is_some_and(|n| n.name == iface.name)
            {
                c.push(Cause::invalid(
                    format!(
                        "{:?} interface's state {:?} is not supported on default networks",
                        iface.name,
                        state.as_str()
                    ),
                    at.child("state"),
                ));
            }
        }
        let bm = &iface.binding_method;
        let bindings = usize::from(bm.bridge.is_some())
            + usize::from(bm.masquerade.is_some())
            + usize::from(bm.sriov.is_some())
            + usize::from(bm.passt_binding.is_some())
            + usize::from(iface.binding.is_some());
        if bindings != 1 {
            c.push(Cause::invalid(
                format!(
                    "logical {} interface must have exactly one binding method or binding plugin",
                    iface.name
                ),
                &at,
            ));
        }
        let on_pod = networks
            .get(iface.name.as_str())
            .is_some_and(|n| n.network_source.pod.is_some());
        validate_binding_on_network(iface, on_pod, &at, cfg, c);
    }
}

/// What each binding needs of its network and configuration (upstream's messages).
fn validate_binding_on_network(
    iface: &kubevirt_api::v1::Interface,
    on_pod: bool,
    at: &FieldPath,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let bm = &iface.binding_method;
    if bm.masquerade.is_some() && !on_pod {
        c.push(Cause::invalid(
            "Masquerade interface only implemented with pod network",
            at.child("name"),
        ));
    }
    if bm.masquerade.is_some()
        && iface
            .mac_address
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("02:00:00:00:00:00"))
    {
        c.push(Cause::invalid(
            "The requested MAC address is reserved for the in-pod bridge. Please choose another one.",
            at.child("macAddress"),
        ));
    }
    if bm.passt_binding.is_some() && !cfg.gate(gates::PASST_BINDING) {
        c.push(Cause::invalid(
            "PasstBinding feature gate is not enabled",
            at.child("name"),
        ));
    }
    if bm.passt_binding.is_some() && !on_pod {
        c.push(Cause::invalid(
            "PasstBinding interface only implemented with pod network",
            at.child("name"),
        ));
    }
    if bm.bridge.is_some() && on_pod && !cfg.permit_bridge_interface_on_pod_network {
        c.push(Cause::invalid(
            "Bridge on pod network configuration is not enabled under kubevirt-config",
            at.child("name"),
        ));
    }
}

fn validate_names(
    nets_f: &FieldPath,
    ifaces_f: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    networks: &BTreeMap<&str, &Network>,
    c: &mut Vec<Cause>,
) {
    let ifaces = &spec.domain.devices.interfaces;
    let mut seen = BTreeSet::new();
    for (idx, net) in spec.networks.iter().enumerate() {
        if !seen.insert(net.name.as_str()) {
            c.push(Cause::new(
                reason::DUPLICATE,
                format!(
                    "Network with name {:?} already exists, every network must have a unique name",
                    net.name
                ),
                nets_f.index(idx).child("name"),
            ));
        }
    }
    let iface_names: BTreeSet<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
    for (idx, net) in spec.networks.iter().enumerate() {
        if !iface_names.contains(net.name.as_str()) {
            let f = nets_f.index(idx).child("name");
            c.push(Cause::required(format!("{f} '{}' not found.", net.name), f));
        }
    }
    let mut seen = BTreeSet::new();
    for (idx, iface) in ifaces.iter().enumerate() {
        if !seen.insert(iface.name.as_str()) {
            c.push(Cause::new(
                reason::DUPLICATE,
                "Only one interface can be connected to one specific network",
                ifaces_f.index(idx).child("name"),
            ));
        }
    }
    for (idx, iface) in ifaces.iter().enumerate() {
        if !networks.contains_key(iface.name.as_str()) {
            let f = ifaces_f.index(idx).child("name");
            c.push(Cause::invalid(
                format!("{f} '{}' not found.", iface.name),
                f,
            ));
        }
    }
}

fn validate_interface_fields(
    ifaces_f: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    networks: &BTreeMap<&str, &Network>,
    c: &mut Vec<Cause>,
) {
    for (idx, iface) in spec.domain.devices.interfaces.iter().enumerate() {
        let at = ifaces_f.index(idx);
        if iface.name.is_empty()
            || !iface
                .name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
        {
            c.push(Cause::invalid(
                "Network interface name can only contain alphabetical characters, numbers, dashes (-) or underscores (_)",
                at.child("name"),
            ));
        }
        if let Some(model) = iface
            .model
            .as_deref()
            .filter(|m| !m.is_empty() && !MODELS.contains(m))
        {
            c.push(Cause::new(
                reason::NOT_SUPPORTED,
                format!(
                    "interface {} uses model {model} that is not supported.",
                    at.child("name")
                ),
                at.child("model"),
            ));
        }
        if let Some(err) = iface.mac_address.as_deref().and_then(mac_error) {
            c.push(Cause::invalid(
                format!("interface {} has {err}.", at.child("name")),
                at.child("macAddress"),
            ));
        }
        if let Some(pci) = iface
            .pci_address
            .as_deref()
            .filter(|p| !p.is_empty() && !is_pci_address(p))
        {
            c.push(Cause::invalid(
                format!(
                    "interface {} has malformed PCI address ({pci}).",
                    at.child("name")
                ),
                at.child("pciAddress"),
            ));
        }
        let on_pod = networks
            .get(iface.name.as_str())
            .is_some_and(|n| n.network_source.pod.is_some());
        if on_pod {
            let mut names = BTreeSet::new();
            for (pi, port) in iface.ports.iter().enumerate() {
                let pf = at.child("ports").index(pi);
                if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
                    if !names.insert(name) {
                        c.push(Cause::new(
                            reason::DUPLICATE,
                            format!("Duplicate name of the port: {name}"),
                            pf.child("name"),
                        ));
                    }
                    if !is_port_name(name) {
                        c.push(Cause::invalid(
                            format!("Invalid name of the port: {name}"),
                            pf.child("name"),
                        ));
                    }
                }
                if port.port == 0 {
                    c.push(Cause::invalid("Port field is mandatory.", pf.child("port")));
                }
                if !(0..65536).contains(&port.port) {
                    c.push(Cause::invalid(
                        "Port field must be in range 0 < x < 65536.",
                        pf.child("port"),
                    ));
                }
                if !matches!(port.protocol.as_deref(), None | Some("" | "TCP" | "UDP")) {
                    c.push(Cause::invalid(
                        "Unknown protocol, only TCP or UDP allowed",
                        pf.child("protocol"),
                    ));
                }
            }
        }
        if let Some(d) = &iface.dhcp_options {
            let mut opts = BTreeSet::new();
            if d.private_options.iter().any(|o| !opts.insert(o.option)) {
                c.push(Cause::invalid(
                    "Found Duplicates: you have provided duplicate DHCPPrivateOptions",
                    at.child("dhcpOptions"),
                ));
            }
        }
    }
}

/// `IsValidPortName`: an IANA service name (1–15 chars, lowercase alphanumerics and `-`).
fn is_port_name(name: &str) -> bool {
    name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.chars().any(|c| c.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// Bindings discontinued upstream (`slirp`, `passt`, `macvtap`), refused on create.
pub fn validate_discontinued_bindings(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let base = field.children(&["domain", "devices", "interfaces"]);
    for (idx, iface) in spec.domain.devices.interfaces.iter().enumerate() {
        let bm = &iface.binding_method;
        if bm.slirp.is_some() {
            c.push(Cause::invalid(
                "Slirp interface support has been discontinued since v1.3",
                base.index(idx).child("slirp"),
            ));
        }
        if bm.passt.is_some() {
            c.push(Cause::invalid(
                "Passt network binding has been discontinued since v1.3",
                base.index(idx).child("passt"),
            ));
        }
        if bm.macvtap.is_some() {
            c.push(Cause::invalid(
                "Macvtap network binding has been discontinued since v1.3",
                base.index(idx).child("macvtap"),
            ));
        }
    }
}
