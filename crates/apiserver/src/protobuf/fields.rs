//! The fields a built-in object has that its type does not (`fieldValidation=Strict|Warn`),
//! from the same descriptor table the protobuf decoder uses: kube-apiserver finds them while
//! decoding into its Go types; this server stores JSON, so it walks the object along the
//! table instead.

use serde_json::Value;

use super::KINDS;
use super::schema::{Cardinality, Field, Schema, Type};

/// The unknown fields of `obj`, a `group/version` `kind` (paths as kube writes them:
/// `spec.template.spec.containers[0].badField`); `None` for a kind the table does not
/// describe, which is then not checked.
pub fn unknown_fields(api_version: &str, kind: &str, obj: &Value) -> Option<Vec<String>> {
    if !KINDS.contains(&(api_version, kind)) {
        return None;
    }
    let schema = Schema::get().ok()?;
    let index = schema.index(kind)?;
    let mut out = Vec::new();
    let Value::Object(map) = obj else {
        return Some(out);
    };
    for (key, value) in map {
        if key == "apiVersion" || key == "kind" {
            continue;
        }
        check_field(schema, index, key, value, key, &mut out);
    }
    Some(out)
}

/// The field named `json` of message `index`, looking into inline (embedded) fields.
fn find<'s>(schema: &'s Schema, index: usize, json: &str) -> Option<&'s Field> {
    let message = &schema.messages[index];
    message.fields.iter().find_map(|f| {
        if f.inline {
            match f.ty {
                Type::Message(inner) => find(schema, inner, json),
                _ => None,
            }
        } else {
            (f.json == json).then_some(f)
        }
    })
}

fn check_field(
    schema: &Schema,
    index: usize,
    key: &str,
    value: &Value,
    path: &str,
    out: &mut Vec<String>,
) {
    let Some(field) = find(schema, index, key) else {
        out.push(path.to_owned());
        return;
    };
    let Type::Message(inner) = field.ty else {
        return; // scalars and well-known types have no fields of their own
    };
    match (field.cardinality, value) {
        (Cardinality::Single, Value::Object(_)) => walk(schema, inner, value, path, out),
        (Cardinality::Repeated, Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                walk(schema, inner, item, &format!("{path}[{i}]"), out);
            }
        }
        (Cardinality::Map, Value::Object(entries)) => {
            for (k, item) in entries {
                walk(schema, inner, item, &format!("{path}.{k}"), out);
            }
        }
        // A value of the wrong shape is the decoder's and the validators' business.
        _ => {}
    }
}

fn walk(schema: &Schema, index: usize, value: &Value, path: &str, out: &mut Vec<String>) {
    let Value::Object(map) = value else {
        return;
    };
    for (key, v) in map {
        check_field(schema, index, key, v, &format!("{path}.{key}"), out);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_fields_are_named_by_their_path_through_lists_maps_and_inline_fields() {
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"a": "b"}, "colour": "red"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [
                    {"name": "c", "image": "i", "resources": {"limits": {"cpu": "1"}},
                     "livenessProbe": {"httpGet": {"port": 80}, "periodSeconds": 3}},
                    {"name": "d", "image": "i", "imagePullPolcy": "Always"}
                ], "volumes": [{"name": "v", "emptyDir": {}, "hostPth": {}}]}},
                "strategy": {"type": "Recreate"},
                "replica": 2
            },
            "status": {}
        });
        let mut unknown =
            unknown_fields("apps/v1", "Deployment", &deployment).expect("a described kind");
        unknown.sort();
        assert_eq!(
            unknown,
            [
                "metadata.colour",
                "spec.replica",
                "spec.template.spec.containers[1].imagePullPolcy",
                "spec.template.spec.volumes[0].hostPth",
            ],
            "inline fields (a probe's httpGet, a volume's emptyDir) are known"
        );
    }

    #[test]
    fn a_well_formed_object_has_none_and_an_undescribed_kind_is_not_checked() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "creationTimestamp": null}, "data": {"k": "v"}});
        assert_eq!(unknown_fields("v1", "ConfigMap", &cm), Some(vec![]));
        assert_eq!(unknown_fields("v1", "Node", &json!({"x": 1})), None);
    }
}
