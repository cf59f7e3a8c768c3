//! A failed sync as the VM and VMI controllers report it: upstream's reason and message.
//!
//! The VM controller shows it in the VM's `Failure` condition, the VMI controller in the VMI's
//! `Synchronized` condition; both return it from `reconcile`, so the key is retried with
//! back-off and the reason labels the error metric.

/// A failed sync: upstream's CamelCase reason (`FailedCreate`, `ErrImagePull`, …) and its
/// human-readable message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SyncFailure {
    /// The condition reason.
    pub reason: String,
    /// The condition message.
    pub message: String,
}

impl SyncFailure {
    /// A failure with `reason` and `message`.
    pub fn new(reason: &str, message: impl Into<String>) -> Self {
        Self {
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}
