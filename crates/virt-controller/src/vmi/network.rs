//! The VMI controller's part of NIC hotplug (upstream `pkg/network/controllers/vmi.go`).
//!
//! Data flow: the VM controller appends a hotplugged interface to the VMI spec, or marks one
//! `absent` ([`crate::vm::network`]). While the VMI is `Scheduled` or `Running`,
//! [`pod_networks_patch`] brings the launcher pod's `k8s.v1.cni.cncf.io/networks` annotation to
//! what a new pod would get ([`super::template`]: the Multus networks of the interfaces not
//! `absent`, each on its hashed pod interface); the node (Multus' dynamic networks
//! controller on a cluster) then adds or removes that interface in the pod and reports it
//! in `k8s.v1.cni.cncf.io/network-status`. [`interfaces_status`] turns that report into the
//! VMI's `status.interfaces`: `multus-status` in `infoSource` and the `podInterfaceName` of
//! each secondary interface the pod has, neither once it is gone. virt-handler plugs an
//! interface into the domain once its status says `multus-status`, and keeps those sources
//! when it writes the domain's interfaces.

use k8s_openapi::api::core::v1::Pod;
use kubevirt_api::constants as c;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstanceNetworkInterface};
use serde_json::{Value, json};

/// The `infoSource` of an interface the pod's network status lists.
pub const MULTUS_STATUS_SOURCE: &str = "multus-status";
/// The pod annotation in which the node reports the pod's networks.
pub const NETWORK_STATUS_ANNOTATION: &str = "k8s.v1.cni.cncf.io/network-status";

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a String> {
    pod.metadata.annotations.as_ref()?.get(key)
}

/// The merge patch that gives the running launcher pod the networks annotation the VMI's
/// interfaces want now; `None` when it has it.
pub fn pod_networks_patch(vmi: &VirtualMachineInstance, pod: &Pod) -> Option<Value> {
    let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let wanted = super::template::multus_annotations(vmi, namespace)
        .into_iter()
        .find(|(k, _)| k == c::MULTUS_NETWORKS_ANNOTATION)
        .map(|(_, v)| v);
    let current = annotation(pod, c::MULTUS_NETWORKS_ANNOTATION);
    if current == wanted.as_ref() {
        return None;
    }
    Some(json!({"metadata": {"annotations": {c::MULTUS_NETWORKS_ANNOTATION: wanted}}}))
}

/// The pod interfaces the pod's `network-status` lists.
fn pod_interfaces(pod: &Pod) -> Vec<String> {
    annotation(pod, NETWORK_STATUS_ANNOTATION)
        .and_then(|s| serde_json::from_str::<Vec<Value>>(s).ok())
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e["interface"].as_str().map(str::to_owned))
        .collect()
}

fn sources(iface: &VirtualMachineInstanceNetworkInterface) -> Vec<String> {
    iface
        .info_source
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn set_sources(iface: &mut VirtualMachineInstanceNetworkInterface, sources: &[String]) {
    iface.info_source = (!sources.is_empty()).then(|| sources.join(", "));
}

/// `status.interfaces` with the secondary interfaces the pod has marked `multus-status` (see
/// the module docs).
pub fn interfaces_status(
    vmi: &VirtualMachineInstance,
    pod: &Pod,
) -> Vec<VirtualMachineInstanceNetworkInterface> {
    let mut out = vmi
        .status
        .as_ref()
        .map(|s| s.interfaces.clone())
        .unwrap_or_default();
    let on_pod = pod_interfaces(pod);
    let secondaries: Vec<(String, String)> = vmi
        .spec
        .networks
        .iter()
        .filter(|n| {
            n.network_source
                .multus
                .as_ref()
                .is_some_and(|m| m.default != Some(true))
        })
        .map(|n| {
            (
                n.name.clone(),
                super::template::hashed_pod_interface_name(&n.name),
            )
        })
        .collect();
    for (name, pod_iface) in &secondaries {
        let present = on_pod.contains(pod_iface);
        let position = out.iter().position(|i| i.name.as_deref() == Some(name));
        match (position, present) {
            (None, true) => out.push(VirtualMachineInstanceNetworkInterface {
                name: Some(name.clone()),
                pod_interface_name: Some(pod_iface.clone()),
                info_source: Some(MULTUS_STATUS_SOURCE.to_owned()),
                ..Default::default()
            }),
            (Some(i), true) => {
                let entry = &mut out[i];
                entry.pod_interface_name = Some(pod_iface.clone());
                let mut s = sources(entry);
                if !s.iter().any(|x| x == MULTUS_STATUS_SOURCE) {
                    s.push(MULTUS_STATUS_SOURCE.to_owned());
                    set_sources(entry, &s);
                }
            }
            (None, false) => {}
            (Some(_), false) => {}
        }
    }
    // Whatever the pod no longer has loses the source; an entry left with none goes.
    out.retain_mut(|entry| {
        let mut s = sources(entry);
        if !s.iter().any(|x| x == MULTUS_STATUS_SOURCE) {
            return true;
        }
        let still = entry.name.as_deref().is_some_and(|name| {
            secondaries
                .iter()
                .any(|(n, p)| n == name && on_pod.contains(p))
        });
        if still {
            return true;
        }
        s.retain(|x| x != MULTUS_STATUS_SOURCE);
        set_sources(entry, &s);
        !s.is_empty()
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(interfaces: Value, status: Value) -> VirtualMachineInstance {
        let mut vmi = json!({
            "metadata": {"name": "vm", "namespace": "default"},
            "spec": {"networks": [{"name": "default", "pod": {}},
                                  {"name": "blue", "multus": {"networkName": "blue-nad"}}]},
        });
        vmi["spec"]["domain"]["devices"]["interfaces"] = interfaces;
        vmi["status"]["interfaces"] = status;
        serde_json::from_value(vmi).unwrap()
    }

    fn pod(annotations: Value) -> Pod {
        let mut pod = json!({"metadata": {"name": "p"}});
        pod["metadata"]["annotations"] = annotations;
        serde_json::from_value(pod).unwrap()
    }

    fn blue_iface() -> String {
        super::super::template::hashed_pod_interface_name("blue")
    }

    #[test]
    fn the_pod_annotation_follows_the_interfaces_not_absent() {
        let with_blue = vmi(
            json!([{"name": "default", "masquerade": {}}, {"name": "blue", "bridge": {}}]),
            json!([]),
        );
        let patch = pod_networks_patch(&with_blue, &pod(json!({}))).expect("a patch");
        let value = patch["metadata"]["annotations"][c::MULTUS_NETWORKS_ANNOTATION]
            .as_str()
            .unwrap()
            .to_owned();
        let list: Value = serde_json::from_str(&value).unwrap();
        assert_eq!(
            list,
            json!([{"name": "blue-nad", "namespace": "default", "interface": blue_iface()}])
        );
        let annotated = pod(json!({c::MULTUS_NETWORKS_ANNOTATION: value}));
        assert_eq!(pod_networks_patch(&with_blue, &annotated), None);
        let absent = vmi(
            json!([{"name": "default", "masquerade": {}}, {"name": "blue", "bridge": {}, "state": "absent"}]),
            json!([]),
        );
        assert_eq!(
            pod_networks_patch(&absent, &annotated),
            Some(json!({"metadata": {"annotations": {c::MULTUS_NETWORKS_ANNOTATION: null}}}))
        );
    }

    #[test]
    fn interfaces_the_pod_reports_get_multus_status_and_lose_it_when_gone() {
        let ifaces = json!([{"name": "default", "masquerade": {}}, {"name": "blue", "bridge": {}}]);
        let status =
            json!([{"name": "default", "infoSource": "domain", "podInterfaceName": "eth0"}]);
        let reported = pod(json!({NETWORK_STATUS_ANNOTATION: json!([
            {"name": "pods", "interface": "eth0", "default": true},
            {"name": "default/blue-nad", "interface": blue_iface()},
        ]).to_string()}));
        let out = interfaces_status(&vmi(ifaces.clone(), status), &reported);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].name.as_deref(), Some("blue"));
        assert_eq!(out[1].info_source.as_deref(), Some("multus-status"));
        assert_eq!(
            out[1].pod_interface_name.as_deref(),
            Some(blue_iface().as_str())
        );
        // The domain has it too; then the pod loses it.
        let status = json!([{"name": "default", "infoSource": "domain"},
            {"name": "blue", "infoSource": "domain, multus-status", "podInterfaceName": blue_iface()}]);
        let out = interfaces_status(&vmi(ifaces.clone(), status.clone()), &reported);
        assert_eq!(out[1].info_source.as_deref(), Some("domain, multus-status"));
        let out = interfaces_status(&vmi(ifaces.clone(), status), &pod(json!({})));
        assert_eq!(out[1].info_source.as_deref(), Some("domain"));
        let only_multus = json!([{"name": "default", "infoSource": "domain"},
            {"name": "blue", "infoSource": "multus-status"}]);
        let out = interfaces_status(&vmi(ifaces, only_multus), &pod(json!({})));
        assert_eq!(out.len(), 1);
    }
}
