//! `PATCH` an object: JSON Patch, JSON merge patch, strategic merge patch (built-in kinds
//! only, as kube-apiserver), server-side apply refused with 415. The patched object then
//! goes through the update path; a write that lost a race is retried on the fresh object.

use serde_json::Value;

use super::common::{Reply, WriteOptions, get_object, object_rv};
use super::update::write_update;
use crate::patch::{PatchError, json_patch, merge_patch, strategic_merge_patch};
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

/// How often a patch without a resourceVersion is re-applied to a fresh object after
/// losing a race (kube-apiserver retries such patches until they apply; writers such as
/// controllers updating status can make a few rounds necessary, more so while admission
/// webhooks are called).
const MAX_ATTEMPTS: u32 = 20;

/// The patch flavours, by `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

const ACCEPTED: &str =
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";

impl PatchType {
    /// The patch type of a `Content-Type` header value.
    pub fn from_content_type(ct: &str) -> Result<PatchType, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
            _ => Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: {ACCEPTED}, application/strategic-merge-patch+json"
            ))),
        }
    }
}

fn patch_error(info: &ResourceInfo, name: &str, e: PatchError) -> ApiError {
    match e {
        PatchError::Invalid(m) => ApiError::bad_request(m),
        PatchError::TestFailed(m) | PatchError::PathNotFound(m) => {
            let mut err = ApiError::new(422, "Invalid", m);
            err.kind = Some(info.kind.clone());
            err.group = Some(info.group.clone());
            err.name = Some(name.to_owned());
            err
        }
    }
}

/// Applies `patch` (already parsed) to object `name`.
#[allow(clippy::too_many_arguments)]
pub async fn patch(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    subresource: Option<&str>,
    patch_type: PatchType,
    patch: &Value,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    match patch_type {
        PatchType::Apply => {
            return Err(ApiError::unsupported_media_type(
                "server-side apply (application/apply-patch+yaml) is not supported by this server yet; use client-side apply (kubectl apply without --server-side)",
            ));
        }
        PatchType::Strategic if info.is_custom() => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: {ACCEPTED}"
            )));
        }
        _ => {}
    }
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (old, old_rev) = get_object(state, info, ns, name)?;
        let patched = match patch_type {
            PatchType::Json => json_patch(&old, patch),
            PatchType::Merge => merge_patch(&old, patch),
            PatchType::Strategic => {
                strategic_merge_patch(&old, patch, &info.api_version(), &info.kind)
            }
            PatchType::Apply => unreachable!("refused above"),
        }
        .map_err(|e| patch_error(info, name, e))?;
        if !patched.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        if !(patched["metadata"].is_null() || patched["metadata"].is_object()) {
            return Err(ApiError::bad_request(
                "the patched object's metadata is not a JSON object",
            ));
        }
        // Optimistic concurrency only when the patch itself names a resourceVersion (as
        // kube-apiserver does); otherwise the patch is re-applied to the newer object.
        let explicit_rv = if patch_names_resource_version(patch_type, patch) {
            object_rv(&patched)?
        } else {
            None
        };
        if let Some(rv) = explicit_rv
            && rv != old_rev
        {
            return Err(ApiError::conflict(&info.group, &info.plural, name));
        }
        match write_update(
            state,
            info,
            ns,
            name,
            subresource,
            patched,
            &old,
            old_rev,
            opts,
        )
        .await
        {
            Err(e)
                if e.reason == "Conflict" && explicit_rv.is_none() && attempts < MAX_ATTEMPTS =>
            {
                continue;
            }
            other => return other,
        }
    }
}

/// Whether a patch sets or tests `metadata.resourceVersion`.
fn patch_names_resource_version(patch_type: PatchType, patch: &Value) -> bool {
    match patch_type {
        PatchType::Json => patch.as_array().is_some_and(|ops| {
            ops.iter()
                .any(|op| op["path"].as_str() == Some("/metadata/resourceVersion"))
        }),
        _ => !patch["metadata"]["resourceVersion"].is_null(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_patches_naming_a_resource_version_are_optimistic() {
        let json =
            serde_json::json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "3"}]);
        assert!(patch_names_resource_version(PatchType::Json, &json));
        let labels =
            serde_json::json!([{"op": "replace", "path": "/metadata/labels", "value": {}}]);
        assert!(!patch_names_resource_version(PatchType::Json, &labels));
        let merge = serde_json::json!({"metadata": {"resourceVersion": "3"}});
        assert!(patch_names_resource_version(PatchType::Merge, &merge));
        let merge = serde_json::json!({"spec": {"runStrategy": "Always"}});
        assert!(!patch_names_resource_version(PatchType::Strategic, &merge));
    }

    #[test]
    fn content_types_select_the_patch_type() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json").unwrap(),
            PatchType::Merge
        );
        assert_eq!(
            PatchType::from_content_type("application/json-patch+json; charset=utf-8").unwrap(),
            PatchType::Json
        );
        assert_eq!(
            PatchType::from_content_type("text/plain").unwrap_err().code,
            415
        );
    }
}
