//! `60-kubevirt-cr.yaml`: the default `KubeVirt` CR `kubevirt`, as upstream's
//! `kubevirt-cr.yaml` renders it without feature gates.

use kubevirt_api::v1::KubeVirt;
use serde_json::{Value, json};

use crate::{InstallConfig, InstallError};

/// Name of the KubeVirt CR.
pub const NAME: &str = "kubevirt";

/// The default CR, typed.
///
/// # Errors
///
/// [`InstallError::Encode`] if the CR does not decode as a `KubeVirt` (a bug).
pub fn kubevirt(config: &InstallConfig) -> Result<KubeVirt, InstallError> {
    let cr = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": NAME, "namespace": config.namespace},
        "spec": {
            "certificateRotateStrategy": {},
            "configuration": {
                "developerConfiguration": {"featureGates": []},
            },
            "customizeComponents": {},
            "imagePullPolicy": config.image_pull_policy,
            "workloadUpdateStrategy": {},
        },
    });
    serde_json::from_value(cr).map_err(|source| InstallError::Encode {
        what: "KubeVirt".into(),
        source,
    })
}

/// The group's objects.
///
/// # Errors
///
/// [`InstallError::Encode`] (a bug in the types).
pub fn objects(config: &InstallConfig) -> Result<Vec<Value>, InstallError> {
    Ok(vec![crate::to_value("KubeVirt", &kubevirt(config)?)?])
}
