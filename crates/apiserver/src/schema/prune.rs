//! Pruning: dropping the fields a structural schema does not specify.
//!
//! Follows kube-apiserver's pruning algorithm: an object node keeps the keys of its
//! `properties` and, with `additionalProperties`, every key; other keys are removed and
//! reported. Below `x-kubernetes-preserve-unknown-fields: true` unknown keys stay, but the
//! known ones are still pruned. A value the schema says nothing about (no schema, or a type
//! mismatch such as an object where a string is expected) loses all its object keys. Resource
//! roots (the root and `x-kubernetes-embedded-resource` objects) keep `apiVersion`, `kind` and
//! `metadata` as they are.

use serde_json::Value;

use super::node::{Additional, Node};
use super::{child_path, index_path};

const RESOURCE_META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Prunes `value` against `node`; returns the removed paths in document order.
pub(crate) fn prune_value(
    value: &mut Value,
    node: &Node,
    path: &str,
    resource_root: bool,
) -> Vec<String> {
    let mut removed = Vec::new();
    prune(value, Some(node), path, resource_root, &mut removed);
    removed
}

fn prune(
    value: &mut Value,
    node: Option<&Node>,
    path: &str,
    resource_root: bool,
    removed: &mut Vec<String>,
) {
    if let Some(node) = node
        && node.preserve_unknown
    {
        skip_prune(value, node, path, resource_root, removed);
        return;
    }
    match value {
        Value::Object(map) => {
            let Some(node) = node else {
                for key in map.keys() {
                    removed.push(child_path(path, key));
                }
                map.clear();
                return;
            };
            let keep_meta = resource_root || node.embedded_resource;
            map.retain(|key, child| {
                let child_at = child_path(path, key);
                if keep_meta && RESOURCE_META_FIELDS.contains(&key.as_str()) {
                    return true;
                }
                if let Some(property) = node.properties.get(key) {
                    prune(child, Some(property), &child_at, false, removed);
                    return true;
                }
                match &node.additional {
                    Additional::Schema(values) => {
                        prune(child, Some(values), &child_at, false, removed);
                        true
                    }
                    Additional::Any => {
                        prune(child, None, &child_at, false, removed);
                        true
                    }
                    Additional::Unspecified | Additional::Forbidden => {
                        removed.push(child_at);
                        false
                    }
                }
            });
        }
        Value::Array(items) => {
            let item_node = node.and_then(|n| n.items.as_deref());
            for (i, item) in items.iter_mut().enumerate() {
                prune(item, item_node, &index_path(path, i), false, removed);
            }
        }
        _ => {}
    }
}

/// Pruning below `x-kubernetes-preserve-unknown-fields`: unknown keys stay, known keys are
/// pruned with their own schema.
fn skip_prune(
    value: &mut Value,
    node: &Node,
    path: &str,
    resource_root: bool,
    removed: &mut Vec<String>,
) {
    match value {
        Value::Object(map) => {
            let keep_meta = resource_root || node.embedded_resource;
            for (key, child) in map.iter_mut() {
                if keep_meta && RESOURCE_META_FIELDS.contains(&key.as_str()) {
                    continue;
                }
                let child_at = child_path(path, key);
                if let Some(property) = node.properties.get(key) {
                    prune(child, Some(property), &child_at, false, removed);
                } else {
                    match &node.additional {
                        Additional::Schema(values) => {
                            prune(child, Some(values), &child_at, false, removed);
                        }
                        Additional::Any => prune(child, None, &child_at, false, removed),
                        Additional::Unspecified | Additional::Forbidden => {}
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_node) = node.items.as_deref() {
                for (i, item) in items.iter_mut().enumerate() {
                    skip_prune(item, item_node, &index_path(path, i), false, removed);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::schema::Schema;
    use crate::schema::fixtures::widget_schema;

    fn pruned(schema: &Schema, mut object: Value) -> (Value, Vec<String>) {
        let removed = schema.prune(&mut object);
        (object, removed)
    }

    #[test]
    fn unknown_fields_are_removed_and_reported_in_document_order() {
        let schema = widget_schema();
        let (object, removed) = pruned(
            &schema,
            json!({
                "apiVersion": "shop.example.com/v1", "kind": "Widget",
                "metadata": {"name": "w1", "whatever": 1},
                "bogus": true,
                "spec": {"size": 3, "colour": "red", "parts": [{"name": "a", "extra": 1}, {"name": "b"}]},
            }),
        );
        assert_eq!(removed, vec!["bogus", "spec.colour", "spec.parts[0].extra"]);
        assert_eq!(
            object,
            json!({
                "apiVersion": "shop.example.com/v1", "kind": "Widget",
                "metadata": {"name": "w1", "whatever": 1},
                "spec": {"size": 3, "parts": [{"name": "a"}, {"name": "b"}]},
            })
        );
    }

    #[test]
    fn preserve_unknown_fields_keeps_unknown_keys_but_prunes_known_ones() {
        let schema = widget_schema();
        let (object, removed) = pruned(
            &schema,
            json!({"spec": {"config": {"free": {"deep": [1, {"x": 2}]}, "known": {"a": 1, "junk": 2}}}}),
        );
        assert_eq!(removed, vec!["spec.config.known.junk"]);
        assert_eq!(
            object,
            json!({"spec": {"config": {"free": {"deep": [1, {"x": 2}]}, "known": {"a": 1}}}})
        );
    }

    #[test]
    fn additional_properties_maps_prune_their_values() {
        let schema = widget_schema();
        let (object, removed) = pruned(
            &schema,
            json!({"spec": {"labelsByZone": {"z1": {"tier": "gold", "junk": 1}, "z2": {}}}}),
        );
        assert_eq!(removed, vec!["spec.labelsByZone.z1.junk"]);
        assert_eq!(
            object,
            json!({"spec": {"labelsByZone": {"z1": {"tier": "gold"}, "z2": {}}}})
        );
    }

    #[test]
    fn embedded_resources_keep_api_version_kind_and_metadata() {
        let schema = widget_schema();
        let (object, removed) = pruned(
            &schema,
            json!({"spec": {"template": {
                "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"a": "b"}},
                "data": {"k": "v"}, "junk": 1,
            }}}),
        );
        assert_eq!(removed, vec!["spec.template.junk"]);
        assert_eq!(
            object["spec"]["template"],
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"a": "b"}}, "data": {"k": "v"}})
        );
    }

    #[test]
    fn an_object_where_a_scalar_is_expected_loses_its_keys() {
        let schema = widget_schema();
        let (object, removed) = pruned(&schema, json!({"spec": {"size": {"a": 1, "b": 2}}}));
        assert_eq!(removed, vec!["spec.size.a", "spec.size.b"]);
        assert_eq!(object, json!({"spec": {"size": {}}}));
    }

    #[test]
    fn nested_api_version_is_pruned_outside_resource_roots() {
        let schema = widget_schema();
        let (_, removed) = pruned(&schema, json!({"spec": {"kind": "x", "apiVersion": "y"}}));
        assert_eq!(removed, vec!["spec.kind", "spec.apiVersion"]);
    }
}
