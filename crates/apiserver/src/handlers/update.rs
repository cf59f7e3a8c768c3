//! `PUT` an object (or its `status`): optimistic concurrency on `resourceVersion`,
//! status-subresource rules, generation bumps, finalizer-driven deletion.
//!
//! [`write_update`] is the shared tail of update and patch.

use serde_json::{Value, json};
use tracing::debug;

use super::common::{
    Reply, WriteOptions, admission_request, admit, check_size, comparable, encoder, get_object,
    meta_mut, object_rv, set_rv, spec_part, store_error, validate_object,
};
use super::create::check_type;
use crate::admission::{Operation, Phase};
use crate::cause::Cause;
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

/// Metadata fields a client can never change with an update.
const IMMUTABLE_META: &[&str] = &[
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "namespace",
    "name",
];

/// Builds the object to store from the old one and the client's new one.
pub fn merge_for_update(
    info: &ResourceInfo,
    subresource: Option<&str>,
    old: &Value,
    new: Value,
) -> Value {
    let mut out = match subresource {
        Some("status") => {
            let mut o = old.clone();
            match new.get("status") {
                Some(s) => o["status"] = s.clone(),
                None => {
                    if let Some(m) = o.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            o
        }
        _ => {
            let mut n = new;
            if info.has_status() {
                match old.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            n
        }
    };
    let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
    let meta = meta_mut(&mut out);
    for k in IMMUTABLE_META {
        match old_meta.get(*k) {
            Some(v) => {
                meta.insert((*k).to_owned(), v.clone());
            }
            None => {
                meta.remove(*k);
            }
        }
    }
    meta.remove("managedFields");
    // Generation: bumped when anything outside metadata (and status, when status is a
    // subresource) changed.
    let without_status = info.has_status();
    let tracks_generation = old["metadata"].get("generation").is_some();
    if tracks_generation && spec_part(old, without_status) != spec_part(&out, without_status) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0);
        meta_mut(&mut out).insert("generation".into(), json!(g + 1));
    }
    out
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Stores `new` over `old` (at `old_rev`), or deletes the object when its last finalizer
/// went away during deletion. `new` is the client's object (not yet merged).
#[allow(clippy::too_many_arguments)]
pub async fn write_update(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    subresource: Option<&str>,
    new: Value,
    old: &Value,
    old_rev: u64,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    let mut obj = merge_for_update(info, subresource, old, new);
    // Kube defaults while decoding: admission sees the defaulted object.
    if !info.is_custom() {
        crate::defaults::apply(&info.group, &info.kind, &mut obj);
    }
    if info.group == "apiextensions.k8s.io" && info.kind == "CustomResourceDefinition" {
        crate::crd::prepare_status(&mut obj);
    }
    let deleting = old["metadata"]["deletionTimestamp"].is_string();
    if deleting {
        let old_f = finalizers(old);
        let added: Vec<_> = finalizers(&obj)
            .into_iter()
            .filter(|f| !old_f.contains(f))
            .collect();
        if !added.is_empty() {
            return Err(ApiError::invalid(
                &info.group,
                &info.kind,
                name,
                vec![Cause::new(
                    "FieldValueForbidden",
                    "metadata.finalizers",
                    format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                )],
            ));
        }
    }
    let req = admission_request(
        Operation::Update,
        info,
        subresource,
        ns,
        name,
        Some(old),
        opts,
    );
    let mut warnings = admit(state, Phase::Mutating, &req, &mut obj).await?;
    warnings.extend(validate_object(info, &mut obj, opts.field_validation)?);
    warnings.extend(admit(state, Phase::Validating, &req, &mut obj).await?);
    check_size(&obj)?;
    set_rv(&mut obj, old_rev);
    if comparable(&obj) == comparable(old) {
        // A no-op write keeps the resourceVersion (kubectl relies on it for "unchanged").
        return Ok(Reply {
            code: 200,
            body: old.clone(),
            warnings,
        });
    }
    let key = info.key(ns, name);
    // As kube: an object being deleted goes once it has no finalizers left and its grace
    // period is over (a gracefully deleted pod stays until deleted with grace 0).
    let grace_over = obj["metadata"]["deletionGracePeriodSeconds"]
        .as_i64()
        .is_none_or(|g| g == 0);
    if deleting && grace_over && finalizers(&obj).is_empty() {
        if !opts.dry_run {
            let record = super::common::timed(state, state.store.delete(&key, Some(old_rev)))
                .await
                .map_err(|e| store_error(info, name, e))?;
            set_rv(&mut obj, record.revision);
            debug!(key, "last finalizer removed: deleted");
        }
        return Ok(Reply {
            code: 200,
            body: obj,
            warnings,
        });
    }
    if opts.dry_run {
        return Ok(Reply {
            code: 200,
            body: obj,
            warnings,
        });
    }
    let record = super::common::timed(
        state,
        state.store.update(&key, old_rev, encoder(obj.clone())),
    )
    .await
    .map_err(|e| store_error(info, name, e))?;
    set_rv(&mut obj, record.revision);
    if info.kind == "CustomResourceDefinition" && info.group == "apiextensions.k8s.io" {
        crate::crd::register(&state.registry, &obj);
    }
    Ok(Reply {
        code: 200,
        body: obj,
        warnings,
    })
}

/// `PUT` `new` as object `name` (or its subresource).
pub async fn update(
    state: &ApiState,
    info: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    subresource: Option<&str>,
    mut new: Value,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    check_type(info, &mut new)?;
    match new["metadata"]["name"].as_str() {
        Some(n) if n == name => {}
        None | Some("") => {
            meta_mut(&mut new).insert("name".into(), json!(name));
        }
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
    }
    if info.namespaced
        && let (Some(body_ns), Some(path_ns)) = (new["metadata"]["namespace"].as_str(), ns)
        && !body_ns.is_empty()
        && body_ns != path_ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let (old, old_rev) = get_object(state, info, ns, name)?;
    match object_rv(&new)? {
        Some(rv) if rv != old_rev => {
            return Err(ApiError::conflict(&info.group, &info.plural, name));
        }
        Some(_) => {}
        None if info.is_custom() => {
            return Err(ApiError::invalid(
                &info.group,
                &info.kind,
                name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update",
                )],
            ));
        }
        None => {}
    }
    write_update(state, info, ns, name, subresource, new, &old, old_rev, opts).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn status_update_changes_only_status() {
        let r = Registry::new();
        let pods = r.find("", "v1", "pods").unwrap();
        let old = json!({"metadata": {"name": "p", "uid": "u", "generation": 1}, "spec": {"a": 1}, "status": {"phase": "Pending"}});
        let new = json!({"metadata": {"name": "p", "uid": "other"}, "spec": {"a": 2}, "status": {"phase": "Running"}});
        let out = merge_for_update(&pods, Some("status"), &old, new);
        assert_eq!(out["spec"]["a"], 1);
        assert_eq!(out["status"]["phase"], "Running");
        assert_eq!(out["metadata"]["uid"], "u");
        assert_eq!(out["metadata"]["generation"], 1);
    }

    #[test]
    fn main_update_ignores_status_and_bumps_generation_on_spec_change() {
        let r = Registry::new();
        let pods = r.find("", "v1", "pods").unwrap();
        let old = json!({"metadata": {"name": "p", "generation": 1}, "spec": {"a": 1}, "status": {"phase": "Pending"}});
        let new = json!({"metadata": {"name": "p", "labels": {"x": "y"}}, "spec": {"a": 2}, "status": {"phase": "Running"}});
        let out = merge_for_update(&pods, None, &old, new);
        assert_eq!(out["status"]["phase"], "Pending");
        assert_eq!(out["metadata"]["generation"], 2);
        assert_eq!(out["metadata"]["labels"]["x"], "y");
    }

    #[test]
    fn label_change_does_not_bump_generation() {
        let r = Registry::new();
        let cms = r.find("", "v1", "configmaps").unwrap();
        let old = json!({"metadata": {"name": "c", "generation": 1}, "data": {"a": "1"}});
        let new = json!({"metadata": {"name": "c", "labels": {"x": "y"}}, "data": {"a": "1"}});
        let out = merge_for_update(&cms, None, &old, new);
        assert_eq!(out["metadata"]["generation"], 1);
        let old = json!({"metadata": {"name": "c"}, "data": {"a": "1"}});
        let new = json!({"metadata": {"name": "c"}, "data": {"a": "2"}});
        let out = merge_for_update(&cms, None, &old, new);
        assert!(out["metadata"].get("generation").is_none());
    }
}
