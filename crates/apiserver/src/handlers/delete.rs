//! `DELETE` an object or a collection.
//!
//! Objects without finalizers are removed at once and answered with their last state (200).
//! Objects with finalizers get `deletionTimestamp` and stay until the last finalizer is
//! removed by an update (202). Deleting a namespace removes its contents first; deleting a
//! CRD removes its custom objects and stops serving them.
//!
//! Pods bound to a node and not terminated are deleted gracefully: the first delete only sets
//! `deletionTimestamp` (now + grace) and `deletionGracePeriodSeconds`; the object goes with
//! a delete whose grace period is 0 (the node agent's, once the containers stopped).
//! `propagationPolicy`: Background deletes now and leaves the dependents to the garbage
//! collector ([`crate::gc`]); Foreground and Orphan add the `foregroundDeletion` / `orphan`
//! finalizer, which the collector acts on and removes.
//!
//! Caveat: namespace deletion removes the contents synchronously with grace period 0
//! (kube's namespace controller waits for graceful pod termination).

use serde::Deserialize;
use serde_json::{Value, json};
use tracing::debug;

use super::common::{
    Reply, WriteOptions, admission_request, admit, decode_listed, encoder, get_object, meta_mut,
    set_rv, store_error,
};
use super::list::list_objects;
use crate::admission::{Operation, Phase};
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

/// How dependents of a deleted object are treated (`propagationPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// Delete the owner now; the garbage collector deletes the dependents afterwards.
    Background,
    /// Delete the dependents first (finalizer `foregroundDeletion`), then the owner.
    Foreground,
    /// Keep the dependents, removing their references to the owner (finalizer `orphan`).
    Orphan,
}

/// The finalizer the garbage collector acts on for foreground deletion.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The finalizer the garbage collector acts on for orphaning deletion.
pub const ORPHAN_FINALIZER: &str = "orphan";

impl DeleteOptions {
    /// The requested propagation (`propagationPolicy`, else the deprecated
    /// `orphanDependents`, else Background).
    pub fn propagation(&self) -> Result<Propagation, ApiError> {
        if self.propagation_policy.is_some() && self.orphan_dependents.is_some() {
            return Err(ApiError::invalid(
                "",
                "DeleteOptions",
                "",
                vec![crate::cause::Cause::new(
                    "FieldValueInvalid",
                    "propagationPolicy",
                    "Invalid value: \"propagationPolicy\": orphanDependents and deletionPropagation cannot be both set",
                )],
            ));
        }
        match (self.propagation_policy.as_deref(), self.orphan_dependents) {
            (Some("Background") | None, None | Some(false)) => Ok(Propagation::Background),
            (Some("Foreground"), _) => Ok(Propagation::Foreground),
            (Some("Orphan"), _) | (None, Some(true)) => Ok(Propagation::Orphan),
            (Some(other), _) => Err(ApiError::invalid(
                "",
                "DeleteOptions",
                "",
                vec![crate::cause::Cause::new(
                    "FieldValueNotSupported",
                    "propagationPolicy",
                    format!(
                        "Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                )],
            )),
        }
    }
}

/// The grace period a delete of `obj` gets: only pods bound to a node and not terminated
/// are deleted gracefully (requested period, else `terminationGracePeriodSeconds`, else 30).
pub fn grace_period(info: &ResourceInfo, obj: &Value, options: &DeleteOptions) -> i64 {
    if !(info.group.is_empty() && info.kind == "Pod") {
        return 0;
    }
    let bound = obj["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let phase = obj["status"]["phase"].as_str().unwrap_or("");
    if !bound || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    options
        .grace_period_seconds
        .or_else(|| obj["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30)
        .max(0)
}

fn finalizer_list(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `now + seconds` formatted as kube formats timestamps.
fn timestamp_in(seconds: i64) -> String {
    let now = jiff::Timestamp::now();
    now.checked_add(jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(now)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// What a delete does to an object that cannot go at once.
enum Pending {
    /// Store this object (deletion marked, grace shortened or a GC finalizer added).
    Mark(Value),
    /// Already marked as asked: answer with the stored object.
    Unchanged,
}

/// Decides whether a delete of `old` is pending (finalizers, graceful pod) and how the
/// object changes; `None` when it must be removed now.
fn pending_deletion(old: &Value, grace: i64, propagation: Propagation) -> Option<Pending> {
    let deleting = old["metadata"]["deletionTimestamp"].is_string();
    let mut finals = finalizer_list(old);
    let gc_finalizer = match propagation {
        Propagation::Background => None,
        Propagation::Foreground => Some(FOREGROUND_FINALIZER),
        Propagation::Orphan => Some(ORPHAN_FINALIZER),
    };
    let mut finalizers_changed = false;
    if !deleting
        && let Some(f) = gc_finalizer
        && !finals.iter().any(|x| x == f)
    {
        finals.push(f.to_owned());
        finalizers_changed = true;
    }
    if finals.is_empty() && grace == 0 {
        return None;
    }
    let mut obj = old.clone();
    let meta = meta_mut(&mut obj);
    if deleting {
        let current = old["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0);
        if grace >= current {
            return Some(Pending::Unchanged);
        }
        if finals.is_empty() && grace == 0 {
            return None;
        }
    }
    meta.insert("deletionTimestamp".into(), json!(timestamp_in(grace)));
    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if finalizers_changed {
        meta.insert("finalizers".into(), json!(finals));
    }
    Some(Pending::Mark(obj))
}

/// Deletes one object.
///
/// Pods bound to a node are deleted gracefully (only marked until a delete with grace 0);
/// objects with finalizers are marked and stay until the last finalizer goes; Foreground
/// and Orphan propagation add the garbage collector's finalizer (see [`crate::gc`]).
pub async fn delete(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    options: &DeleteOptions,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let propagation = options.propagation()?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (old, old_rev) = get_object(state, info, ns, name)?;
        check_preconditions(info, name, &old, options.preconditions.as_ref())?;
        let mut obj = old.clone();
        let req = admission_request(Operation::Delete, info, None, ns, name, Some(&old), opts);
        let mut warnings = admit(state, Phase::Mutating, &req, &mut obj).await?;
        warnings.extend(admit(state, Phase::Validating, &req, &mut obj).await?);
        let grace = grace_period(info, &old, options);
        let code = if finalizer_list(&old).is_empty() {
            200
        } else {
            202
        };
        match pending_deletion(&old, grace, propagation) {
            Some(Pending::Unchanged) => {
                return Ok(Reply {
                    code,
                    body: old,
                    warnings,
                });
            }
            Some(Pending::Mark(mut marked)) => {
                if opts.dry_run {
                    return Ok(Reply {
                        code,
                        body: marked,
                        warnings,
                    });
                }
                let key = info.key(ns, name);
                match super::common::timed(
                    state,
                    state.store.update(&key, old_rev, encoder(marked.clone())),
                )
                .await
                {
                    Ok(record) => {
                        set_rv(&mut marked, record.revision);
                        debug!(key, grace, "marked for deletion");
                        return Ok(Reply {
                            code,
                            body: marked,
                            warnings,
                        });
                    }
                    Err(kubevirt_store::StoreError::Conflict { .. }) if attempts < 5 => continue,
                    Err(e) => return Err(store_error(info, name, e)),
                }
            }
            None => {}
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
            let Some(obj) = decode_listed(&r) else {
                continue;
            };
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let opts = WriteOptions {
                dry_run: false,
                ..opts.clone()
            };
            // Contents go at once (no graceful pod deletion): the namespace is removed
            // synchronously.
            let options = DeleteOptions {
                grace_period_seconds: Some(0),
                ..DeleteOptions::default()
            };
            match Box::pin(delete(
                state,
                &info,
                Some(namespace),
                &name,
                &options,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::{create::create, update::update};
    use kubevirt_store::Store;

    async fn setup() -> (ApiState, std::sync::Arc<ResourceInfo>) {
        let s = ApiState::new(Store::in_memory());
        let nsi = s.registry.find("", "v1", "namespaces").unwrap();
        let opts = WriteOptions::default();
        create(
            &s,
            &nsi,
            None,
            json!({"metadata": {"name": "default"}}),
            &opts,
        )
        .await
        .unwrap();
        let pods = s.registry.find("", "v1", "pods").unwrap();
        (s, pods)
    }

    async fn pod(s: &ApiState, pods: &ResourceInfo, name: &str, node: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}], "terminationGracePeriodSeconds": 45}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        create(s, pods, Some("default"), p, &WriteOptions::default())
            .await
            .unwrap()
            .body
    }

    fn stored(s: &ApiState, name: &str) -> Option<Value> {
        s.store
            .get(&format!("/registry/core/pods/default/{name}"))
            .map(|r| super::super::common::decode_record(&r).unwrap())
    }

    #[tokio::test]
    async fn a_bound_running_pod_is_only_marked_until_deleted_with_grace_zero() {
        let (s, pods) = setup().await;
        let p = pod(&s, &pods, "web", Some("node1")).await;
        let opts = WriteOptions::default();
        let r = delete(
            &s,
            &pods,
            Some("default"),
            "web",
            &DeleteOptions::default(),
            &opts,
        )
        .await
        .unwrap();
        assert_eq!(r.code, 200);
        let marked = stored(&s, "web").expect("pod stays while terminating");
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 45);
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        // A status update from the node agent does not remove it.
        let mut st = marked.clone();
        st["status"]["phase"] = json!("Running");
        update(&s, &pods, Some("default"), "web", Some("status"), st, &opts)
            .await
            .unwrap();
        assert!(stored(&s, "web").is_some());
        // A repeated delete with a longer grace changes nothing.
        let again = DeleteOptions {
            grace_period_seconds: Some(100),
            ..DeleteOptions::default()
        };
        delete(&s, &pods, Some("default"), "web", &again, &opts)
            .await
            .unwrap();
        assert_eq!(
            stored(&s, "web").unwrap()["metadata"]["deletionGracePeriodSeconds"],
            45
        );
        // The node agent's delete: grace 0 with a uid precondition.
        let wrong = DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some("other".into()),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        };
        let e = delete(&s, &pods, Some("default"), "web", &wrong, &opts)
            .await
            .unwrap_err();
        assert_eq!(e.code, 409);
        let now = DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: p["metadata"]["uid"].as_str().map(str::to_owned),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        };
        delete(&s, &pods, Some("default"), "web", &now, &opts)
            .await
            .unwrap();
        assert!(stored(&s, "web").is_none());
    }

    #[tokio::test]
    async fn unbound_and_terminated_pods_are_deleted_at_once() {
        let (s, pods) = setup().await;
        let opts = WriteOptions::default();
        pod(&s, &pods, "pending", None).await;
        delete(
            &s,
            &pods,
            Some("default"),
            "pending",
            &DeleteOptions::default(),
            &opts,
        )
        .await
        .unwrap();
        assert!(stored(&s, "pending").is_none());
        let done = pod(&s, &pods, "done", Some("node1")).await;
        let mut st = done.clone();
        st["status"]["phase"] = json!("Succeeded");
        update(
            &s,
            &pods,
            Some("default"),
            "done",
            Some("status"),
            st,
            &opts,
        )
        .await
        .unwrap();
        delete(
            &s,
            &pods,
            Some("default"),
            "done",
            &DeleteOptions::default(),
            &opts,
        )
        .await
        .unwrap();
        assert!(stored(&s, "done").is_none());
    }

    #[test]
    fn propagation_policy_values_are_checked() {
        let o = |p: Option<&str>, orphan: Option<bool>| DeleteOptions {
            propagation_policy: p.map(str::to_owned),
            orphan_dependents: orphan,
            ..DeleteOptions::default()
        };
        assert_eq!(
            o(None, None).propagation().unwrap(),
            Propagation::Background
        );
        assert_eq!(
            o(None, Some(true)).propagation().unwrap(),
            Propagation::Orphan
        );
        assert_eq!(
            o(Some("Foreground"), None).propagation().unwrap(),
            Propagation::Foreground
        );
        assert_eq!(
            o(Some("Sideways"), None).propagation().unwrap_err().code,
            422
        );
        assert_eq!(
            o(Some("Orphan"), Some(true))
                .propagation()
                .unwrap_err()
                .code,
            422
        );
    }
}
