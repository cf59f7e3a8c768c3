//! Label selectors, controller references and adoption (kube's `ControllerRefManager`).
//!
//! An owner claims the objects of its namespace that its selector matches: an orphan that
//! matches is adopted (an owner reference with `controller: true` and `blockOwnerDeletion:
//! true` is added), an object it controls that no longer matches is released (the reference
//! is removed). Both writes are JSON patches that test the object's `resourceVersion`, so
//! they never act on a changed object; a failed test is retried at the next reconcile.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

/// `namespace/name` of an object: the key of owners in work queues and expectations.
pub fn key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// Whether `selector` selects `labels`. An empty selector selects nothing here: the
/// workload kinds require a non-empty one, and kube's controllers refuse to act on
/// "everything".
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if selector_is_empty(selector) {
        return false;
    }
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// Whether a selector has no requirement at all.
pub fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
}

/// The controller reference of an object, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// The reference an owner puts on what it controls.
pub fn controller_reference<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.meta().name.clone().unwrap_or_default(),
        uid: owner.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Errors of adoption and release.
#[derive(Debug, thiserror::Error)]
#[error("{action} {kind} {name}")]
pub struct ClaimError {
    action: &'static str,
    kind: String,
    name: String,
    #[source]
    source: kube::Error,
}

/// Adopts the orphans among `candidates` that `selector` matches and releases the objects
/// `owner` controls that it no longer matches; returns the objects `owner` controls
/// afterwards (candidates of its namespace only).
///
/// # Guarantees
/// Nothing is adopted by an owner being deleted, and nothing being deleted is adopted.
pub async fn claim<O, K>(
    api: &Api<K>,
    owner: &O,
    selector: &LabelSelector,
    candidates: Vec<std::sync::Arc<K>>,
) -> Result<Vec<std::sync::Arc<K>>, ClaimError>
where
    O: Resource<DynamicType = ()>,
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let owner_uid = owner.meta().uid.clone().unwrap_or_default();
    let owner_deleting = owner.meta().deletion_timestamp.is_some();
    let mut claimed = Vec::new();
    for object in candidates {
        let matches = selector_matches(selector, object.labels());
        match controller_of(object.meta()) {
            Some(r) if r.uid == owner_uid => {
                if matches || owner_deleting {
                    claimed.push(object);
                } else {
                    release(api, &object, &owner_uid).await?;
                }
            }
            Some(_) => {}
            None => {
                if !matches || owner_deleting || object.meta().deletion_timestamp.is_some() {
                    continue;
                }
                if let Some(adopted) = adopt(api, owner, &object).await? {
                    claimed.push(std::sync::Arc::new(adopted));
                }
            }
        }
    }
    Ok(claimed)
}

async fn adopt<O, K>(api: &Api<K>, owner: &O, object: &K) -> Result<Option<K>, ClaimError>
where
    O: Resource<DynamicType = ()>,
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut refs = object.meta().owner_references.clone().unwrap_or_default();
    refs.push(controller_reference(owner));
    let patch = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version()},
        {"op": "add", "path": "/metadata/ownerReferences", "value": refs},
    ]);
    patch_refs(api, object, patch, "adopting").await
}

async fn release<K>(api: &Api<K>, object: &K, owner_uid: &str) -> Result<(), ClaimError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let refs: Vec<OwnerReference> = object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.uid != owner_uid)
        .cloned()
        .collect();
    let patch = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version()},
        {"op": "add", "path": "/metadata/ownerReferences", "value": refs},
    ]);
    patch_refs(api, object, patch, "releasing").await.map(drop)
}

async fn patch_refs<K>(
    api: &Api<K>,
    object: &K,
    patch: serde_json::Value,
    action: &'static str,
) -> Result<Option<K>, ClaimError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let name = object.name_any();
    let err = |source| ClaimError {
        action,
        kind: K::kind(&()).into_owned(),
        name: name.clone(),
        source,
    };
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| err(kube::Error::SerdeError(e)))?;
    match api
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(o) => Ok(Some(o)),
        // Gone, or changed since the cache saw it: the next reconcile decides again.
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => Ok(None),
        Err(source) => Err(err(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let selector = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["front".into(), "edge".into()]),
            }]),
        };
        assert!(selector_matches(
            &selector,
            &labels(&[("app", "web"), ("tier", "edge")])
        ));
        assert!(!selector_matches(&selector, &labels(&[("app", "web")])));
        assert!(!selector_matches(
            &selector,
            &labels(&[("app", "db"), ("tier", "edge")])
        ));
    }

    #[test]
    fn an_empty_selector_selects_nothing() {
        assert!(!selector_matches(
            &LabelSelector::default(),
            &labels(&[("a", "b")])
        ));
    }
}
