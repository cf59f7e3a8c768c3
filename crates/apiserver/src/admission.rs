//! The admission seam: hooks called on every write before it is stored.
//!
//! The server calls each registered [`Admission`] twice per write, as kube-apiserver runs
//! its admission chain: in the [`Phase::Mutating`] phase before schema validation (a hook
//! may change the object) and in the [`Phase::Validating`] phase after it, just before the
//! store write (changes are ignored). A hook may add warnings or refuse the request with an
//! [`ApiError`]. Webhook admission ([`crate::webhook`]: Mutating/Validating webhook
//! configurations) is one such hook.

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

/// The two admission phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Before validation: hooks may change the object.
    Mutating,
    /// After validation: hooks may only refuse.
    Validating,
}

impl Operation {
    /// The operation as AdmissionReview and webhook rules spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }
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
    /// The caller's groups; `None` for the server's own writes.
    pub groups: Option<&'a [String]>,
}

/// A hook called before every write.
#[async_trait::async_trait]
pub trait Admission: Send + Sync {
    /// Admits (in the mutating phase possibly changing `object`) or refuses the write;
    /// returns warnings for the client. For deletes `object` is the object about to be
    /// deleted.
    async fn admit(
        &self,
        phase: Phase,
        request: &AdmissionRequest<'_>,
        object: &mut Value,
    ) -> Result<Vec<String>, ApiError>;
}
