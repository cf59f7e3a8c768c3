//! VirtualMachinePool rules (`vmpool-admitter.go`): template, selector, immutable selector,
//! `maxUnavailable`, one strategy at a time, and the VM template spec.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kubevirt_api::pool::v1beta1::VirtualMachinePool;

use super::{Cause, FieldPath, reason, replicaset::selector_matches, vm::validate_vm_spec};
use crate::config::ClusterConfig;

/// Validates a pool; `old` is the stored pool on UPDATE.
#[must_use]
pub fn validate_pool(
    pool: &VirtualMachinePool,
    old: Option<&VirtualMachinePool>,
    cfg: &ClusterConfig,
) -> Vec<Cause> {
    let field = FieldPath::new("spec");
    let spec = &pool.spec;
    let Some(vm_spec) = &spec.virtual_machine_template.spec else {
        return vec![Cause::required(
            "missing virtual machine template.",
            field.child("template"),
        )];
    };
    let mut c = Vec::new();
    let labels = spec
        .virtual_machine_template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    match selector_matches(&spec.selector, &labels) {
        Err(e) => c.push(Cause::invalid(e, field.child("selector"))),
        Ok(false) => c.push(Cause::invalid(
            "selector does not match labels.",
            field.child("selector"),
        )),
        Ok(true) => {}
    }
    match &spec.max_unavailable {
        Some(IntOrString::String(s)) => match s.strip_suffix('%') {
            None => c.push(Cause::invalid(
                "maxUnavailable percentage must end with %",
                field.child("maxUnavailable"),
            )),
            Some(num) => match num.parse::<i64>() {
                Err(e) => c.push(Cause::invalid(
                    format!("maxUnavailable percentage value {num:?} is invalid: {e}"),
                    field.child("maxUnavailable"),
                )),
                Ok(v) if !(1..=100).contains(&v) => c.push(Cause::invalid(
                    format!("maxUnavailable percentage value {v} must be between 1 and 100"),
                    field.child("maxUnavailable"),
                )),
                Ok(_) => {}
            },
        },
        Some(IntOrString::Int(v)) if *v <= 0 => {
            c.push(Cause::invalid(
                "maxUnavailable must be greater than 0",
                field.child("maxUnavailable"),
            ));
        }
        _ => {}
    }
    if let Some(old) = old
        && old.spec.selector != spec.selector
    {
        c.push(Cause::invalid(
            "selector is immutable after creation.",
            field.child("selector"),
        ));
    }
    let mut configured = Vec::new();
    if let Some(s) = &spec.scale_in_strategy {
        for (set, name) in [
            (s.unmanaged.is_some(), "unmanaged"),
            (s.opportunistic.is_some(), "opportunistic"),
            (s.proactive.is_some(), "proactive"),
        ] {
            if set {
                configured.push(name);
            }
        }
        if configured.len() > 1 {
            c.push(Cause::new(
                reason::INVALID,
                format!(
                    "only one strategy can be configured at a time: but found {} strategies",
                    configured.join(", ")
                ),
                field.child("scaleInStrategy"),
            ));
        }
    }
    let vm_field = field.child("virtualMachineTemplate").child("spec");
    c.extend(validate_vm_spec(&vm_field, vm_spec, cfg, false));
    c
}
