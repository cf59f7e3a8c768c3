//! `00-namespace.yaml`: the Namespace (upstream's labels: `kubevirt.io: ""` and the
//! `privileged` pod-security level virt-handler needs), the PriorityClass
//! `kubevirt-cluster-critical` every KubeVirt pod names (a pod naming a missing class is
//! refused), and one ServiceAccount per component.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use serde_json::Value;

use crate::meta::{APP_LABEL, PRIORITY_CLASS, cluster_meta, namespaced_meta};
use crate::{InstallConfig, InstallError, to_value};

/// ServiceAccount of virt-api.
pub const API_SERVICE_ACCOUNT: &str = "kubevirt-apiserver";
/// ServiceAccount of virt-controller.
pub const CONTROLLER_SERVICE_ACCOUNT: &str = "kubevirt-controller";
/// ServiceAccount of virt-handler.
pub const HANDLER_SERVICE_ACCOUNT: &str = "kubevirt-handler";
/// ServiceAccount of virt-operator.
pub const OPERATOR_SERVICE_ACCOUNT: &str = "kubevirt-operator";

/// The components' service accounts, in upstream's order.
pub const SERVICE_ACCOUNTS: [&str; 4] = [
    API_SERVICE_ACCOUNT,
    CONTROLLER_SERVICE_ACCOUNT,
    HANDLER_SERVICE_ACCOUNT,
    OPERATOR_SERVICE_ACCOUNT,
];

/// The group's objects.
///
/// # Errors
///
/// [`InstallError::Encode`] (a bug in the types).
pub fn objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    let ns = &config.namespace;
    let namespace = Namespace {
        metadata: cluster_meta(
            ns,
            &[
                (APP_LABEL, ""),
                ("pod-security.kubernetes.io/enforce", "privileged"),
            ],
        ),
        ..Namespace::default()
    };
    let priority = PriorityClass {
        metadata: cluster_meta(PRIORITY_CLASS, &[]),
        value: 1_000_000_000,
        global_default: Some(false),
        description: Some(
            "This priority class should be used for core kubevirt components only.".into(),
        ),
        ..PriorityClass::default()
    };
    let mut out = vec![
        to_value("Namespace", &namespace)?,
        to_value("PriorityClass", &priority)?,
    ];
    for name in SERVICE_ACCOUNTS {
        let sa = ServiceAccount {
            metadata: namespaced_meta(ns, name, &[(APP_LABEL, "")]),
            ..ServiceAccount::default()
        };
        out.push(to_value("ServiceAccount", &sa)?);
    }
    Ok(out)
}
