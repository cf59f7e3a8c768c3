//! VirtualMachine rules (`vms-admitter.go`): template, run strategy, live-update limits and
//! `status.volumeRequests`. The template spec is validated after defaults are applied to a copy,
//! as upstream does.

use std::collections::BTreeSet;

use kubevirt_api::v1::{
    RunStrategy, VirtualMachine, VirtualMachineSpec, VirtualMachineVolumeRequest,
};

use super::data_volume_template::{
    validate_data_volume_template_namespaces, validate_data_volume_templates,
};
use super::{Cause, FieldPath, network, spec::validate_vmi_spec, vmi::validate_vmi_metadata};
use crate::config::{ClusterConfig, gates};
use crate::mutate::vmi::set_spec_defaults;
use kubevirt_api::live_update::memory_hotplug_error;

/// Warning returned when `spec.running` is used.
pub const RUNNING_DEPRECATED_WARNING: &str =
    "spec.running is deprecated, please use spec.runStrategy instead.";

/// How a VM reaches the admitter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmRequest {
    /// CREATE (true) or UPDATE.
    pub create: bool,
    /// The requester is one of KubeVirt's service accounts.
    pub user_is_kubevirt_sa: bool,
}

/// Validates a VM as created by a user (see [`validate_vm_request`]).
#[must_use]
pub fn validate_vm(vm: &VirtualMachine, cfg: &ClusterConfig) -> Vec<Cause> {
    validate_vm_request(
        vm,
        cfg,
        VmRequest {
            create: true,
            user_is_kubevirt_sa: false,
        },
    )
}

/// Validates a VM; stops at the first family with causes, like upstream.
#[must_use]
pub fn validate_vm_request(vm: &VirtualMachine, cfg: &ClusterConfig, req: VmRequest) -> Vec<Cause> {
    if vm.metadata.deletion_timestamp.is_some() {
        return Vec::new();
    }
    let spec_f = FieldPath::new("spec");
    let mut defaulted = vm.spec.clone();
    if let Some(s) = defaulted.template.spec.as_mut()
        && let Err(e) = set_spec_defaults(cfg, s)
    {
        return vec![Cause::invalid(e.to_string(), "")];
    }
    if req.create
        && let Some(s) = &defaulted.template.spec
    {
        let mut c = Vec::new();
        network::validate_discontinued_bindings(&spec_f.children(&["template", "spec"]), s, &mut c);
        if !c.is_empty() {
            return c;
        }
    }
    let c = validate_vm_spec(&spec_f, &defaulted, cfg, req.user_is_kubevirt_sa);
    if !c.is_empty() {
        return c;
    }
    // The storage admitter. Upstream skips this on an update that leaves the templates as they
    // were; here it runs on every request (a template refused on create cannot be stored).
    if let Some(namespace) = vm.metadata.namespace.as_deref().filter(|n| !n.is_empty()) {
        let c = validate_data_volume_template_namespaces(&spec_f, &vm.spec, namespace);
        if !c.is_empty() {
            return c;
        }
    }
    vm.status
        .as_ref()
        .map(|s| validate_volume_requests(&s.volume_requests))
        .unwrap_or_default()
}

/// `ValidateVirtualMachineSpec`: template, template metadata and spec, run strategy, live update.
#[must_use]
pub fn validate_vm_spec(
    field: &FieldPath,
    spec: &VirtualMachineSpec,
    cfg: &ClusterConfig,
    user_is_kubevirt_sa: bool,
) -> Vec<Cause> {
    let Some(tspec) = &spec.template.spec else {
        return vec![Cause::required(
            "missing virtual machine template.",
            field.child("template"),
        )];
    };
    let mut c = Vec::new();
    if let Some(meta) = &spec.template.metadata {
        c.extend(validate_vmi_metadata(
            &field.children(&["template", "metadata"]),
            meta,
            cfg,
            user_is_kubevirt_sa,
        ));
    }
    c.extend(validate_vmi_spec(
        &field.children(&["template", "spec"]),
        tspec,
        cfg,
    ));
    c.extend(validate_data_volume_templates(field, spec));
    validate_run_strategy(field, spec, cfg, &mut c);
    if cfg.live_update() {
        if let Some(cpu) = &tspec.domain.cpu {
            let (s, m) = (cpu.sockets.unwrap_or(0), cpu.max_sockets.unwrap_or(0));
            if s != 0 && m != 0 && s > m {
                c.push(Cause::invalid(
                    "Number of sockets in CPU topology is greater than the maximum sockets allowed",
                    field.children(&["template", "spec", "domain", "cpu", "sockets"]),
                ));
            }
        }
        if let Some(max) = tspec
            .domain
            .memory
            .as_ref()
            .and_then(|m| m.max_guest.as_ref())
            && let Some(e) = memory_hotplug_error(tspec, Some(max))
        {
            c.push(Cause::invalid(
                e,
                field.children(&["template", "spec", "domain", "memory", "guest"]),
            ));
        }
    }
    c
}

fn validate_run_strategy(
    field: &FieldPath,
    spec: &VirtualMachineSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    if spec.running.is_some() && spec.run_strategy.is_some() {
        c.push(Cause::invalid(
            "Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead",
            field.child("running"),
        ));
    }
    if spec.running.is_none() && spec.run_strategy.is_none() {
        c.push(Cause::invalid(
            "RunStrategy must be specified",
            field.child("running"),
        ));
    }
    let Some(rs) = &spec.run_strategy else { return };
    match rs {
        RunStrategy::WaitAsReceiver if !cfg.gate(gates::DECENTRALIZED_LIVE_MIGRATION) => {
            c.push(Cause::invalid(
                format!(
                    "Invalid RunStrategy ({}), {} feature gate is not enabled in kubevirt resource",
                    rs.as_str(),
                    gates::DECENTRALIZED_LIVE_MIGRATION
                ),
                field.child("runStrategy"),
            ))
        }
        RunStrategy::Unknown | RunStrategy::Other(_) => {
            c.push(Cause::invalid(
                format!("Invalid RunStrategy ({})", rs.as_str()),
                field.child("runStrategy"),
            ));
        }
        _ => {}
    }
}

/// `status.volumeRequests`: each names one operation; no duplicate add or remove per volume.
#[must_use]
pub fn validate_volume_requests(requests: &[VirtualMachineVolumeRequest]) -> Vec<Cause> {
    let field = FieldPath::new("Status").child("volumeRequests");
    let mut c = Vec::new();
    let (mut adds, mut removes) = (BTreeSet::new(), BTreeSet::new());
    for r in requests {
        match (&r.add_volume_options, &r.remove_volume_options) {
            (Some(_), Some(_)) => c.push(Cause::invalid(
                "VolumeRequests require either addVolumeOptions or removeVolumeOptions to be set, not both",
                &field,
            )),
            (Some(add), None) => {
                if !adds.insert(add.name.clone()) {
                    c.push(Cause::invalid(format!("AddVolume request for [{}] aleady exists", add.name), &field));
                }
            }
            (None, Some(rm)) => {
                if !removes.insert(rm.name.clone()) {
                    c.push(Cause::invalid(format!("RemoveVolume request for [{}] aleady exists", rm.name), &field));
                }
            }
            (None, None) => c.push(Cause::invalid(
                "VolumeRequests require one of either addVolumeOptions or removeVolumeOptions to be set",
                &field,
            )),
        }
    }
    c
}

/// Warnings for an admitted VM.
#[must_use]
pub fn vm_warnings(vm: &VirtualMachine) -> Vec<String> {
    if vm.spec.running.is_some() {
        vec![RUNNING_DEPRECATED_WARNING.to_owned()]
    } else {
        Vec::new()
    }
}
