//! Structural-schema enforcement for CRD objects, as kube-apiserver does it.
//! (Skeleton: the signatures are the contract.)

use serde_json::Value;

use crate::cause::Cause;

/// A compiled `openAPIV3Schema` of one CRD version.
#[derive(Clone, Debug)]
pub struct Schema {}

/// A schema that cannot be compiled (not structural, bad pattern …).
#[derive(Debug, thiserror::Error)]
#[error("invalid schema at {path}: {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

impl Schema {
    /// Compiles the `openAPIV3Schema` JSON.
    pub fn compile(_schema: &Value) -> Result<Schema, SchemaError> {
        Ok(Schema {})
    }

    /// Removes fields the schema does not know (not under `x-kubernetes-preserve-unknown-fields`);
    /// returns their paths (`spec.foo`), for `fieldValidation=Strict|Warn`. `apiVersion`,
    /// `kind` and `metadata` at the root are never pruned.
    pub fn prune(&self, _object: &mut Value) -> Vec<String> {
        Vec::new()
    }

    /// Applies `default`s of the schema to absent fields.
    pub fn apply_defaults(&self, _object: &mut Value) {}

    /// Validates the (pruned, defaulted) object; every violation is one cause with its field path.
    pub fn validate(&self, _object: &Value) -> Vec<Cause> {
        Vec::new()
    }
}
