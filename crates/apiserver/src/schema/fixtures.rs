//! A realistic CRD schema (a `Widget` of `shop.example.com`) shared by the schema tests.

use serde_json::{Value, json};

use super::Schema;

/// The `openAPIV3Schema` of the `Widget` CRD.
pub(crate) fn widget_schema_json() -> Value {
    json!({
        "type": "object",
        "description": "A Widget is something a shop sells.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}},
            "spec": {
                "type": "object",
                "required": ["size"],
                "properties": {
                    "size": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                    "ratio": {
                        "type": "number", "minimum": 0, "exclusiveMinimum": true,
                        "maximum": 1, "exclusiveMaximum": true, "multipleOf": 0.25,
                    },
                    "name": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 8},
                    "description": {"type": "string"},
                    "note": {"type": "string", "nullable": true},
                    "phase": {"type": "string", "enum": ["Pending", "Running"]},
                    "port": {"x-kubernetes-int-or-string": true,
                             "anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "enabled": {"type": "boolean"},
                    "createdAt": {"type": "string", "format": "date-time"},
                    "tags": {
                        "type": "array", "maxItems": 3, "x-kubernetes-list-type": "set",
                        "items": {"type": "string"},
                    },
                    "parts": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string"},
                                "count": {"type": "integer", "default": 1, "minimum": 0},
                            },
                        },
                    },
                    "strategy": {
                        "type": "object",
                        "default": {"type": "Rolling"},
                        "properties": {
                            "type": {"type": "string", "enum": ["Rolling", "Recreate"]},
                            "maxUnavailable": {"x-kubernetes-int-or-string": true, "default": "25%"},
                        },
                    },
                    "labelsByZone": {
                        "type": "object",
                        "maxProperties": 3,
                        "additionalProperties": {
                            "type": "object",
                            "properties": {"tier": {"type": "string", "default": "standard"}},
                        },
                    },
                    "config": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": true,
                        "properties": {"known": {"type": "object", "properties": {"a": {"type": "integer"}}}},
                    },
                    "template": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": true,
                        "properties": {"data": {"type": "object", "additionalProperties": {"type": "string"}}},
                    },
                    "selector": {
                        "type": "object",
                        "anyOf": [{"required": ["matchLabels"]}, {"required": ["matchExpressions"]}],
                        "properties": {
                            "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "matchExpressions": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                },
            },
            "status": {
                "type": "object",
                "properties": {
                    "ready": {"type": "boolean"},
                    "conditions": {
                        "type": "array",
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["type"],
                        "items": {
                            "type": "object",
                            "required": ["type", "status"],
                            "properties": {
                                "type": {"type": "string"},
                                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                                "lastTransitionTime": {"type": "string", "format": "date-time"},
                            },
                        },
                    },
                },
            },
        },
    })
}

/// The compiled `Widget` schema.
pub(crate) fn widget_schema() -> Schema {
    match Schema::compile(&widget_schema_json()) {
        Ok(schema) => schema,
        Err(e) => panic!("the Widget fixture schema must compile: {e}"),
    }
}
