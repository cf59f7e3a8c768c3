//! `/openapi/v3`: the index and one document per group version; `/openapi/v2`: an empty
//! Swagger document.
//!
//! Each document has the paths of every resource with a PATCH operation carrying
//! `x-kubernetes-group-version-kind` and the `fieldValidation` parameter (kubectl checks
//! for it before `create`/`apply`/`replace`), and a component schema per kind: the CRD's
//! `openAPIV3Schema` for custom resources (so `kubectl explain` works), a skeleton for
//! built-ins. The strategic-merge-patch content type is deliberately not listed, so kubectl
//! computes client-side apply patches from its compiled-in types.
//!
//! kubectl reads `/openapi/v2` (protobuf only) for one case: a `v1` `List` (what `kubectl get
//! -o json` of several objects prints), whose kind has no PATCH operation, so kubectl validates
//! it client-side against the v2 definitions before creating the items one by one. The v2
//! document has no definitions: kubectl skips client-side checks of kinds it finds no
//! definition for, and every item is still validated by this server (`fieldValidation`) as it
//! is created.

use std::hash::{DefaultHasher, Hash, Hasher};

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::sync::Arc;

use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::{ApiError, json_response};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The component schema name of a kind (`io.kubevirt.v1.VirtualMachine`).
pub fn schema_name(r: &ResourceInfo) -> String {
    if r.is_custom() {
        let reversed: Vec<&str> = r.group.split('.').rev().collect();
        format!("{}.{}.{}", reversed.join("."), r.version, r.kind)
    } else {
        let g = if r.group.is_empty() {
            "core"
        } else {
            r.group.split('.').next().unwrap_or("core")
        };
        format!("io.k8s.api.{g}.{}.{}", r.version, r.kind)
    }
}

fn param(name: &str, location: &str, description: &str) -> Value {
    json!({"name": name, "in": location, "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        param(
            "dryRun",
            "query",
            "When present, indicates that modifications should not be persisted.",
        ),
        param(
            "fieldManager",
            "query",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
        ),
        param(
            "fieldValidation",
            "query",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
        ),
    ]
}

fn operation(r: &ResourceInfo, action: &str, with_body: bool, patch: bool) -> Value {
    let reference = json!({"$ref": format!("#/components/schemas/{}", schema_name(r))});
    let mut op = json!({
        "operationId": format!("{action}{}", r.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": reference.clone()}}}},
    });
    if with_body {
        op["parameters"] = json!(write_params());
        let content = if patch {
            let s = json!({"schema": {"type": "object"}});
            json!({"application/json-patch+json": s, "application/merge-patch+json": s, "application/apply-patch+yaml": s})
        } else {
            json!({"application/json": {"schema": reference}})
        };
        op["requestBody"] = json!({"content": content, "required": true});
    }
    op
}

fn paths_of(r: &ResourceInfo) -> Vec<(String, Value)> {
    let base = format!("/{}", gv_path(&r.group, &r.version));
    let coll = if r.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", r.plural)
    } else {
        format!("{base}/{}", r.plural)
    };
    let item = format!("{coll}/{{name}}");
    let mut out = vec![
        (
            coll,
            json!({"get": operation(r, "list", false, false), "post": operation(r, "post", true, false), "delete": operation(r, "deletecollection", false, false)}),
        ),
        (
            item.clone(),
            json!({"get": operation(r, "get", false, false), "put": operation(r, "put", true, false), "patch": operation(r, "patch", true, true), "delete": operation(r, "delete", false, false)}),
        ),
    ];
    if r.has_status() {
        out.push((
            format!("{item}/status"),
            json!({"get": operation(r, "get", false, false), "put": operation(r, "put", true, false), "patch": operation(r, "patch", true, true)}),
        ));
    }
    out
}

fn component_schema(r: &ResourceInfo) -> Value {
    let gvk = json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
    let mut schema = match r.crd.as_ref().map(|c| c.raw_schema.clone()) {
        Some(s) if s.is_object() => s,
        _ => json!({
            "description": format!("{} is served by kubevirt-rs; its full schema is not published.", r.kind),
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": true,
        }),
    };
    let props = schema
        .as_object_mut()
        .map(|m| m.entry("properties").or_insert_with(|| json!({})));
    if let Some(Value::Object(p)) = props {
        p.entry("apiVersion").or_insert_with(|| json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
        p.entry("kind").or_insert_with(|| json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
        p.entry("metadata").or_insert_with(
            || json!({"type": "object", "description": "Standard object's metadata."}),
        );
    }
    schema["x-kubernetes-group-version-kind"] = gvk;
    schema
}

/// The document of one group version, if served.
pub fn document(state: &ApiState, group: &str, version: &str) -> Option<Value> {
    let infos = state.registry.in_group_version(group, version);
    if infos.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for r in &infos {
        for (p, ops) in paths_of(r) {
            paths.insert(p, ops);
        }
        schemas.insert(schema_name(r), component_schema(r));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

fn hash_of(v: &Value) -> String {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// `GET /openapi/v3`.
pub async fn index(State(state): State<Arc<ApiState>>) -> Response {
    let mut paths = Map::new();
    for (g, versions) in state.registry.groups() {
        for v in versions {
            if let Some(doc) = document(&state, &g, &v) {
                let p = gv_path(&g, &v);
                paths.insert(
                    p.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", hash_of(&doc))}),
                );
            }
        }
    }
    json_response(200, &json!({"paths": paths}))
}

/// `GET /openapi/v3/{api/v1 | apis/g/v}`.
pub async fn group_version(
    State(state): State<Arc<ApiState>>,
    Path(path): Path<String>,
) -> Response {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let doc = match segs.as_slice() {
        ["api", v] => document(&state, "", v),
        ["apis", g, v] => document(&state, g, v),
        _ => None,
    };
    match doc {
        Some(d) => json_response(200, &d),
        None => ApiError::no_route().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn patch_operations_list_field_validation_and_the_gvk() {
        let r = Registry::new();
        let cm = r.find("", "v1", "configmaps").unwrap();
        let paths = paths_of(&cm);
        let (p, ops) = &paths[1];
        assert_eq!(p, "/api/v1/namespaces/{namespace}/configmaps/{name}");
        let patch = &ops["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "ConfigMap"
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(
            patch["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_none()
        );
    }
}

/// The Swagger 2.0 document `/openapi/v2` serves: version and title only, no paths or definitions.
const V2_SWAGGER: &str = "2.0";
const V2_TITLE: &str = "Kubernetes";
const V2_VERSION: &str = "v1.32.0";

/// The media type of the protobuf `/openapi/v2` (gnostic's `openapi.v2.Document` message).
/// kubectl asks for the older spelling with `@v1.0`, which Go's MIME parser refuses in a
/// response's `Content-Type`; kube-apiserver answers with this one, as here.
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `GET /openapi/v2`: the document as protobuf when the client accepts it, else as JSON.
pub async fn v2(headers: axum::http::HeaderMap) -> Response {
    let wants_protobuf = headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|accept| accept.contains("com.github.proto-openapi.spec.v2"));
    if !wants_protobuf {
        return json_response(
            200,
            &json!({"swagger": V2_SWAGGER, "info": {"title": V2_TITLE, "version": V2_VERSION}, "paths": {}}),
        );
    }
    (
        [(axum::http::header::CONTENT_TYPE, V2_PROTOBUF)],
        v2_protobuf(),
    )
        .into_response()
}

/// gnostic's `openapi.v2.Document` with `swagger` (1), `info` (2: `title` 1, `version` 2) and
/// an empty `paths` (8).
fn v2_protobuf() -> Vec<u8> {
    let mut info = Vec::new();
    length_delimited(&mut info, 1, V2_TITLE.as_bytes());
    length_delimited(&mut info, 2, V2_VERSION.as_bytes());
    let mut doc = Vec::new();
    length_delimited(&mut doc, 1, V2_SWAGGER.as_bytes());
    length_delimited(&mut doc, 2, &info);
    length_delimited(&mut doc, 8, &[]);
    doc
}

/// Appends field `number` with wire type 2 (length-delimited) holding `payload`.
fn length_delimited(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    varint(out, u64::from(number << 3 | 2));
    varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod v2_tests {
    use super::*;

    #[test]
    fn the_v2_protobuf_document_is_swagger_two_with_its_info_and_empty_paths() {
        let mut expected = b"\x0a\x032.0\x12\x15".to_vec();
        expected.extend_from_slice(b"\x0a\x0aKubernetes\x12\x07v1.32.0");
        expected.extend_from_slice(b"\x42\x00");
        assert_eq!(v2_protobuf(), expected);
    }

    #[test]
    fn long_fields_get_multi_byte_lengths() {
        let mut out = Vec::new();
        length_delimited(&mut out, 1, &[0; 300]);
        assert_eq!(&out[..3], [0x0a, 0xac, 0x02]);
        assert_eq!(out.len(), 303);
    }
}
