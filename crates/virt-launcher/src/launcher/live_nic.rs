//! Live changes to a running domain's network interfaces (NIC hotplug), a part of
//! [`super::live`]'s plan.
//!
//! | spec change | step | in the pod, then QMP |
//! |---|---|---|
//! | a bridge-bound interface added | attach it on a free `pcie-root-port` | bridge and tap on its pod interface ([`crate::netsetup::bridge`]); `netdev_add` (tap), `device_add` (virtio-net) |
//! | an interface attached live removed | detach it | `device_del`, wait for `DEVICE_DELETED`, `netdev_del`; the tap, the bridge and the renamed pod interface deleted |
//! | `linkDown` changed | set the link | `set_link` |
//!
//! Interfaces are compared by name. Only interfaces attached live can be detached: the boot
//! interfaces sit on the root complex, which has no hotplug. An interface whose definition
//! changed under the same name (other than its link) is refused: remove it, then add it.
//!
//! Deleting the renamed pod interface on detach (a veth: its peer on the node goes with it)
//! leaves nothing for the node's CNI DEL to find, which DEL accepts; an interface attached
//! again later finds a fresh pod interface, never a stale renamed one.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use tokio::sync::broadcast;

use crate::argv::valid_device_name;
use crate::qmp::QmpClient;
use crate::spec::{Interface, InterfaceBinding, LauncherSpec};

use super::live::Step;

/// How long a guest may take to release a NIC after `device_del`.
const DETACH_TIMEOUT: Duration = Duration::from_secs(30);

/// Interfaces attached to the running domain, by name, with the root port each took.
pub(super) type AttachedNics = BTreeMap<String, u32>;

/// The interface steps from `running` to `wanted`.
pub(super) fn steps(
    running: &LauncherSpec,
    wanted: &LauncherSpec,
    attached: &AttachedNics,
    free_ports: &mut u32,
    steps: &mut Vec<Step>,
) -> Result<(), String> {
    let find =
        |spec: &LauncherSpec, name: &str| spec.interfaces.iter().find(|i| i.name == name).cloned();
    for gone in running
        .interfaces
        .iter()
        .filter(|i| find(wanted, &i.name).is_none())
    {
        if !attached.contains_key(&gone.name) {
            return Err(format!(
                "interface {:?} was there at boot: removing it takes a restart",
                gone.name
            ));
        }
        steps.push(Step::DetachInterface(gone.name.clone()));
    }
    for iface in &wanted.interfaces {
        match find(running, &iface.name) {
            Some(now) if now == *iface => {}
            Some(now) if same_but_link(&now, iface) => {
                steps.push(Step::SetLink {
                    name: iface.name.clone(),
                    up: !iface.link_down,
                });
            }
            Some(_) => {
                return Err(format!(
                    "interface {:?} changed on the running domain: detach it first",
                    iface.name
                ));
            }
            None => {
                check_attachable(iface)?;
                if *free_ports == 0 {
                    return Err(format!(
                        "interface {:?}: no free hotplug port (the domain booted with {})",
                        iface.name, running.hotplug_ports
                    ));
                }
                *free_ports -= 1;
                steps.push(Step::AttachInterface(Box::new(iface.clone())));
            }
        }
    }
    Ok(())
}

/// Whether `a` and `b` differ at most in their link state.
fn same_but_link(a: &Interface, b: &Interface) -> bool {
    let mut a = a.clone();
    a.link_down = b.link_down;
    a == *b
}

fn check_attachable(iface: &Interface) -> Result<(), String> {
    if !matches!(iface.binding, InterfaceBinding::Bridge(_)) {
        return Err(format!(
            "interface {:?}: only bridge-bound interfaces can be attached to a running domain",
            iface.name
        ));
    }
    if iface.model != "virtio" {
        return Err(format!(
            "interface {:?}: only virtio interfaces can be attached to a running domain",
            iface.name
        ));
    }
    if !valid_device_name(&iface.name) {
        return Err(format!(
            "interface {:?}: the name is not usable as a device id",
            iface.name
        ));
    }
    Ok(())
}

/// The QEMU ids of an interface attached live: its backend and its device.
fn ids(name: &str) -> (String, String) {
    (format!("netdev-hp-{name}"), format!("ua-{name}"))
}

/// `netdev_add` arguments of a tap backend QEMU opens by name.
pub(super) fn netdev_args(name: &str, tap: &str) -> serde_json::Value {
    json!({
        "type": "tap",
        "id": ids(name).0,
        "ifname": tap,
        "script": "no",
        "downscript": "no",
    })
}

/// `device_add` arguments of the virtio NIC of `iface` on root port `port`.
pub(super) fn device_args(iface: &Interface, port: u32) -> serde_json::Value {
    let (netdev, id) = ids(&iface.name);
    let mut device = json!({
        "driver": "virtio-net-pci",
        "id": id,
        "netdev": netdev,
        "bus": format!("pci.{port}"),
        "romfile": "",
    });
    if let Some(mac) = &iface.mac_address {
        device["mac"] = json!(mac);
    }
    device
}

/// Plugs `iface` (its tap exists) into QEMU at root port `port`, its link down when the
/// spec says so. On an error, what was added is removed.
pub(super) async fn attach(qmp: &QmpClient, iface: &Interface, port: u32) -> Result<(), String> {
    let InterfaceBinding::Bridge(bridge) = &iface.binding else {
        return Err(format!("interface {:?}: not a bridge binding", iface.name));
    };
    let fail = |what: &str, e: crate::qmp::QmpError| {
        format!("attaching interface {:?}: {what}: {e}", iface.name)
    };
    let (netdev, id) = ids(&iface.name);
    qmp.execute("netdev_add", Some(netdev_args(&iface.name, &bridge.tap)))
        .await
        .map_err(|e| fail("backend", e))?;
    if let Err(e) = qmp.device_add(device_args(iface, port)).await {
        let _ = qmp.execute("netdev_del", Some(json!({"id": netdev}))).await;
        return Err(fail("device", e));
    }
    if iface.link_down {
        set_link(qmp, &iface.name, false).await?;
    }
    tracing::info!(interface = %iface.name, device = %id, port, "interface attached");
    Ok(())
}

/// Asks the guest to release interface `name`, waits for QEMU's `DEVICE_DELETED`, then
/// removes its backend.
pub(super) async fn detach(
    qmp: &QmpClient,
    name: &str,
    mut deleted: broadcast::Receiver<String>,
) -> Result<(), String> {
    let (netdev, id) = ids(name);
    qmp.device_del(&id)
        .await
        .map_err(|e| format!("detaching interface {name:?}: {e}"))?;
    let released = async {
        loop {
            match deleted.recv().await {
                Ok(device) if device == id => return true,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return false,
            }
        }
    };
    match tokio::time::timeout(DETACH_TIMEOUT, released).await {
        Ok(true) => {}
        Ok(false) => return Err(format!("detaching interface {name:?}: QEMU went away")),
        Err(_) => {
            return Err(format!(
                "detaching interface {name:?}: the guest did not release it within {} s",
                DETACH_TIMEOUT.as_secs()
            ));
        }
    }
    qmp.execute("netdev_del", Some(json!({"id": netdev})))
        .await
        .map_err(|e| format!("detaching interface {name:?}: backend {netdev}: {e}"))?;
    tracing::info!(interface = %name, "interface detached");
    Ok(())
}

/// `set_link` of interface `name`'s device.
pub(super) async fn set_link(qmp: &QmpClient, name: &str, up: bool) -> Result<(), String> {
    qmp.execute("set_link", Some(json!({"name": ids(name).1, "up": up})))
        .await
        .map(drop)
        .map_err(|e| format!("setting the link of interface {name:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::PodBridge;

    fn bridged(name: &str) -> Interface {
        Interface {
            name: name.into(),
            model: "virtio".into(),
            binding: InterfaceBinding::Bridge(PodBridge {
                pod_interface: "pod1234abcd567".into(),
                renamed: "1234abcd567-nic".into(),
                bridge: "k6t-1234abcd567".into(),
                tap: "tap1234abcd567".into(),
                server: [169, 254, 75, 11].into(),
            }),
            mac_address: Some("52:54:00:01:02:03".into()),
            boot_order: None,
            link_down: false,
        }
    }

    fn spec(interfaces: Vec<Interface>) -> LauncherSpec {
        let mut spec = crate::argv::tests::minimal_spec();
        spec.interfaces = interfaces;
        spec.hotplug_ports = 2;
        spec
    }

    fn plan(
        running: &LauncherSpec,
        wanted: &LauncherSpec,
        attached: &AttachedNics,
    ) -> Result<Vec<Step>, String> {
        let mut free = running.hotplug_ports;
        let mut out = Vec::new();
        steps(running, wanted, attached, &mut free, &mut out).map(|()| out)
    }

    #[test]
    fn a_new_bridge_interface_is_attached_and_an_attached_one_detached() {
        let running = spec(vec![bridged("default")]);
        let wanted = spec(vec![bridged("default"), bridged("blue")]);
        assert_eq!(
            plan(&running, &wanted, &AttachedNics::new()),
            Ok(vec![Step::AttachInterface(Box::new(bridged("blue")))])
        );
        let attached = AttachedNics::from([("blue".to_owned(), 1)]);
        assert_eq!(
            plan(&wanted, &running, &attached),
            Ok(vec![Step::DetachInterface("blue".into())])
        );
    }

    #[test]
    fn a_link_change_is_a_set_link_and_other_changes_are_refused() {
        let running = spec(vec![bridged("default")]);
        let mut down = bridged("default");
        down.link_down = true;
        assert_eq!(
            plan(&running, &spec(vec![down]), &AttachedNics::new()),
            Ok(vec![Step::SetLink {
                name: "default".into(),
                up: false
            }])
        );
        let mut other_mac = bridged("default");
        other_mac.mac_address = Some("52:54:00:09:09:09".into());
        let refused = plan(&running, &spec(vec![other_mac]), &AttachedNics::new()).unwrap_err();
        assert!(refused.contains("detach it first"), "{refused}");
    }

    #[test]
    fn boot_interfaces_stay_and_only_bridged_virtio_nics_are_attached_while_ports_last() {
        let running = spec(vec![bridged("default")]);
        let error = plan(&running, &spec(vec![]), &AttachedNics::new()).unwrap_err();
        assert!(error.contains("takes a restart"), "{error}");
        let mut user = bridged("blue");
        user.binding = InterfaceBinding::UserMode;
        let error = plan(
            &running,
            &spec(vec![bridged("default"), user]),
            &AttachedNics::new(),
        )
        .unwrap_err();
        assert!(error.contains("only bridge-bound"), "{error}");
        let mut e1000 = bridged("blue");
        e1000.model = "e1000".into();
        let error = plan(
            &running,
            &spec(vec![bridged("default"), e1000]),
            &AttachedNics::new(),
        )
        .unwrap_err();
        assert!(error.contains("only virtio"), "{error}");
        let three = spec(vec![
            bridged("default"),
            bridged("a"),
            bridged("b"),
            bridged("c"),
        ]);
        let error = plan(&running, &three, &AttachedNics::new()).unwrap_err();
        assert!(error.contains("no free hotplug port"), "{error}");
    }

    #[test]
    fn the_qmp_arguments_name_the_tap_the_port_and_the_mac() {
        let iface = bridged("blue");
        assert_eq!(
            netdev_args("blue", "tap1234abcd567"),
            json!({"type": "tap", "id": "netdev-hp-blue", "ifname": "tap1234abcd567",
                   "script": "no", "downscript": "no"})
        );
        assert_eq!(
            device_args(&iface, 2),
            json!({"driver": "virtio-net-pci", "id": "ua-blue", "netdev": "netdev-hp-blue",
                   "bus": "pci.2", "romfile": "", "mac": "52:54:00:01:02:03"})
        );
    }
}
