//! A field-level error cause, as in `metav1.StatusCause`.

use serde::{Deserialize, Serialize};

/// One reason a request was refused, naming the field (`spec.domain.cpu.cores`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`,
    /// `FieldValueDuplicate`, `FieldValueTooLong`, `FieldValueTypeInvalid` (upstream: `FieldValueInvalid` for type errors too),
    /// `FieldValueForbidden`, `FieldValueUnknown` (an unknown field under strict validation).
    #[serde(rename = "reason")]
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl Cause {
    pub fn new(reason: &str, field: impl Into<String>, message: impl Into<String>) -> Cause {
        Cause {
            reason: reason.to_owned(),
            message: message.into(),
            field: field.into(),
        }
    }
}
