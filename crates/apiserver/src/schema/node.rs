//! The compiled form of one schema node and the compiler that builds it from JSON.
//!
//! Data flow: `openAPIV3Schema` JSON → [`compile_root`] → a tree of [`Node`]s. The compiler
//! rejects schemas that are not *structural* (the rules kube-apiserver enforces on a v1 CRD),
//! so that pruning, defaulting and validation can rely on every specified field having a type.
//! Junctor subschemas (`allOf`, `anyOf`, `oneOf`, `not`) are compiled too, but only the
//! validator looks at them.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::SchemaError;

/// The JSON type a node declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Type {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

impl Type {
    fn parse(name: &str) -> Option<Type> {
        Some(match name {
            "object" => Type::Object,
            "array" => Type::Array,
            "string" => Type::String,
            "integer" => Type::Integer,
            "number" => Type::Number,
            "boolean" => Type::Boolean,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Type::Object => "object",
            Type::Array => "array",
            Type::String => "string",
            Type::Integer => "integer",
            Type::Number => "number",
            Type::Boolean => "boolean",
        }
    }
}

/// `additionalProperties` of an object node.
#[derive(Clone, Debug, Default)]
pub(crate) enum Additional {
    /// Not specified: only `properties` are known.
    #[default]
    Unspecified,
    /// `additionalProperties: false`: no other keys (treated like `Unspecified` when pruning).
    Forbidden,
    /// `additionalProperties: true`: any key, value without schema.
    Any,
    /// `additionalProperties: {schema}`: a map whose values follow the schema.
    Schema(Box<Node>),
}

/// `x-kubernetes-list-type`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ListType {
    Atomic,
    Set,
    /// A list of objects keyed by the `x-kubernetes-list-map-keys` fields.
    Map(Vec<String>),
}

/// A numeric bound (`minimum`/`maximum`) and whether it is exclusive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound {
    pub(crate) value: f64,
    pub(crate) exclusive: bool,
}

/// One compiled schema node.
#[derive(Clone, Debug, Default)]
pub(crate) struct Node {
    pub(crate) ty: Option<Type>,
    pub(crate) format: Option<String>,
    pub(crate) nullable: bool,
    pub(crate) default: Option<Value>,
    pub(crate) properties: BTreeMap<String, Node>,
    pub(crate) additional: Additional,
    pub(crate) items: Option<Box<Node>>,
    pub(crate) required: Vec<String>,
    pub(crate) enumeration: Option<Vec<Value>>,
    /// The compiled `pattern` and its text as written in the schema.
    pub(crate) pattern: Option<(Regex, String)>,
    pub(crate) minimum: Option<Bound>,
    pub(crate) maximum: Option<Bound>,
    pub(crate) multiple_of: Option<f64>,
    pub(crate) min_length: Option<u64>,
    pub(crate) max_length: Option<u64>,
    pub(crate) min_items: Option<u64>,
    pub(crate) max_items: Option<u64>,
    pub(crate) min_properties: Option<u64>,
    pub(crate) max_properties: Option<u64>,
    pub(crate) int_or_string: bool,
    pub(crate) preserve_unknown: bool,
    pub(crate) embedded_resource: bool,
    pub(crate) list_type: Option<ListType>,
    pub(crate) all_of: Vec<Node>,
    pub(crate) any_of: Vec<Node>,
    pub(crate) one_of: Vec<Node>,
    pub(crate) not: Option<Box<Node>>,
}

/// Keywords a v1 CRD schema may not use at all.
const FORBIDDEN_KEYWORDS: &[&str] = &[
    "$ref",
    "$schema",
    "id",
    "definitions",
    "dependencies",
    "additionalItems",
    "patternProperties",
];

/// Keywords a structural schema may not set inside `allOf`/`anyOf`/`oneOf`/`not`.
const FORBIDDEN_IN_JUNCTORS: &[&str] = &[
    "type",
    "default",
    "nullable",
    "additionalProperties",
    "description",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
];

/// Where in the schema tree a node sits; decides which structural rules apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// The root of the schema.
    Root,
    /// A value of `properties`, `additionalProperties` or `items`: must have a type.
    Field,
    /// Inside a junctor: must not set types, defaults …
    Junctor,
    /// A junctor subschema directly under an `x-kubernetes-int-or-string` node: may say
    /// `type: integer` or `type: string`.
    IntOrStringJunctor,
}

fn err(path: &str, message: impl Into<String>) -> SchemaError {
    SchemaError {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// Compiles the root of an `openAPIV3Schema`; error paths start with `openAPIV3Schema`.
pub(crate) fn compile_root(schema: &Value) -> Result<Node, SchemaError> {
    let path = "openAPIV3Schema";
    let node = compile(schema, path, Place::Root)?;
    if node.ty != Some(Type::Object) {
        return Err(err(&format!("{path}.type"), "must be object at the root"));
    }
    check_metadata(&node, path)?;
    check_embedded_metadata(&node, path)?;
    check_junctor_fields_specified(schema, &node, path)?;
    Ok(node)
}

fn compile(schema: &Value, path: &str, place: Place) -> Result<Node, SchemaError> {
    let Value::Object(map) = schema else {
        return Err(err(path, "must be a schema object"));
    };
    for keyword in FORBIDDEN_KEYWORDS {
        if map.contains_key(*keyword) {
            return Err(err(
                &format!("{path}.{keyword}"),
                format!("{keyword} is not supported"),
            ));
        }
    }
    if matches!(place, Place::Junctor | Place::IntOrStringJunctor) {
        check_junctor_keywords(map, path, place)?;
    }
    let mut node = Node {
        ty: parse_type(map, path)?,
        format: opt_str(map, "format", path)?.map(str::to_owned),
        nullable: opt_bool(map, "nullable", path)?.unwrap_or(false),
        default: map.get("default").filter(|d| !d.is_null()).cloned(),
        required: parse_required(map, path)?,
        enumeration: parse_enum(map, path)?,
        pattern: parse_pattern(map, path)?,
        minimum: parse_bound(map, "minimum", "exclusiveMinimum", path)?,
        maximum: parse_bound(map, "maximum", "exclusiveMaximum", path)?,
        multiple_of: opt_f64(map, "multipleOf", path)?,
        min_length: opt_u64(map, "minLength", path)?,
        max_length: opt_u64(map, "maxLength", path)?,
        min_items: opt_u64(map, "minItems", path)?,
        max_items: opt_u64(map, "maxItems", path)?,
        min_properties: opt_u64(map, "minProperties", path)?,
        max_properties: opt_u64(map, "maxProperties", path)?,
        int_or_string: opt_bool(map, "x-kubernetes-int-or-string", path)?.unwrap_or(false),
        embedded_resource: opt_bool(map, "x-kubernetes-embedded-resource", path)?.unwrap_or(false),
        ..Node::default()
    };
    if let Some(false) = opt_bool(map, "x-kubernetes-preserve-unknown-fields", path)? {
        return Err(err(
            &format!("{path}.x-kubernetes-preserve-unknown-fields"),
            "must be true or undefined",
        ));
    }
    node.preserve_unknown = map.contains_key("x-kubernetes-preserve-unknown-fields");
    if let Some(true) = opt_bool(map, "uniqueItems", path)? {
        return Err(err(
            &format!("{path}.uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    if let Some(m) = node.multiple_of
        && m <= 0.0
    {
        return Err(err(&format!("{path}.multipleOf"), "must be positive"));
    }
    check_type_rules(&node, path, place)?;
    let child_place = match place {
        Place::Junctor | Place::IntOrStringJunctor => Place::Junctor,
        Place::Root | Place::Field => Place::Field,
    };
    compile_children(map, &mut node, path, child_place)?;
    compile_junctors(map, &mut node, path)?;
    node.list_type = parse_list_type(map, &node, path)?;
    check_default(&node, path)?;
    Ok(node)
}

/// Structural rules about `type` and the extensions that replace it.
fn check_type_rules(node: &Node, path: &str, place: Place) -> Result<(), SchemaError> {
    if node.int_or_string && node.ty.is_some() {
        return Err(err(
            &format!("{path}.type"),
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    if node.embedded_resource && node.ty != Some(Type::Object) {
        return Err(err(
            &format!("{path}.type"),
            "must be object if x-kubernetes-embedded-resource is true",
        ));
    }
    if matches!(place, Place::Field | Place::Root)
        && node.ty.is_none()
        && !node.int_or_string
        && !node.preserve_unknown
    {
        let message = match place {
            Place::Root => "must not be empty at the root",
            _ if path.ends_with(".items") => "must not be empty for specified array items",
            _ => "must not be empty for specified object fields",
        };
        return Err(err(&format!("{path}.type"), message));
    }
    Ok(())
}

fn compile_children(
    map: &Map<String, Value>,
    node: &mut Node,
    path: &str,
    place: Place,
) -> Result<(), SchemaError> {
    if let Some(properties) = map.get("properties") {
        let Value::Object(properties) = properties else {
            return Err(err(&format!("{path}.properties"), "must be an object"));
        };
        for (name, sub) in properties {
            let sub_path = format!("{path}.properties[{name}]");
            node.properties
                .insert(name.clone(), compile(sub, &sub_path, place)?);
        }
    }
    let additional_path = format!("{path}.additionalProperties");
    node.additional = match map.get("additionalProperties") {
        None => Additional::Unspecified,
        Some(Value::Bool(true)) => Additional::Any,
        Some(Value::Bool(false)) => Additional::Forbidden,
        Some(sub) => Additional::Schema(Box::new(compile(sub, &additional_path, place)?)),
    };
    let additional_schema = matches!(
        node.additional,
        Additional::Schema(_) | Additional::Forbidden
    );
    if !node.properties.is_empty() && additional_schema {
        return Err(err(
            &additional_path,
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if let Some(items) = map.get("items") {
        let items_path = format!("{path}.items");
        if items.is_array() {
            return Err(err(
                &items_path,
                "items must be a schema object and not an array",
            ));
        }
        node.items = Some(Box::new(compile(items, &items_path, place)?));
    }
    if node.ty == Some(Type::Array) && node.items.is_none() {
        return Err(err(&format!("{path}.items"), "must be specified"));
    }
    Ok(())
}

fn compile_junctors(
    map: &Map<String, Value>,
    node: &mut Node,
    path: &str,
) -> Result<(), SchemaError> {
    let place = if node.int_or_string {
        Place::IntOrStringJunctor
    } else {
        Place::Junctor
    };
    for (keyword, target) in [
        ("allOf", &mut node.all_of),
        ("anyOf", &mut node.any_of),
        ("oneOf", &mut node.one_of),
    ] {
        let Some(list) = map.get(keyword) else {
            continue;
        };
        let Value::Array(list) = list else {
            return Err(err(&format!("{path}.{keyword}"), "must be an array"));
        };
        for (i, sub) in list.iter().enumerate() {
            target.push(compile(sub, &format!("{path}.{keyword}[{i}]"), place)?);
        }
    }
    if let Some(sub) = map.get("not") {
        node.not = Some(Box::new(compile(
            sub,
            &format!("{path}.not"),
            Place::Junctor,
        )?));
    }
    Ok(())
}

fn check_junctor_keywords(
    map: &Map<String, Value>,
    path: &str,
    place: Place,
) -> Result<(), SchemaError> {
    for keyword in FORBIDDEN_IN_JUNCTORS {
        let Some(value) = map.get(*keyword) else {
            continue;
        };
        let int_or_string_type = place == Place::IntOrStringJunctor
            && *keyword == "type"
            && matches!(value.as_str(), Some("integer" | "string"));
        if !int_or_string_type {
            return Err(err(
                &format!("{path}.{keyword}"),
                "must not be used inside of logical junctors",
            ));
        }
    }
    Ok(())
}

/// Every property and `items` named inside a junctor must also be specified outside of it.
fn check_junctor_fields_specified(
    schema: &Value,
    node: &Node,
    path: &str,
) -> Result<(), SchemaError> {
    let Value::Object(map) = schema else {
        return Ok(());
    };
    for keyword in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = map.get(keyword) {
            for (i, sub) in list.iter().enumerate() {
                check_sub_specified(sub, node, &format!("{path}.{keyword}[{i}]"))?;
            }
        }
    }
    if let Some(sub) = map.get("not") {
        check_sub_specified(sub, node, &format!("{path}.not"))?;
    }
    if let Some(Value::Object(properties)) = map.get("properties") {
        for (name, sub) in properties {
            if let Some(child) = node.properties.get(name) {
                check_junctor_fields_specified(sub, child, &format!("{path}.properties[{name}]"))?;
            }
        }
    }
    if let (Some(items), Some(child)) = (map.get("items"), node.items.as_deref()) {
        check_junctor_fields_specified(items, child, &format!("{path}.items"))?;
    }
    if let (Some(sub), Additional::Schema(child)) =
        (map.get("additionalProperties"), &node.additional)
    {
        check_junctor_fields_specified(sub, child, &format!("{path}.additionalProperties"))?;
    }
    Ok(())
}

/// Checks one junctor subschema `sub` against the node `outer` it constrains.
fn check_sub_specified(sub: &Value, outer: &Node, path: &str) -> Result<(), SchemaError> {
    let Value::Object(map) = sub else {
        return Ok(());
    };
    if let Some(Value::Object(properties)) = map.get("properties") {
        for (name, inner) in properties {
            let inner_path = format!("{path}.properties[{name}]");
            let Some(outer_child) = outer.properties.get(name) else {
                return Err(err(
                    &inner_path,
                    "must have a properties value outside of the logical junctors",
                ));
            };
            check_sub_specified(inner, outer_child, &inner_path)?;
        }
    }
    if let Some(items) = map.get("items") {
        let items_path = format!("{path}.items");
        let Some(outer_items) = outer.items.as_deref() else {
            return Err(err(
                &items_path,
                "must have an items value outside of the logical junctors",
            ));
        };
        check_sub_specified(items, outer_items, &items_path)?;
    }
    for keyword in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = map.get(keyword) {
            for (i, nested) in list.iter().enumerate() {
                check_sub_specified(nested, outer, &format!("{path}.{keyword}[{i}]"))?;
            }
        }
    }
    if let Some(nested) = map.get("not") {
        check_sub_specified(nested, outer, &format!("{path}.not"))?;
    }
    Ok(())
}

/// `metadata` at a resource root (the root and every `x-kubernetes-embedded-resource`) may
/// only constrain `name` and `generateName`.
fn check_metadata(node: &Node, path: &str) -> Result<(), SchemaError> {
    let Some(metadata) = node.properties.get("metadata") else {
        return Ok(());
    };
    let meta_path = format!("{path}.properties[metadata]");
    if metadata.ty != Some(Type::Object) {
        return Err(err(&format!("{meta_path}.type"), "must be object"));
    }
    for name in metadata.properties.keys() {
        if name != "name" && name != "generateName" {
            return Err(err(
                &format!("{meta_path}.properties[{name}]"),
                "must not be specified: only metadata.name and metadata.generateName can be \
                 restricted",
            ));
        }
    }
    Ok(())
}

/// Applies [`check_metadata`] to every embedded resource below `node`.
fn check_embedded_metadata(node: &Node, path: &str) -> Result<(), SchemaError> {
    let children = node
        .properties
        .iter()
        .map(|(name, child)| (child, format!("{path}.properties[{name}]")))
        .chain(node.items.as_deref().map(|i| (i, format!("{path}.items"))))
        .chain(match &node.additional {
            Additional::Schema(values) => Some((&**values, format!("{path}.additionalProperties"))),
            _ => None,
        });
    for (child, child_path) in children {
        if child.embedded_resource {
            check_metadata(child, &child_path)?;
        }
        check_embedded_metadata(child, &child_path)?;
    }
    Ok(())
}

/// A default must itself be valid for its node (kube-apiserver refuses such a CRD).
fn check_default(node: &Node, path: &str) -> Result<(), SchemaError> {
    let Some(default) = &node.default else {
        return Ok(());
    };
    let mut pruned = default.clone();
    let unknown = super::prune::prune_value(&mut pruned, node, "", false);
    if let Some(first) = unknown.first() {
        return Err(err(
            &format!("{path}.default"),
            format!("must not have unknown fields, got {first:?}"),
        ));
    }
    super::defaults::default_value(&mut pruned, node);
    let causes = super::validate::validate_value(&pruned, node, "default");
    if let Some(cause) = causes.first() {
        return Err(err(&format!("{path}.default"), cause.message.clone()));
    }
    Ok(())
}

fn parse_type(map: &Map<String, Value>, path: &str) -> Result<Option<Type>, SchemaError> {
    match map.get("type") {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Type::parse(s).map(Some).ok_or_else(|| {
            err(
                &format!("{path}.type"),
                format!(
                    "Unsupported value: {s:?}: supported values: \"array\", \"boolean\", \
                     \"integer\", \"number\", \"object\", \"string\""
                ),
            )
        }),
        Some(_) => Err(err(&format!("{path}.type"), "must be a string")),
    }
}

fn parse_required(map: &Map<String, Value>, path: &str) -> Result<Vec<String>, SchemaError> {
    match map.get("required") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| err(&format!("{path}.required"), "must be a list of strings"))
            })
            .collect(),
        Some(_) => Err(err(
            &format!("{path}.required"),
            "must be a list of strings",
        )),
    }
}

fn parse_enum(map: &Map<String, Value>, path: &str) -> Result<Option<Vec<Value>>, SchemaError> {
    match map.get("enum") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(list)) => Ok(Some(list.clone())),
        Some(_) => Err(err(&format!("{path}.enum"), "must be a list")),
    }
}

fn parse_pattern(
    map: &Map<String, Value>,
    path: &str,
) -> Result<Option<(Regex, String)>, SchemaError> {
    let Some(pattern) = opt_str(map, "pattern", path)? else {
        return Ok(None);
    };
    super::pattern::compile(pattern)
        .map(|regex| Some((regex, pattern.to_owned())))
        .map_err(|e| {
            err(
                &format!("{path}.pattern"),
                format!("must be a valid regular expression, but isn't: {e}"),
            )
        })
}

fn parse_bound(
    map: &Map<String, Value>,
    key: &str,
    exclusive_key: &str,
    path: &str,
) -> Result<Option<Bound>, SchemaError> {
    let exclusive = opt_bool(map, exclusive_key, path)?.unwrap_or(false);
    let value = opt_f64(map, key, path)?;
    if exclusive && value.is_none() {
        return Err(err(
            &format!("{path}.{exclusive_key}"),
            format!("{exclusive_key} cannot be set if {key} is not set"),
        ));
    }
    Ok(value.map(|value| Bound { value, exclusive }))
}

fn parse_list_type(
    map: &Map<String, Value>,
    node: &Node,
    path: &str,
) -> Result<Option<ListType>, SchemaError> {
    let type_path = format!("{path}.x-kubernetes-list-type");
    let keys_path = format!("{path}.x-kubernetes-list-map-keys");
    let keys: Option<Vec<String>> = match map.get("x-kubernetes-list-map-keys") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(
            list.iter()
                .map(|k| {
                    k.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| err(&keys_path, "must be a list of strings"))
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err(err(&keys_path, "must be a list of strings")),
    };
    let Some(list_type) = opt_str(map, "x-kubernetes-list-type", path)? else {
        if keys.is_some() {
            return Err(err(
                &keys_path,
                "must not be set if x-kubernetes-list-type is not map",
            ));
        }
        return Ok(None);
    };
    if node.ty != Some(Type::Array) {
        return Err(err(&type_path, "must only be used if type is array"));
    }
    let items = node.items.as_deref();
    let parsed = match list_type {
        "atomic" => ListType::Atomic,
        "set" => {
            if items.is_some_and(|i| matches!(i.ty, Some(Type::Object | Type::Array))) {
                return Err(err(
                    &format!("{path}.items.type"),
                    "must be a scalar type if x-kubernetes-list-type is set",
                ));
            }
            ListType::Set
        }
        "map" => {
            let keys = keys.clone().unwrap_or_default();
            if keys.is_empty() {
                return Err(err(
                    &keys_path,
                    "must not be empty if x-kubernetes-list-type is map",
                ));
            }
            let Some(items) = items.filter(|i| i.ty == Some(Type::Object)) else {
                return Err(err(
                    &format!("{path}.items.type"),
                    "must be object if x-kubernetes-list-type is map",
                ));
            };
            for key in &keys {
                if !items.properties.contains_key(key) {
                    return Err(err(
                        &keys_path,
                        format!("entries must all be names of item properties, got {key:?}"),
                    ));
                }
            }
            ListType::Map(keys)
        }
        other => {
            return Err(err(
                &type_path,
                format!(
                    "Unsupported value: {other:?}: supported values: \"atomic\", \"set\", \"map\""
                ),
            ));
        }
    };
    if keys.is_some() && !matches!(parsed, ListType::Map(_)) {
        return Err(err(
            &keys_path,
            "must not be set if x-kubernetes-list-type is not map",
        ));
    }
    Ok(Some(parsed))
}

fn opt_str<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, SchemaError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(err(&format!("{path}.{key}"), "must be a string")),
    }
}

fn opt_bool(map: &Map<String, Value>, key: &str, path: &str) -> Result<Option<bool>, SchemaError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(err(&format!("{path}.{key}"), "must be a boolean")),
    }
}

fn opt_f64(map: &Map<String, Value>, key: &str, path: &str) -> Result<Option<f64>, SchemaError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .map(Some)
            .ok_or_else(|| err(&format!("{path}.{key}"), "must be a number")),
        Some(_) => Err(err(&format!("{path}.{key}"), "must be a number")),
    }
}

fn opt_u64(map: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, SchemaError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| err(&format!("{path}.{key}"), "must be a non-negative integer")),
        Some(_) => Err(err(
            &format!("{path}.{key}"),
            "must be a non-negative integer",
        )),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use crate::schema::Schema;
    use crate::schema::fixtures::{widget_schema, widget_schema_json};

    fn rejection(schema: &Value) -> String {
        match Schema::compile(schema) {
            Ok(_) => "compiled".to_owned(),
            Err(e) => e.to_string(),
        }
    }

    fn object_with(name: &str, property: &Value) -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {name: property.clone()}}}})
    }

    #[test]
    fn the_widget_schema_compiles() {
        assert!(Schema::compile(&widget_schema_json()).is_ok());
    }

    #[test]
    fn non_structural_schemas_are_rejected_with_the_offending_path() {
        let spec = "openAPIV3Schema.properties[spec].properties";
        let table = vec![
            (json!({"type": "string"}), "invalid schema at openAPIV3Schema.type: must be object at the root".to_owned()),
            (json!({"properties": {}}), "invalid schema at openAPIV3Schema.type: must not be empty at the root".to_owned()),
            (object_with("a", &json!({"description": "no type"})),
                format!("invalid schema at {spec}[a].type: must not be empty for specified object fields")),
            (object_with("a", &json!({"type": "array", "items": {"minimum": 1}})),
                format!("invalid schema at {spec}[a].items.type: must not be empty for specified array items")),
            (object_with("a", &json!({"$ref": "#/definitions/x"})),
                format!("invalid schema at {spec}[a].$ref: $ref is not supported")),
            (object_with("a", &json!({"type": "array"})),
                format!("invalid schema at {spec}[a].items: must be specified")),
            (object_with("a", &json!({"type": "array", "items": [{"type": "string"}]})),
                format!("invalid schema at {spec}[a].items: items must be a schema object and not an array")),
            (object_with("a", &json!({"type": "string", "pattern": "("})),
                format!("invalid schema at {spec}[a].pattern: must be a valid regular expression, but isn't: regex parse error:\n    (\n    ^\nerror: unclosed group")),
            (object_with("a", &json!({"type": "object", "anyOf": [{"type": "object"}]})),
                format!("invalid schema at {spec}[a].anyOf[0].type: must not be used inside of logical junctors")),
            (object_with("a", &json!({"type": "object", "anyOf": [{"properties": {"b": {}}}]})),
                format!("invalid schema at {spec}[a].anyOf[0].properties[b]: must have a properties value outside of the logical junctors")),
            (object_with("a", &json!({"type": "object", "properties": {"b": {"type": "string"}},
                                      "additionalProperties": {"type": "string"}})),
                format!("invalid schema at {spec}[a].additionalProperties: additionalProperties and properties are mutual exclusive")),
            (object_with("a", &json!({"type": "string", "x-kubernetes-int-or-string": true})),
                format!("invalid schema at {spec}[a].type: must be empty if x-kubernetes-int-or-string is true")),
            (object_with("a", &json!({"type": "object", "x-kubernetes-preserve-unknown-fields": false})),
                format!("invalid schema at {spec}[a].x-kubernetes-preserve-unknown-fields: must be true or undefined")),
            (object_with("a", &json!({"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "set"})),
                format!("invalid schema at {spec}[a].items.type: must be a scalar type if x-kubernetes-list-type is set")),
            (object_with("a", &json!({"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}},
                                      "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})),
                format!("invalid schema at {spec}[a].x-kubernetes-list-map-keys: entries must all be names of item properties, got \"name\"")),
            (object_with("a", &json!({"type": "integer", "maximum": 5, "default": 7})),
                format!("invalid schema at {spec}[a].default: Invalid value: 7: default in body should be less than or equal to 5")),
            (object_with("a", &json!({"type": "object", "default": {"x": 1}})),
                format!("invalid schema at {spec}[a].default: must not have unknown fields, got \"x\"")),
            (json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}),
                "invalid schema at openAPIV3Schema.properties[metadata].properties[labels]: must not be specified: only metadata.name and metadata.generateName can be restricted".to_owned()),
            (object_with("a", &json!({"type": "integer", "exclusiveMinimum": true})),
                format!("invalid schema at {spec}[a].exclusiveMinimum: exclusiveMinimum cannot be set if minimum is not set")),
        ];
        for (schema, expected) in table {
            assert_eq!(rejection(&schema), expected, "schema {schema}");
        }
    }

    #[test]
    fn int_or_string_may_name_its_two_types_in_any_of() {
        let schema = object_with(
            "port",
            &json!({
                "x-kubernetes-int-or-string": true,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": "^[a-z0-9]+$",
            }),
        );
        assert_eq!(rejection(&schema), "compiled");
    }

    #[test]
    fn preserve_unknown_fields_replaces_the_type() {
        let schema = object_with(
            "free",
            &json!({"x-kubernetes-preserve-unknown-fields": true}),
        );
        assert_eq!(rejection(&schema), "compiled");
    }

    /// Arbitrary JSON values, a few levels deep, with keys the Widget schema knows.
    fn arb_json() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("spec".to_owned()),
            Just("size".to_owned()),
            Just("parts".to_owned()),
            Just("name".to_owned()),
            Just("tags".to_owned()),
            Just("template".to_owned()),
            Just("config".to_owned()),
            Just("strategy".to_owned()),
            Just("status".to_owned()),
            Just("conditions".to_owned()),
            Just("type".to_owned()),
            "[a-z]{1,3}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-zA-Z0-9%]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn prune_default_and_validate_never_panic_on_any_json(mut value in arb_json()) {
            let schemas = [
                widget_schema(),
                Schema::compile(&json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"spec": {"type": "array", "items": {"x-kubernetes-int-or-string": true}}}}))
                    .map_err(|e| TestCaseError::fail(e.to_string()))?,
            ];
            for schema in &schemas {
                let mut copy = value.clone();
                let _ = schema.prune(&mut copy);
                schema.apply_defaults(&mut copy);
                let _ = schema.validate(&copy);
                let _ = schema.validate(&value);
            }
            let mut wrapped = json!({"spec": value.take()});
            let _ = schemas[0].prune(&mut wrapped);
            schemas[0].apply_defaults(&mut wrapped);
            let _ = schemas[0].validate(&wrapped);
        }

        #[test]
        fn compiling_any_json_never_panics(value in arb_json()) {
            let _ = Schema::compile(&value);
            let _ = Schema::compile(&json!({"type": "object", "properties": {"spec": value}}));
        }
    }
}
