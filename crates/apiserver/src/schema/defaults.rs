//! Defaulting: filling absent fields from the schema's `default`s, as kube-apiserver does.
//!
//! For an object node, every property with a `default` that is absent (or `null` while the
//! property is not `nullable`) gets a copy of the default; then every property and every
//! `additionalProperties` value is defaulted recursively (so a default value is itself
//! defaulted further down). Array items are defaulted with the `items` schema. Afterwards
//! [`drop_non_nullable_nulls`] removes `null`s of non-nullable properties that have no default.

use serde_json::Value;

use super::node::{Additional, Node};

/// Applies the defaults of `node` to `value`, recursively.
pub(crate) fn default_value(value: &mut Value, node: &Node) {
    match value {
        Value::Object(map) => {
            for (name, property) in &node.properties {
                let Some(default) = &property.default else {
                    continue;
                };
                let needs_default = match map.get(name) {
                    None => true,
                    Some(Value::Null) => !property.nullable,
                    Some(_) => false,
                };
                if needs_default {
                    map.insert(name.clone(), default.clone());
                }
            }
            for (key, child) in map.iter_mut() {
                if let Some(property) = node.properties.get(key) {
                    default_value(child, property);
                } else if let Additional::Schema(values) = &node.additional {
                    default_value(child, values);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_node) = node.items.as_deref() {
                for item in items {
                    default_value(item, item_node);
                }
            }
        }
        _ => {}
    }
}

/// Removes `null` values of non-nullable properties without a default, recursively.
pub(crate) fn drop_non_nullable_nulls(value: &mut Value, node: &Node) {
    match value {
        Value::Object(map) => {
            map.retain(|key, child| {
                let Some(property) = node.properties.get(key) else {
                    if let Additional::Schema(values) = &node.additional {
                        drop_non_nullable_nulls(child, values);
                    }
                    return true;
                };
                if child.is_null() && property.default.is_none() && !property.nullable {
                    return false;
                }
                drop_non_nullable_nulls(child, property);
                true
            });
        }
        Value::Array(items) => {
            if let Some(item_node) = node.items.as_deref() {
                for item in items {
                    drop_non_nullable_nulls(item, item_node);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::schema::fixtures::widget_schema;

    fn defaulted(mut object: Value) -> Value {
        widget_schema().apply_defaults(&mut object);
        object
    }

    #[test]
    fn absent_properties_get_their_defaults_at_every_depth() {
        let object = defaulted(json!({
            "spec": {"parts": [{"name": "a"}, {"name": "b", "count": 7}]},
        }));
        assert_eq!(
            object,
            json!({"spec": {
                "parts": [{"name": "a", "count": 1}, {"name": "b", "count": 7}],
                "size": 1,
                "strategy": {"type": "Rolling", "maxUnavailable": "25%"},
            }})
        );
    }

    #[test]
    fn a_default_object_is_defaulted_further_down() {
        let object = defaulted(json!({"spec": {"size": 2, "strategy": {"type": "Recreate"}}}));
        assert_eq!(
            object["spec"]["strategy"],
            json!({"type": "Recreate", "maxUnavailable": "25%"})
        );
    }

    #[test]
    fn additional_properties_values_are_defaulted() {
        let object = defaulted(json!({"spec": {"size": 1, "labelsByZone": {"z1": {}}}}));
        assert_eq!(
            object["spec"]["labelsByZone"],
            json!({"z1": {"tier": "standard"}})
        );
    }

    #[test]
    fn null_for_a_non_nullable_field_with_a_default_becomes_the_default() {
        let object = defaulted(json!({"spec": {"size": null}}));
        assert_eq!(object["spec"]["size"], json!(1));
    }

    #[test]
    fn null_for_a_non_nullable_field_without_default_is_dropped() {
        let object = defaulted(json!({"spec": {"size": 1, "description": null}}));
        assert!(object["spec"].get("description").is_none());
    }

    #[test]
    fn null_for_a_nullable_field_stays() {
        let object = defaulted(json!({"spec": {"size": 1, "note": null}}));
        assert_eq!(object["spec"]["note"], Value::Null);
    }

    #[test]
    fn present_values_are_never_overwritten() {
        let object = defaulted(
            json!({"spec": {"size": 5, "strategy": {"type": "Recreate", "maxUnavailable": 2}}}),
        );
        assert_eq!(object["spec"]["size"], json!(5));
        assert_eq!(object["spec"]["strategy"]["maxUnavailable"], json!(2));
    }
}
