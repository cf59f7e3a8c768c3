//! `POST` a new object: defaults system metadata, validates, admits and stores it.

use rand::Rng;
use serde_json::{Value, json};
use tracing::debug;

use super::common::{
    Reply, WriteOptions, admission_request, admit, check_size, encoder, meta_mut, now_rfc3339,
    require_namespace, set_rv, store_error, validate_object,
};
use crate::admission::{Operation, Phase};
use crate::registry::ResourceInfo;
use crate::state::ApiState;
use crate::status::ApiError;

const NAME_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Random characters `generateName` appends.
const SUFFIX_LEN: usize = 5;

/// Longest prefix kept from `generateName` (so a valid prefix gives a 63-character name).
const MAX_PREFIX_CHARS: usize = 63 - SUFFIX_LEN;

/// `generateName` + 5 random characters, as kube does: the prefix is cut to 58
/// characters (on a character boundary) first. The result is validated like any name.
pub fn generate_name(prefix: &str) -> String {
    let mut rng = rand::rng();
    let suffix: String = (0..SUFFIX_LEN)
        .map(|_| NAME_CHARS[rng.random_range(0..NAME_CHARS.len())] as char)
        .collect();
    let end = prefix
        .char_indices()
        .nth(MAX_PREFIX_CHARS)
        .map_or(prefix.len(), |(index, _)| index);
    format!("{}{suffix}", &prefix[..end])
}

/// Checks (and fills in) `apiVersion` and `kind` against the resource.
pub fn check_type(info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    let want_av = info.api_version();
    match obj["apiVersion"].as_str() {
        None | Some("") => obj["apiVersion"] = json!(want_av),
        Some(av) if av == want_av => {}
        // Another served version of the same resource: stored as this one.
        Some(av) if av.split('/').next() == want_av.split('/').next() && !info.group.is_empty() => {
            obj["apiVersion"] = json!(want_av);
        }
        Some(av) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            )));
        }
    }
    match obj["kind"].as_str() {
        None | Some("") => obj["kind"] = json!(info.kind),
        Some(k) if k == info.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                info.kind
            )));
        }
    }
    Ok(())
}

/// Checks the object's namespace against the request's and returns the one to use.
pub fn check_namespace(
    info: &ResourceInfo,
    path_ns: Option<&str>,
    obj: &mut Value,
) -> Result<Option<String>, ApiError> {
    if !info.namespaced {
        meta_mut(obj).remove("namespace");
        return Ok(None);
    }
    let body_ns = obj["metadata"]["namespace"]
        .as_str()
        .filter(|s| !s.is_empty());
    let ns = match (path_ns, body_ns) {
        (Some(p), Some(b)) if p != b => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        (Some(p), _) => p.to_owned(),
        (None, Some(b)) => b.to_owned(),
        (None, None) => {
            return Err(ApiError::bad_request(
                "a namespaced resource needs a namespace in the request path",
            ));
        }
    };
    meta_mut(obj).insert("namespace".into(), json!(ns));
    Ok(Some(ns))
}

/// Kind-specific changes at creation (status reset, namespace label …).
fn prepare_for_create(info: &ResourceInfo, obj: &mut Value) {
    if info.is_custom()
        && info.has_status()
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    match (info.group.as_str(), info.kind.as_str()) {
        ("", "Pod") => {
            // `qosClass` once mutating admission is through (see `create`).
            obj["status"] = json!({"phase": "Pending"});
        }
        ("", "Namespace") => {
            let name = obj["metadata"]["name"].clone();
            let labels = meta_mut(obj).entry("labels").or_insert_with(|| json!({}));
            if labels.is_object() {
                labels["kubernetes.io/metadata.name"] = name;
            }
            obj["status"] = json!({"phase": "Active"});
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            crate::crd::prepare_status(obj);
        }
        _ => {}
    }
}

/// Creates `obj` (already decoded) in `path_ns`.
pub async fn create(
    state: &ApiState,
    info: &ResourceInfo,
    path_ns: Option<&str>,
    mut obj: Value,
    opts: &WriteOptions,
) -> Result<Reply, ApiError> {
    check_type(info, &mut obj)?;
    let ns = check_namespace(info, path_ns, &mut obj)?;
    {
        let meta = meta_mut(&mut obj);
        let has_name = meta
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        if !has_name
            && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
            && !prefix.is_empty()
        {
            let name = generate_name(prefix);
            meta.insert("name".into(), json!(name));
        }
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
        ] {
            meta.remove(k);
        }
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    }
    // Kinds with a spec (and every custom resource) track spec changes in `generation`.
    if info.is_custom() || obj.get("spec").is_some() {
        meta_mut(&mut obj).insert("generation".into(), json!(1));
    }
    prepare_for_create(info, &mut obj);
    let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
    if let Some(ns) = &ns {
        let ns_obj = require_namespace(state, ns)?;
        if ns_obj["status"]["phase"] == "Terminating" {
            return Err(ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                crate::status::qualified(&info.plural, &info.group)
            )));
        }
    }
    let req = admission_request(
        Operation::Create,
        info,
        None,
        ns.as_deref(),
        &name,
        None,
        opts,
    );
    // Kube defaults while decoding: admission sees the defaulted object.
    if !info.is_custom() {
        crate::defaults::apply(&info.group, &info.kind, &mut obj);
    }
    let mut warnings = admit(state, Phase::Mutating, &req, &mut obj).await?;
    // A webhook may not rename the object.
    meta_mut(&mut obj).insert("name".into(), json!(name));
    if info.group.is_empty() && info.kind == "Pod" {
        obj["status"]["qosClass"] = json!(crate::qos::pod_qos_class(&obj));
    }
    warnings.extend(validate_object(info, &mut obj, opts.field_validation)?);
    warnings.extend(admit(state, Phase::Validating, &req, &mut obj).await?);
    check_size(&obj)?;
    let key = info.key(ns.as_deref(), &name);
    if opts.dry_run {
        if state.store.get(&key).is_some() {
            return Err(ApiError::already_exists(&info.group, &info.plural, &name));
        }
        return Ok(Reply {
            code: 201,
            body: obj,
            warnings,
        });
    }
    let record = super::common::timed(state, state.store.create(&key, encoder(obj.clone())))
        .await
        .map_err(|e| store_error(info, &name, e))?;
    set_rv(&mut obj, record.revision);
    debug!(key, revision = record.revision, "created");
    if info.kind == "CustomResourceDefinition" && info.group == "apiextensions.k8s.io" {
        crate::crd::register(&state.registry, &obj);
    }
    Ok(Reply {
        code: 201,
        body: obj,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_keep_the_prefix_and_add_five_characters() {
        let n = generate_name("vm-");
        assert!(n.starts_with("vm-"));
        assert_eq!(n.len(), 8);
        assert!(n[3..].bytes().all(|b| NAME_CHARS.contains(&b)));
    }

    #[test]
    fn long_generate_name_prefixes_are_cut_to_58_characters() {
        let n = generate_name(&"a".repeat(100));
        assert_eq!(n.len(), 63);
        assert!(n.starts_with(&"a".repeat(58)));
    }

    #[test]
    fn multi_byte_generate_name_prefixes_are_cut_on_a_character_boundary() {
        // 'é' is two bytes: byte 58 falls inside a character.
        let n = generate_name(&format!("a{}", "é".repeat(40)));
        assert_eq!(n.chars().count(), 41 + SUFFIX_LEN);
        let n = generate_name(&"日本".repeat(40));
        assert_eq!(n.chars().count(), MAX_PREFIX_CHARS + SUFFIX_LEN);
        assert!(n.starts_with(&"日本".repeat(29)));
    }
}
