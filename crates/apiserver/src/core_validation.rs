//! Validation of built-in kinds beyond their metadata, as kube-apiserver's registry
//! strategies do it: pure functions from an object to [`Cause`]s with field paths.
//!
//! Data flow: [`crate::handlers::common::validate_object`] calls [`validate_builtin`] on
//! every create and update (after mutating admission), next to the metadata checks; the
//! causes become one 422 `Invalid`.
//!
//! Covered so far: `spec` and `status` are objects where present; container names of pods and of the pod templates of the served
//! workload kinds (required, RFC 1123 labels, unique within the pod). Everything else about a pod spec
//! is left to the components that use it.

use std::collections::HashSet;

use serde_json::Value;

use crate::cause::Cause;
use crate::metadata::validate_dns_label;

/// The causes for `obj` of kind `group`/`kind`.
pub fn validate_builtin(group: &str, kind: &str, obj: &Value) -> Vec<Cause> {
    let mut causes = validate_shape(obj);
    if !causes.is_empty() {
        return causes;
    }
    causes.extend(match (group, kind) {
        ("", "Pod") => validate_pod_spec("spec", &obj["spec"]),
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet") => {
            validate_pod_spec("spec.template.spec", &obj["spec"]["template"]["spec"])
        }
        _ => Vec::new(),
    });
    causes
}

/// `spec` and `status`, where present, are objects in every built-in kind (kube could
/// not decode anything else; the server and its controllers write into them).
fn validate_shape(obj: &Value) -> Vec<Cause> {
    ["spec", "status"]
        .into_iter()
        .filter(|field| !(obj[*field].is_null() || obj[*field].is_object()))
        .map(|field| {
            Cause::new(
                "FieldValueInvalid",
                field,
                format!("Invalid value: {}: must be an object", obj[field]),
            )
        })
        .collect()
}

/// The causes for a pod spec at `path`: its containers, then its init containers
/// (names are unique across both, a duplicate is reported where it is seen second).
pub fn validate_pod_spec(path: &str, spec: &Value) -> Vec<Cause> {
    let mut names = HashSet::new();
    let mut causes = validate_containers(
        &format!("{path}.containers"),
        &spec["containers"],
        &mut names,
    );
    causes.extend(validate_containers(
        &format!("{path}.initContainers"),
        &spec["initContainers"],
        &mut names,
    ));
    causes
}

/// The causes for the list of containers at `path`; `seen` collects their names.
fn validate_containers<'a>(
    path: &str,
    containers: &'a Value,
    seen: &mut HashSet<&'a str>,
) -> Vec<Cause> {
    let Some(list) = containers.as_array() else {
        return Vec::new();
    };
    let mut causes = Vec::new();
    for (index, container) in list.iter().enumerate() {
        let field = format!("{path}[{index}].name");
        match &container["name"] {
            Value::Null => causes.push(Cause::new("FieldValueRequired", field, "Required value")),
            Value::String(name) if name.is_empty() => {
                causes.push(Cause::new("FieldValueRequired", field, "Required value"));
            }
            Value::String(name) => {
                causes.extend(validate_dns_label(name, &field));
                if !seen.insert(name) {
                    causes.push(Cause::new(
                        "FieldValueDuplicate",
                        field,
                        format!("Duplicate value: {name:?}"),
                    ));
                }
            }
            other => causes.push(Cause::new(
                "FieldValueInvalid",
                field,
                format!("Invalid value: {other}: must be a string"),
            )),
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::metadata::DNS_LABEL_MESSAGE;

    fn fields(causes: &[Cause]) -> Vec<(&str, &str)> {
        causes
            .iter()
            .map(|c| (c.reason.as_str(), c.field.as_str()))
            .collect()
    }

    #[test]
    fn container_names_must_be_rfc_1123_labels() {
        let pod = json!({"spec": {"containers": [{"name": "ok"}, {"name": "../x/compute"}]}});
        let causes = validate_builtin("", "Pod", &pod);
        assert_eq!(
            fields(&causes),
            [("FieldValueInvalid", "spec.containers[1].name")]
        );
        assert_eq!(
            causes[0].message,
            format!("Invalid value: \"../x/compute\": {DNS_LABEL_MESSAGE}")
        );
    }

    #[test]
    fn missing_empty_duplicate_and_non_string_names_are_reported_with_their_paths() {
        let pod = json!({"spec": {
            "containers": [{"image": "i"}, {"name": ""}, {"name": "a"}, {"name": 3}],
            "initContainers": [{"name": "a"}, {"name": "Init"}],
        }});
        let causes = validate_builtin("", "Pod", &pod);
        assert_eq!(
            fields(&causes),
            [
                ("FieldValueRequired", "spec.containers[0].name"),
                ("FieldValueRequired", "spec.containers[1].name"),
                ("FieldValueInvalid", "spec.containers[3].name"),
                ("FieldValueDuplicate", "spec.initContainers[0].name"),
                ("FieldValueInvalid", "spec.initContainers[1].name"),
            ]
        );
        assert_eq!(causes[3].message, "Duplicate value: \"a\"");
    }

    #[test]
    fn pod_templates_of_workload_kinds_are_checked_too() {
        let bad = json!([{"name": "Bad"}]);
        let deployment = json!({"spec": {"template": {"spec": {"containers": bad}}}});
        let causes = validate_builtin("apps", "Deployment", &deployment);
        assert_eq!(
            fields(&causes),
            [("FieldValueInvalid", "spec.template.spec.containers[0].name")]
        );
        let daemon_set = json!({"spec": {"template": {"spec": {"initContainers": bad}}}});
        let causes = validate_builtin("apps", "DaemonSet", &daemon_set);
        assert_eq!(
            fields(&causes),
            [(
                "FieldValueInvalid",
                "spec.template.spec.initContainers[0].name"
            )]
        );
        assert!(
            validate_builtin("", "ConfigMap", &json!({"spec": {"containers": bad}})).is_empty()
        );
    }

    #[test]
    fn spec_and_status_that_are_not_objects_are_invalid() {
        let pod = json!({"spec": "x", "status": [1]});
        let causes = validate_builtin("", "Pod", &pod);
        assert_eq!(
            fields(&causes),
            [
                ("FieldValueInvalid", "spec"),
                ("FieldValueInvalid", "status")
            ]
        );
        assert_eq!(causes[0].message, "Invalid value: \"x\": must be an object");
        assert!(validate_builtin("", "Pod", &json!({"spec": {}, "status": null})).is_empty());
    }

    #[test]
    fn pods_without_containers_or_with_valid_names_pass() {
        assert!(validate_builtin("", "Pod", &json!({})).is_empty());
        let pod = json!({"spec": {"containers": [{"name": "compute"}], "initContainers": [{"name": "setup-1"}]}});
        assert!(validate_builtin("", "Pod", &pod).is_empty());
    }
}
