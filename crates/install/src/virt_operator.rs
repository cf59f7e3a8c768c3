//! `kubevirt-operator.yaml`: what a user applies first, as upstream's release manifest of the
//! same name — the Namespace, the PriorityClass, the `KubeVirt` CRD, the operator's
//! ServiceAccount and RBAC (`kubevirt-operator` ClusterRole/Role and bindings, the
//! `kubevirt.io:operator` user role) and the `virt-operator` Deployment (2 replicas; the
//! replicas elect a leader on the Lease `virt-operator` of the namespace).
//!
//! Everything else is the operator's to install: [`crate::install_strategy`], including the
//! operator's own admission webhooks ([`strategy_objects`]: the Service
//! `kubevirt-operator-webhook` and the ValidatingWebhookConfiguration `virt-operator-validator`),
//! which upstream's operator also installs itself once it runs.

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
/// The operator's metrics port (HTTPS).
pub const METRICS_PORT: i32 = 8443;
/// The operator's webhook port (HTTPS).
pub const WEBHOOK_PORT: i32 = 8444;
/// The Service in front of the operator's webhooks (port 443 → `webhooks`).
pub const WEBHOOK_SERVICE: &str = "kubevirt-operator-webhook";
/// The operator's ValidatingWebhookConfiguration.
pub const VALIDATOR: &str = "virt-operator-validator";
/// The Secret of the operator's serving certificate (for [`WEBHOOK_SERVICE`]).
pub const CERT_SECRET: &str = "kubevirt-operator-certs";
/// Where [`CERT_SECRET`] is mounted.
pub const CERTIFICATES_DIR: &str = "/etc/virt-operator/certificates";
/// The webhook paths, as upstream's.
pub mod paths {
    /// `DELETE` of a KubeVirt CR.
    pub const DELETE: &str = "/kubevirt-validate-delete";
    /// `UPDATE` of a KubeVirt CR.
    pub const UPDATE: &str = "/kubevirt-validate-update";
    /// `CREATE` of a KubeVirt CR.
    pub const CREATE: &str = "/kubevirt-validate-create";
}

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
            c.ports = Some(vec![
                tcp_port("metrics", METRICS_PORT),
                tcp_port("webhooks", WEBHOOK_PORT),
            ]);
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
        pod::attach_certificate(spec, CERT_SECRET, CERTIFICATES_DIR);
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

/// The operator's part of the install strategy: the Service `kubevirt-operator-webhook` and
/// the ValidatingWebhookConfiguration `virt-operator-validator` (upstream's three webhooks on
/// `kubevirts`: delete, update, create; `failurePolicy: Fail`). The `caBundle` is the
/// operator's to inject, as for virt-api's configurations.
///
/// # Errors
///
/// [`InstallError`] if an object cannot be encoded.
pub fn strategy_objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    let service = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": WEBHOOK_SERVICE,
            "namespace": config.namespace,
            "labels": {"kubevirt.io": "", "app.kubernetes.io/managed-by": "virt-operator"},
        },
        "spec": {
            "selector": {"kubevirt.io": NAME},
            "ports": [{"name": "webhooks", "port": 443, "targetPort": "webhooks", "protocol": "TCP"}],
            "type": "ClusterIP",
        },
    });
    let hook = |name: &str, operation: &str, path: &str| {
        serde_json::json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {
                "namespace": config.namespace, "name": WEBHOOK_SERVICE, "path": path, "port": 443,
            }},
            "rules": [{
                "operations": [operation],
                "apiGroups": ["kubevirt.io"],
                "apiVersions": ["v1alpha3", "v1"],
                "resources": ["kubevirts"],
                "scope": "*",
            }],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "timeoutSeconds": 10,
        })
    };
    let validator = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": VALIDATOR,
            "labels": {"kubevirt.io": VALIDATOR, "app.kubernetes.io/managed-by": "virt-operator"},
            "annotations": {"certificates.kubevirt.io/secret": CERT_SECRET},
        },
        "webhooks": [
            hook("kubevirt-validator.kubevirt.io", "DELETE", paths::DELETE),
            hook("kubevirt-update-validator.kubevirt.io", "UPDATE", paths::UPDATE),
            hook("kubevirt-create-validator.kubevirt.io", "CREATE", paths::CREATE),
        ],
    });
    // Decoded once, so a typo in a field name fails here rather than at the API server.
    let service: k8s_openapi::api::core::v1::Service =
        serde_json::from_value(service).map_err(|source| InstallError::Encode {
            what: format!("Service {WEBHOOK_SERVICE}"),
            source,
        })?;
    let validator: k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration =
        serde_json::from_value(validator).map_err(|source| InstallError::Encode {
            what: format!("ValidatingWebhookConfiguration {VALIDATOR}"),
            source,
        })?;
    Ok(vec![
        to_value("Service kubevirt-operator-webhook", &service)?,
        to_value(
            "ValidatingWebhookConfiguration virt-operator-validator",
            &validator,
        )?,
    ])
}
