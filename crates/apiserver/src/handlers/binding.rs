//! `POST pods/{name}/binding`: the scheduler's way of setting `spec.nodeName`.

use serde_json::{Value, json};

use super::common::{Reply, WriteOptions, encoder, get_object, now_rfc3339, store_error, timed};
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

/// Binds pod `name` to the node named in the Binding body.
pub async fn bind(
    state: &ApiState,
    pods: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    binding: &Value,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let node = binding["target"]["name"].as_str().unwrap_or("");
    if node.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![crate::cause::Cause::new(
                "FieldValueRequired",
                "target.name",
                "Required value",
            )],
        ));
    }
    let (mut pod, rev) = get_object(state, pods, ns, name)?;
    if let Some(current) = pod["spec"]["nodeName"].as_str().filter(|s| !s.is_empty()) {
        return Err(ApiError::conflict_because(
            "",
            "pods",
            name,
            &format!("pod {name} is already assigned to node \"{current}\""),
        ));
    }
    if pod["metadata"]["deletionTimestamp"].is_string() {
        return Err(ApiError::conflict_because(
            "",
            "pods",
            name,
            &format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    pod["spec"]["nodeName"] = json!(node);
    let mut conditions = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c["type"] != "PodScheduled");
    conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now_rfc3339()}));
    pod["status"]["conditions"] = json!(conditions);
    if !opts.dry_run {
        timed(
            state,
            state.store.update(&pods.key(ns, name), rev, encoder(pod)),
        )
        .await
        .map_err(|e| store_error(pods, name, e))?;
    }
    Ok(Reply {
        code: 201,
        body: json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        warnings: Vec::new(),
    })
}
