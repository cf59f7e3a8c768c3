//! Validation of a custom resource against its compiled schema.
//!
//! Walks value and schema together and reports every violation as a [`Cause`], worded as
//! kube-apiserver words the errors of its OpenAPI validator after turning them into
//! `field.Error`s: the field is the value's path (`spec.items[2].name`), the message is
//! `<kind of error>: <bad value>: <detail>`, the detail names the path again
//! (`spec.replicas in body should be less than or equal to 10`).
//!
//! | rule | reason | message |
//! |---|---|---|
//! | type, format | `FieldValueTypeInvalid` | `Invalid value: "string": p in body must be of type integer: "string"` |
//! | required | `FieldValueRequired` | `Required value` |
//! | enum | `FieldValueNotSupported` | `Unsupported value: "x": supported values: "a", "b"` |
//! | maxLength | `FieldValueTooLong` | `Too long: may not be more than 8 bytes` |
//! | maxItems, maxProperties | `FieldValueTooMany` | `Too many: 4: must have at most 3 items` |
//! | list-type set/map | `FieldValueDuplicate` | `Duplicate value: "a"` (map: the key fields as JSON) |
//! | everything else | `FieldValueInvalid` | `Invalid value: 11: p in body should be less than or equal to 10` |
//!
//! Integers are JSON numbers without a fractional part (`1.0` is an integer, `1.5` is not).
//! Junctor failures (`allOf`, `anyOf`, `oneOf`, `not`) are reported on the value's path with
//! the bad value `""`, as kube-apiserver prints them.

use serde_json::{Map, Number, Value};

use super::node::{Additional, ListType, Node, Type};
use super::{child_path, go_float, go_value, index_path, quote};
use crate::cause::Cause;

const INVALID: &str = "FieldValueInvalid";
const TYPE_INVALID: &str = "FieldValueTypeInvalid";

/// Validates `value` (found at `path`) against `node`.
pub(crate) fn validate_value(value: &Value, node: &Node, path: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    validate(value, node, path, &mut causes);
    causes
}

fn validate(value: &Value, node: &Node, path: &str, out: &mut Vec<Cause>) {
    if value.is_null() && node.nullable {
        return;
    }
    if check_type(value, node, path, out) {
        match value {
            Value::String(s) => check_string(s, node, path, out),
            Value::Number(n) => check_number(n, node, path, out),
            Value::Array(items) => check_array(items, node, path, out),
            Value::Object(map) => check_object(map, node, path, out),
            Value::Null | Value::Bool(_) => {}
        }
    }
    check_enum(value, node, path, out);
    check_junctors(value, node, path, out);
}

/// The JSON type of a value as the OpenAPI validator names it.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            !n.is_f64()
                || n.as_f64()
                    .is_some_and(|f| f.is_finite() && f.fract() == 0.0)
        }
        _ => false,
    }
}

/// Reports a type mismatch; returns whether the value has an acceptable type.
fn check_type(value: &Value, node: &Node, path: &str, out: &mut Vec<Cause>) -> bool {
    let (ok, expected) = if node.int_or_string {
        (is_integer(value) || value.is_string(), "integer,string")
    } else {
        let Some(ty) = node.ty else {
            return true;
        };
        let ok = match ty {
            Type::Integer => is_integer(value),
            Type::Number => value.is_number(),
            Type::String => value.is_string(),
            Type::Boolean => value.is_boolean(),
            Type::Array => value.is_array(),
            Type::Object => value.is_object(),
        };
        (ok, ty.name())
    };
    if !ok {
        let actual = json_type(value);
        out.push(Cause::new(
            TYPE_INVALID,
            path,
            format!("Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""),
        ));
    }
    ok
}

fn invalid(out: &mut Vec<Cause>, path: &str, value: &str, detail: &str) {
    out.push(Cause::new(
        INVALID,
        path,
        format!("Invalid value: {value}: {path} in body {detail}"),
    ));
}

fn check_string(s: &str, node: &Node, path: &str, out: &mut Vec<Cause>) {
    let quoted = quote(s);
    let chars = u64::try_from(s.chars().count()).unwrap_or(u64::MAX);
    if let Some(max) = node.max_length
        && chars > max
    {
        let unit = if max == 1 { "byte" } else { "bytes" };
        out.push(Cause::new(
            "FieldValueTooLong",
            path,
            format!("Too long: may not be more than {max} {unit}"),
        ));
    }
    if let Some(min) = node.min_length
        && chars < min
    {
        invalid(
            out,
            path,
            &quoted,
            &format!("should be at least {min} chars long"),
        );
    }
    if let Some((pattern, source)) = &node.pattern
        && !pattern.is_match(s)
    {
        invalid(out, path, &quoted, &format!("should match '{source}'"));
    }
    if let Some(format) = node.format.as_deref()
        && !format_ok(format, s)
    {
        out.push(Cause::new(
            TYPE_INVALID,
            path,
            format!("Invalid value: {quoted}: {path} in body must be of type {format}: {quoted}"),
        ));
    }
}

/// The string formats checked; other formats are accepted as kube-apiserver ignores them.
fn format_ok(format: &str, s: &str) -> bool {
    match format {
        "date-time" => {
            s.parse::<jiff::Timestamp>().is_ok() || s.parse::<jiff::civil::DateTime>().is_ok()
        }
        "date" => s.len() == 10 && s.parse::<jiff::civil::Date>().is_ok(),
        _ => true,
    }
}

fn check_number(n: &Number, node: &Node, path: &str, out: &mut Vec<Cause>) {
    let Some(v) = n.as_f64() else {
        return;
    };
    let shown = go_value(&Value::Number(n.clone()));
    if let Some(max) = node.maximum {
        if max.exclusive && v >= max.value {
            invalid(
                out,
                path,
                &shown,
                &format!("should be less than {}", go_float(max.value)),
            );
        } else if !max.exclusive && v > max.value {
            let detail = format!("should be less than or equal to {}", go_float(max.value));
            invalid(out, path, &shown, &detail);
        }
    }
    if let Some(min) = node.minimum {
        if min.exclusive && v <= min.value {
            let detail = format!("should be greater than {}", go_float(min.value));
            invalid(out, path, &shown, &detail);
        } else if !min.exclusive && v < min.value {
            let detail = format!("should be greater than or equal to {}", go_float(min.value));
            invalid(out, path, &shown, &detail);
        }
    }
    if let Some(factor) = node.multiple_of {
        let quotient = v / factor;
        let off = (quotient - quotient.round()).abs();
        if !quotient.is_finite() || off > 1e-9 * quotient.abs().max(1.0) {
            let detail = format!("should be a multiple of {}", go_float(factor));
            invalid(out, path, &shown, &detail);
        }
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn too_many(out: &mut Vec<Cause>, path: &str, actual: u64, max: u64) {
    let unit = if max == 1 { "item" } else { "items" };
    out.push(Cause::new(
        "FieldValueTooMany",
        path,
        format!("Too many: {actual}: must have at most {max} {unit}"),
    ));
}

fn check_array(items: &[Value], node: &Node, path: &str, out: &mut Vec<Cause>) {
    let len = count(items.len());
    if let Some(max) = node.max_items
        && len > max
    {
        too_many(out, path, len, max);
    }
    if let Some(min) = node.min_items
        && len < min
    {
        invalid(
            out,
            path,
            &len.to_string(),
            &format!("should have at least {min} items"),
        );
    }
    if let Some(item_node) = node.items.as_deref() {
        for (i, item) in items.iter().enumerate() {
            validate(item, item_node, &index_path(path, i), out);
        }
    }
    match &node.list_type {
        Some(ListType::Set) => report_duplicates(items.iter().map(Some), path, out),
        Some(ListType::Map(keys)) => {
            let key_values = items.iter().map(|item| {
                let map = item.as_object()?;
                let key: Map<String, Value> = keys
                    .iter()
                    .filter_map(|k| map.get(k).map(|v| (k.clone(), v.clone())))
                    .collect();
                Some(Value::Object(key))
            });
            let key_values: Vec<Option<Value>> = key_values.collect();
            report_duplicates(key_values.iter().map(Option::as_ref), path, out);
        }
        Some(ListType::Atomic) | None => {}
    }
}

/// Reports every element equal to an earlier one (`None` elements are skipped).
fn report_duplicates<'a>(
    elements: impl Iterator<Item = Option<&'a Value>>,
    path: &str,
    out: &mut Vec<Cause>,
) {
    let mut seen: Vec<&Value> = Vec::new();
    for (i, element) in elements.enumerate() {
        let Some(element) = element else {
            continue;
        };
        if seen.iter().any(|s| json_equal(s, element)) {
            out.push(Cause::new(
                "FieldValueDuplicate",
                index_path(path, i),
                format!("Duplicate value: {}", go_value(element)),
            ));
        } else {
            seen.push(element);
        }
    }
}

fn check_object(map: &Map<String, Value>, node: &Node, path: &str, out: &mut Vec<Cause>) {
    let len = count(map.len());
    if let Some(max) = node.max_properties
        && len > max
    {
        too_many(out, path, len, max);
    }
    if let Some(min) = node.min_properties
        && len < min
    {
        let detail = format!("should have at least {min} properties");
        invalid(out, path, &len.to_string(), &detail);
    }
    for name in &node.required {
        if !map.contains_key(name) {
            out.push(Cause::new(
                "FieldValueRequired",
                child_path(path, name),
                "Required value",
            ));
        }
    }
    if node.embedded_resource {
        check_embedded_resource(map, path, out);
    }
    for (key, child) in map {
        let child_at = child_path(path, key);
        if node.embedded_resource && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(property) = node.properties.get(key) {
            validate(child, property, &child_at, out);
            continue;
        }
        match &node.additional {
            Additional::Schema(values) => validate(child, values, &child_at, out),
            Additional::Forbidden => out.push(Cause::new(
                INVALID,
                path,
                format!(
                    "Invalid value: {}: {child_at} in body is a forbidden property",
                    quote(key)
                ),
            )),
            Additional::Any | Additional::Unspecified => {}
        }
    }
}

/// An embedded resource needs a non-empty string `apiVersion` and `kind`.
fn check_embedded_resource(map: &Map<String, Value>, path: &str, out: &mut Vec<Cause>) {
    for key in ["apiVersion", "kind"] {
        let at = child_path(path, key);
        match map.get(key) {
            None => out.push(Cause::new(
                "FieldValueRequired",
                at,
                "Required value: must not be empty",
            )),
            Some(Value::String(s)) if s.is_empty() => out.push(Cause::new(
                INVALID,
                at,
                "Invalid value: \"\": must not be empty",
            )),
            Some(Value::String(s)) if key == "apiVersion" && s.matches('/').count() > 1 => {
                out.push(Cause::new(
                    INVALID,
                    at,
                    format!(
                        "Invalid value: {}: unexpected GroupVersion string: {s}",
                        quote(s)
                    ),
                ));
            }
            Some(Value::String(_)) => {}
            Some(other) => out.push(Cause::new(
                INVALID,
                at,
                format!("Invalid value: {}: must be a string", go_value(other)),
            )),
        }
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64() && x.as_u64() == y.as_u64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

fn check_enum(value: &Value, node: &Node, path: &str, out: &mut Vec<Cause>) {
    let Some(allowed) = &node.enumeration else {
        return;
    };
    if allowed.iter().any(|a| json_equal(a, value)) {
        return;
    }
    let supported: Vec<String> = allowed
        .iter()
        .map(|a| match a {
            Value::String(s) => quote(s),
            other => quote(&other.to_string()),
        })
        .collect();
    out.push(Cause::new(
        "FieldValueNotSupported",
        path,
        format!(
            "Unsupported value: {}: supported values: {}",
            go_value(value),
            supported.join(", ")
        ),
    ));
}

fn is_valid(value: &Value, node: &Node, path: &str) -> bool {
    let mut causes = Vec::new();
    validate(value, node, path, &mut causes);
    causes.is_empty()
}

fn check_junctors(value: &Value, node: &Node, path: &str, out: &mut Vec<Cause>) {
    let composite = |out: &mut Vec<Cause>, detail: String| {
        out.push(Cause::new(
            INVALID,
            path,
            format!("Invalid value: \"\": {path} in body {detail}"),
        ));
    };
    if !node.all_of.is_empty() {
        let mut validated = 0;
        for sub in &node.all_of {
            let causes = validate_value(value, sub, path);
            if causes.is_empty() {
                validated += 1;
            }
            out.extend(causes);
        }
        if validated != node.all_of.len() {
            let none = if validated == 0 {
                ". None validated"
            } else {
                ""
            };
            composite(out, format!("must validate all the schemas (allOf){none}"));
        }
    }
    if !node.any_of.is_empty() && !node.any_of.iter().any(|sub| is_valid(value, sub, path)) {
        composite(
            out,
            "should validate at least one schema (anyOf)".to_owned(),
        );
    }
    if !node.one_of.is_empty() {
        let valid = node
            .one_of
            .iter()
            .filter(|sub| is_valid(value, sub, path))
            .count();
        if valid == 0 {
            composite(
                out,
                "should validate one and only one schema (oneOf). Found none valid".to_owned(),
            );
        } else if valid > 1 {
            composite(
                out,
                format!(
                    "should validate one and only one schema (oneOf). Found {valid} valid alternatives"
                ),
            );
        }
    }
    if let Some(not) = node.not.as_deref()
        && is_valid(value, not, path)
    {
        composite(out, "must not validate the schema (not)".to_owned());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::cause::Cause;
    use crate::schema::Schema;
    use crate::schema::fixtures::widget_schema;

    /// A valid Widget with `spec` fields replaced by `spec_patch`.
    fn widget(spec_patch: Value) -> Value {
        let mut spec = json!({"size": 3});
        if let (Some(spec), Value::Object(patch)) = (spec.as_object_mut(), spec_patch) {
            spec.extend(patch);
        }
        json!({"apiVersion": "shop.example.com/v1", "kind": "Widget",
               "metadata": {"name": "w1"}, "spec": spec})
    }

    /// A cause as `(field, reason, message)`.
    type Row = (String, String, String);

    fn causes(object: &Value) -> Vec<Row> {
        widget_schema()
            .validate(object)
            .into_iter()
            .map(
                |Cause {
                     reason,
                     message,
                     field,
                 }| (field, reason, message),
            )
            .collect()
    }

    fn one(field: &str, reason: &str, message: &str) -> Vec<Row> {
        vec![(field.to_owned(), reason.to_owned(), message.to_owned())]
    }

    #[test]
    fn a_valid_widget_has_no_causes() {
        let object = widget(json!({
            "ratio": 0.5, "name": "bolt", "note": null, "phase": "Running", "port": "http",
            "enabled": true, "createdAt": "2024-05-01T10:00:00Z", "tags": ["a", "b"],
            "parts": [{"name": "a", "count": 2}, {"name": "b"}],
            "strategy": {"type": "Rolling", "maxUnavailable": 1},
            "labelsByZone": {"z1": {"tier": "gold"}},
            "config": {"anything": [1, "x"]},
            "template": {"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}},
            "selector": {"matchLabels": {"app": "x"}},
        }));
        assert_eq!(causes(&object), vec![]);
    }

    #[test]
    fn each_rule_reports_a_kube_style_cause() {
        let table: Vec<(Value, Vec<Row>)> = vec![
            (json!({"size": "three"}), one("spec.size", "FieldValueTypeInvalid",
                "Invalid value: \"string\": spec.size in body must be of type integer: \"string\"")),
            (json!({"size": 1.5}), one("spec.size", "FieldValueTypeInvalid",
                "Invalid value: \"number\": spec.size in body must be of type integer: \"number\"")),
            (json!({"size": 11}), one("spec.size", "FieldValueInvalid",
                "Invalid value: 11: spec.size in body should be less than or equal to 10")),
            (json!({"size": 0}), one("spec.size", "FieldValueInvalid",
                "Invalid value: 0: spec.size in body should be greater than or equal to 1")),
            (json!({"ratio": 1}), one("spec.ratio", "FieldValueInvalid",
                "Invalid value: 1: spec.ratio in body should be less than 1")),
            (json!({"ratio": 0}), one("spec.ratio", "FieldValueInvalid",
                "Invalid value: 0: spec.ratio in body should be greater than 0")),
            (json!({"ratio": 0.3}), one("spec.ratio", "FieldValueInvalid",
                "Invalid value: 0.3: spec.ratio in body should be a multiple of 0.25")),
            (json!({"name": "Bolt"}), one("spec.name", "FieldValueInvalid",
                "Invalid value: \"Bolt\": spec.name in body should match '^[a-z]+$'")),
            (json!({"name": "b"}), one("spec.name", "FieldValueInvalid",
                "Invalid value: \"b\": spec.name in body should be at least 2 chars long")),
            (json!({"name": "abcdefghij"}), one("spec.name", "FieldValueTooLong",
                "Too long: may not be more than 8 bytes")),
            (json!({"phase": "Gone"}), one("spec.phase", "FieldValueNotSupported",
                "Unsupported value: \"Gone\": supported values: \"Pending\", \"Running\"")),
            (json!({"port": true}), one("spec.port", "FieldValueTypeInvalid",
                "Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"")
                .into_iter()
                .chain(one("spec.port", "FieldValueInvalid",
                    "Invalid value: \"\": spec.port in body should validate at least one schema (anyOf)"))
                .collect()),
            (json!({"enabled": "yes"}), one("spec.enabled", "FieldValueTypeInvalid",
                "Invalid value: \"string\": spec.enabled in body must be of type boolean: \"string\"")),
            (json!({"createdAt": "yesterday"}), one("spec.createdAt", "FieldValueTypeInvalid",
                "Invalid value: \"yesterday\": spec.createdAt in body must be of type date-time: \"yesterday\"")),
            (json!({"tags": ["a", "b", "a"]}), one("spec.tags[2]", "FieldValueDuplicate",
                "Duplicate value: \"a\"")),
            (json!({"tags": ["a", "b", "c", "d"]}), one("spec.tags", "FieldValueTooMany",
                "Too many: 4: must have at most 3 items")),
            (json!({"parts": [{"name": "a"}, {"name": "b"}, {"name": "a", "count": 2}]}),
                one("spec.parts[2]", "FieldValueDuplicate", "Duplicate value: {\"name\":\"a\"}")),
            (json!({"parts": [{"count": 1}]}), one("spec.parts[0].name", "FieldValueRequired",
                "Required value")),
            (json!({"parts": [{"name": "a", "count": -1}]}), one("spec.parts[0].count", "FieldValueInvalid",
                "Invalid value: -1: spec.parts[0].count in body should be greater than or equal to 0")),
            (json!({"labelsByZone": {"a": {}, "b": {}, "c": {}, "d": {}}}), one("spec.labelsByZone",
                "FieldValueTooMany", "Too many: 4: must have at most 3 items")),
            (json!({"labelsByZone": {"a": {"tier": 1}}}), one("spec.labelsByZone.a.tier",
                "FieldValueTypeInvalid",
                "Invalid value: \"integer\": spec.labelsByZone.a.tier in body must be of type string: \"integer\"")),
            (json!({"template": {"data": {}}}), vec![
                ("spec.template.apiVersion".into(), "FieldValueRequired".into(), "Required value: must not be empty".into()),
                ("spec.template.kind".into(), "FieldValueRequired".into(), "Required value: must not be empty".into()),
            ]),
            (json!({"template": {"apiVersion": "a/b/c", "kind": ""}}), vec![
                ("spec.template.apiVersion".into(), "FieldValueInvalid".into(),
                 "Invalid value: \"a/b/c\": unexpected GroupVersion string: a/b/c".into()),
                ("spec.template.kind".into(), "FieldValueInvalid".into(), "Invalid value: \"\": must not be empty".into()),
            ]),
            (json!({"selector": {}}), one("spec.selector", "FieldValueInvalid",
                "Invalid value: \"\": spec.selector in body should validate at least one schema (anyOf)")),
            (json!({"description": null}), one("spec.description", "FieldValueTypeInvalid",
                "Invalid value: \"null\": spec.description in body must be of type string: \"null\"")),
        ];
        for (patch, expected) in table {
            let object = widget(patch.clone());
            assert_eq!(causes(&object), expected, "spec patch {patch}");
        }
    }

    #[test]
    fn integral_floats_count_as_integers() {
        assert_eq!(causes(&widget(json!({"size": 2.0, "port": 80.0}))), vec![]);
    }

    #[test]
    fn a_missing_required_field_is_reported_at_its_path() {
        let object = json!({"apiVersion": "shop.example.com/v1", "kind": "Widget", "spec": {}});
        assert_eq!(
            causes(&object),
            one("spec.size", "FieldValueRequired", "Required value")
        );
    }

    #[test]
    fn every_violation_is_reported_in_document_order() {
        let object = widget(json!({"size": 20, "name": "X1", "status": 1}));
        let fields: Vec<String> = causes(&object).into_iter().map(|c| c.0).collect();
        assert_eq!(fields, vec!["spec.size", "spec.name"]);
    }

    #[test]
    fn status_conditions_are_a_list_map_keyed_by_type() {
        let mut object = widget(json!({}));
        object["status"] = json!({"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Ready", "status": "Maybe"},
        ]});
        assert_eq!(
            causes(&object),
            vec![
                ("status.conditions[1].status".to_owned(), "FieldValueNotSupported".to_owned(),
                 "Unsupported value: \"Maybe\": supported values: \"True\", \"False\", \"Unknown\"".to_owned()),
                ("status.conditions[1]".to_owned(), "FieldValueDuplicate".to_owned(),
                 "Duplicate value: {\"type\":\"Ready\"}".to_owned()),
            ]
        );
    }

    #[test]
    fn junctors_are_checked_with_kube_messages() {
        let schema = Schema::compile(&json!({
            "type": "object",
            "properties": {"v": {
                "type": "integer",
                "allOf": [{"minimum": 0}, {"maximum": 100}],
                "oneOf": [{"multipleOf": 2}, {"multipleOf": 3}],
                "not": {"enum": [44]},
            }},
        }))
        .map_err(|e| e.to_string());
        let Ok(schema) = schema else {
            panic!("schema must compile: {schema:?}");
        };
        let messages = |v: Value| -> Vec<String> {
            schema
                .validate(&json!({"v": v}))
                .into_iter()
                .map(|c| c.message)
                .collect()
        };
        assert_eq!(messages(json!(4)), Vec::<String>::new());
        assert_eq!(
            messages(json!(6)),
            vec![
                "Invalid value: \"\": v in body should validate one and only one schema (oneOf). Found 2 valid alternatives",
            ]
        );
        assert_eq!(
            messages(json!(7)),
            vec![
                "Invalid value: \"\": v in body should validate one and only one schema (oneOf). Found none valid",
            ]
        );
        assert_eq!(
            messages(json!(44)),
            vec!["Invalid value: \"\": v in body must not validate the schema (not)",]
        );
        assert_eq!(
            messages(json!(104)),
            vec![
                "Invalid value: 104: v in body should be less than or equal to 100",
                "Invalid value: \"\": v in body must validate all the schemas (allOf)",
            ]
        );
    }

    #[test]
    fn additional_properties_false_forbids_other_keys() {
        let schema = Schema::compile(&json!({
            "type": "object",
            "properties": {"m": {"type": "object", "additionalProperties": false}},
        }))
        .map_err(|e| e.to_string());
        let Ok(schema) = schema else {
            panic!("schema must compile: {schema:?}");
        };
        let causes = schema.validate(&json!({"m": {"x": 1}}));
        assert_eq!(
            causes,
            vec![Cause::new(
                "FieldValueInvalid",
                "m",
                "Invalid value: \"x\": m.x in body is a forbidden property",
            )]
        );
    }
}
