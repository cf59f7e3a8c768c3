//! `expose`: a Service selecting the launcher pods of a VMI or a VM (upstream's
//! `vmi.kubevirt.io/id` label, which the VMI controller puts on the pod) or of a VMI replica
//! set (its `matchLabels`), owned by what it exposes (controller reference, not blocking
//! its deletion). Without `--port` the Service gets the `ports` of the interfaces on the pod
//! network (`port-1`, `port-2`, …), as upstream introspects them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::PostParams;
use kube::{Api, Resource};
use kubevirt_api::constants::{VMI_ID_LABEL, vmi_id_label};
use kubevirt_api::v1::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceReplicaSet,
    VirtualMachineInstanceSpec,
};

use crate::Error;
use crate::cli::Expose;
use crate::client::{Ctx, api_message};

/// The Service `expose` creates for `selector`.
///
/// # Errors
/// An unknown protocol or service type.
pub fn service(a: &Expose, namespace: &str, info: ResourceInfo) -> Result<Service, Error> {
    if !matches!(a.protocol.as_str(), "TCP" | "UDP") {
        return Err(Error::Message(format!("unknown protocol: {}", a.protocol)));
    }
    match a.service_type.as_str() {
        "ClusterIP" | "NodePort" | "LoadBalancer" => {}
        "ExternalName" => {
            return Err(Error::Message(format!(
                "type: {} not supported",
                a.service_type
            )));
        }
        other => return Err(Error::Message(format!("unknown service type: {other}"))),
    }
    let target_port = a.target_port.as_ref().filter(|t| !t.is_empty()).map(|t| {
        t.parse::<i32>()
            .map_or_else(|_| IntOrString::String(t.clone()), IntOrString::Int)
    });
    let ports = match a.port {
        Some(port) => vec![ServicePort {
            name: a.port_name.clone(),
            protocol: Some(a.protocol.clone()),
            port,
            target_port,
            node_port: a.node_port,
            ..Default::default()
        }],
        None => info.ports,
    };
    if ports.is_empty() {
        return Err(Error::Message(
            "couldn't find port via --port flag or introspection".into(),
        ));
    }
    Ok(Service {
        metadata: kube::api::ObjectMeta {
            name: Some(a.name.clone()),
            namespace: Some(namespace.to_owned()),
            owner_references: Some(vec![info.owner]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(ports),
            selector: Some(info.selector),
            cluster_ip: a.cluster_ip.clone(),
            type_: Some(a.service_type.clone()),
            external_ips: a.external_ip.clone().map(|ip| vec![ip]),
            load_balancer_ip: a.load_balancer_ip.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

/// What `expose` reads from the exposed object.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    /// The Service's selector.
    pub selector: BTreeMap<String, String>,
    /// The ports found on the object's pod-network interfaces.
    pub ports: Vec<ServicePort>,
    /// The Service's owner: the exposed object.
    pub owner: OwnerReference,
}

/// Upstream's `podNetworkPorts`: the `ports` of every interface on the pod network, named
/// `port-1`, `port-2`, … in order.
pub fn pod_network_ports(spec: &VirtualMachineInstanceSpec) -> Vec<ServicePort> {
    let pod_networks: Vec<&str> = spec
        .networks
        .iter()
        .filter(|n| n.network_source.pod.is_some())
        .map(|n| n.name.as_str())
        .collect();
    spec.domain
        .devices
        .interfaces
        .iter()
        .filter(|i| pod_networks.contains(&i.name.as_str()))
        .flat_map(|i| &i.ports)
        .enumerate()
        .map(|(n, p)| ServicePort {
            name: Some(format!("port-{}", n + 1)),
            protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
            port: p.port,
            ..Default::default()
        })
        .collect()
}

/// A controller reference to `obj` that does not block its deletion.
fn owner<K: Resource<DynamicType = ()>>(obj: &K) -> OwnerReference {
    let mut owner = obj
        .controller_owner_ref(&())
        .unwrap_or_else(|| OwnerReference {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            ..Default::default()
        });
    owner.block_owner_deletion = Some(false);
    owner
}

fn by_id(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(VMI_ID_LABEL.to_owned(), vmi_id_label(name))])
}

async fn resource_info(ctx: &Ctx, a: &Expose) -> Result<ResourceInfo, Error> {
    let c = ctx.client.clone();
    let ns = ctx.namespace.as_str();
    let fetch = |what: &str, e: &kube::Error| {
        Error::Message(format!("error fetching {what}: {}", api_message(e)))
    };
    match a.kind.to_lowercase().as_str() {
        "vmi" | "vmis" | "virtualmachineinstance" | "virtualmachineinstances" => {
            let vmi = Api::<VirtualMachineInstance>::namespaced(c, ns)
                .get(&a.resource)
                .await
                .map_err(|e| fetch("VirtualMachineInstance", &e))?;
            Ok(ResourceInfo {
                selector: by_id(&a.resource),
                ports: pod_network_ports(&vmi.spec),
                owner: owner(&vmi),
            })
        }
        "vm" | "vms" | "virtualmachine" | "virtualmachines" => {
            let vm = Api::<VirtualMachine>::namespaced(c, ns)
                .get(&a.resource)
                .await
                .map_err(|e| fetch("VirtualMachine", &e))?;
            Ok(ResourceInfo {
                selector: by_id(&a.resource),
                ports: vm
                    .spec
                    .template
                    .spec
                    .as_ref()
                    .map(pod_network_ports)
                    .unwrap_or_default(),
                owner: owner(&vm),
            })
        }
        "vmirs"
        | "vmirss"
        | "virtualmachineinstancereplicaset"
        | "virtualmachineinstancereplicasets" => {
            let rs = Api::<VirtualMachineInstanceReplicaSet>::namespaced(c, ns)
                .get(&a.resource)
                .await
                .map_err(|e| fetch("VirtualMachineInstanceReplicaSet", &e))?;
            let sel = &rs.spec.selector;
            let labels = sel.match_labels.clone().unwrap_or_default();
            if labels.is_empty() {
                return Err(Error::Message(
                    "cannot expose VirtualMachineInstanceReplicaSet without any selector labels"
                        .into(),
                ));
            }
            if sel
                .match_expressions
                .as_ref()
                .is_some_and(|m| !m.is_empty())
            {
                return Err(Error::Message(
                    "cannot expose VirtualMachineInstanceReplicaSet with match expressions".into(),
                ));
            }
            Ok(ResourceInfo {
                selector: labels,
                ports: rs
                    .spec
                    .template
                    .spec
                    .as_ref()
                    .map(pod_network_ports)
                    .unwrap_or_default(),
                owner: owner(&rs),
            })
        }
        other => Err(Error::Message(format!(
            "unsupported resource type: {other}"
        ))),
    }
}

/// `virtctl expose TYPE NAME --name SVC --port N …`.
///
/// # Errors
/// Bad flags, a missing resource, or the refused create.
pub async fn run(ctx: &Ctx, a: &Expose) -> Result<(), Error> {
    let info = resource_info(ctx, a).await?;
    let svc = service(a, &ctx.namespace, info)?;
    Api::<Service>::namespaced(ctx.client.clone(), &ctx.namespace)
        .create(&PostParams::default(), &svc)
        .await
        .map_err(|e| Error::Message(format!("service creation failed: {}", api_message(&e))))?;
    println!(
        "Service {} successfully created for {} {}",
        a.name, a.kind, a.resource
    );
    Ok(())
}
