//! `cdi.kubevirt.io/v1beta1` DataVolume: the fields KubeVirt's VM and VMI controllers and the
//! embedded CDI read, typed; nothing else.
//!
//! A DataVolume is CDI's object, not KubeVirt's: KubeVirt creates it from a VM's
//! `dataVolumeTemplates` (whose spec it forwards as opaque JSON, so fields this module does not
//! type survive) and reads its phase and conditions. Decoding ignores fields not listed here;
//! the CRD ([`crd`]) keeps them (`x-kubernetes-preserve-unknown-fields` on spec and status), as
//! a user's manifest written for upstream CDI must apply unchanged.

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of DataVolumes.
pub const GROUP: &str = "cdi.kubevirt.io";
/// The served (and stored) version.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of a DataVolume.
pub const API_VERSION: &str = "cdi.kubevirt.io/v1beta1";
/// The CRD's name.
pub const CRD_NAME: &str = "datavolumes.cdi.kubevirt.io";
/// Annotation KubeVirt sets on the DataVolumes it creates: CDI may adopt an existing claim of
/// the same name.
pub const ALLOW_CLAIM_ADOPTION_ANNOTATION: &str = "cdi.kubevirt.io/allowClaimAdoption";
/// CDI's default share of a filesystem volume kept free for the filesystem (5.5%).
pub const DEFAULT_FILESYSTEM_OVERHEAD: &str = "0.055";

/// Spec of a DataVolume: where its data comes from and the claim to put it in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, CustomResource)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataVolume",
    doc = "A claim and the data CDI fills it with.",
    namespaced,
    status = "DataVolumeStatus",
    derive = "Default",
    derive = "PartialEq",
    shortname = "dv",
    shortname = "dvs",
    category = "all"
)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSpec {
    /// Where the data comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<DataVolumeSource>,
    /// The claim to create, as a full claim spec (sizes and class as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    pub pvc: Option<PersistentVolumeClaimSpec>,
    /// The claim to create, with CDI filling in what is missing (class default, access modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::schema::preserved_object")]
    pub storage: Option<PersistentVolumeClaimSpec>,
}

/// The source of a DataVolume (one of).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    /// An empty disk image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blank: Option<serde_json::Map<String, serde_json::Value>>,
    /// A disk image in a container image's `/disk/` directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<DataVolumeSourceRegistry>,
    /// A disk image at a URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<DataVolumeSourceHttp>,
    /// A clone of another claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<DataVolumeSourcePvc>,
}

/// `source.registry`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceRegistry {
    /// `docker://registry/repository:tag`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A Secret with `accessKeyId` (user) and `secretKey` (password).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// A ConfigMap with the registry's CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_config_map: Option<String>,
    /// `pod` or `node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_method: Option<String>,
}

/// `source.http`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceHttp {
    /// The URL of the image.
    pub url: String,
    /// A Secret with `accessKeyId` and `secretKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
}

/// `source.pvc`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourcePvc {
    /// Namespace of the source claim.
    pub namespace: String,
    /// Name of the source claim.
    pub name: String,
}

crate::string_enum::string_enum! {
    /// `status.phase` of a DataVolume (CDI's).
    pub enum DataVolumePhase {
        /// Nothing observed yet.
        Unset = "",
        /// Waiting for the claim or the importer.
        Pending = "Pending",
        /// The importer pod is created.
        ImportScheduled = "ImportScheduled",
        /// The importer pod runs.
        ImportInProgress = "ImportInProgress",
        /// Cloning is scheduled.
        CloneScheduled = "CloneScheduled",
        /// Cloning runs.
        CloneInProgress = "CloneInProgress",
        /// The claim waits for its first consumer before being populated.
        WaitForFirstConsumer = "WaitForFirstConsumer",
        /// The claim waits for a populator.
        PendingPopulation = "PendingPopulation",
        /// The data is in the claim.
        Succeeded = "Succeeded",
        /// The import failed.
        Failed = "Failed",
        /// Unknown.
        Unknown = "Unknown",
    }
}

/// Observed state of a DataVolume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeStatus {
    /// The claim holding the data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// The phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DataVolumePhase>,
    /// `N/A` or a percentage (`45.10%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Restarts of the importer pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<i32>,
    /// `Bound`, `Ready`, `Running`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<DataVolumeCondition>,
}

/// One condition of a DataVolume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeCondition {
    /// `Bound`, `Ready` or `Running`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Last change of `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Last time the condition was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heart_beat_time: Option<Time>,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl DataVolume {
    /// The phase (`Unset` when none is written yet).
    #[must_use]
    pub fn phase(&self) -> DataVolumePhase {
        self.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or(DataVolumePhase::Unset)
    }

    /// The condition of `type_`, if written.
    #[must_use]
    pub fn condition(&self, type_: &str) -> Option<&DataVolumeCondition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
    }
}

/// The DataVolume CRD: generated names and columns, spec and status kept verbatim (see the
/// module documentation).
///
/// # Errors
/// A [`serde_json::Error`] if the generated CRD does not round-trip (a bug).
pub fn crd() -> Result<CustomResourceDefinition, serde_json::Error> {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(DataVolume::crd())?;
    let version = &mut crd["spec"]["versions"][0];
    version["schema"]["openAPIV3Schema"] = serde_json::json!({
        "type": "object",
        "description": "A claim and the data CDI fills it with.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        },
        "required": ["spec"],
    });
    version["additionalPrinterColumns"] = serde_json::json!([
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "The phase the data volume is in"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress", "description": "Transfer progress in percentage if known, N/A otherwise"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restartCount", "description": "The number of times the transfer has been restarted."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]);
    serde_json::from_value(crd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_data_volume_decodes_with_its_phase_and_conditions() {
        let dv: DataVolume = serde_json::from_value(serde_json::json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": "default"},
            "spec": {"source": {"registry": {"url": "docker://r/i:1", "secretRef": "s"}},
                     "storage": {"resources": {"requests": {"storage": "1Gi"}}},
                     "contentType": "kubevirt"},
            "status": {"phase": "ImportInProgress", "progress": "12.00%",
                       "conditions": [{"type": "Running", "status": "True", "reason": "Pod is running"}]}
        }))
        .unwrap();
        assert_eq!(dv.phase(), DataVolumePhase::ImportInProgress);
        assert_eq!(dv.condition("Running").unwrap().status, "True");
        let registry = dv.spec.source.unwrap().registry.unwrap();
        assert_eq!(registry.secret_ref.as_deref(), Some("s"));
        assert!(dv.spec.storage.is_some());
    }

    #[test]
    fn the_crd_keeps_unknown_fields_and_shows_cdi_columns() {
        let crd = serde_json::to_value(crd().unwrap()).unwrap();
        assert_eq!(crd["metadata"]["name"], CRD_NAME);
        let version = &crd["spec"]["versions"][0];
        assert_eq!(
            version["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"],
            true
        );
        assert_eq!(version["additionalPrinterColumns"][0]["name"], "Phase");
        assert_eq!(crd["spec"]["names"]["shortNames"][0], "dv");
    }
}
