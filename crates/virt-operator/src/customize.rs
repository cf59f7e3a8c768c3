//! `spec.customizeComponents.patches` (upstream's `pkg/virt-operator/resource/apply/patches.go`):
//! each patch names a `resourceType` (the kind, `*` for any) and a `resourceName` (`*` for
//! any) and is applied to every matching object of the install strategy before it is
//! installed, in the CR's order, as `json` (RFC 6902), `merge` (RFC 7386) or `strategic`.
//! A patched object carries upstream's annotation `kubevirt.io/customizer-identifier` (a hash
//! of the patches that touched it), so a change of the patches changes the object.
//!
//! # Caveats
//! `strategic` merges lists of objects by their `name` (the merge key of containers, volumes,
//! env, ports of the objects KubeVirt installs) and replaces other lists; the
//! `$patch`/`$retainKeys` directives of Kubernetes' strategic merge are not interpreted.

use kubevirt_api::v1::CustomizeComponentsPatch;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Upstream's `KubeVirtCustomizeComponentAnnotationHash`.
pub const CUSTOMIZER_ANNOTATION: &str = "kubevirt.io/customizer-identifier";

/// A patch that cannot be applied; `field` is its path in the CR.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PatchError {
    /// `spec.customizeComponents.patches[i]` (with the sub-field).
    pub field: String,
    /// Why.
    pub reason: String,
}

fn matches(pattern: &str, value: &str) -> bool {
    pattern == "*" || pattern.eq_ignore_ascii_case(value)
}

/// Applies `patches` to the matching `objects` (see the module documentation).
///
/// # Errors
/// [`PatchError`] for a patch that does not parse, has an unknown type or does not apply; the
/// objects are then left as they were (nothing half-patched is installed).
pub fn apply(
    objects: &mut [Value],
    patches: &[CustomizeComponentsPatch],
) -> Result<(), PatchError> {
    let mut patched = objects.to_vec();
    for object in &mut patched {
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut hash = Sha256::new();
        let mut touched = false;
        for (i, patch) in patches.iter().enumerate() {
            if !matches(&patch.resource_type, &kind) || !matches(&patch.resource_name, &name) {
                continue;
            }
            let field = format!("spec.customizeComponents.patches[{i}]");
            apply_one(object, patch, &field)?;
            hash.update(patch.patch.as_bytes());
            hash.update(patch.type_.as_bytes());
            touched = true;
        }
        if touched {
            let id: String = hash
                .finalize()
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect();
            object["metadata"]["annotations"][CUSTOMIZER_ANNOTATION] = Value::String(id);
        }
    }
    objects.clone_from_slice(&patched);
    Ok(())
}

fn apply_one(
    object: &mut Value,
    patch: &CustomizeComponentsPatch,
    field: &str,
) -> Result<(), PatchError> {
    let error = |sub: &str, reason: String| PatchError {
        field: format!("{field}.{sub}"),
        reason,
    };
    let body: Value =
        serde_json::from_str(&patch.patch).map_err(|e| error("patch", format!("not JSON: {e}")))?;
    match patch.type_.to_ascii_lowercase().as_str() {
        "json" => {
            let ops: json_patch::Patch = serde_json::from_value(body)
                .map_err(|e| error("patch", format!("not a JSON patch: {e}")))?;
            json_patch::patch(object, &ops).map_err(|e| error("patch", e.to_string()))?;
        }
        "merge" => json_patch::merge(object, &body),
        "strategic" => strategic_merge(object, &body),
        other => {
            return Err(error(
                "type",
                format!(
                    "unsupported value {other:?}: supported values: \"json\", \"merge\", \"strategic\""
                ),
            ));
        }
    }
    Ok(())
}

/// A strategic merge (see the module's caveats).
fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (key, value) in p {
                if value.is_null() {
                    t.remove(key);
                } else {
                    strategic_merge(t.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (Value::Array(t), Value::Array(p))
            if t.iter()
                .chain(p)
                .all(|v| v.get("name").is_some_and(Value::is_string)) =>
        {
            for item in p {
                match t.iter_mut().find(|v| v["name"] == item["name"]) {
                    Some(existing) => strategic_merge(existing, item),
                    None => t.push(item.clone()),
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(kind: &str, name: &str, type_: &str, body: &str) -> CustomizeComponentsPatch {
        CustomizeComponentsPatch {
            resource_name: name.into(),
            resource_type: kind.into(),
            patch: body.into(),
            type_: type_.into(),
        }
    }

    fn deployment(name: &str) -> Value {
        json!({"kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [
                {"name": name, "image": "i", "env": [{"name": "A", "value": "1"}]}]}}}})
    }

    #[test]
    fn json_merge_and_strategic_patches_reach_only_the_named_resources() {
        let mut objects = vec![
            deployment("virt-api"),
            deployment("virt-controller"),
            json!({"kind": "Service", "metadata": {"name": "virt-api"}, "spec": {}}),
        ];
        let patches = [
            patch(
                "Deployment",
                "virt-api",
                "json",
                r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
            ),
            patch(
                "Deployment",
                "virt-controller",
                "merge",
                r#"{"metadata":{"labels":{"x":"y"}}}"#,
            ),
            patch(
                "Deployment",
                "*",
                "strategic",
                r#"{"spec":{"template":{"spec":{"containers":[{"name":"virt-api","env":[{"name":"B","value":"2"}]}]}}}}"#,
            ),
        ];
        apply(&mut objects, &patches).unwrap();
        assert_eq!(objects[0]["spec"]["replicas"], 3);
        assert_eq!(objects[1]["spec"]["replicas"], 2);
        assert_eq!(objects[1]["metadata"]["labels"]["x"], "y");
        let env = &objects[0]["spec"]["template"]["spec"]["containers"][0]["env"];
        assert_eq!(
            env,
            &json!([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
        );
        // virt-controller's container is not named virt-api: the strategic patch adds one.
        let containers = objects[1]["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap();
        assert_eq!(containers.len(), 2);
        assert!(objects[0]["metadata"]["annotations"][CUSTOMIZER_ANNOTATION].is_string());
        assert_eq!(
            objects[2],
            json!({"kind": "Service", "metadata": {"name": "virt-api"}, "spec": {}})
        );
    }

    #[test]
    fn a_bad_patch_names_its_field_and_leaves_every_object_unpatched() {
        let mut objects = vec![deployment("virt-api"), deployment("virt-controller")];
        let before = objects.clone();
        let patches = [
            patch(
                "Deployment",
                "virt-api",
                "merge",
                r#"{"spec":{"replicas":5}}"#,
            ),
            patch(
                "Deployment",
                "virt-controller",
                "json",
                r#"[{"op":"remove","path":"/nope"}]"#,
            ),
        ];
        let e = apply(&mut objects, &patches).unwrap_err();
        assert_eq!(e.field, "spec.customizeComponents.patches[1].patch");
        assert_eq!(objects, before);
        let e = apply(&mut objects, &[patch("*", "*", "yaml", "{}")]).unwrap_err();
        assert_eq!(e.field, "spec.customizeComponents.patches[0].type");
        assert!(e.reason.contains("supported values"));
    }
}
