//! Making derived JSON schemas structural, and checking that they are.
//!
//! kube-apiserver only accepts CRD schemas that are *structural*: every node has a `type` (unless
//! it is `x-kubernetes-int-or-string` or `x-kubernetes-preserve-unknown-fields`), there are no
//! `$ref`s or `definitions`, `properties` and `additionalProperties` are not combined, and the
//! junctors `anyOf`/`oneOf`/`allOf` carry no types, defaults or descriptions of their own (the
//! int-or-string pattern `anyOf: [{type: integer}, {type: string}]` excepted). schemars output
//! for flattened structs, `serde_json::Value` and k8s-openapi quantities breaks some of these
//! rules; [`structuralize`] rewrites a schema in place and [`structural_violations`] checks one.

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Map, Value};

/// Schema of an object kept as-is: `type: object` with `x-kubernetes-preserve-unknown-fields`,
/// as upstream uses for embedded template metadata and CDI DataVolume specs.
pub fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

const JUNCTORS: [&str; 3] = ["anyOf", "oneOf", "allOf"];
const INT_OR_STRING: &str = "x-kubernetes-int-or-string";
const PRESERVE_UNKNOWN: &str = "x-kubernetes-preserve-unknown-fields";

/// Rewrites `schema` in place into a structural schema; see the module docs for the rules.
pub fn structuralize(schema: &mut Value) {
    if let Value::Bool(_) = schema {
        *schema = serde_json::json!({ PRESERVE_UNKNOWN: true });
        return;
    }
    let Value::Object(node) = schema else {
        return;
    };
    for key in ["$schema", "$id", "definitions", "$defs", "title"] {
        node.remove(key);
    }
    normalise_type(node);
    merge_junctors(node);
    normalise_int_or_string(node);
    normalise_additional_properties(node);
    normalise_format(node);
    if node.get("default").is_some_and(Value::is_null) {
        node.remove("default");
    }
    if let Some(Value::Array(values)) = node.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    if node
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        node.remove("required");
    }
    if !has_type(node) && !is_flag(node, INT_OR_STRING) && !is_flag(node, PRESERVE_UNKNOWN) {
        if node.contains_key("properties") {
            node.insert("type".into(), "object".into());
        } else if node.contains_key("items") {
            node.insert("type".into(), "array".into());
        } else {
            node.insert(PRESERVE_UNKNOWN.into(), true.into());
        }
    }
    for child in children_mut(node) {
        structuralize(child);
    }
}

fn has_type(node: &Map<String, Value>) -> bool {
    node.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
}

fn is_flag(node: &Map<String, Value>, key: &str) -> bool {
    node.get(key).and_then(Value::as_bool) == Some(true)
}

/// `type: [T, "null"]` becomes `type: T, nullable: true`.
fn normalise_type(node: &mut Map<String, Value>) {
    if let Some(Value::Array(types)) = node.get("type") {
        let nullable = types.iter().any(|t| t == "null");
        let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        match rest.as_slice() {
            [single] => {
                node.insert("type".into(), single.clone());
            }
            _ => {
                node.remove("type");
            }
        }
        if nullable {
            node.insert("nullable".into(), true.into());
        }
    }
}

/// Moves the properties and the common type of junctor branches into the node and drops the
/// junctor: such branches come from flattened structs and `Option`s, not from real one-of rules.
fn merge_junctors(node: &mut Map<String, Value>) {
    if is_int_or_string_pattern(node) {
        return;
    }
    for junctor in JUNCTORS {
        let Some(Value::Array(branches)) = node.remove(junctor) else {
            continue;
        };
        let mut types = Vec::new();
        for branch in branches {
            let Value::Object(branch) = branch else {
                continue;
            };
            if branch.get("type").and_then(Value::as_str) == Some("null") {
                node.insert("nullable".into(), true.into());
                continue;
            }
            merge_branch(node, branch, &mut types);
        }
        types.dedup();
        if let (false, [single]) = (has_type(node), types.as_slice()) {
            node.insert("type".into(), single.clone().into());
        }
    }
}

fn merge_branch(
    node: &mut Map<String, Value>,
    branch: Map<String, Value>,
    types: &mut Vec<String>,
) {
    for (key, value) in branch {
        match key.as_str() {
            "type" => {
                if let Some(t) = value.as_str() {
                    types.push(t.to_owned());
                }
            }
            "properties" => {
                let Value::Object(props) = value else {
                    continue;
                };
                let target = node
                    .entry("properties")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(target) = target {
                    for (name, prop) in props {
                        target.entry(name).or_insert(prop);
                    }
                }
            }
            "required" | "description" | "default" | "title" | "nullable" => {}
            _ => {
                node.entry(key).or_insert(value);
            }
        }
    }
}

fn is_int_or_string_pattern(node: &Map<String, Value>) -> bool {
    is_flag(node, INT_OR_STRING)
}

/// Int-or-string nodes get no `type` and the `anyOf: [{type: integer}, {type: string}]` pattern.
fn normalise_int_or_string(node: &mut Map<String, Value>) {
    if !is_flag(node, INT_OR_STRING) {
        return;
    }
    node.remove("type");
    node.remove("format");
    node.insert(
        "anyOf".into(),
        serde_json::json!([{ "type": "integer" }, { "type": "string" }]),
    );
}

/// `additionalProperties` next to `properties` becomes `x-kubernetes-preserve-unknown-fields`
/// (when it allowed anything) or is dropped; `additionalProperties: false` is dropped.
fn normalise_additional_properties(node: &mut Map<String, Value>) {
    let Some(additional) = node.get("additionalProperties") else {
        return;
    };
    let allows_anything = match additional {
        Value::Bool(b) => *b,
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    if matches!(additional, Value::Bool(false)) {
        node.remove("additionalProperties");
    } else if node.contains_key("properties") {
        node.remove("additionalProperties");
        if allows_anything {
            node.insert(PRESERVE_UNKNOWN.into(), true.into());
        }
    } else if allows_anything {
        node.remove("additionalProperties");
        node.insert(PRESERVE_UNKNOWN.into(), true.into());
    }
}

/// Maps schemars' unsigned integer formats onto the OpenAPI ones Kubernetes knows.
fn normalise_format(node: &mut Map<String, Value>) {
    let mapped = match node.get("format").and_then(Value::as_str) {
        Some("uint8" | "uint16" | "int8" | "int16" | "uint32") => "int32",
        Some("uint64" | "uint" | "int") => "int64",
        _ => return,
    };
    node.insert("format".into(), mapped.into());
}

/// Direct sub-schemas of a node: properties, items, additionalProperties and junctor branches.
fn children_mut(node: &mut Map<String, Value>) -> Vec<&mut Value> {
    let mut out = Vec::new();
    for (key, value) in node.iter_mut() {
        match (key.as_str(), value) {
            ("properties", Value::Object(props)) => out.extend(props.values_mut()),
            ("items" | "additionalProperties" | "not", v @ (Value::Object(_) | Value::Bool(_))) => {
                out.push(v);
            }
            ("items" | "anyOf" | "oneOf" | "allOf", Value::Array(branches)) => {
                out.extend(branches.iter_mut());
            }
            _ => {}
        }
    }
    out
}

/// Upstream's validation pattern of `resource.Quantity`.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Drops the long descriptions k8s-openapi attaches to `Quantity`, `IntOrString` and `Time`
/// (upstream CRDs carry none) and gives quantities upstream's [`QUANTITY_PATTERN`].
pub fn tidy_k8s_descriptions(schema: &mut Value) {
    let Value::Object(node) = schema else {
        return;
    };
    let description = node
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if description.starts_with("Quantity is a fixed-point representation") {
        node.remove("description");
        node.insert("pattern".into(), QUANTITY_PATTERN.into());
    } else if description.starts_with("IntOrString is a type that can hold")
        || description.starts_with("Time is a wrapper around time.Time")
    {
        node.remove("description");
    }
    for child in children_mut(node) {
        tidy_k8s_descriptions(child);
    }
}

/// The structural-schema rules `schema` breaks, each as `path: problem`; empty when structural.
#[must_use]
pub fn structural_violations(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check(schema, "", false, &mut out);
    out
}

fn check(schema: &Value, path: &str, in_junctor: bool, out: &mut Vec<String>) {
    let Value::Object(node) = schema else {
        out.push(format!("{path}: schema is not an object"));
        return;
    };
    for key in ["$ref", "definitions", "$defs", "$schema"] {
        if node.contains_key(key) {
            out.push(format!("{path}: has {key}"));
        }
    }
    if in_junctor {
        for key in [
            "description",
            "default",
            "nullable",
            "additionalProperties",
            "title",
        ] {
            if node.contains_key(key) {
                out.push(format!("{path}: {key} inside a junctor"));
            }
        }
    } else if !has_type(node) && !is_flag(node, INT_OR_STRING) && !is_flag(node, PRESERVE_UNKNOWN) {
        out.push(format!("{path}: no type"));
    }
    if is_flag(node, INT_OR_STRING) && node.contains_key("type") {
        out.push(format!("{path}: int-or-string with a type"));
    }
    if node.contains_key("properties") && node.contains_key("additionalProperties") {
        out.push(format!("{path}: properties with additionalProperties"));
    }
    if node.get("type").and_then(Value::as_str) == Some("array") && !node.contains_key("items") {
        out.push(format!("{path}: array without items"));
    }
    if let Some(Value::Object(props)) = node.get("properties") {
        for (name, prop) in props {
            check(prop, &format!("{path}.{name}"), in_junctor, out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child @ Value::Object(_)) = node.get(key) {
            check(child, &format!("{path}[{key}]"), in_junctor, out);
        }
    }
    for junctor in JUNCTORS {
        if let Some(Value::Array(branches)) = node.get(junctor) {
            if !is_flag(node, INT_OR_STRING) {
                out.push(format!("{path}: unexpected {junctor}"));
            }
            for (i, branch) in branches.iter().enumerate() {
                check(branch, &format!("{path}.{junctor}[{i}]"), true, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_get_the_int_or_string_pattern_without_a_type() {
        let mut s =
            json!({"type": "object", "properties": {"q": {"x-kubernetes-int-or-string": true}}});
        structuralize(&mut s);
        assert_eq!(
            s["properties"]["q"],
            json!({"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]})
        );
        assert!(structural_violations(&s).is_empty());
    }

    #[test]
    fn flattened_branches_are_merged_into_the_parent() {
        let mut s = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "anyOf": [{"type": "object", "properties": {"pod": {"type": "object"}}, "description": "x"}]
        });
        structuralize(&mut s);
        assert!(s.get("anyOf").is_none());
        assert_eq!(s["properties"]["pod"], json!({"type": "object"}));
        assert!(structural_violations(&s).is_empty());
    }

    #[test]
    fn untyped_values_preserve_unknown_fields() {
        let mut s = json!({"type": "object", "properties": {"v": true, "w": {}}, "additionalProperties": true});
        structuralize(&mut s);
        assert_eq!(
            s["properties"]["v"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
        assert_eq!(
            s["properties"]["w"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
        assert_eq!(s["x-kubernetes-preserve-unknown-fields"], json!(true));
        assert!(s.get("additionalProperties").is_none());
    }

    #[test]
    fn nullable_type_arrays_become_nullable_flags() {
        let mut s = json!({"type": ["string", "null"], "enum": ["A", null], "format": "uint32"});
        structuralize(&mut s);
        assert_eq!(
            s,
            json!({"type": "string", "nullable": true, "enum": ["A"], "format": "int32"})
        );
    }

    #[test]
    fn quantity_descriptions_become_patterns() {
        let mut s = json!({"type": "object", "properties": {"q": {
            "description": "Quantity is a fixed-point representation of a number.",
            "x-kubernetes-int-or-string": true
        }}});
        tidy_k8s_descriptions(&mut s);
        assert_eq!(s["properties"]["q"]["pattern"], json!(QUANTITY_PATTERN));
        assert!(s["properties"]["q"].get("description").is_none());
    }

    #[test]
    fn violations_are_reported_with_their_path() {
        let s = json!({"type": "object", "properties": {"a": {"$ref": "#/x"}, "b": {"anyOf": [{"type": "string"}]}}});
        let v = structural_violations(&s);
        assert!(v.iter().any(|m| m == ".a: has $ref"), "{v:?}");
        assert!(v.iter().any(|m| m == ".b: unexpected anyOf"), "{v:?}");
    }
}
