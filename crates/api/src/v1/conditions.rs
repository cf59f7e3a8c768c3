//! Condition shapes shared by every KubeVirt kind.
//!
//! Upstream declares one condition struct per kind (`VirtualMachineInstanceCondition`,
//! `VirtualMachineCondition`, …) with identical JSON; here a single generic [`Condition`] is
//! parametrised by the kind's condition-type enum, with an alias per kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;

string_enum! {
    /// Status of a condition: `True`, `False` or `Unknown`.
    pub enum ConditionStatus {
        /// The condition holds.
        True = "True",
        /// The condition does not hold.
        False = "False",
        /// It is not known whether the condition holds.
        Unknown = "Unknown",
    }
}

/// One condition of an object's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition<T> {
    /// The kind of condition.
    #[serde(rename = "type")]
    pub type_: T,
    /// Whether the condition holds.
    pub status: ConditionStatus,
    /// Last time the condition was probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// Last time the condition changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// A machine-readable reason for the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable message about the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl<T: PartialEq> Condition<T> {
    /// A condition of `type_` with `status` and no timestamps, reason or message.
    pub fn new(type_: T, status: ConditionStatus) -> Self {
        Self {
            type_,
            status,
            last_probe_time: None,
            last_transition_time: None,
            reason: None,
            message: None,
        }
    }

    /// Whether this condition is of `type_` and has status `True`.
    pub fn is_true(&self, type_: &T) -> bool {
        self.type_ == *type_ && self.status == ConditionStatus::True
    }
}

/// Finds the condition of `type_` in `conditions`.
pub fn find_condition<'a, T: PartialEq>(
    conditions: &'a [Condition<T>],
    type_: &T,
) -> Option<&'a Condition<T>> {
    conditions.iter().find(|c| c.type_ == *type_)
}

/// Whether `conditions` holds a condition of `type_` with status `True`.
pub fn has_true_condition<T: PartialEq>(conditions: &[Condition<T>], type_: &T) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_serialises_type_and_status_with_upstream_names() {
        let c = Condition::new("Ready".to_owned(), ConditionStatus::True);
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json, serde_json::json!({"type": "Ready", "status": "True"}));
    }

    #[test]
    fn null_timestamps_decode_as_absent() {
        let c: Condition<String> = serde_json::from_value(serde_json::json!({
            "type": "Ready", "status": "False", "lastProbeTime": null, "lastTransitionTime": null
        }))
        .unwrap();
        assert_eq!(c.last_probe_time, None);
        assert!(!has_true_condition(&[c], &"Ready".to_owned()));
    }
}
