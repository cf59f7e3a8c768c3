//! The `scale` subresource (`autoscaling/v1` `Scale`) of Deployments, ReplicaSets and
//! CRDs that declare `subresources.scale`.
//!
//! GET renders the object's replica counts and selector as a Scale; PUT and PATCH (JSON
//! Patch and merge patch on the Scale) change only the spec replicas field of the object,
//! through the normal update path (admission sees subresource `scale`).

use serde_json::{Map, Value, json};

use super::common::{Reply, WriteOptions, get_object, object_rv};
use super::patch::PatchType;
use super::update::write_update;
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

/// `(specReplicasPath, statusReplicasPath, labelSelectorPath)` of a resource, if it has a
/// scale subresource.
fn paths(info: &ResourceInfo) -> Option<(String, String, String)> {
    if let Some(c) = &info.crd {
        return c.scale.clone();
    }
    info.subresources.iter().any(|s| s == "scale").then(|| {
        (
            ".spec.replicas".to_owned(),
            ".status.replicas".to_owned(),
            String::new(),
        )
    })
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect()
}

fn at<'a>(obj: &'a Value, path: &str) -> &'a Value {
    segments(path).iter().fold(obj, |v, k| &v[*k])
}

fn set(obj: &mut Value, path: &str, value: Value) {
    let segs = segments(path);
    let mut cur = obj;
    for (i, k) in segs.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        if i + 1 == segs.len() {
            cur[*k] = value;
            return;
        }
        cur = &mut cur[*k];
    }
}

/// A label selector object (`matchLabels`, `matchExpressions`) as a selector string.
fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = sel["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        parts.push(match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            _ => format!("!{key}"),
        });
    }
    parts.join(",")
}

/// The Scale of `obj`.
pub fn to_scale(info: &ResourceInfo, obj: &Value) -> Option<Value> {
    let (spec, status, selector) = paths(info)?;
    let sel = if selector.is_empty() {
        selector_string(&obj["spec"]["selector"])
    } else {
        at(obj, &selector).as_str().unwrap_or("").to_owned()
    };
    let m = &obj["metadata"];
    let mut scale = json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
                     "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
        "spec": {"replicas": at(obj, &spec).as_i64().unwrap_or(0)},
        "status": {"replicas": at(obj, &status).as_i64().unwrap_or(0)},
    });
    if !sel.is_empty() {
        scale["status"]["selector"] = json!(sel);
    }
    Some(scale)
}

/// GET `…/scale`.
pub fn get(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
) -> Result<Reply, ApiError> {
    let (obj, _) = get_object(state, info, ns, name)?;
    to_scale(info, &obj)
        .map(Reply::ok)
        .ok_or_else(ApiError::no_route)
}

/// PUT `…/scale` with `scale` (a Scale).
pub async fn update(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    scale: &Value,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let (spec, _, _) = paths(info).ok_or_else(ApiError::no_route)?;
    let (old, old_rev) = get_object(state, info, ns, name)?;
    if let Some(rv) = object_rv(scale)?
        && rv != old_rev
    {
        return Err(ApiError::conflict(&info.group, &info.plural, name));
    }
    let Some(replicas) = scale["spec"]["replicas"].as_i64().filter(|r| *r >= 0) else {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name,
            vec![crate::cause::Cause::new(
                "FieldValueInvalid",
                "spec.replicas",
                "Invalid value: must be greater than or equal to 0",
            )],
        ));
    };
    let mut new = old.clone();
    set(&mut new, &spec, json!(replicas));
    let reply = write_update(
        state,
        info,
        ns,
        name,
        Some("scale"),
        new,
        &old,
        old_rev,
        opts,
    )
    .await?;
    Ok(Reply {
        code: 200,
        body: to_scale(info, &reply.body).unwrap_or(Value::Null),
        warnings: reply.warnings,
    })
}

/// PATCH `…/scale`: the patch applies to the Scale, then as a PUT.
pub async fn patch(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    pt: PatchType,
    p: &Value,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let current = get(state, info, ns, name)?.body;
    let patched = match pt {
        PatchType::Json => crate::patch::json_patch(&current, p),
        PatchType::Merge | PatchType::Strategic => crate::patch::merge_patch(&current, p),
        PatchType::Apply => {
            return Err(ApiError::unsupported_media_type(
                "server-side apply is not supported",
            ));
        }
    }
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    update(state, info, ns, name, &patched, opts).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_objects_render_as_selector_strings() {
        let s = json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]});
        assert_eq!(selector_string(&s), "app=web,tier in (a,b)");
    }

    #[test]
    fn dotted_paths_read_and_write_nested_fields() {
        let mut o = json!({"spec": {}});
        set(&mut o, ".spec.replicas", json!(3));
        assert_eq!(at(&o, ".spec.replicas"), 3);
        set(&mut o, ".status.ready.count", json!(1));
        assert_eq!(o["status"]["ready"]["count"], 1);
    }
}
