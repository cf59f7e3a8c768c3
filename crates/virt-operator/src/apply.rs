//! Writing rendered objects to the API server: create, or replace on the `resourceVersion`
//! read, for objects given as JSON (any kind, with or without a Rust type).

use anyhow::Context;
use kube::api::{Api, PostParams};

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
            let mut obj = obj;
            obj.metadata.resource_version = existing.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &obj).await?;
        }
    }
    Ok(())
}
