//! Volumes of a VMI (`spec.volumes`): one struct per source kind.

use k8s_openapi::api::core::v1::{
    DownwardAPIVolumeFile, LocalObjectReference, PersistentVolumeClaimVolumeSource as K8sPvcSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `hostDisk.type`: the image must exist.
pub const HOST_DISK_TYPE_DISK: &str = "Disk";
/// `hostDisk.type`: the image is created when missing.
pub const HOST_DISK_TYPE_DISK_OR_CREATE: &str = "DiskOrCreate";

impl VolumeSource {
    /// The JSON names of the sources set, e.g. `["containerDisk"]`. Valid volumes have exactly one.
    #[must_use]
    pub fn set_sources(&self) -> Vec<&'static str> {
        let candidates = [
            ("hostDisk", self.host_disk.is_some()),
            (
                "persistentVolumeClaim",
                self.persistent_volume_claim.is_some(),
            ),
            ("cloudInitNoCloud", self.cloud_init_no_cloud.is_some()),
            (
                "cloudInitConfigDrive",
                self.cloud_init_config_drive.is_some(),
            ),
            ("sysprep", self.sysprep.is_some()),
            ("containerDisk", self.container_disk.is_some()),
            ("ephemeral", self.ephemeral.is_some()),
            ("emptyDisk", self.empty_disk.is_some()),
            ("dataVolume", self.data_volume.is_some()),
            ("configMap", self.config_map.is_some()),
            ("secret", self.secret.is_some()),
            ("downwardAPI", self.downward_api.is_some()),
            ("serviceAccount", self.service_account.is_some()),
            ("downwardMetrics", self.downward_metrics.is_some()),
            ("memoryDump", self.memory_dump.is_some()),
            ("containerPath", self.container_path.is_some()),
        ];
        candidates
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect()
    }

    /// The claim a `persistentVolumeClaim` or `dataVolume` source names (a DataVolume's claim
    /// has the DataVolume's name).
    #[must_use]
    pub fn claim_name(&self) -> Option<&str> {
        self.persistent_volume_claim
            .as_ref()
            .map(|p| p.claim_name.as_str())
            .or_else(|| self.data_volume.as_ref().map(|d| d.name.as_str()))
    }

    /// The claim an `ephemeral` source reads its disk from (the guest's writes go to an
    /// overlay; the claim is only read).
    #[must_use]
    pub fn ephemeral_claim_name(&self) -> Option<&str> {
        self.ephemeral
            .as_ref()?
            .persistent_volume_claim
            .as_ref()
            .map(|p| p.claim_name.as_str())
    }

    /// The claim the launcher pod mounts for this source: [`Self::claim_name`]'s, or an
    /// `ephemeral` source's ([`Self::ephemeral_claim_name`]). Such a claim must exist before
    /// the pod is created, as upstream's PVC checks treat both alike.
    #[must_use]
    pub fn pod_claim_name(&self) -> Option<&str> {
        self.claim_name().or_else(|| self.ephemeral_claim_name())
    }

    /// Whether the volume is hotpluggable (a PVC or DataVolume marked `hotpluggable`, or a
    /// memory dump).
    #[must_use]
    pub fn is_hotpluggable(&self) -> bool {
        self.persistent_volume_claim
            .as_ref()
            .is_some_and(|p| p.hotpluggable == Some(true))
            || self
                .data_volume
                .as_ref()
                .is_some_and(|d| d.hotpluggable == Some(true))
            || self.memory_dump.is_some()
    }
}

/// A volume of the VMI: a name and exactly one source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Name; matches a disk or filesystem.
    pub name: String,
    /// Source of the volume (inline).
    #[serde(flatten)]
    pub volume_source: VolumeSource,
}

/// Source of a volume; exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSource {
    /// A disk image on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_disk: Option<HostDisk>,
    /// A PVC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// cloud-init NoCloud data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_init_no_cloud: Option<CloudInitNoCloudSource>,
    /// cloud-init ConfigDrive data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_init_config_drive: Option<CloudInitConfigDriveSource>,
    /// Windows sysprep answer files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sysprep: Option<SysprepSource>,
    /// A disk image shipped in a container image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_disk: Option<ContainerDiskSource>,
    /// A PVC used copy-on-write; writes are discarded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EphemeralVolumeSource>,
    /// A temporary sparse disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_disk: Option<EmptyDiskSource>,
    /// A CDI DataVolume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<DataVolumeSource>,
    /// A ConfigMap as a disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolumeSource>,
    /// A Secret as a disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolumeSource>,
    /// Downward API fields as a disk.
    #[serde(rename = "downwardAPI", skip_serializing_if = "Option::is_none")]
    pub downward_api: Option<DownwardApiVolumeSource>,
    /// A service account token as a disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ServiceAccountVolumeSource>,
    /// Downward metrics as a disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub downward_metrics: Option<DownwardMetricsVolumeSource>,
    /// A PVC receiving a memory dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_dump: Option<MemoryDumpVolumeSource>,
    /// A path inside the launcher container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_path: Option<ContainerPathVolumeSource>,
}

/// Sources allowed for hotplugged volumes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotplugVolumeSource {
    /// A PVC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// A DataVolume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<DataVolumeSource>,
}

/// A disk image on the host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostDisk {
    /// Path of the image.
    pub path: String,
    /// `Disk` or `DiskOrCreate`.
    pub type_: String,
    /// Size when the image is created.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    /// Shared between nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<bool>,
}

/// A PVC source: the Kubernetes PVC fields plus `hotpluggable`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimVolumeSource {
    /// PVC name.
    pub claim_name: String,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Attached by hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
}

/// A PVC receiving a memory dump.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryDumpVolumeSource {
    /// PVC name.
    pub claim_name: String,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    /// Attached by hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
}

/// cloud-init NoCloud data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitNoCloudSource {
    /// Secret holding `userdata` and optionally `networkdata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,
    /// Base64 user data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data_base64: Option<String>,
    /// User data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// Secret holding `networkdata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_secret_ref: Option<LocalObjectReference>,
    /// Base64 network data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_base64: Option<String>,
    /// Network data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data: Option<String>,
}

/// cloud-init ConfigDrive data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitConfigDriveSource {
    /// Secret holding `userdata` and optionally `networkdata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<LocalObjectReference>,
    /// Base64 user data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data_base64: Option<String>,
    /// User data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    /// Secret holding `networkdata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_secret_ref: Option<LocalObjectReference>,
    /// Base64 network data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_base64: Option<String>,
    /// Network data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data: Option<String>,
}

/// Windows sysprep answer files from a Secret or ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SysprepSource {
    /// Secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<LocalObjectReference>,
    /// ConfigMap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<LocalObjectReference>,
}

/// A disk image shipped in a container image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDiskSource {
    /// Image reference.
    pub image: String,
    /// Pull secret name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    /// Path of the image file inside the container image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// `Always`, `Never` or `IfNotPresent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
}

/// A PVC used copy-on-write.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralVolumeSource {
    /// The PVC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<K8sPvcSource>,
}

/// A temporary sparse disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDiskSource {
    /// Size.
    pub capacity: Quantity,
}

/// A CDI DataVolume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    /// DataVolume name.
    pub name: String,
    /// Attached by hotplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
}

/// A ConfigMap as a disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapVolumeSource {
    /// ConfigMap name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether the ConfigMap may be missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// Filesystem label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// A Secret as a disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretVolumeSource {
    /// Secret name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Whether the Secret may be missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
    /// Filesystem label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// Downward API fields as a disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownwardApiVolumeSource {
    /// Files to create.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<DownwardAPIVolumeFile>,
    /// Filesystem label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_label: Option<String>,
}

/// A service account token as a disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountVolumeSource {
    /// Service account name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
}

/// Marker: downward metrics as a disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownwardMetricsVolumeSource {}

/// A path inside the launcher container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPathVolumeSource {
    /// Path.
    pub path: String,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(json: serde_json::Value) -> VolumeSource {
        serde_json::from_value(json).expect("volume source")
    }

    #[test]
    fn the_pod_mounts_the_claims_of_claim_and_ephemeral_volumes() {
        let pvc = source(serde_json::json!({"persistentVolumeClaim": {"claimName": "a"}}));
        let dv = source(serde_json::json!({"dataVolume": {"name": "b"}}));
        let eph =
            source(serde_json::json!({"ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}}));
        let bare = source(serde_json::json!({"ephemeral": {}}));
        assert_eq!(pvc.pod_claim_name(), Some("a"));
        assert_eq!(dv.pod_claim_name(), Some("b"));
        assert_eq!(eph.claim_name(), None, "not a claim the guest writes");
        assert_eq!(eph.ephemeral_claim_name(), Some("c"));
        assert_eq!(eph.pod_claim_name(), Some("c"));
        assert_eq!(bare.pod_claim_name(), None);
        assert_eq!(pvc.ephemeral_claim_name(), None);
    }
}
