//! What a Service's EndpointSlices should hold (kube's `staging/src/k8s.io/endpointslice`
//! `podToEndpoint`, `getEndpointPorts`, `FindPort`, `getAddressTypesForService`, the
//! reconciler's grouping by address type and port set) and the plan that turns the existing
//! slices into them. Pure functions; the controller in `mod.rs` reads the caches and writes.
//!
//! Data flow: Service + its pods (+ their nodes) → [`desired_groups`]: one group per address
//! type and set of resolved ports, each with its endpoints sorted by pod name → [`plan`]
//! against the slices the controller manages → slices to create, update and delete.
//!
//! # Guarantees
//! - A group's endpoints are cut into slices of at most [`MAX_ENDPOINTS_PER_SLICE`]; existing
//!   slices of the same address type and ports are reused in name order, so an unchanged
//!   Service plans nothing.
//! - An address type the Service supports but no pod provides keeps exactly one placeholder
//!   slice (no ports, no endpoints), as kube does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use crate::ownership::controller_reference;
use crate::pods;

/// The label naming the Service a slice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages a slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`LABEL_MANAGED_BY`].
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The label kube puts on slices of headless Services (no cluster IP).
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The node label whose value becomes an endpoint's `zone`.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// At most this many endpoints go into one slice.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// An address type and port set: what all endpoints of one slice share.
pub type GroupKey = (String, Vec<PortKey>);
/// An [`EndpointPort`] as an orderable value (name, port, protocol, appProtocol).
pub type PortKey = (String, i32, String, Option<String>);

/// One group of endpoints that share an address type and a port set.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    pub ports: Vec<EndpointPort>,
    pub endpoints: Vec<Endpoint>,
}

/// The desired groups of a Service, and whether a pod was left out because its node is not
/// (yet) known.
#[derive(Clone, Debug, Default)]
pub struct Desired {
    pub groups: BTreeMap<GroupKey, Group>,
    pub node_missing: bool,
}

/// What to write to turn the existing slices into the desired ones.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub create: Vec<EndpointSlice>,
    pub update: Vec<EndpointSlice>,
    pub delete: Vec<Arc<EndpointSlice>>,
}

impl Plan {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.create.is_empty() && self.update.is_empty() && self.delete.is_empty()
    }
}

/// The orderable key of a port list.
pub fn port_key(ports: &[EndpointPort]) -> Vec<PortKey> {
    let mut key: Vec<PortKey> = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or_default(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.app_protocol.clone(),
            )
        })
        .collect();
    key.sort();
    key
}

/// Whether `ip` is of `address_type` (`IPv4` or `IPv6`).
fn is_of_type(ip: IpAddr, address_type: &str) -> bool {
    match ip {
        IpAddr::V4(_) => address_type == "IPv4",
        IpAddr::V6(_) => address_type == "IPv6",
    }
}

/// The address types a Service's slices carry: its `ipFamilies`; without them the family of
/// its cluster IP; a headless Service without families gets both (kube's fallback).
pub fn address_types(service: &Service) -> BTreeSet<String> {
    let spec = service.spec.clone().unwrap_or_default();
    let families: BTreeSet<String> = spec
        .ip_families
        .iter()
        .flatten()
        .filter(|f| matches!(f.as_str(), "IPv4" | "IPv6"))
        .cloned()
        .collect();
    if !families.is_empty() {
        return families;
    }
    match spec.cluster_ip.as_deref() {
        Some(ip) if !ip.is_empty() && ip != "None" => {
            let v6 = ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6());
            BTreeSet::from([if v6 { "IPv6" } else { "IPv4" }.to_owned()])
        }
        _ => BTreeSet::from(["IPv4".to_owned(), "IPv6".to_owned()]),
    }
}

/// The pod's IPs (`status.podIPs`, or `status.podIP` when the list is empty).
fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<&str> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .collect();
    let ips = if listed.is_empty() {
        status.pod_ip.as_deref().into_iter().collect()
    } else {
        listed
    };
    ips.iter().filter_map(|ip| ip.parse().ok()).collect()
}

/// Whether a pod belongs in a Service's slices at all (kube's `ShouldPodBeInEndpoints` with
/// terminating pods included): not terminal and with an IP.
pub fn should_be_in_endpoints(pod: &Pod) -> bool {
    !pods::is_terminal(pod) && !pod_ips(pod).is_empty()
}

/// The container port a Service port targets on `pod` (kube's `FindPort`): a number as it is,
/// a name looked up among the containers' (and restartable init containers') named ports of
/// the same protocol; `None` when the pod has no such port.
pub fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match &port.target_port {
        None => Some(port.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(name)) => {
            let spec = pod.spec.as_ref()?;
            let sidecars = spec
                .init_containers
                .iter()
                .flatten()
                .filter(|c| c.restart_policy.as_deref() == Some("Always"));
            spec.containers
                .iter()
                .chain(sidecars)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| {
                    p.name.as_deref() == Some(name.as_str())
                        && p.protocol.as_deref().unwrap_or("TCP") == protocol
                })
                .map(|p| p.container_port)
        }
    }
}

/// The slice ports of `pod` for the Service: one per Service port whose target the pod has.
pub fn endpoint_ports(service: &Service, pod: &Pod) -> Vec<EndpointPort> {
    let spec = service.spec.clone().unwrap_or_default();
    spec.ports
        .iter()
        .flatten()
        .filter_map(|port| {
            let number = find_port(pod, port)?;
            Some(EndpointPort {
                name: Some(port.name.clone().unwrap_or_default()),
                port: Some(number),
                protocol: Some(port.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: port.app_protocol.clone(),
            })
        })
        .collect()
}

/// The endpoint of `pod` for one address type (kube's `podToEndpoint`): `serving` is the
/// pod's readiness, `terminating` its deletion, `ready` serving and not terminating (always,
/// with `publishNotReadyAddresses`).
pub fn pod_to_endpoint(
    pod: &Pod,
    node: Option<&Node>,
    service: &Service,
    address_type: &str,
) -> Endpoint {
    let spec = service.spec.clone().unwrap_or_default();
    let serving = pods::is_ready(pod);
    let terminating = pod.metadata.deletion_timestamp.is_some();
    let ready = spec.publish_not_ready_addresses.unwrap_or(false) || (serving && !terminating);
    let pod_spec = pod.spec.clone().unwrap_or_default();
    let hostname = pod_spec.hostname.filter(|h| {
        !h.is_empty()
            && pod_spec.subdomain.as_deref() == service.metadata.name.as_deref()
            && pod.metadata.namespace == service.metadata.namespace
    });
    Endpoint {
        addresses: pod_ips(pod)
            .into_iter()
            .filter(|ip| is_of_type(*ip, address_type))
            .map(|ip| ip.to_string())
            .collect(),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname,
        node_name: pod_spec.node_name.filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..ObjectReference::default()
        }),
        zone: node.and_then(|n| n.labels().get(LABEL_ZONE).cloned()),
        ..Endpoint::default()
    }
}

/// The desired groups of `service` over the pods it selects. A pod whose node is unknown is
/// left out (and reported) unless the Service publishes not-ready addresses, as kube does.
pub fn desired_groups(
    service: &Service,
    selected: &[Arc<Pod>],
    node: &dyn Fn(&str) -> Option<Arc<Node>>,
) -> Desired {
    let publish = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut desired = Desired::default();
    let mut selected: Vec<&Arc<Pod>> = selected
        .iter()
        .filter(|p| should_be_in_endpoints(p))
        .collect();
    selected.sort_by_key(|p| p.name_any());
    for address_type in address_types(service) {
        for pod in &selected {
            let node_name = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or_default();
            let found = node(node_name);
            if found.is_none() && !publish {
                desired.node_missing = true;
                continue;
            }
            let endpoint = pod_to_endpoint(pod, found.as_deref(), service, &address_type);
            if endpoint.addresses.is_empty() {
                continue;
            }
            let ports = endpoint_ports(service, pod);
            let group = desired
                .groups
                .entry((address_type.clone(), port_key(&ports)))
                .or_insert_with(|| Group {
                    ports,
                    endpoints: Vec::new(),
                });
            group.endpoints.push(endpoint);
        }
    }
    desired
}

/// The labels of a Service's slices: the Service's own (but the reserved ones), the
/// headless label when it has no cluster IP, the service name and the manager.
pub fn slice_labels(service: &Service) -> BTreeMap<String, String> {
    let reserved = [LABEL_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_HEADLESS];
    let mut labels: BTreeMap<String, String> = service
        .labels()
        .iter()
        .filter(|(k, _)| !reserved.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let cluster_ip = service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .unwrap_or_default();
    if cluster_ip.is_empty() || cluster_ip == "None" {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(LABEL_SERVICE_NAME.into(), service.name_any());
    labels.insert(LABEL_MANAGED_BY.into(), CONTROLLER_NAME.into());
    labels
}

/// Whether `slice` is controlled by `service` (an owner reference to its uid).
pub fn owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    slice.owner_references().iter().any(|r| {
        r.kind == "Service" && r.api_version == "v1" && Some(&r.uid) == service.uid().as_ref()
    })
}

/// A new slice of `service` (`generateName` `<service>-`).
fn new_slice(service: &Service, address_type: &str, group: Group) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", service.name_any())),
            namespace: service.namespace(),
            labels: Some(slice_labels(service)),
            owner_references: Some(vec![controller_reference(service)]),
            ..ObjectMeta::default()
        },
        address_type: address_type.to_owned(),
        endpoints: group.endpoints,
        ports: Some(group.ports),
    }
}

/// Turns `existing` (the slices labelled as this Service's and managed by this controller)
/// into the `desired` groups: reuse slices of the same address type and ports in name order,
/// create what is missing, delete the rest (and any slice not owned by the Service or of an
/// address type it no longer has).
pub fn plan(service: &Service, desired: Desired, existing: &[Arc<EndpointSlice>]) -> Plan {
    let types = address_types(service);
    let labels = slice_labels(service);
    let mut plan = Plan::default();
    let mut reusable: BTreeMap<GroupKey, Vec<Arc<EndpointSlice>>> = BTreeMap::new();
    for slice in existing {
        if owned_by(slice, service) && types.contains(&slice.address_type) {
            let key = (
                slice.address_type.clone(),
                port_key(slice.ports.as_deref().unwrap_or_default()),
            );
            reusable.entry(key).or_default().push(Arc::clone(slice));
        } else {
            plan.delete.push(Arc::clone(slice));
        }
    }
    for slices in reusable.values_mut() {
        slices.sort_by_key(|s| s.name_any());
    }
    let mut groups = desired.groups;
    for address_type in &types {
        if !groups.keys().any(|(t, _)| t == address_type) {
            groups.insert((address_type.clone(), Vec::new()), Group::default());
        }
    }
    for (key, group) in groups {
        let mut slices = reusable.remove(&key).unwrap_or_default().into_iter();
        let chunks: Vec<Vec<Endpoint>> = if group.endpoints.is_empty() {
            vec![Vec::new()]
        } else {
            group
                .endpoints
                .chunks(MAX_ENDPOINTS_PER_SLICE)
                .map(<[Endpoint]>::to_vec)
                .collect()
        };
        for endpoints in chunks {
            let group = Group {
                ports: group.ports.clone(),
                endpoints,
            };
            match slices.next() {
                Some(slice) => {
                    let same = slice.endpoints == group.endpoints
                        && slice.ports.as_deref().unwrap_or_default() == group.ports.as_slice()
                        && slice.metadata.labels.as_ref() == Some(&labels);
                    if !same {
                        let mut updated = (*slice).clone();
                        updated.endpoints = group.endpoints;
                        updated.ports = Some(group.ports);
                        updated.metadata.labels = Some(labels.clone());
                        plan.update.push(updated);
                    }
                }
                None => plan.create.push(new_slice(service, &key.0, group)),
            }
        }
        plan.delete.extend(slices);
    }
    plan.delete.extend(reusable.into_values().flatten());
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(spec: serde_json::Value) -> Service {
        let mut svc = json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid",
                         "labels": {"app": "web"}},
        });
        svc["spec"] = spec;
        serde_json::from_value(svc).unwrap()
    }

    fn pod(name: &str, ready: bool, ips: &[&str], ports: serde_json::Value) -> Arc<Pod> {
        let ips: Vec<_> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                         "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
            "status": {"podIPs": ips, "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        });
        pod["spec"]["containers"][0]["ports"] = ports;
        Arc::new(serde_json::from_value(pod).unwrap())
    }

    fn any_node(_: &str) -> Option<Arc<Node>> {
        Some(Arc::new(Node::default()))
    }

    #[test]
    fn named_target_ports_resolve_per_pod_and_pods_without_them_get_their_own_group() {
        let svc = service(json!({"clusterIP": "10.96.0.10", "ports": [
            {"name": "https", "port": 443, "targetPort": "https"}]}));
        let pods = [
            pod(
                "a",
                true,
                &["10.0.0.1"],
                json!([{"name": "https", "containerPort": 8443}]),
            ),
            pod(
                "b",
                false,
                &["10.0.0.2"],
                json!([{"name": "https", "containerPort": 9443}]),
            ),
            pod("c", true, &["10.0.0.3"], json!([])),
        ];
        let desired = desired_groups(&svc, &pods, &any_node);
        assert_eq!(desired.groups.len(), 3, "{:?}", desired.groups.keys());
        let key = |ports: Vec<PortKey>| -> GroupKey { ("IPv4".to_owned(), ports) };
        let https = |port| vec![("https".to_owned(), port, "TCP".to_owned(), None)];
        let a = &desired.groups[&key(https(8443))];
        assert_eq!(a.endpoints[0].addresses, ["10.0.0.1"]);
        assert_eq!(
            a.endpoints[0].conditions.as_ref().unwrap().ready,
            Some(true)
        );
        let b = &desired.groups[&key(https(9443))];
        let cond = b.endpoints[0].conditions.as_ref().unwrap();
        assert_eq!((cond.ready, cond.serving), (Some(false), Some(false)));
        assert_eq!(desired.groups[&key(Vec::new())].endpoints.len(), 1);
    }

    #[test]
    fn an_unchanged_service_plans_nothing_and_an_empty_one_keeps_a_placeholder() {
        let svc = service(json!({"clusterIP": "10.96.0.10", "ports": [
            {"name": "http", "port": 80, "targetPort": 8080}]}));
        let pods = [pod("a", true, &["10.0.0.1", "fd00::1"], json!([]))];
        let first = plan(&svc, desired_groups(&svc, &pods, &any_node), &[]);
        assert_eq!(first.create.len(), 1, "only the IPv4 family of the Service");
        let mut created = first.create[0].clone();
        created.metadata.name = Some("web-abcde".into());
        let existing = [Arc::new(created)];
        let again = plan(&svc, desired_groups(&svc, &pods, &any_node), &existing);
        assert!(again.is_empty(), "{again:?}");
        // As kube does: the slice of other ports goes, an empty placeholder comes.
        let empty = plan(&svc, desired_groups(&svc, &[], &any_node), &existing);
        assert_eq!((empty.create.len(), empty.delete.len()), (1, 1));
        let mut placeholder = empty.create[0].clone();
        assert!(placeholder.endpoints.is_empty());
        assert!(placeholder.ports.as_deref().is_some_and(<[_]>::is_empty));
        placeholder.metadata.name = Some("web-fghij".into());
        let kept = plan(
            &svc,
            desired_groups(&svc, &[], &any_node),
            &[Arc::new(placeholder)],
        );
        assert!(kept.is_empty(), "{kept:?}");
    }

    #[test]
    fn publish_not_ready_addresses_makes_every_endpoint_ready_and_terminating_is_not_ready() {
        let svc = service(json!({"clusterIP": "10.96.0.10", "publishNotReadyAddresses": true}));
        let p = pod("a", false, &["10.0.0.1"], json!([]));
        let e = pod_to_endpoint(&p, None, &svc, "IPv4");
        assert_eq!(e.conditions.unwrap().ready, Some(true));
        let svc = service(json!({"clusterIP": "10.96.0.10"}));
        let mut p = (*pod("a", true, &["10.0.0.1"], json!([]))).clone();
        p.metadata.deletion_timestamp = Some(crate::now_time());
        let c = pod_to_endpoint(&p, None, &svc, "IPv4").conditions.unwrap();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true))
        );
    }

    #[test]
    fn slices_not_owned_by_the_service_or_of_a_dropped_family_are_deleted() {
        let svc = service(json!({"clusterIP": "10.96.0.10", "ipFamilies": ["IPv4"]}));
        let pods = [pod("a", true, &["10.0.0.1"], json!([]))];
        let mut ours = plan(&svc, desired_groups(&svc, &pods, &any_node), &[]).create[0].clone();
        ours.metadata.name = Some("web-abcde".into());
        let mut foreign = ours.clone();
        foreign.metadata.name = Some("web-zzzzz".into());
        foreign.metadata.owner_references = None;
        let mut v6 = ours.clone();
        v6.metadata.name = Some("web-yyyyy".into());
        v6.address_type = "IPv6".into();
        let existing = [Arc::new(ours), Arc::new(foreign), Arc::new(v6)];
        let p = plan(&svc, desired_groups(&svc, &pods, &any_node), &existing);
        let mut deleted: Vec<String> = p.delete.iter().map(|s| s.name_any()).collect();
        deleted.sort();
        assert_eq!(deleted, ["web-yyyyy", "web-zzzzz"]);
        assert!(p.create.is_empty() && p.update.is_empty());
    }

    #[test]
    fn address_types_follow_the_families_then_the_cluster_ip() {
        let types = |spec| {
            address_types(&service(spec))
                .into_iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            types(json!({"ipFamilies": ["IPv6", "IPv4"]})),
            ["IPv4", "IPv6"]
        );
        assert_eq!(types(json!({"clusterIP": "fd00::10"})), ["IPv6"]);
        assert_eq!(types(json!({"clusterIP": "None"})), ["IPv4", "IPv6"]);
    }

    #[test]
    fn more_than_a_hundred_endpoints_are_cut_into_slices() {
        let svc = service(json!({"clusterIP": "10.96.0.10"}));
        let pods: Vec<_> = (0..150)
            .map(|i| {
                pod(
                    &format!("p{i:03}"),
                    true,
                    &[format!("10.0.{}.{}", i / 200, i % 200).as_str()],
                    json!([]),
                )
            })
            .collect();
        let p = plan(&svc, desired_groups(&svc, &pods, &any_node), &[]);
        let sizes: Vec<usize> = p.create.iter().map(|s| s.endpoints.len()).collect();
        assert_eq!(sizes, [100, 50]);
    }
}
