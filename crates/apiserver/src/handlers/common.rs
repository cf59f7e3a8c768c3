//! Helpers shared by the verb handlers: decoding stored records, system metadata, the
//! write path into the store (size limits, admission, store errors → Status).

use kubevirt_store::{Encode, Record, StoreError};
use serde_json::{Map, Value, json};

use crate::admission::{AdmissionRequest, Operation, Phase};
use crate::cause::Cause;
use crate::metadata::validate_object_meta;
use crate::registry::ResourceInfo;
use crate::request::FieldValidation;
use crate::state::ApiState;
use crate::status::ApiError;

/// Largest object the store accepts (kube's etcd limit).
pub const MAX_OBJECT_BYTES: usize = 3 * 1024 * 1024 / 2;

/// Options common to writes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// Authenticated user.
    pub user: String,
    /// The caller's groups, for checks that depend on who asks (RBAC escalation); `None`
    /// for the server's own writes, which are trusted.
    pub groups: Option<Vec<String>>,
}

/// The answer of a handler before HTTP rendering.
#[derive(Clone, Debug)]
pub struct Reply {
    pub code: u16,
    pub body: Value,
    /// `Warning: 299` headers.
    pub warnings: Vec<String>,
}

impl Reply {
    pub fn ok(body: Value) -> Reply {
        Reply {
            code: 200,
            body,
            warnings: Vec::new(),
        }
    }
}

/// The current time as kube formats timestamps (`2024-01-02T03:04:05Z`).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Parses a stored record into its object (a JSON object: anything else is corrupt).
pub fn decode_record(record: &Record) -> Result<Value, ApiError> {
    let corrupt = |why: &dyn std::fmt::Display| {
        ApiError::internal(format!("stored object {} is corrupt: {why}", record.key))
    };
    let value: Value = serde_json::from_slice(&record.value).map_err(|e| corrupt(&e))?;
    if !value.is_object() {
        return Err(corrupt(&"not a JSON object"));
    }
    Ok(value)
}

/// [`decode_record`] for lists and watches: an undecodable record is skipped with a
/// warning naming its key (and counted, see [`crate::metrics::decode_error`]), so one
/// corrupt row does not fail every list of its kind.
pub fn decode_listed(record: &Record) -> Option<Value> {
    match decode_record(record) {
        Ok(value) => Some(value),
        Err(error) => {
            crate::metrics::decode_error(&record.key);
            tracing::warn!(
                key = record.key,
                revision = record.revision,
                error = %error.message,
                "skipping a stored object that cannot be decoded"
            );
            None
        }
    }
}

/// `metadata` as a mutable map, creating it if needed. `obj` must be a JSON object (request
/// bodies are checked when decoded).
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    let m = &mut obj["metadata"];
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    match m {
        Value::Object(map) => map,
        // Just replaced by an object above.
        _ => unreachable!("metadata is an object"),
    }
}

/// The store encoder: embeds the write's revision as `metadata.resourceVersion`.
pub fn encoder(mut obj: Value) -> Encode {
    Box::new(move |rev| {
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rev.to_string()));
        serde_json::to_vec(&obj).unwrap_or_default()
    })
}

/// Sets `metadata.resourceVersion` on an object we keep a copy of.
pub fn set_rv(obj: &mut Value, rev: u64) {
    meta_mut(obj).insert("resourceVersion".into(), json!(rev.to_string()));
}

/// The object's `metadata.resourceVersion` as a revision, if set.
pub fn object_rv(obj: &Value) -> Result<Option<u64>, ApiError> {
    match obj["metadata"]["resourceVersion"].as_str() {
        None | Some("") => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|_| {
            ApiError::bad_request(format!("invalid resourceVersion {s:?}: must be an integer"))
        }),
    }
}

/// Refuses objects larger than [`MAX_OBJECT_BYTES`].
pub fn check_size(obj: &Value) -> Result<(), ApiError> {
    let n = serde_json::to_vec(obj).map(|v| v.len()).unwrap_or(0);
    if n > MAX_OBJECT_BYTES {
        return Err(ApiError::too_large(format!(
            "object is too large: {n} bytes, the limit is {MAX_OBJECT_BYTES}"
        )));
    }
    Ok(())
}

/// Maps a store error of a write on `name` to the Status kube would send.
pub fn store_error(info: &ResourceInfo, name: &str, e: StoreError) -> ApiError {
    match e {
        StoreError::AlreadyExists(_) => ApiError::already_exists(&info.group, &info.plural, name),
        StoreError::NotFound(_) => ApiError::not_found(&info.group, &info.plural, name),
        StoreError::Conflict { .. } => ApiError::conflict(&info.group, &info.plural, name),
        StoreError::Compacted { requested, oldest } => {
            ApiError::expired(format!("too old resource version: {requested} ({oldest})"))
        }
        other => ApiError::internal(format!("storage error: {other}")),
    }
}

/// Schema enforcement (CRDs), metadata validation and defaulting of an object about to
/// be written. Returns warnings (unknown fields under `Warn`).
pub fn validate_object(
    info: &ResourceInfo,
    obj: &mut Value,
    field_validation: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let mut warnings = Vec::new();
    let mut causes: Vec<Cause> = Vec::new();
    if let Some(schema) = info.crd.as_ref().and_then(|c| c.schema.as_ref()) {
        let unknown = schema.prune(obj);
        warnings.extend(unknown_field_verdict(info, &unknown, field_validation)?);
        schema.apply_defaults(obj);
        causes.extend(schema.validate(obj));
    } else if field_validation != FieldValidation::Ignore && !info.is_custom() {
        // Built-ins keep their fields (the stored JSON is what was sent, as before); only the
        // verdict is kube's. Kinds the descriptor table does not describe are not checked.
        let api_version = if info.group.is_empty() {
            info.version.clone()
        } else {
            format!("{}/{}", info.group, info.version)
        };
        if let Some(unknown) = crate::protobuf::unknown_fields(&api_version, &info.kind, obj) {
            warnings.extend(unknown_field_verdict(info, &unknown, field_validation)?);
        }
    }
    causes.extend(validate_object_meta(obj, info.name_rule));
    if !info.is_custom() {
        causes.extend(crate::core_validation::validate_builtin(
            &info.group,
            &info.kind,
            obj,
        ));
    }
    if info.kind == "CustomResourceDefinition" {
        causes.extend(crate::crd::validate_crd(obj));
    }
    if !causes.is_empty() {
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
        return Err(ApiError::invalid(&info.group, &info.kind, &name, causes));
    }
    Ok(warnings)
}

/// kube's answer to `unknown` fields under `field_validation`: `Strict` refuses the object
/// (400, "strict decoding error"), `Warn` returns one warning each, `Ignore` nothing.
fn unknown_field_verdict(
    info: &ResourceInfo,
    unknown: &[String],
    field_validation: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let each = unknown.iter().map(|f| format!("unknown field \"{f}\""));
    match field_validation {
        FieldValidation::Strict => Err(ApiError::bad_request(format!(
            "{kind} in version \"{v}\" cannot be handled as a {kind}: strict decoding error: {list}",
            kind = info.kind,
            v = info.version,
            list = each.collect::<Vec<_>>().join(", ")
        ))),
        FieldValidation::Warn => Ok(each.collect()),
        FieldValidation::Ignore => Ok(Vec::new()),
    }
}

/// Runs every admission hook in `phase`; returns their warnings.
pub async fn admit(
    state: &ApiState,
    phase: Phase,
    request: &AdmissionRequest<'_>,
    obj: &mut Value,
) -> Result<Vec<String>, ApiError> {
    let mut warnings = Vec::new();
    for hook in &state.admission {
        warnings.extend(hook.admit(phase, request, obj).await?);
        // The write path indexes into the object: a hook must leave an object behind.
        if !obj.is_object() || !(obj["metadata"].is_null() || obj["metadata"].is_object()) {
            return Err(ApiError::internal(
                "Internal error occurred: an admission hook returned an object that is not a JSON object with object metadata",
            ));
        }
    }
    Ok(warnings)
}

/// Shorthand for building an [`AdmissionRequest`].
pub fn admission_request<'a>(
    operation: Operation,
    info: &'a ResourceInfo,
    subresource: Option<&'a str>,
    namespace: Option<&'a str>,
    name: &'a str,
    old_object: Option<&'a Value>,
    opts: &'a WriteOptions,
) -> AdmissionRequest<'a> {
    AdmissionRequest {
        operation,
        resource: info,
        subresource,
        namespace,
        name,
        old_object,
        dry_run: opts.dry_run,
        user: &opts.user,
        groups: opts.groups.as_deref(),
    }
}

/// Reads one object; 404 if absent.
pub fn get_object(
    state: &ApiState,
    info: &ResourceInfo,
    namespace: Option<&str>,
    name: &str,
) -> Result<(Value, u64), ApiError> {
    let key = info.key(namespace, name);
    let record = state
        .store
        .get(&key)
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
    Ok((decode_record(&record)?, record.revision))
}

/// Checks that a namespaced write names an existing namespace.
pub fn require_namespace(state: &ApiState, namespace: &str) -> Result<Value, ApiError> {
    let key = format!("/registry/core/namespaces/{namespace}");
    match state.store.get(&key) {
        Some(r) => decode_record(&r),
        None => Err(ApiError::not_found("", "namespaces", namespace)),
    }
}

/// The object without the fields a no-op comparison ignores.
pub fn comparable(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    o
}

/// `obj` with `metadata` (and `status` when `without_status`) removed: the part whose
/// change bumps `metadata.generation`.
pub fn spec_part(obj: &Value, without_status: bool) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        if without_status {
            m.remove("status");
        }
    }
    o
}

/// Awaits a store write, recording its latency.
pub async fn timed<T>(state: &ApiState, f: impl std::future::Future<Output = T>) -> T {
    let start = std::time::Instant::now();
    let out = f.await;
    state.metrics.commit(start.elapsed());
    out
}
