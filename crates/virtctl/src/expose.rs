//! `expose`: a Service selecting the launcher pods of a VMI (its labels, which the VMI
//! controller copies onto the pod), a VM (its template labels) or a VMI replica set (its
//! `matchLabels`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Api;
use kube::api::PostParams;
use kubevirt_api::v1::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceReplicaSet};

use crate::Error;
use crate::cli::Expose;
use crate::client::{Ctx, api_message};

/// The Service `expose` creates for `selector`.
///
/// # Errors
/// An unknown protocol or service type.
pub fn service(
    a: &Expose,
    namespace: &str,
    selector: BTreeMap<String, String>,
) -> Result<Service, Error> {
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
    Ok(Service {
        metadata: kube::api::ObjectMeta {
            name: Some(a.name.clone()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: a.port_name.clone(),
                protocol: Some(a.protocol.clone()),
                port: a.port,
                target_port,
                node_port: a.node_port,
                ..Default::default()
            }]),
            selector: Some(selector),
            cluster_ip: a.cluster_ip.clone(),
            type_: Some(a.service_type.clone()),
            external_ips: a.external_ip.clone().map(|ip| vec![ip]),
            load_balancer_ip: a.load_balancer_ip.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

async fn selector(ctx: &Ctx, a: &Expose) -> Result<BTreeMap<String, String>, Error> {
    let c = ctx.client.clone();
    let ns = ctx.namespace.as_str();
    let kind = a.kind.to_lowercase();
    let fetch = |what: &str, e: &kube::Error| {
        Error::Message(format!("error fetching {what}: {}", api_message(e)))
    };
    let labels = match kind.as_str() {
        "vmi" | "vmis" | "virtualmachineinstance" | "virtualmachineinstances" => {
            let vmi = Api::<VirtualMachineInstance>::namespaced(c, ns)
                .get(&a.resource)
                .await
                .map_err(|e| fetch("VirtualMachineInstance", &e))?;
            let mut l = vmi.metadata.labels.unwrap_or_default();
            l.remove("kubevirt.io/nodeName");
            l
        }
        "vm" | "vms" | "virtualmachine" | "virtualmachines" => {
            let vm = Api::<VirtualMachine>::namespaced(c, ns)
                .get(&a.resource)
                .await
                .map_err(|e| fetch("VirtualMachine", &e))?;
            vm.spec
                .template
                .metadata
                .and_then(|m| m.labels)
                .unwrap_or_default()
        }
        "vmirs"
        | "vmirss"
        | "virtualmachineinstancereplicaset"
        | "virtualmachineinstancereplicasets" => {
            let rs = Api::<VirtualMachineInstanceReplicaSet>::namespaced(c, ns)
                .get(&a.resource)
                .await
                .map_err(|e| fetch("VirtualMachineInstance ReplicaSet", &e))?;
            let sel = rs.spec.selector;
            if sel
                .match_expressions
                .as_ref()
                .is_some_and(|m| !m.is_empty())
            {
                return Err(Error::Message(
                    "cannot expose VirtualMachineInstance ReplicaSet with match expressions".into(),
                ));
            }
            sel.match_labels.unwrap_or_default()
        }
        other => {
            return Err(Error::Message(format!(
                "unsupported resource type: {other}"
            )));
        }
    };
    if labels.is_empty() {
        return Err(Error::Message(format!(
            "missing label information for {kind}: {}",
            a.resource
        )));
    }
    Ok(labels)
}

/// `virtctl expose TYPE NAME --name SVC --port N …`.
///
/// # Errors
/// Bad flags, a missing resource, or the refused create.
pub async fn run(ctx: &Ctx, a: &Expose) -> Result<(), Error> {
    let selector = selector(ctx, a).await?;
    let svc = service(a, &ctx.namespace, selector)?;
    Api::<Service>::namespaced(ctx.client.clone(), &ctx.namespace)
        .create(&PostParams::default(), &svc)
        .await
        .map_err(|e| Error::Message(format!("service creation failed: {}", api_message(&e))))?;
    println!(
        "Service {} successfully exposed for {} {}",
        a.name, a.kind, a.resource
    );
    Ok(())
}
