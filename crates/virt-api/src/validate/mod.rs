//! Pure admission validators: objects in, field-path [`Cause`]s out.
//!
//! One file per family: the shared VMI spec rules ([`spec`], split into [`devices`],
//! [`volumes`], [`network`] and [`misc`]), VMI create/update ([`vmi`]), VMs ([`vm`]), migrations
//! ([`migration`]), replica sets ([`replicaset`]) and pools ([`pool`]). Messages and field paths
//! follow upstream KubeVirt, so a client sees the same `details.causes[]`. No function here does
//! I/O; anything that needs other objects (the VMI of a migration) takes them as arguments.

pub mod data_volume_template;
pub mod devices;
pub mod migration;
pub mod misc;
pub mod network;
mod path;
pub mod pool;
pub mod replicaset;
pub mod spec;
pub mod vm;
pub mod vmi;
pub mod volumes;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use migration::{validate_migration, validate_migration_update};
pub use path::FieldPath;
pub use pool::validate_pool;
pub use replicaset::validate_replicaset;
pub use spec::validate_vmi_spec;
pub use vm::validate_vm;
pub use vmi::{validate_vmi_create, validate_vmi_update};

/// `StatusCause` reasons (`metav1.CauseType`).
pub mod reason {
    /// The value is not valid.
    pub const INVALID: &str = "FieldValueInvalid";
    /// A required value is missing.
    pub const REQUIRED: &str = "FieldValueRequired";
    /// The value is not one of the supported values.
    pub const NOT_SUPPORTED: &str = "FieldValueNotSupported";
    /// The value duplicates another.
    pub const DUPLICATE: &str = "FieldValueDuplicate";
    /// The value refers to something that does not exist.
    pub const NOT_FOUND: &str = "FieldValueNotFound";
    /// The change is forbidden.
    pub const FORBIDDEN: &str = "FieldValueForbidden";
}

/// One reason a request is invalid, as a Kubernetes `StatusCause`.
///
/// Serialized with the Kubernetes wire names: the reason is the JSON key `reason`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// One of the [`reason`] constants.
    pub reason: String,
    /// Human-readable message (upstream's wording).
    pub message: String,
    /// Field path, e.g. `spec.domain.devices.disks[0].name`; may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

impl Cause {
    /// A cause with the given reason, message and field.
    pub fn new(reason: &str, message: impl Into<String>, field: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
            field: field.into(),
        }
    }

    /// A `FieldValueInvalid` cause.
    pub fn invalid(message: impl Into<String>, field: impl Into<String>) -> Self {
        Self::new(reason::INVALID, message, field)
    }

    /// A `FieldValueRequired` cause.
    pub fn required(message: impl Into<String>, field: impl Into<String>) -> Self {
        Self::new(reason::REQUIRED, message, field)
    }
}

/// Labels only KubeVirt service accounts may set on VMIs, filtered from `labels`.
#[must_use]
pub fn restricted_labels(labels: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    labels
        .iter()
        .filter(|(k, _)| kubevirt_api::constants::RESTRICTED_VMI_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[cfg(test)]
mod tests;
