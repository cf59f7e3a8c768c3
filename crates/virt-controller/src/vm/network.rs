//! The VM controller's network synchronizer (NIC hotplug, reference §6.4) and the network part
//! of `RestartRequired`.
//!
//! On each sync with a VMI that is not being deleted, [`plan`] compares the template's
//! interfaces with the VMI's:
//! - a template interface the VMI lacks, not `absent`, with the bridge (or SR-IOV) binding is
//!   appended to the VMI, with its network;
//! - a changed `state` (`up`, `down`, `absent`) of an interface both have is copied to the
//!   VMI, unless the VMI's is `absent` already (and `absent` is not copied where the VMI
//!   uses ordinal secondary interface names, which cannot be unplugged);
//! - an `absent` interface gone from the VMI status is dropped from the VMI spec, and from
//!   the template once the VMI has neither it nor its status.
//!
//! The VMI write `test`s both lists it replaces (`/spec/networks`,
//! `/spec/domain/devices/interfaces`), the template write likewise, so a concurrent change
//! makes the write fail and the next sync starts over from what is there. The VMI controller
//! then asks the node for the pod interface (the pod's networks annotation) and virt-handler
//! plugs the NIC into the domain.
//!
//! [`restart_required`] is upstream's rule for networks: a change cannot be applied live when
//! an interface or network the VMI has is missing from the template, an interface changed in
//! anything but `state`, the template adds the pod network to a VMI without one, or a network
//! changed. Only then are the template's interfaces and networks compared with those the VMI
//! was started from (a template that never named any, as the VMI's defaults have it, needs no
//! restart); otherwise they are left out of `RestartRequired`.

use kubevirt_api::v1::{
    Interface, InterfaceState, Network, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstanceNetworkInterface,
};
use serde_json::{Value, json};

/// The writes NIC hotplug needs now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetworkPlan {
    /// JSON Patch of the VMI's networks and interfaces.
    pub vmi_ops: Vec<Value>,
    /// JSON Patch of the VM template's networks and interfaces.
    pub template_ops: Vec<Value>,
}

fn is_absent(iface: &Interface) -> bool {
    iface.state == Some(InterfaceState::Absent)
}

fn statuses(vmi: &VirtualMachineInstance) -> &[VirtualMachineInstanceNetworkInterface] {
    vmi.status.as_ref().map_or(&[], |s| s.interfaces.as_slice())
}

/// Whether the VMI's secondary interfaces use the ordinal names (`net1`…) of VMIs started
/// before hashed names: a pod interface status named so.
fn has_ordinal_secondary_ifaces(vmi: &VirtualMachineInstance) -> bool {
    statuses(vmi).iter().any(|s| {
        s.pod_interface_name
            .as_deref()
            .and_then(|n| n.strip_prefix("net"))
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit()))
    })
}

fn networks_of<'a>(networks: &'a [Network], interfaces: &[Interface]) -> Vec<&'a Network> {
    networks
        .iter()
        .filter(|n| interfaces.iter().any(|i| i.name == n.name))
        .collect()
}

/// The VMI's interfaces and networks as the template wants them (see the module docs).
fn synced_vmi(
    vm_template: (&[Interface], &[Network]),
    vmi: &VirtualMachineInstance,
) -> (Vec<Interface>, Vec<Network>) {
    let (template_ifaces, template_nets) = vm_template;
    let mut ifaces = vmi.spec.domain.devices.interfaces.clone();
    let mut nets = vmi.spec.networks.clone();
    let ordinal = has_ordinal_secondary_ifaces(vmi);
    for wanted in template_ifaces {
        match ifaces.iter_mut().find(|i| i.name == wanted.name) {
            None => {
                let b = &wanted.binding_method;
                if is_absent(wanted) || (b.bridge.is_none() && b.sriov.is_none()) {
                    continue;
                }
                let Some(network) = template_nets.iter().find(|n| n.name == wanted.name) else {
                    continue;
                };
                ifaces.push(wanted.clone());
                if !nets.iter().any(|n| n.name == network.name) {
                    nets.push(network.clone());
                }
            }
            Some(have) => {
                if have.state != wanted.state && !is_absent(have) && !(ordinal && is_absent(wanted))
                {
                    have.state.clone_from(&wanted.state);
                }
            }
        }
    }
    let status = statuses(vmi);
    ifaces.retain(|i| {
        !is_absent(i)
            || status
                .iter()
                .any(|s| s.name.as_deref() == Some(i.name.as_str()))
    });
    let nets = networks_of(&nets, &ifaces).into_iter().cloned().collect();
    (ifaces, nets)
}

fn list_ops(ops: &mut Vec<Value>, path: &str, old: &Value, new: &Value) {
    if old != new {
        ops.push(json!({"op": "test", "path": path, "value": old}));
        ops.push(json!({"op": "add", "path": path, "value": new}));
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The writes of one sync of `vm` with its VMI `vmi` (none without a VMI or while it is
/// deleted, except clearing the template).
pub fn plan(vm: &VirtualMachine, vmi: Option<&VirtualMachineInstance>) -> NetworkPlan {
    let mut out = NetworkPlan::default();
    let Some(template) = vm.spec.template.spec.as_ref() else {
        return out;
    };
    let template_ifaces = &template.domain.devices.interfaces;
    if vmi.is_some_and(|v| v.metadata.deletion_timestamp.is_some()) {
        return out;
    }
    let mut vmi_ifaces: Vec<Interface> = Vec::new();
    let mut vmi_statuses: &[VirtualMachineInstanceNetworkInterface] = &[];
    if let Some(vmi) = vmi {
        let (ifaces, nets) = synced_vmi((template_ifaces, &template.networks), vmi);
        list_ops(
            &mut out.vmi_ops,
            "/spec/networks",
            &to_value(&vmi.spec.networks),
            &to_value(&nets),
        );
        list_ops(
            &mut out.vmi_ops,
            "/spec/domain/devices/interfaces",
            &to_value(&vmi.spec.domain.devices.interfaces),
            &to_value(&ifaces),
        );
        vmi_ifaces = ifaces;
        vmi_statuses = statuses(vmi);
    }
    let kept: Vec<Interface> = template_ifaces
        .iter()
        .filter(|i| {
            !is_absent(i)
                || vmi_ifaces.iter().any(|v| v.name == i.name)
                || vmi_statuses
                    .iter()
                    .any(|s| s.name.as_deref() == Some(i.name.as_str()))
        })
        .cloned()
        .collect();
    if kept.len() != template_ifaces.len() {
        let nets: Vec<Network> = networks_of(&template.networks, &kept)
            .into_iter()
            .cloned()
            .collect();
        list_ops(
            &mut out.template_ops,
            "/spec/template/spec/networks",
            &to_value(&template.networks),
            &to_value(&nets),
        );
        list_ops(
            &mut out.template_ops,
            "/spec/template/spec/domain/devices/interfaces",
            &to_value(template_ifaces),
            &to_value(&kept),
        );
    }
    out
}

fn without_state(iface: &Interface) -> Interface {
    let mut iface = iface.clone();
    iface.state = None;
    iface
}

fn is_pod_network(network: &Network) -> bool {
    network.network_source.pod.is_some()
}

/// Upstream's network `RestartRequired` rule (see the module docs). A migratable VMI may
/// change a Multus network's NAD name live; here VMIs are not treated as migratable for it.
pub fn restart_required(vm: &VirtualMachine, vmi: &VirtualMachineInstance) -> bool {
    let Some(template) = vm.spec.template.spec.as_ref() else {
        return false;
    };
    let desired = &template.domain.devices.interfaces;
    let changed_iface = vmi.spec.domain.devices.interfaces.iter().any(|current| {
        desired
            .iter()
            .find(|d| d.name == current.name)
            .is_none_or(|d| without_state(d) != without_state(current))
    });
    if changed_iface {
        return true;
    }
    if template.networks.iter().any(is_pod_network) && !vmi.spec.networks.iter().any(is_pod_network)
    {
        return true;
    }
    vmi.spec.networks.iter().any(|current| {
        template
            .networks
            .iter()
            .find(|d| d.name == current.name)
            .is_none_or(|d| d != current)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(interfaces: Value, networks: Value) -> VirtualMachine {
        let mut vm = json!({"metadata": {"name": "vm", "namespace": "default"}});
        vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"] = interfaces;
        vm["spec"]["template"]["spec"]["networks"] = networks;
        serde_json::from_value(vm).unwrap()
    }

    fn vmi(interfaces: Value, networks: Value, status: Value) -> VirtualMachineInstance {
        let mut vmi = json!({"metadata": {"name": "vm", "namespace": "default"}});
        vmi["spec"]["domain"]["devices"]["interfaces"] = interfaces;
        vmi["spec"]["networks"] = networks;
        vmi["status"]["interfaces"] = status;
        serde_json::from_value(vmi).unwrap()
    }

    fn pod_net() -> Value {
        json!({"name": "default", "pod": {}})
    }

    fn blue_net() -> Value {
        json!({"name": "blue", "multus": {"networkName": "blue-nad"}})
    }

    fn masq() -> Value {
        json!({"name": "default", "masquerade": {}})
    }

    fn op_value(ops: &[Value], path: &str) -> Value {
        ops.iter()
            .find(|o| o["op"] == "add" && o["path"] == path)
            .map(|o| o["value"].clone())
            .unwrap_or(Value::Null)
    }

    #[test]
    fn a_bridge_interface_added_to_the_template_is_appended_to_the_vmi_with_its_network() {
        let vm = vm(
            json!([masq(), {"name": "blue", "bridge": {}}]),
            json!([pod_net(), blue_net()]),
        );
        let vmi = vmi(
            json!([masq()]),
            json!([pod_net()]),
            json!([{"name": "default"}]),
        );
        let plan = plan(&vm, Some(&vmi));
        assert_eq!(
            plan.vmi_ops[0],
            json!({"op": "test", "path": "/spec/networks", "value": [pod_net()]})
        );
        assert_eq!(
            op_value(&plan.vmi_ops, "/spec/networks"),
            json!([pod_net(), blue_net()])
        );
        assert_eq!(
            op_value(&plan.vmi_ops, "/spec/domain/devices/interfaces"),
            json!([masq(), {"name": "blue", "bridge": {}}])
        );
        assert!(plan.template_ops.is_empty());
        assert!(!restart_required(&vm, &vmi));
    }

    #[test]
    fn a_masquerade_or_absent_interface_is_not_hotplugged() {
        let vm = vm(
            json!([masq(), {"name": "blue", "masquerade": {}}, {"name": "red", "bridge": {}, "state": "absent"}]),
            json!([pod_net(), blue_net(), {"name": "red", "multus": {"networkName": "red"}}]),
        );
        let vmi = vmi(json!([masq()]), json!([pod_net()]), json!([]));
        let plan = plan(&vm, Some(&vmi));
        assert!(plan.vmi_ops.is_empty(), "{:?}", plan.vmi_ops);
        // The absent one has never been on the VMI: it leaves the template.
        assert_eq!(
            op_value(
                &plan.template_ops,
                "/spec/template/spec/domain/devices/interfaces"
            ),
            json!([masq(), {"name": "blue", "masquerade": {}}])
        );
        assert_eq!(
            op_value(&plan.template_ops, "/spec/template/spec/networks"),
            json!([pod_net(), blue_net()])
        );
    }

    #[test]
    fn the_state_is_propagated_and_an_absent_one_cleared_once_gone_from_the_status() {
        let blue = |state: &str| json!({"name": "blue", "bridge": {}, "state": state});
        let vm = vm(
            json!([masq(), blue("absent")]),
            json!([pod_net(), blue_net()]),
        );
        let running = vmi(
            json!([masq(), blue("down")]),
            json!([pod_net(), blue_net()]),
            json!([{"name": "default"}, {"name": "blue"}]),
        );
        let plan = plan(&vm, Some(&running));
        assert_eq!(
            op_value(&plan.vmi_ops, "/spec/domain/devices/interfaces"),
            json!([masq(), blue("absent")])
        );
        assert!(plan.template_ops.is_empty());
        assert!(!restart_required(&vm, &running));
        // Unplugged: gone from the status, so gone from the VMI and then the template.
        let unplugged = vmi(
            json!([masq(), blue("absent")]),
            json!([pod_net(), blue_net()]),
            json!([{"name": "default"}]),
        );
        let plan = super::plan(&vm, Some(&unplugged));
        assert_eq!(
            op_value(&plan.vmi_ops, "/spec/networks"),
            json!([pod_net()])
        );
        assert_eq!(
            op_value(&plan.vmi_ops, "/spec/domain/devices/interfaces"),
            json!([masq()])
        );
        assert_eq!(
            op_value(
                &plan.template_ops,
                "/spec/template/spec/domain/devices/interfaces"
            ),
            json!([masq()])
        );
    }

    #[test]
    fn ordinal_names_keep_an_interface_from_being_marked_absent() {
        let vm = vm(
            json!([masq(), {"name": "blue", "bridge": {}, "state": "absent"}]),
            json!([pod_net(), blue_net()]),
        );
        let vmi = vmi(
            json!([masq(), {"name": "blue", "bridge": {}}]),
            json!([pod_net(), blue_net()]),
            json!([{"name": "default", "podInterfaceName": "eth0"}, {"name": "blue", "podInterfaceName": "net1"}]),
        );
        assert!(plan(&vm, Some(&vmi)).vmi_ops.is_empty());
    }

    #[test]
    fn removing_or_changing_a_vmi_interface_or_network_requires_a_restart() {
        let vmi = vmi(
            json!([masq(), {"name": "blue", "bridge": {}}]),
            json!([pod_net(), blue_net()]),
            json!([]),
        );
        let removed = vm(json!([masq()]), json!([pod_net()]));
        assert!(restart_required(&removed, &vmi));
        let changed = vm(
            json!([masq(), {"name": "blue", "bridge": {}, "macAddress": "02:00:00:00:00:01"}]),
            json!([pod_net(), blue_net()]),
        );
        assert!(restart_required(&changed, &vmi));
        let other_nad = vm(
            json!([masq(), {"name": "blue", "bridge": {}}]),
            json!([pod_net(), {"name": "blue", "multus": {"networkName": "other"}}]),
        );
        assert!(restart_required(&other_nad, &vmi));
        let only_state = vm(
            json!([masq(), {"name": "blue", "bridge": {}, "state": "down"}]),
            json!([pod_net(), blue_net()]),
        );
        assert!(!restart_required(&only_state, &vmi));
        let secondary_only = self::vmi(
            json!([{"name": "blue", "bridge": {}}]),
            json!([blue_net()]),
            json!([]),
        );
        let adds_pod = vm(
            json!([{"name": "blue", "bridge": {}}, masq()]),
            json!([blue_net(), pod_net()]),
        );
        assert!(restart_required(&adds_pod, &secondary_only));
    }
}
