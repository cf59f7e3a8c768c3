//! JSON Patch (RFC 6902), JSON merge patch (RFC 7386) and Kubernetes strategic merge patch.
//! (Skeleton: the signatures are the contract.)

use serde_json::Value;

/// Why a patch could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document is malformed (HTTP 400 / 422 upstream).
    #[error("invalid patch: {0}")]
    Invalid(String),
    /// A JSON Patch `test` operation failed (HTTP 422 upstream? no: kube-apiserver answers 422 `Invalid`
    /// for test failures; see the module docs).
    #[error("test operation failed: {0}")]
    TestFailed(String),
    /// An operation referenced a path that does not exist.
    #[error("path not found: {0}")]
    PathNotFound(String),
}

/// Applies an RFC 6902 JSON Patch to `doc`, all-or-nothing.
pub fn json_patch(_doc: &Value, _patch: &Value) -> Result<Value, PatchError> {
    Err(PatchError::Invalid("not implemented yet".into()))
}

/// Applies an RFC 7386 merge patch.
pub fn merge_patch(_doc: &Value, _patch: &Value) -> Result<Value, PatchError> {
    Err(PatchError::Invalid("not implemented yet".into()))
}

/// Applies a strategic merge patch to a built-in kind identified by `api_version` and `kind`
/// (merge keys such as containers by `name`, `$patch`, `$retainKeys`, `$deleteFromPrimitiveList`,
/// `$setElementOrder`).
pub fn strategic_merge_patch(
    _doc: &Value,
    _patch: &Value,
    _api_version: &str,
    _kind: &str,
) -> Result<Value, PatchError> {
    Err(PatchError::Invalid("not implemented yet".into()))
}
