//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`) → JSON.
//!
//! `kubectl create <kind>` sends protobuf and never falls back to JSON; the store keeps JSON.
//! [`decode_to_json`] bridges the two:
//!
//! 1. the envelope: the magic `k8s\0`, then a `runtime.Unknown` message
//!    `{typeMeta = 1 {apiVersion = 1, kind = 2}, raw = 2, contentEncoding = 3, contentType = 4}`;
//! 2. the `(apiVersion, kind)` pair picks a root message in the descriptor table
//!    ([`schema`], generated from Kubernetes' field numbers into `schema.txt`);
//! 3. `raw` is decoded against that table ([`decode`]) into the JSON Go would write for the
//!    same object, with `apiVersion` and `kind` put first.
//!
//! Every malformed input is an error, never a panic: this is a fuzz target.

mod decode;
mod fields;
mod schema;
mod wire;

use serde_json::{Map, Value as Json};

use schema::Schema;
use wire::{Reader, Value};

/// The four bytes every Kubernetes protobuf body starts with.
const MAGIC: &[u8] = b"k8s\0";

/// The kinds this module decodes, with the apiVersion each is served at. The root message
/// of each is named after the kind in `schema.txt`.
const KINDS: &[(&str, &str)] = &[
    ("v1", "Namespace"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("v1", "Pod"),
    ("v1", "Endpoints"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Event"),
    ("v1", "ResourceQuota"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "DaemonSet"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("policy/v1", "PodDisruptionBudget"),
    ("scheduling.k8s.io/v1", "PriorityClass"),
    ("coordination.k8s.io/v1", "Lease"),
    ("networking.k8s.io/v1", "Ingress"),
    ("authentication.k8s.io/v1", "TokenRequest"),
    ("authentication.k8s.io/v1", "TokenReview"),
    ("authentication.k8s.io/v1", "SelfSubjectReview"),
    ("authorization.k8s.io/v1", "SubjectAccessReview"),
    ("authorization.k8s.io/v1", "LocalSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"),
];

/// Why a protobuf body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    /// The body does not start with the `k8s\0` magic or the envelope is malformed.
    #[error("not a Kubernetes protobuf envelope: {0}")]
    Envelope(String),
    /// The envelope names a kind this server cannot decode.
    #[error("protobuf decoding of {api_version}/{kind} is not supported")]
    UnsupportedKind { api_version: String, kind: String },
    /// The inner message is malformed.
    #[error("malformed protobuf for {kind}: {message}")]
    Malformed { kind: String, message: String },
    /// The built-in descriptor table is broken (a bug of this crate).
    #[error("protobuf descriptor table: {0}")]
    Schema(#[from] &'static schema::SchemaError),
}

/// The fields of a `runtime.Unknown` envelope that matter here.
#[derive(Debug, Default, PartialEq, Eq)]
struct Envelope<'a> {
    api_version: String,
    kind: String,
    raw: &'a [u8],
    content_encoding: String,
}

fn envelope_error(e: impl std::fmt::Display) -> ProtobufError {
    ProtobufError::Envelope(e.to_string())
}

fn text(bytes: &[u8], what: &str) -> Result<String, ProtobufError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| ProtobufError::Envelope(format!("{what} is not valid UTF-8")))
}

/// Parses the magic and the `runtime.Unknown` message around the object.
fn envelope(body: &[u8]) -> Result<Envelope<'_>, ProtobufError> {
    let Some(rest) = body.strip_prefix(MAGIC) else {
        return Err(ProtobufError::Envelope("missing k8s\\0 magic".into()));
    };
    let mut out = Envelope::default();
    let mut reader = Reader::new(rest);
    while let Some((number, value)) = reader.next_field().map_err(envelope_error)? {
        match (number, value) {
            (1, Value::Len(type_meta)) => {
                let mut tm = Reader::new(type_meta);
                while let Some((n, v)) = tm.next_field().map_err(envelope_error)? {
                    match (n, v) {
                        (1, Value::Len(b)) => out.api_version = text(b, "apiVersion")?,
                        (2, Value::Len(b)) => out.kind = text(b, "kind")?,
                        _ => {}
                    }
                }
            }
            (2, Value::Len(raw)) => out.raw = raw,
            (3, Value::Len(b)) => out.content_encoding = text(b, "contentEncoding")?,
            (4, Value::Len(_)) => {} // contentType: the object itself is always protobuf
            (1..=4, v) => {
                return Err(ProtobufError::Envelope(format!(
                    "field {number} has wire type {}",
                    v.wire_type()
                )));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Decodes a whole request body (`k8s\0` magic + `runtime.Unknown` envelope) into the
/// object's JSON form, including `apiVersion` and `kind`.
pub fn decode_to_json(body: &[u8]) -> Result<serde_json::Value, ProtobufError> {
    let env = envelope(body)?;
    if !env.content_encoding.is_empty() {
        return Err(ProtobufError::Envelope(format!(
            "unsupported contentEncoding {:?}",
            env.content_encoding
        )));
    }
    let unsupported = || ProtobufError::UnsupportedKind {
        api_version: env.api_version.clone(),
        kind: env.kind.clone(),
    };
    if !KINDS.contains(&(env.api_version.as_str(), env.kind.as_str())) {
        return Err(unsupported());
    }
    let schema = Schema::get()?;
    let index = schema.index(&env.kind).ok_or_else(unsupported)?;
    let fields =
        decode::message(schema, index, env.raw, 0).map_err(|e| ProtobufError::Malformed {
            kind: env.kind.clone(),
            message: e.to_string(),
        })?;
    let mut object = Map::with_capacity(fields.len() + 2);
    object.insert("apiVersion".into(), Json::String(env.api_version.clone()));
    object.insert("kind".into(), Json::String(env.kind.clone()));
    object.extend(fields);
    Ok(Json::Object(object))
}

pub use fields::unknown_fields;

#[cfg(test)]
mod tests;
