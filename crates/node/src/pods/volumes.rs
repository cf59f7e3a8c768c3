//! A pod's volumes on this node, with kubelet's layout and checks, and what each container
//! sees of them.
//!
//! Layout: an `emptyDir` volume is the directory
//! `<pod dir>/volumes/kubernetes.io~empty-dir/<name>/`, as kubelet's
//! `/var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>`; it lives as long as
//! the pod. A `hostPath` volume is its path after kubelet's `type` check (`DirectoryOrCreate`
//! and `FileOrCreate` create it). Each container gets its `volumeMounts` bind-mounted at their
//! `mountPath` (with `subPath` and `readOnly`) in its own mount namespace ([`super::process`]).
//!
//! # Caveats
//! Other volume kinds (configMap, secret, downwardAPI, projected, persistentVolumeClaim) are
//! not prepared yet: a pod that uses one waits in `ContainerCreating` with the reason in its
//! container status, as kubelet's pod does while a mount fails.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, HostPathVolumeSource, Pod};

use super::process::BindMount;

/// Why a pod's volumes cannot be set up (the pod waits in `ContainerCreating`).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// Creating or inspecting a path failed.
    #[error("MountVolume.SetUp failed for volume \"{volume}\": {path}: {source}")]
    Io {
        volume: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A `hostPath` is not of its declared `type`.
    #[error(
        "MountVolume.SetUp failed for volume \"{volume}\": hostPath type check failed: {path} is not a {expected}"
    )]
    HostPathType {
        volume: String,
        path: String,
        expected: String,
    },
    /// The volume kind is not supported by this node.
    #[error(
        "MountVolume.SetUp failed for volume \"{volume}\": {kind} volumes are not supported by this node yet"
    )]
    Unsupported { volume: String, kind: &'static str },
}

/// `<pod dir>/volumes/kubernetes.io~empty-dir/<name>`.
pub fn empty_dir_path(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir
        .join("volumes")
        .join("kubernetes.io~empty-dir")
        .join(name)
}

fn check_host_path(volume: &str, source: &HostPathVolumeSource) -> Result<PathBuf, VolumeError> {
    use std::os::unix::fs::FileTypeExt;
    let path = PathBuf::from(&source.path);
    let io = |source| VolumeError::Io {
        volume: volume.to_owned(),
        path: path.clone(),
        source,
    };
    let kind = source.type_.as_deref().unwrap_or("");
    let meta = std::fs::metadata(&path);
    let wrong = |expected: &str| VolumeError::HostPathType {
        volume: volume.to_owned(),
        path: source.path.clone(),
        expected: expected.to_owned(),
    };
    match kind {
        "" => {}
        "DirectoryOrCreate" => match meta {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(wrong("directory")),
            Err(_) => std::fs::create_dir_all(&path).map_err(io)?,
        },
        "Directory" => {
            if !meta.is_ok_and(|m| m.is_dir()) {
                return Err(wrong("directory"));
            }
        }
        "FileOrCreate" => match meta {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(wrong("file")),
            Err(_) => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io)?;
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(io)?;
            }
        },
        "File" => {
            if !meta.is_ok_and(|m| m.is_file()) {
                return Err(wrong("file"));
            }
        }
        "Socket" => {
            if !meta.is_ok_and(|m| m.file_type().is_socket()) {
                return Err(wrong("socket"));
            }
        }
        "CharDevice" => {
            if !meta.is_ok_and(|m| m.file_type().is_char_device()) {
                return Err(wrong("character device"));
            }
        }
        "BlockDevice" => {
            if !meta.is_ok_and(|m| m.file_type().is_block_device()) {
                return Err(wrong("block device"));
            }
        }
        other => return Err(wrong(other)),
    }
    Ok(path)
}

/// Prepares every volume of `pod` below `pod_dir`; returns each volume's host path by name.
///
/// # Errors
/// [`VolumeError`] for the first volume that cannot be set up.
pub fn prepare(pod: &Pod, pod_dir: &Path) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
    let mut paths = BTreeMap::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let name = volume.name.clone();
        let path = if volume.empty_dir.is_some() {
            let dir = empty_dir_path(pod_dir, &name);
            private_fs::create_dir_all(&dir).map_err(|source| VolumeError::Io {
                volume: name.clone(),
                path: dir.clone(),
                source,
            })?;
            dir
        } else if let Some(host) = &volume.host_path {
            check_host_path(&name, host)?
        } else {
            let kind = if volume.config_map.is_some() {
                "configMap"
            } else if volume.secret.is_some() {
                "secret"
            } else if volume.downward_api.is_some() {
                "downwardAPI"
            } else if volume.projected.is_some() {
                "projected"
            } else if volume.persistent_volume_claim.is_some() {
                "persistentVolumeClaim"
            } else {
                "this kind of"
            };
            return Err(VolumeError::Unsupported { volume: name, kind });
        };
        paths.insert(name, path);
    }
    Ok(paths)
}

/// A `subPath` stays inside its volume: relative, without `..`.
fn safe_sub_path(sub: &str) -> Option<&Path> {
    let path = Path::new(sub);
    path.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(path)
}

/// The bind mounts of `container`'s `volumeMounts` (mounts of unknown volumes or with an
/// escaping `subPath` are skipped: the API server refuses both).
pub fn bind_mounts(container: &Container, volumes: &BTreeMap<String, PathBuf>) -> Vec<BindMount> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let mut source = volumes.get(&m.name)?.clone();
            if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                source = source.join(safe_sub_path(sub)?);
            }
            Some(BindMount {
                source,
                target: PathBuf::from(&m.mount_path),
                read_only: m.read_only.unwrap_or(false),
            })
        })
        .collect()
}

/// The value of a downward-API `fieldRef` for this pod.
fn field_value(pod: &Pod, field: &str, host_ip: &str, pod_ip: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    match field {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.hostIP" => Some(host_ip.to_owned()),
        "status.podIP" => Some(pod_ip.to_owned()),
        _ => {
            let key = field
                .strip_prefix("metadata.labels['")
                .map(|k| (k, &meta.labels))
                .or_else(|| {
                    field
                        .strip_prefix("metadata.annotations['")
                        .map(|k| (k, &meta.annotations))
                })?;
            key.1.as_ref()?.get(key.0.strip_suffix("']")?).cloned()
        }
    }
}

/// The environment of `container`: its `env` entries with values and downward-API
/// `fieldRef`s (`status.podIP` is `pod_ip`), in order.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    host_ip: &str,
    pod_ip: &str,
) -> Vec<(String, String)> {
    container
        .env
        .iter()
        .flatten()
        .filter_map(|e| {
            let value = match (&e.value, &e.value_from) {
                (Some(v), _) => v.clone(),
                (None, Some(from)) => {
                    field_value(pod, &from.field_ref.as_ref()?.field_path, host_ip, pod_ip)?
                }
                (None, None) => String::new(),
            };
            Some((e.name.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "b"}},
        });
        pod["spec"] = spec;
        serde_json::from_value(pod).expect("pod")
    }

    #[test]
    fn empty_dirs_live_under_the_pod_directory_as_kubelets_do() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = pod(json!({"containers": [], "volumes": [{"name": "public", "emptyDir": {}}]}));
        let paths = prepare(&p, tmp.path()).expect("prepare");
        let dir = tmp.path().join("volumes/kubernetes.io~empty-dir/public");
        assert_eq!(paths["public"], dir);
        assert!(dir.is_dir());
    }

    #[test]
    fn host_path_types_are_checked_and_or_create_creates() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        let vol = |path: &Path, kind: &str| {
            pod(
                json!({"containers": [], "volumes": [{"name": "h", "hostPath": {"path": path, "type": kind}}]}),
            )
        };
        assert!(matches!(
            prepare(&vol(&file, "Directory"), tmp.path()),
            Err(VolumeError::HostPathType { .. })
        ));
        assert!(prepare(&vol(&file, "File"), tmp.path()).is_ok());
        let made = tmp.path().join("made/here");
        prepare(&vol(&made, "DirectoryOrCreate"), tmp.path()).expect("create");
        assert!(made.is_dir());
        assert!(matches!(
            prepare(&vol(&tmp.path().join("none"), "Socket"), tmp.path()),
            Err(VolumeError::HostPathType { .. })
        ));
    }

    #[test]
    fn unsupported_kinds_name_the_volume_and_the_kind() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p =
            pod(json!({"containers": [], "volumes": [{"name": "cm", "configMap": {"name": "x"}}]}));
        let err = prepare(&p, tmp.path())
            .expect_err("unsupported")
            .to_string();
        assert!(err.contains("\"cm\"") && err.contains("configMap"), "{err}");
    }

    #[test]
    fn mounts_follow_volume_mounts_and_sub_paths_cannot_escape() {
        let c: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "v", "mountPath": "/var/run/kubevirt"},
            {"name": "v", "mountPath": "/sub", "subPath": "a/b", "readOnly": true},
            {"name": "v", "mountPath": "/evil", "subPath": "../x"},
            {"name": "missing", "mountPath": "/m"},
        ]}))
        .expect("container");
        let volumes = BTreeMap::from([("v".to_owned(), PathBuf::from("/data/v"))]);
        let mounts = bind_mounts(&c, &volumes);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].target, PathBuf::from("/var/run/kubevirt"));
        assert_eq!(mounts[1].source, PathBuf::from("/data/v/a/b"));
        assert!(mounts[1].read_only);
    }

    #[test]
    fn env_takes_values_and_downward_api_fields() {
        let p = pod(json!({"nodeName": "node01", "containers": []}));
        let c: Container = serde_json::from_value(json!({"name": "c", "env": [
            {"name": "A", "value": "1"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ]}))
        .expect("container");
        let env = container_env(&p, &c, "10.0.0.1", "10.245.0.2");
        assert_eq!(
            env,
            vec![
                ("A".to_owned(), "1".to_owned()),
                ("NODE".to_owned(), "node01".to_owned()),
                ("UID".to_owned(), "u1".to_owned()),
                ("L".to_owned(), "b".to_owned()),
                ("IP".to_owned(), "10.245.0.2".to_owned()),
                ("HOST".to_owned(), "10.0.0.1".to_owned()),
            ]
        );
    }
}
