//! Writing rendered objects to the API server: create, or update with a JSON patch (see
//! [`create_or_replace_dynamic`]), for objects given as JSON (any kind, with or without a Rust
//! type).

use anyhow::Context;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

/// Creates or replaces an object of a kind without a Rust type (such as an APIService), in
/// its namespace when it names one.
///
/// # Errors
/// When the object does not decode or the API server refuses the read or the write.
pub async fn create_or_replace_dynamic(
    client: kube::Client,
    object: serde_json::Value,
) -> anyhow::Result<()> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let obj: DynamicObject = serde_json::from_value(object).context("decoding the object")?;
    let types = obj
        .types
        .clone()
        .context("object without apiVersion/kind")?;
    let (group, version) = types
        .api_version
        .split_once('/')
        .unwrap_or(("", &types.api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &types.kind));
    let api: Api<DynamicObject> = match obj.metadata.namespace.as_deref() {
        Some(ns) => Api::namespaced_with(client, ns, &ar),
        None => Api::all_with(client, &ar),
    };
    let name = obj.metadata.name.clone().unwrap_or_default();
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &obj).await?;
        }
        Some(existing) => {
            let desired = serde_json::to_value(&obj).context("encoding the object")?;
            let ops = update_ops(&existing.metadata, &desired);
            let patch: json_patch::Patch =
                serde_json::from_value(serde_json::Value::Array(ops)).context("the update")?;
            api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await?;
        }
    }
    Ok(())
}

/// The JSON patch that makes an existing object what `desired` says, as upstream's operator
/// updates (it holds `patch`, not `update`, on most kinds): its labels and annotations added
/// to the existing ones, every other top-level field but `status` replaced.
fn update_ops(existing: &ObjectMeta, desired: &serde_json::Value) -> Vec<serde_json::Value> {
    let mut ops = Vec::new();
    for (key, current) in [
        ("labels", existing.labels.clone()),
        ("annotations", existing.annotations.clone()),
    ] {
        let mut merged = current.unwrap_or_default();
        if let Some(wanted) = desired["metadata"][key].as_object() {
            for (k, v) in wanted {
                merged.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
            }
        }
        ops.push(json!({"op": "add", "path": format!("/metadata/{key}"), "value": merged}));
    }
    if let Some(fields) = desired.as_object() {
        for (key, value) in fields {
            if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
                ops.push(json!({"op": "add", "path": format!("/{key}"), "value": value}));
            }
        }
    }
    ops
}
