//! Network interfaces: a QEMU backend (`-netdev`) plus the guest NIC.
//!
//! Three backends: user-mode networking (slirp) where the launcher shares the host's network
//! (no privileges, no tap; the guest gets 10.0.2.15 from QEMU); for the masquerade and bridge
//! bindings a tap device that [`crate::netsetup`] created on the in-pod bridge before QEMU
//! starts (`-netdev tap,ifname=tap0,script=no,downscript=no`: QEMU only opens it); for the
//! passt binding passt's unix socket (`-netdev stream,server=off,addr.type=unix`).
//! NICs without a boot order get no option ROM (`romfile=`), which saves guest memory and
//! boot time; a NIC with a boot order keeps iPXE so it can network-boot.

use super::{Args, ArgvError, valid_device_name};
use crate::spec::{InterfaceBinding, LauncherSpec};

pub(super) fn push(spec: &LauncherSpec, args: &mut Args) -> Result<(), ArgvError> {
    let mut names = std::collections::BTreeSet::new();
    for (index, iface) in spec.interfaces.iter().enumerate() {
        let fail = |reason: String| ArgvError::Interface {
            name: iface.name.clone(),
            reason,
        };
        if !valid_device_name(&iface.name) {
            return Err(fail("the name is not usable as a device id".to_owned()));
        }
        if !names.insert(iface.name.as_str()) {
            return Err(fail("the name is used twice".to_owned()));
        }
        let driver = match iface.model.as_str() {
            "virtio" => "virtio-net-pci",
            "e1000" => "e1000",
            "e1000e" => "e1000e",
            "rtl8139" => "rtl8139",
            other => return Err(fail(format!("model {other:?} is not supported"))),
        };
        match &iface.binding {
            InterfaceBinding::UserMode => {
                args.push_pair("-netdev", format!("user,id=netdev-{index}"));
            }
            InterfaceBinding::Masquerade(crate::spec::Masquerade { tap, .. })
            | InterfaceBinding::Bridge(crate::spec::PodBridge { tap, .. }) => {
                if !is_link_name(tap) {
                    return Err(fail(format!("{tap:?} is not a usable tap name")));
                }
                args.push_pair(
                    "-netdev",
                    format!("tap,id=netdev-{index},ifname={tap},script=no,downscript=no"),
                );
            }
            InterfaceBinding::Passt(crate::spec::Passt { socket, .. }) => {
                if socket.is_empty() || socket.contains(',') {
                    return Err(fail(format!("{socket:?} is not a usable passt socket")));
                }
                args.push_pair(
                    "-netdev",
                    format!(
                        "stream,id=netdev-{index},server=off,addr.type=unix,addr.path={socket}"
                    ),
                );
            }
        }
        let mut device = format!("{driver},id=ua-{},netdev=netdev-{index}", iface.name);
        if let Some(mac) = &iface.mac_address {
            if !is_mac(mac) {
                return Err(fail(format!("{mac:?} is not a MAC address")));
            }
            device.push_str(&format!(",mac={mac}"));
        }
        match iface.boot_order {
            Some(order) => device.push_str(&format!(",bootindex={order}")),
            None => device.push_str(",romfile="),
        }
        args.push_pair("-device", device);
    }
    Ok(())
}

/// A Linux interface name: 1–15 bytes, no `/`, whitespace, `:` or `,`.
pub(crate) fn is_link_name(s: &str) -> bool {
    (1..16).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b':' | b','))
}

fn is_mac(s: &str) -> bool {
    let parts: Vec<_> = s.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::super::{qemu_argv, tests::minimal_spec};
    use super::*;
    use crate::spec::Interface;

    fn iface(model: &str, mac: Option<&str>) -> Interface {
        Interface {
            name: "default".into(),
            model: model.into(),
            binding: InterfaceBinding::UserMode,
            mac_address: mac.map(Into::into),
            boot_order: None,
            link_down: false,
        }
    }

    #[test]
    fn an_unknown_nic_model_is_refused() {
        let mut spec = minimal_spec();
        spec.interfaces = vec![iface("ne2k_isa", None)];
        assert!(
            matches!(qemu_argv(&spec), Err(ArgvError::Interface { reason, .. }) if reason.contains("ne2k_isa"))
        );
    }

    #[test]
    fn a_masquerade_tap_name_with_a_comma_is_refused() {
        let mut spec = minimal_spec();
        let mut nic = iface("virtio", None);
        nic.binding = InterfaceBinding::Masquerade(crate::spec::Masquerade {
            pod_interface: "eth0".into(),
            bridge: "k6t-eth0".into(),
            tap: "tap0,script=/bin/evil".into(),
            gateway: [10, 0, 2, 1].into(),
            guest: [10, 0, 2, 2].into(),
            prefix_length: 24,
            ports: vec![],
        });
        spec.interfaces = vec![nic];
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Interface { .. })));
    }

    #[test]
    fn a_passt_interface_connects_to_passts_socket() {
        let mut spec = minimal_spec();
        let mut nic = iface("virtio", None);
        let passt = |socket: &str| {
            InterfaceBinding::Passt(crate::spec::Passt {
                pod_interface: "eth0".into(),
                socket: socket.into(),
                log: "/var/run/kubevirt/passt.log".into(),
                ports: vec![],
            })
        };
        nic.binding = passt("/var/run/kubevirt/passt.sock");
        spec.interfaces = vec![nic.clone()];
        let argv = qemu_argv(&spec).unwrap();
        assert!(
            argv.windows(2).any(|w| w[0] == "-netdev"
                && w[1]
                    == "stream,id=netdev-0,server=off,addr.type=unix,addr.path=/var/run/kubevirt/passt.sock"),
            "{argv:?}"
        );
        nic.binding = passt("/x.sock,reconnect=1");
        spec.interfaces = vec![nic];
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Interface { .. })));
    }

    #[test]
    fn a_malformed_mac_is_refused() {
        let mut spec = minimal_spec();
        spec.interfaces = vec![iface("virtio", Some("02:00:00:00:00"))];
        assert!(matches!(qemu_argv(&spec), Err(ArgvError::Interface { .. })));
    }
}
