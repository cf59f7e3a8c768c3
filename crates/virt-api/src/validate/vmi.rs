//! VMI create (`vmi-create-admitter.go`) and update (`vmi-update-admitter.go`) rules.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstanceSpec};

use super::{
    Cause, FieldPath, network, reason, restricted_labels, spec::validate_vmi_spec, volumes,
};
use crate::config::{ClusterConfig, gates};

/// Annotation carrying Ignition data (needs the ExperimentalIgnitionSupport gate).
pub const IGNITION_ANNOTATION: &str = "kubevirt.io/ignitiondata";
/// Annotation listing sidecar hooks (needs the Sidecar gate).
pub const SIDECAR_ANNOTATION: &str = "hooks.kubevirt.io/hookSidecars";

/// Every rule of a VMI CREATE: the shared spec rules, volume ↔ disk mapping, mandatory memory,
/// metadata and architecture.
#[must_use]
pub fn validate_vmi_create(
    vmi: &VirtualMachineInstance,
    cfg: &ClusterConfig,
    user_is_kubevirt_sa: bool,
) -> Vec<Cause> {
    let spec_f = FieldPath::new("spec");
    let mut c = validate_vmi_spec(&spec_f, &vmi.spec, cfg);
    network::validate_discontinued_bindings(&spec_f, &vmi.spec, &mut c);
    volumes::validate_volume_disks(&spec_f, &vmi.spec, &mut c);
    validate_mandatory_memory(&spec_f, &vmi.spec, &mut c);
    c.extend(validate_vmi_metadata(
        &FieldPath::new("metadata"),
        &vmi.metadata,
        cfg,
        user_is_kubevirt_sa,
    ));
    validate_architecture(&spec_f, &vmi.spec, &mut c);
    c
}

/// Some memory must be requested (run after defaults are applied).
pub fn validate_mandatory_memory(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let req = super::spec::resource(&spec.domain, false, "memory")
        .and_then(super::spec::value_of)
        .map_or(0, |q| q.value());
    if req != 0 {
        return;
    }
    let mem = spec.domain.memory.as_ref();
    if mem.is_none_or(|m| m.guest.is_none() && m.hugepages.is_none()) {
        c.push(Cause::new(
            reason::REQUIRED,
            format!(
                "no memory requested, at least one of '{}', '{}' or '{}' must be set",
                field.children(&["domain", "memory", "guest"]),
                field.children(&["domain", "memory", "hugepages", "pageSize"]),
                field.children(&["domain", "resources", "requests", "memory"])
            ),
            "",
        ));
    }
}

/// Reserved labels (users only) and feature-gated annotations.
#[must_use]
pub fn validate_vmi_metadata(
    field: &FieldPath,
    meta: &ObjectMeta,
    cfg: &ClusterConfig,
    user_is_kubevirt_sa: bool,
) -> Vec<Cause> {
    let mut c = Vec::new();
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    if !user_is_kubevirt_sa && !restricted_labels(labels).is_empty() {
        c.push(Cause::new(
            reason::NOT_SUPPORTED,
            "creation of the following reserved kubevirt.io/ labels on a VMI object is prohibited",
            field.child("labels"),
        ));
    }
    if annotations
        .get(IGNITION_ANNOTATION)
        .is_some_and(|v| !v.is_empty())
        && !cfg.gate(gates::IGNITION)
    {
        c.push(Cause::invalid(
            format!(
                "ExperimentalIgnitionSupport feature gate is not enabled in kubevirt-config, invalid entry {}",
                field.child("annotations").child(IGNITION_ANNOTATION)
            ),
            field.child("annotations"),
        ));
    }
    if annotations
        .get(SIDECAR_ANNOTATION)
        .is_some_and(|v| !v.is_empty())
        && !cfg.gate(gates::SIDECAR)
    {
        c.push(Cause::invalid(
            format!(
                "sidecar feature gate is not enabled in kubevirt-config, invalid entry {}",
                field.child("annotations").child(SIDECAR_ANNOTATION)
            ),
            field.child("annotations"),
        ));
    }
    c
}

fn validate_architecture(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let arch = spec.architecture.as_deref().unwrap_or("");
    if !matches!(arch, "" | "amd64" | "arm64" | "s390x") {
        c.push(Cause::invalid(
            format!("unsupported architecture: {arch}"),
            field.child("architecture"),
        ));
    }
}

/// VMI UPDATE: the spec is immutable for users; KubeVirt service accounts may change it but not
/// `maxSockets`/`maxGuest`; users may not touch reserved labels.
#[must_use]
pub fn validate_vmi_update(
    old: &VirtualMachineInstance,
    new: &VirtualMachineInstance,
    user_is_kubevirt_sa: bool,
) -> Vec<Cause> {
    if new.spec != old.spec {
        if !user_is_kubevirt_sa {
            return vec![Cause::new(
                reason::NOT_SUPPORTED,
                "update of VMI object is restricted",
                "",
            )];
        }
        let max_sockets =
            |v: &VirtualMachineInstance| v.spec.domain.cpu.as_ref().and_then(|c| c.max_sockets);
        if max_sockets(old) != max_sockets(new) {
            return vec![Cause::invalid("CPU topology maxSockets changed", "")];
        }
        let max_guest = |v: &VirtualMachineInstance| {
            v.spec
                .domain
                .memory
                .as_ref()
                .and_then(|m| m.max_guest.as_ref())
                .and_then(super::spec::value_of)
        };
        if let (Some(a), Some(b)) = (max_guest(old), max_guest(new))
            && a != b
        {
            return vec![Cause::invalid("Memory maxGuest changed", "")];
        }
        if let Some(cause) = permanent_volumes_changed(&old.spec, &new.spec) {
            return vec![cause];
        }
    }
    if !user_is_kubevirt_sa {
        let empty = BTreeMap::new();
        let old_l = restricted_labels(old.metadata.labels.as_ref().unwrap_or(&empty));
        let new_l = restricted_labels(new.metadata.labels.as_ref().unwrap_or(&empty));
        if old_l != new_l {
            return vec![Cause::new(
                reason::NOT_SUPPORTED,
                "modification of the following reserved kubevirt.io/ labels on a VMI object is prohibited",
                "",
            )];
        }
    }
    Vec::new()
}

/// Hotplug storage rule: volumes that are not hotpluggable, and their disks, never change.
fn permanent_volumes_changed(
    old: &VirtualMachineInstanceSpec,
    new: &VirtualMachineInstanceSpec,
) -> Option<Cause> {
    let permanent = |s: &VirtualMachineInstanceSpec| {
        s.volumes
            .iter()
            .filter(|v| !v.volume_source.is_hotpluggable())
            .cloned()
            .collect::<Vec<_>>()
    };
    let (old_p, new_p) = (permanent(old), permanent(new));
    if old_p.len() != new_p.len() {
        return Some(Cause::invalid(
            "Number of permanent volumes has changed",
            "",
        ));
    }
    for v in &new_p {
        if !old_p.contains(v) {
            return Some(Cause::invalid(
                format!("permanent volume {}, changed", v.name),
                "",
            ));
        }
        let disk = |s: &VirtualMachineInstanceSpec| {
            s.domain
                .devices
                .disks
                .iter()
                .find(|d| d.name == v.name)
                .cloned()
        };
        if disk(old) != disk(new) {
            return Some(Cause::invalid(
                format!("permanent disk {}, changed", v.name),
                "",
            ));
        }
    }
    None
}
