//! VirtualMachineInstanceReplicaSet rules (`vmirs-admitter.go`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kubevirt_api::v1::VirtualMachineInstanceReplicaSet;

use super::{Cause, FieldPath, spec::validate_vmi_spec, vmi::validate_vmi_metadata};
use crate::config::ClusterConfig;

/// Whether `selector` selects `labels` (matchLabels and matchExpressions); `Err` carries the
/// message of an invalid selector.
pub(crate) fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, String> {
    for (k, v) in selector.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return Ok(false);
        }
    }
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default();
        let have = labels.get(&e.key);
        let ok = match e.operator.as_str() {
            "In" => have.is_some_and(|h| values.contains(h)),
            "NotIn" => have.is_none_or(|h| !values.contains(h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => {
                return Err(format!(
                    "\"{other}\" is not a valid label selector operator"
                ));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Template present, selector valid and matching the template labels, template spec valid.
#[must_use]
pub fn validate_replicaset(
    rs: &VirtualMachineInstanceReplicaSet,
    cfg: &ClusterConfig,
) -> Vec<Cause> {
    let field = FieldPath::new("spec");
    let Some(tspec) = &rs.spec.template.spec else {
        return vec![Cause::required(
            "missing virtual machine template.",
            field.child("template"),
        )];
    };
    let mut c = Vec::new();
    let meta = rs.spec.template.metadata.clone().unwrap_or_default();
    let labels = meta.labels.clone().unwrap_or_default();
    match selector_matches(&rs.spec.selector, &labels) {
        Err(e) => c.push(Cause::invalid(e, field.child("selector"))),
        Ok(false) => c.push(Cause::invalid(
            "selector does not match labels.",
            field.child("selector"),
        )),
        Ok(true) => {}
    }
    c.extend(validate_vmi_metadata(
        &field.children(&["template", "metadata"]),
        &meta,
        cfg,
        false,
    ));
    c.extend(validate_vmi_spec(
        &field.children(&["template", "spec"]),
        tspec,
        cfg,
    ));
    c
}
