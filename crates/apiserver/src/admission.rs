//! The admission seam: hooks called on every write before it is stored.
//!
//! The server calls each registered [`Admission`] in order after defaulting and schema
//! validation and before the store write. A hook may mutate the object, add warnings, or
//! refuse the request with an [`ApiError`]. Webhook admission (Mutating/Validating webhook
//! configurations) plugs in here.

use serde_json::Value;

use crate::registry::ResourceInfo;
use crate::status::ApiError;

/// The write being admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

/// Everything a hook knows about the request.
#[derive(Debug)]
pub struct AdmissionRequest<'a> {
    pub operation: Operation,
    pub resource: &'a ResourceInfo,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    /// The stored object for updates and deletes.
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    /// The authenticated user name.
    pub user: &'a str,
}

/// A hook called before every write.
#[async_trait::async_trait]
pub trait Admission: Send + Sync {
    /// Admits (possibly mutating `object`) or refuses the write; returns warnings for the
    /// client. For deletes `object` is the object about to be deleted.
    async fn admit(
        &self,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError>;
}
