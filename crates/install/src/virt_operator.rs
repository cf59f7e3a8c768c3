//! `kubevirt-operator.yaml`: what a user applies first, as upstream's release manifest of the
//! same name — the Namespace, the PriorityClass, the `KubeVirt` CRD, the operator's
//! ServiceAccount and RBAC (`kubevirt-operator` ClusterRole/Role and bindings, the
//! `kubevirt.io:operator` user role) and the `virt-operator` Deployment (2 replicas; the
//! replicas elect a leader on the Lease `virt-operator` of the namespace).
//!
//! Everything else is the operator's to install: [`crate::install_strategy`].

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::EnvVar;
use serde_json::Value;

use crate::meta::strings;
use crate::namespace::OPERATOR_SERVICE_ACCOUNT;
use crate::pod::{self, restrict};
use crate::virt_api::{requests, tcp_port};
use crate::{BINARY, InstallConfig, InstallError, to_value};

/// virt-operator's name (Deployment, container, `kubevirt.io` label, leader Lease).
pub const NAME: &str = "virt-operator";
/// The name of the `KubeVirt` CRD, the only CRD of the operator's manifest.
pub const KUBEVIRT_CRD: &str = "kubevirts.kubevirt.io";
/// The user role the operator's manifest carries.
pub const OPERATOR_USER_ROLE: &str = "kubevirt.io:operator";

/// virt-operator's Deployment: `kubevirt-rs operator` (its namespace from the pod),
/// upstream's `OPERATOR_IMAGE` and `KUBEVIRT_VERSION` in its environment.
#[must_use]
pub fn deployment(config: &InstallConfig) -> Deployment {
    let mut template = pod::template(
        config,
        NAME,
        OPERATOR_SERVICE_ACCOUNT,
        strings(&[BINARY, "operator"]),
        Vec::new(),
    );
    if let Some(spec) = template.spec.as_mut() {
        restrict(spec);
        if let Some(c) = spec.containers.first_mut() {
            c.ports = Some(vec![tcp_port("metrics", 8443)]);
            c.resources = Some(requests("10m", "450Mi"));
            c.env = Some(vec![
                EnvVar {
                    name: "OPERATOR_IMAGE".into(),
                    value: Some(config.image(NAME)),
                    ..EnvVar::default()
                },
                EnvVar {
                    name: "KUBEVIRT_VERSION".into(),
                    value: Some(config.image_tag.clone()),
                    ..EnvVar::default()
                },
            ]);
        }
    }
    pod::deployment(config, NAME, 2, template)
}

/// Whether an object of the full rendering ([`crate::manifests`]) belongs to the operator's
/// manifest rather than to the install strategy.
#[must_use]
pub fn is_operator_object(object: &Value) -> bool {
    let kind = object["kind"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match kind {
        "Namespace" | "PriorityClass" => true,
        "CustomResourceDefinition" => name == KUBEVIRT_CRD,
        "KubeVirt" => false,
        _ => name.starts_with("kubevirt-operator") || name == OPERATOR_USER_ROLE,
    }
}

/// The operator manifest's objects, in apply order: the Namespace and PriorityClass, the
/// KubeVirt CRD, the ServiceAccount, the RBAC, the Deployment.
///
/// # Errors
///
/// [`InstallError`] if an object cannot be generated or encoded.
pub fn objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    let all: Vec<Value> = crate::manifests(config)?
        .into_iter()
        .flat_map(|g| g.objects)
        .filter(is_operator_object)
        .collect();
    let mut out = Vec::new();
    for kinds in [
        &["Namespace", "PriorityClass"][..],
        &["CustomResourceDefinition"],
        &["ServiceAccount"],
        &["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"],
    ] {
        out.extend(
            all.iter()
                .filter(|o| kinds.contains(&o["kind"].as_str().unwrap_or_default()))
                .cloned(),
        );
    }
    out.push(to_value("Deployment virt-operator", &deployment(config))?);
    Ok(out)
}
