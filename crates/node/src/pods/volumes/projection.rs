//! What a configMap, secret or downwardAPI source projects into a volume: pure functions from
//! the source objects and the pod to an [`atomic::Payload`](super::atomic::Payload).
//!
//! As kubelet: without `items` every key becomes a file of its name; with `items` only the
//! listed keys, at their `path`s. A file's mode is the item's `mode`, else the volume's
//! `defaultMode`, else `0644`. A listed key the source lacks fails the volume unless the
//! source is `optional`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod, ResourceFieldSelector};
use k8s_quantity::Quantity;

use super::atomic::{FileProjection, Payload};

/// kubelet's default file mode of configMap, secret, downwardAPI and projected volumes.
pub const DEFAULT_MODE: u32 = 0o644;

/// Why a source cannot be projected.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    /// An item names a key the configMap does not have.
    #[error("configmap references non-existent config key: {0}")]
    ConfigMapKey(String),
    /// An item names a key the secret does not have.
    #[error("references non-existent secret key: {0}")]
    SecretKey(String),
    /// A downward-API `fieldRef` this node does not know.
    #[error("unsupported fieldPath: {0}")]
    FieldPath(String),
    /// A `resourceFieldRef` that cannot be evaluated.
    #[error("{0}")]
    ResourceField(String),
}

/// Which kind of object a key-to-path source reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceKind {
    ConfigMap,
    Secret,
}

/// A mode from the API (`int32` permission bits), limited to the permission bits.
pub fn mode_bits(mode: Option<i32>, default: u32) -> u32 {
    mode.and_then(|m| u32::try_from(m).ok())
        .map_or(default, |m| m & 0o7777)
}

/// The files of a configMap or secret: every key, or only `items`.
///
/// # Errors
/// [`ProjectionError`] for a listed key the source lacks (unless `optional`).
pub fn key_to_path(
    kind: SourceKind,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<Payload, ProjectionError> {
    let mut payload = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (key, value) in data {
                payload.insert(
                    key.clone(),
                    FileProjection {
                        data: value.clone(),
                        mode: default_mode,
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                let Some(value) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(match kind {
                        SourceKind::ConfigMap => ProjectionError::ConfigMapKey(item.key.clone()),
                        SourceKind::Secret => ProjectionError::SecretKey(item.key.clone()),
                    });
                };
                payload.insert(
                    item.path.clone(),
                    FileProjection {
                        data: value.clone(),
                        mode: mode_bits(item.mode, default_mode),
                    },
                );
            }
        }
    }
    Ok(payload)
}

/// Go's `%q` of a string: what kubelet writes for label and annotation values.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if c.is_control() => {
                let code = u32::from(c);
                if code < 0x100 {
                    out.push_str(&format!("\\x{code:02x}"));
                } else {
                    out.push_str(&format!("\\u{code:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// kubelet's format of a labels or annotations file: `key="value"` lines, sorted by key.
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The node's allocatable resources: what a `limits.*` reference reads when the container
/// sets no limit, as kubelet does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeResources {
    pub cpu_millis: i128,
    pub memory_bytes: i128,
}

impl NodeResources {
    /// This machine's CPUs and memory.
    pub fn of_this_host() -> NodeResources {
        let facts = crate::registration::HostFacts::read();
        NodeResources {
            cpu_millis: i128::try_from(facts.cpus.max(1)).unwrap_or(1) * 1000,
            memory_bytes: i128::from(facts.memory_bytes),
        }
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    if b == 0 {
        return 0;
    }
    let q = a / b;
    if a % b != 0 && (a > 0) == (b > 0) {
        q + 1
    } else {
        q
    }
}

/// The value of a `resourceFieldRef` for container `container` of `pod`, in units of the
/// divisor rounded up, as kubelet writes it.
///
/// # Errors
/// [`ProjectionError::ResourceField`] for an unknown container, resource or divisor.
pub fn resource_value(
    pod: &Pod,
    default_container: Option<&str>,
    selector: &ResourceFieldSelector,
    node: NodeResources,
) -> Result<String, ProjectionError> {
    let err = |m: String| ProjectionError::ResourceField(m);
    let name = selector
        .container_name
        .as_deref()
        .filter(|n| !n.is_empty())
        .or(default_container)
        .ok_or_else(|| err("resourceFieldRef needs a containerName".into()))?;
    let container = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == name)
        .ok_or_else(|| err(format!("container {name} not found")))?;
    let resources = container.resources.as_ref();
    let (which, resource) = selector.resource.split_once('.').ok_or_else(|| {
        err(format!(
            "unsupported container resource : {}",
            selector.resource
        ))
    })?;
    let set = match which {
        "limits" => resources.and_then(|r| r.limits.as_ref()),
        "requests" => resources.and_then(|r| r.requests.as_ref()),
        _ => {
            return Err(err(format!(
                "unsupported container resource : {}",
                selector.resource
            )));
        }
    };
    let parse = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        Quantity::parse(&q.0).map_err(|e| err(format!("invalid quantity {:?}: {e}", q.0)))
    };
    let divisor = match &selector.divisor {
        Some(d) => parse(d)?,
        None => Quantity::from_value(1, k8s_quantity::Format::DecimalSi)
            .map_err(|e| err(e.to_string()))?,
    };
    let value = set.and_then(|s| s.get(resource)).map(parse).transpose()?;
    let value = match resource {
        "cpu" => {
            let millis = value.map_or(
                if which == "limits" {
                    node.cpu_millis
                } else {
                    0
                },
                |q| q.milli_value(),
            );
            ceil_div(millis, divisor.milli_value())
        }
        "memory" | "ephemeral-storage" => {
            let bytes = value.map_or(
                if which == "limits" && resource == "memory" {
                    node.memory_bytes
                } else {
                    0
                },
                |q| q.value(),
            );
            ceil_div(bytes, divisor.value())
        }
        _ if resource.starts_with("hugepages-") => {
            ceil_div(value.map_or(0, |q| q.value()), divisor.value())
        }
        _ => {
            return Err(err(format!(
                "unsupported container resource : {}",
                selector.resource
            )));
        }
    };
    Ok(value.to_string())
}

/// The value of a downward-API `fieldRef` in a volume file: what an env var can read, plus
/// the whole `metadata.labels` and `metadata.annotations`.
fn volume_field_value(pod: &Pod, field: &str, host_ip: &str) -> Option<String> {
    match field {
        "metadata.labels" => Some(format_map(pod.metadata.labels.as_ref())),
        "metadata.annotations" => Some(format_map(pod.metadata.annotations.as_ref())),
        // kube refuses `status.*` fields in downward-API volumes.
        _ => super::field_value(pod, field, host_ip, ""),
    }
}

/// The files of a downwardAPI source.
///
/// # Errors
/// [`ProjectionError`] for a field or resource this node cannot evaluate.
pub fn downward_api(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    host_ip: &str,
    node: NodeResources,
) -> Result<Payload, ProjectionError> {
    let mut payload = Payload::new();
    for item in items {
        let data = match (&item.field_ref, &item.resource_field_ref) {
            (Some(field), _) => volume_field_value(pod, &field.field_path, host_ip)
                .ok_or_else(|| ProjectionError::FieldPath(field.field_path.clone()))?,
            (None, Some(resource)) => resource_value(pod, None, resource, node)?,
            (None, None) => String::new(),
        };
        payload.insert(
            item.path.clone(),
            FileProjection {
                data: data.into_bytes(),
                mode: mode_bits(item.mode, default_mode),
            },
        );
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NODE: NodeResources = NodeResources {
        cpu_millis: 4000,
        memory_bytes: 8 << 30,
    };

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "labels": {"b": "2", "a": "x\"y"}},
            "spec": {"containers": [{"name": "c", "resources": {
                "limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": "250m"}}}]}
        }))
        .expect("pod")
    }

    fn items(v: serde_json::Value) -> Vec<KeyToPath> {
        serde_json::from_value(v).expect("items")
    }

    #[test]
    fn all_keys_or_only_items_with_their_modes() {
        let data = BTreeMap::from([
            ("k1".to_owned(), b"v1".to_vec()),
            ("k2".to_owned(), b"v2".to_vec()),
        ]);
        let all = key_to_path(SourceKind::ConfigMap, &data, None, 0o600, false).expect("all");
        assert_eq!(all.len(), 2);
        assert_eq!(all["k1"].mode, 0o600);
        let some = items(json!([{"key": "k2", "path": "d/two", "mode": 0o400}]));
        let one = key_to_path(SourceKind::Secret, &data, Some(&some), 0o644, false).expect("one");
        assert_eq!(one.keys().collect::<Vec<_>>(), ["d/two"]);
        assert_eq!(one["d/two"].mode, 0o400);
        assert_eq!(one["d/two"].data, b"v2");
    }

    #[test]
    fn a_missing_key_fails_unless_optional() {
        let data = BTreeMap::new();
        let some = items(json!([{"key": "nope", "path": "x"}]));
        let err = key_to_path(SourceKind::ConfigMap, &data, Some(&some), 0o644, false)
            .expect_err("missing");
        assert_eq!(
            err.to_string(),
            "configmap references non-existent config key: nope"
        );
        let empty =
            key_to_path(SourceKind::ConfigMap, &data, Some(&some), 0o644, true).expect("optional");
        assert!(empty.is_empty());
    }

    #[test]
    fn labels_are_written_sorted_and_quoted() {
        let files: Vec<DownwardAPIVolumeFile> = serde_json::from_value(json!([
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
        ]))
        .expect("items");
        let payload = downward_api(&pod(), &files, 0o644, "10.0.0.1", NODE).expect("payload");
        assert_eq!(payload["labels"].data, b"a=\"x\\\"y\"\nb=\"2\"");
        assert_eq!(payload["ns"].data, b"ns");
    }

    #[test]
    fn resources_are_divided_and_rounded_up_and_unset_limits_are_the_nodes() {
        let sel = |resource: &str, divisor: Option<&str>| ResourceFieldSelector {
            container_name: Some("c".into()),
            resource: resource.into(),
            divisor: divisor
                .map(|d| k8s_openapi::apimachinery::pkg::api::resource::Quantity(d.into())),
        };
        let p = pod();
        let value = |s| resource_value(&p, None, &s, NODE).expect("value");
        assert_eq!(value(sel("limits.cpu", None)), "1");
        assert_eq!(value(sel("limits.cpu", Some("1m"))), "500");
        assert_eq!(value(sel("requests.cpu", Some("1m"))), "250");
        assert_eq!(value(sel("limits.memory", Some("1Mi"))), "1024");
        assert_eq!(value(sel("requests.memory", None)), "0");
        let mut p2 = p.clone();
        if let Some(spec) = p2.spec.as_mut() {
            spec.containers[0].resources = None;
        }
        let unset = resource_value(&p2, None, &sel("limits.cpu", None), NODE).expect("value");
        assert_eq!(unset, "4");
        assert!(resource_value(&p, None, &sel("limits.gpu", None), NODE).is_err());
    }
}
