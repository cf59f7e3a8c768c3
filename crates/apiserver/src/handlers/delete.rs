//! `DELETE` an object or a collection.
//!
//! Objects without finalizers are removed at once and answered with their last state (200).
//! Objects with finalizers get `deletionTimestamp` and stay until the last finalizer is
//! removed by an update (202). Deleting a namespace removes its contents first; deleting a
//! CRD removes its custom objects and stops serving them.
//!
//! Caveats: propagation policies are accepted, but dependents are not garbage-collected yet
//! (the seam for the collector is [`delete`]'s caller list of cascades).

use serde::Deserialize;
use serde_json::{Value, json};
use tracing::debug;

use super::common::{
    Reply, WriteOptions, admission_request, admit, decode_record, encoder, get_object, meta_mut,
    now_rfc3339, set_rv, store_error,
};
use super::list::list_objects;
use crate::admission::Operation;
use crate::registry::ResourceInfo;
use crate::selectors::Selectors;
use crate::state::ApiState;
use crate::status::ApiError;

/// `DeleteOptions` (body or query).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub propagation_policy: Option<String>,
    pub preconditions: Option<Preconditions>,
    pub orphan_dependents: Option<bool>,
    #[serde(default)]
    pub dry_run: Vec<String>,
}

/// `DeleteOptions.preconditions`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

fn check_preconditions(
    info: &ResourceInfo,
    name: &str,
    obj: &Value,
    pre: Option<&Preconditions>,
) -> Result<(), ApiError> {
    let Some(pre) = pre else { return Ok(()) };
    if let Some(uid) = &pre.uid {
        let actual = obj["metadata"]["uid"].as_str().unwrap_or("");
        if uid != actual {
            return Err(ApiError::conflict_because(
                &info.group,
                &info.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                ),
            ));
        }
    }
    if let Some(rv) = &pre.resource_version {
        let actual = obj["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if rv != actual {
            return Err(ApiError::conflict_because(
                &info.group,
                &info.plural,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                ),
            ));
        }
    }
    Ok(())
}

/// Deletes one object.
pub async fn delete(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    options: &DeleteOptions,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (old, old_rev) = get_object(state, info, ns, name)?;
        check_preconditions(info, name, &old, options.preconditions.as_ref())?;
        let mut obj = old.clone();
        let req = admission_request(Operation::Delete, info, None, ns, name, Some(&old), opts);
        let warnings = admit(state, &req, &mut obj).await?;
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
        if has_finalizers {
            if old["metadata"]["deletionTimestamp"].is_string() || opts.dry_run {
                return Ok(Reply {
                    code: 202,
                    body: old,
                    warnings,
                });
            }
            let meta = meta_mut(&mut obj);
            meta.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            meta.insert(
                "deletionGracePeriodSeconds".into(),
                json!(options.grace_period_seconds.unwrap_or(0).max(0)),
            );
            let key = info.key(ns, name);
            match super::common::timed(
                state,
                state.store.update(&key, old_rev, encoder(obj.clone())),
            )
            .await
            {
                Ok(record) => {
                    set_rv(&mut obj, record.revision);
                    return Ok(Reply {
                        code: 202,
                        body: obj,
                        warnings,
                    });
                }
                Err(kubevirt_store::StoreError::Conflict { .. }) if attempts < 5 => continue,
                Err(e) => return Err(store_error(info, name, e)),
            }
        }
        if opts.dry_run {
            return Ok(Reply {
                code: 200,
                body: old,
                warnings,
            });
        }
        // Cascades that must happen before the object goes.
        if info.group.is_empty() && info.kind == "Namespace" {
            delete_namespace_contents(state, name, opts).await?;
        }
        if info.group == "apiextensions.k8s.io" && info.kind == "CustomResourceDefinition" {
            crate::crd::delete_custom_objects(state, &old, opts).await?;
        }
        let key = info.key(ns, name);
        match super::common::timed(state, state.store.delete(&key, Some(old_rev))).await {
            Ok(record) => {
                set_rv(&mut obj, record.revision);
                debug!(key, "deleted");
                if info.group == "apiextensions.k8s.io" && info.kind == "CustomResourceDefinition" {
                    state.registry.remove_custom(name);
                }
                return Ok(Reply {
                    code: 200,
                    body: obj,
                    warnings,
                });
            }
            Err(kubevirt_store::StoreError::Conflict { .. }) if attempts < 5 => continue,
            Err(e) => return Err(store_error(info, name, e)),
        }
    }
}

/// Deletes every namespaced object in `namespace` (namespace deletion, synchronous).
async fn delete_namespace_contents(
    state: &ApiState,
    namespace: &str,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    let mut seen = std::collections::HashSet::new();
    for info in state.registry.all() {
        if !info.namespaced || !seen.insert(info.key_prefix()) {
            continue;
        }
        let prefix = info.list_prefix(Some(namespace));
        let records = state.store.list(&prefix, None, None).records;
        for r in records {
            let obj = decode_record(&r)?;
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let opts = WriteOptions {
                dry_run: false,
                ..opts.clone()
            };
            match Box::pin(delete(
                state,
                &info,
                Some(namespace),
                &name,
                &DeleteOptions::default(),
                &opts,
            ))
            .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Deletes every object of the collection that matches the selectors.
pub async fn delete_collection(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    selectors: &Selectors,
    options: &DeleteOptions,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let (items, rev, _) = list_objects(state, info, ns, selectors, None, None)?;
    let mut deleted = Vec::new();
    for item in items {
        let name = item["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let item_ns = item["metadata"]["namespace"].as_str().map(str::to_owned);
        match delete(state, info, item_ns.as_deref(), &name, options, opts).await {
            Ok(r) => deleted.push(r.body),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Reply::ok(json!({
        "kind": format!("{}List", info.kind),
        "apiVersion": info.api_version(),
        "metadata": {"resourceVersion": rev.to_string()},
        "items": deleted,
    })))
}
