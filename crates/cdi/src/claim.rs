//! The claim a DataVolume gets and the importer pod that fills it: pure functions of the
//! DataVolume (and the claim, for its size).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kubevirt_api::cdi::{API_VERSION, DataVolume};
use serde_json::json;

/// Where the importer mounts the claim.
pub const DATA_DIR: &str = "/data";
/// Where the importer finds the `secretRef`'s `accessKeyId` and `secretKey`.
pub const AUTH_DIR: &str = "/var/run/cdi/auth";
/// CDI's default filesystem overhead, in thousandths (5.5%).
pub const FILESYSTEM_OVERHEAD_PER_MILLE: u128 = 55;

/// Why a DataVolume cannot be imported; the message goes into its `Running` condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// Neither `spec.pvc` nor `spec.storage` is given.
    #[error("DataVolume.spec.pvc or DataVolume.spec.storage must be set")]
    NoClaimSpec,
    /// The claim asks for no (or an unreadable) size.
    #[error("the DataVolume's claim has no valid storage request")]
    NoSize,
    /// The source is none this CDI imports.
    #[error("{0}")]
    UnsupportedSource(String),
}

/// The controller reference CDI's objects carry to their DataVolume.
fn owner(dv: &DataVolume) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: "DataVolume".to_owned(),
        name: dv.metadata.name.clone().unwrap_or_default(),
        uid: dv.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The claim of `dv`: its name, owned by it, from `spec.pvc` as given or from `spec.storage`
/// with CDI's defaults (`ReadWriteOnce`, `Filesystem`; the class left to the cluster's default).
///
/// # Errors
/// [`ClaimError::NoClaimSpec`] when the DataVolume names no claim spec.
pub fn claim_for(dv: &DataVolume) -> Result<PersistentVolumeClaim, ClaimError> {
    let mut spec: PersistentVolumeClaimSpec = match (&dv.spec.pvc, &dv.spec.storage) {
        (Some(pvc), _) => pvc.clone(),
        (None, Some(storage)) => storage.clone(),
        (None, None) => return Err(ClaimError::NoClaimSpec),
    };
    if spec.access_modes.as_ref().is_none_or(Vec::is_empty) {
        spec.access_modes = Some(vec!["ReadWriteOnce".into()]);
    }
    spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
    Ok(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: dv.metadata.name.clone(),
            namespace: dv.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([(
                "app".to_owned(),
                crate::APP_LABEL_VALUE.to_owned(),
            )])),
            owner_references: Some(vec![owner(dv)]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        ..PersistentVolumeClaim::default()
    })
}

/// The requested size of `pvc` in bytes.
pub fn requested_bytes(pvc: &PersistentVolumeClaim) -> Option<u128> {
    let quantity = pvc
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    let value = kubevirt_api::quantity::Quantity::parse(&quantity.0)
        .ok()?
        .value();
    u128::try_from(value).ok().filter(|v| *v > 0)
}

/// The size of the disk image a claim of `bytes` holds: CDI's usable space, the size less the
/// filesystem overhead (rounded up), aligned down to 1 MiB as CDI aligns images.
pub fn usable_bytes(bytes: u128, overhead_per_mille: u128) -> u128 {
    const MIB: u128 = 1024 * 1024;
    let kept = 1000 - overhead_per_mille.min(1000);
    let with_overhead = (bytes * kept).div_ceil(1000);
    with_overhead / MIB * MIB
}

/// How the importer gets its data, as its command-line arguments.
fn source_args(dv: &DataVolume, pvc: &PersistentVolumeClaim) -> Result<Vec<String>, ClaimError> {
    let source = dv.spec.source.clone().unwrap_or_default();
    if source.blank.is_some() {
        let size = requested_bytes(pvc).ok_or(ClaimError::NoSize)?;
        let usable = usable_bytes(size, FILESYSTEM_OVERHEAD_PER_MILLE);
        return Ok(vec![
            "--source=blank".into(),
            format!("--size-bytes={usable}"),
        ]);
    }
    if let Some(registry) = &source.registry {
        let url = registry.url.clone().ok_or_else(|| {
            ClaimError::UnsupportedSource("source.registry.url must be set".into())
        })?;
        return Ok(vec![
            "--source=registry".into(),
            format!("--endpoint={url}"),
        ]);
    }
    if let Some(http) = &source.http {
        return Ok(vec![
            "--source=http".into(),
            format!("--endpoint={}", http.url),
        ]);
    }
    if source.pvc.is_some() {
        return Err(ClaimError::UnsupportedSource(
            "cloning (source.pvc) is not supported by the embedded CDI".into(),
        ));
    }
    Err(ClaimError::UnsupportedSource(
        "the DataVolume has no source (blank, registry or http)".into(),
    ))
}

/// The `secretRef` of the DataVolume's registry or http source.
fn secret_ref(dv: &DataVolume) -> Option<String> {
    let source = dv.spec.source.as_ref()?;
    source
        .registry
        .as_ref()
        .and_then(|r| r.secret_ref.clone())
        .or_else(|| source.http.as_ref().and_then(|h| h.secret_ref.clone()))
}

/// Whether the source's endpoint is on this machine's loopback: reachable only from the
/// node's own network namespace, so the importer runs in it (tests use loopback servers).
fn loopback_endpoint(dv: &DataVolume) -> bool {
    let Some(source) = dv.spec.source.as_ref() else {
        return false;
    };
    if let Some(url) = source.registry.as_ref().and_then(|r| r.url.as_deref()) {
        let reference = url.strip_prefix("docker://").unwrap_or(url);
        oci_pull::ImageReference::parse(reference)
            .map(|r| r.is_loopback())
            .unwrap_or(false)
    } else if let Some(http) = &source.http {
        http.url
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.host().map(str::to_owned))
            .is_some_and(|h| {
                let h = h.trim_start_matches('[').trim_end_matches(']');
                h == "localhost"
                    || h.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            })
    } else {
        false
    }
}

/// The importer pod of `dv`, filling `pvc`: CDI's name and label, owned by the DataVolume,
/// never restarted (a failed import fails the DataVolume), the claim at [`DATA_DIR`] and the
/// source's Secret at [`AUTH_DIR`].
///
/// # Errors
/// [`ClaimError`] when the source cannot be imported.
pub fn importer_pod(
    dv: &DataVolume,
    pvc: &PersistentVolumeClaim,
    image: &str,
) -> Result<Pod, ClaimError> {
    let name = dv.metadata.name.clone().unwrap_or_default();
    let mut args = vec!["cdi-importer".to_owned()];
    args.extend(source_args(dv, pvc)?);
    args.push(format!("--target={DATA_DIR}/disk.img"));
    let mut mounts = vec![json!({"name": "cdi-data-vol", "mountPath": DATA_DIR})];
    let mut volumes =
        vec![json!({"name": "cdi-data-vol", "persistentVolumeClaim": {"claimName": name}})];
    if let Some(secret) = secret_ref(dv) {
        args.push(format!("--auth-dir={AUTH_DIR}"));
        mounts.push(json!({"name": "cdi-auth", "mountPath": AUTH_DIR, "readOnly": true}));
        volumes.push(json!({"name": "cdi-auth", "secret": {"secretName": secret}}));
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": crate::importer_pod_name(&name),
            "namespace": dv.metadata.namespace,
            "labels": {"app": crate::APP_LABEL_VALUE, "cdi.kubevirt.io": "importer"},
            "ownerReferences": [owner(dv)],
        },
        "spec": {
            "restartPolicy": "Never",
            "hostNetwork": loopback_endpoint(dv),
            "containers": [{
                "name": "importer",
                "image": image,
                "command": ["kubevirt-rs"],
                "args": args,
                "volumeMounts": mounts,
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": volumes,
        },
    });
    serde_json::from_value(pod).map_err(|e| ClaimError::UnsupportedSource(e.to_string()))
}

/// Whether `object` is controlled by `dv` (by UID).
pub fn controlled_by<K: Resource>(object: &K, dv: &DataVolume) -> bool {
    object.meta().owner_references.as_ref().is_some_and(|refs| {
        refs.iter()
            .any(|r| r.controller == Some(true) && Some(&r.uid) == dv.metadata.uid.as_ref())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dv(spec: &serde_json::Value) -> DataVolume {
        serde_json::from_value(json!({
            "apiVersion": API_VERSION, "kind": "DataVolume",
            "metadata": {"name": "root", "namespace": "ns", "uid": "dv-uid"},
            "spec": spec,
        }))
        .unwrap()
    }

    #[test]
    fn usable_size_is_the_claim_less_five_and_a_half_percent_aligned_to_a_mebibyte() {
        let gib: u128 = 1 << 30;
        // 1 GiB · 0.945 = 1014686024.3 → 1014686025 → 967 MiB.
        assert_eq!(usable_bytes(gib, 55), 967 * 1024 * 1024);
        assert_eq!(usable_bytes(64 * 1024 * 1024, 55), 60 * 1024 * 1024);
        assert_eq!(usable_bytes(gib, 0), gib);
        assert_eq!(usable_bytes(512 * 1024, 55), 0);
    }

    #[test]
    fn the_claim_comes_from_storage_with_cdis_defaults_or_from_pvc_as_given() {
        let storage = claim_for(&dv(&json!({"source": {"blank": {}},
            "storage": {"resources": {"requests": {"storage": "64Mi"}}}})))
        .unwrap();
        let spec = storage.spec.as_ref().unwrap();
        assert_eq!(
            spec.access_modes.as_deref(),
            Some(&["ReadWriteOnce".to_owned()][..])
        );
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.storage_class_name, None);
        assert_eq!(requested_bytes(&storage), Some(64 * 1024 * 1024));
        let owner = &storage.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("DataVolume", "dv-uid")
        );
        assert!(controlled_by(&storage, &dv(&json!({}))));

        let pvc = claim_for(&dv(&json!({"pvc": {"accessModes": ["ReadWriteMany"],
            "storageClassName": "fast", "resources": {"requests": {"storage": "1Gi"}}}})))
        .unwrap();
        let spec = pvc.spec.unwrap();
        assert_eq!(spec.access_modes.unwrap(), ["ReadWriteMany"]);
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(claim_for(&dv(&json!({}))), Err(ClaimError::NoClaimSpec));
    }

    #[test]
    fn the_importer_pod_mounts_the_claim_and_the_secret_and_runs_the_importer() {
        let v = dv(&json!({
            "source": {"registry": {"url": "docker://127.0.0.1:5000/disk:1", "secretRef": "creds"}},
            "storage": {"resources": {"requests": {"storage": "64Mi"}}}
        }));
        let pvc = claim_for(&v).unwrap();
        let pod = serde_json::to_value(importer_pod(&v, &pvc, "img").unwrap()).unwrap();
        assert_eq!(pod["metadata"]["name"], "importer-root");
        assert_eq!(
            pod["metadata"]["labels"]["app"],
            "containerized-data-importer"
        );
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        assert_eq!(pod["spec"]["hostNetwork"], true);
        let args = &pod["spec"]["containers"][0]["args"];
        assert_eq!(
            args,
            &json!([
                "cdi-importer",
                "--source=registry",
                "--endpoint=docker://127.0.0.1:5000/disk:1",
                "--target=/data/disk.img",
                "--auth-dir=/var/run/cdi/auth"
            ])
        );
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "root"
        );
        assert_eq!(pod["spec"]["volumes"][1]["secret"]["secretName"], "creds");

        let blank = dv(&json!({"source": {"blank": {}},
            "storage": {"resources": {"requests": {"storage": "64Mi"}}}}));
        let pod =
            serde_json::to_value(importer_pod(&blank, &claim_for(&blank).unwrap(), "img").unwrap())
                .unwrap();
        assert_eq!(
            pod["spec"]["containers"][0]["args"][2],
            format!("--size-bytes={}", 60 << 20)
        );
        assert_eq!(pod["spec"]["hostNetwork"], false);

        let clone = dv(&json!({"source": {"pvc": {"namespace": "a", "name": "b"}},
            "storage": {"resources": {"requests": {"storage": "64Mi"}}}}));
        assert!(importer_pod(&clone, &claim_for(&clone).unwrap(), "img").is_err());
    }
}
