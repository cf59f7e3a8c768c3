//! `ValidateVirtualMachineInstanceSpec`: the rules shared by VMIs and VM/replica set/pool
//! templates, in upstream's order. This file holds the orchestration and the compute rules
//! (hostname, memory, CPU, machine type, start strategy, hotplug); devices, volumes, networks and
//! the rest live in sibling modules.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubevirt_api::quantity::{FORMAT_ERROR_MESSAGE, Quantity as ExactQuantity};
use kubevirt_api::v1::{DomainSpec, VirtualMachineInstanceSpec};

use super::{Cause, FieldPath, devices, misc, network, reason, volumes};
use crate::config::{ClusterConfig, gates};

const MUST_BE_POSITIVE: &str = "must be greater than or equal to 0.";

/// Validates a VMI spec found at `field` (`spec` for VMIs, `spec.template.spec` for VMs).
///
/// Every rule runs; all causes are returned together.
#[must_use]
pub fn validate_vmi_spec(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
) -> Vec<Cause> {
    let mut c = Vec::new();
    misc::validate_hostname(field, spec, &mut c);
    validate_quantities(field, &spec.domain, &mut c);
    validate_memory(field, spec, &mut c);
    validate_hugepages(field, spec, &mut c);
    validate_guest_memory_limit(field, spec, cfg, &mut c);
    validate_emulated_machine(field, spec, cfg, &mut c);
    misc::validate_firmware_acpi(&field.child("acpi"), spec, &mut c);
    validate_cpu_resources(field, spec, &mut c);
    validate_cpu_pinning(field, spec, &mut c);
    validate_numa_and_isolation(field, spec, cfg, &mut c);
    validate_cpu_features(field, spec, &mut c);
    validate_cpu_hotplug(field, spec, &mut c);
    validate_start_strategy(field, spec, &mut c);
    validate_realtime(field, spec, &mut c);
    misc::validate_topology_spread(field, spec, &mut c);
    network::validate_networks(field, spec, cfg, &mut c);
    devices::validate_boot_order(field, spec, cfg, &mut c);
    devices::validate_inputs(field, spec, &mut c);
    misc::validate_io_threads_policy(field, spec, &mut c);
    misc::validate_probes(field, spec, &mut c);
    devices::validate_disks(
        &field.children(&["domain", "devices", "disks"]),
        &spec.domain.devices.disks,
        &mut c,
    );
    misc::validate_firmware(field, &spec.domain, &mut c);
    volumes::validate_volumes(&field.child("volumes"), &spec.volumes, cfg, &mut c);
    volumes::validate_utility_volumes_absent(field, spec, &mut c);
    volumes::validate_access_credentials(&field.child("accessCredentials"), spec, &mut c);
    misc::validate_dns(field, spec, &mut c);
    misc::validate_eviction_strategy(field, spec, &mut c);
    devices::validate_feature_gated_devices(field, spec, cfg, &mut c);
    misc::validate_arch_features(field, spec, cfg, &mut c);
    c
}

/// A resource value of `requests` or `limits` (`"cpu"`, `"memory"`).
pub(crate) fn resource<'a>(
    domain: &'a DomainSpec,
    limits: bool,
    name: &str,
) -> Option<&'a Quantity> {
    let r = domain.resources.as_ref()?;
    if limits {
        r.limits.get(name)
    } else {
        r.requests.get(name)
    }
}

/// The value of an API quantity; `None` when it does not parse ([`validate_quantities`] gives
/// malformed values their own cause).
pub(crate) fn value_of(q: &Quantity) -> Option<ExactQuantity> {
    ExactQuantity::try_from(q).ok()
}

/// Milli-unit value of a resource, rounded up; absent or malformed counts as zero.
pub(crate) fn resource_millis(domain: &DomainSpec, limits: bool, name: &str) -> i128 {
    resource(domain, limits, name)
        .and_then(value_of)
        .map_or(0, |q| q.milli_value())
}

/// Whole-unit value of a resource, rounded up; absent or malformed counts as zero.
fn resource_value(domain: &DomainSpec, limits: bool, name: &str) -> i128 {
    resource(domain, limits, name)
        .and_then(value_of)
        .map_or(0, |q| q.value())
}

fn shown(q: Option<&Quantity>) -> &str {
    q.map_or("0", |q| q.0.as_str())
}

fn validate_quantities(field: &FieldPath, domain: &DomainSpec, c: &mut Vec<Cause>) {
    let Some(r) = &domain.resources else { return };
    for (kind, list) in [("requests", &r.requests), ("limits", &r.limits)] {
        for (name, q) in list {
            if value_of(q).is_none() {
                let f = field.children(&["domain", "resources", kind, name]);
                c.push(Cause::invalid(
                    format!("{f}: Invalid value: \"{}\": {FORMAT_ERROR_MESSAGE}", q.0),
                    f,
                ));
            }
        }
    }
    if let Some(m) = &domain.memory {
        for (name, q) in [("guest", &m.guest), ("maxGuest", &m.max_guest)] {
            if let Some(q) = q.as_ref().filter(|q| value_of(q).is_none()) {
                let f = field.children(&["domain", "memory", name]);
                c.push(Cause::invalid(
                    format!("{f}: Invalid value: \"{}\": {FORMAT_ERROR_MESSAGE}", q.0),
                    f,
                ));
            }
        }
    }
}

fn validate_memory(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let d = &spec.domain;
    let req_f = field.children(&["domain", "resources", "requests", "memory"]);
    let lim_f = field.children(&["domain", "resources", "limits", "memory"]);
    let req = resource_millis(d, false, "memory");
    let lim = resource_millis(d, true, "memory");
    if req < 0 {
        c.push(Cause::invalid(
            format!(
                "{req_f} '{}': {MUST_BE_POSITIVE}",
                shown(resource(d, false, "memory"))
            ),
            &req_f,
        ));
    } else if req > 0 && req < 1_000_000 * 1000 {
        c.push(Cause::invalid(
            format!(
                "{req_f} '{}': must be greater than or equal to 1M.",
                shown(resource(d, false, "memory"))
            ),
            &req_f,
        ));
    }
    if lim < 0 {
        c.push(Cause::invalid(
            format!(
                "{lim_f} '{}': {MUST_BE_POSITIVE}",
                shown(resource(d, true, "memory"))
            ),
            &lim_f,
        ));
    }
    if lim > 0 && req > lim {
        c.push(Cause::invalid(
            format!(
                "{req_f} '{}' is greater than {lim_f} '{}'",
                shown(resource(d, false, "memory")),
                shown(resource(d, true, "memory"))
            ),
            &req_f,
        ));
    }
}

fn validate_hugepages(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let d = &spec.domain;
    let Some(hp) = d.memory.as_ref().and_then(|m| m.hugepages.as_ref()) else {
        return;
    };
    let page_text = hp.page_size.clone().unwrap_or_default();
    let page_f = field.children(&["domain", "memory", "hugepages", "pageSize"]);
    let req_f = field.children(&["domain", "resources", "requests", "memory"]);
    let Ok(page) = ExactQuantity::parse(&page_text).map(|q| q.value()) else {
        c.push(Cause::invalid(
            format!("{page_f} '{page_text}': {FORMAT_ERROR_MESSAGE}"),
            page_f,
        ));
        return;
    };
    let mut mem = resource_value(d, false, "memory");
    if mem == 0 {
        mem = d
            .memory
            .as_ref()
            .and_then(|m| m.guest.as_ref())
            .and_then(value_of)
            .map_or(0, |q| q.value());
    }
    if mem == 0 {
        mem = resource_value(d, true, "memory");
    }
    let req = shown(resource(d, false, "memory"));
    if mem != 0 && mem < page {
        c.push(Cause::invalid(
            format!(
                "{req_f} '{req}' must be equal to or larger than page size {page_f} '{page_text}'"
            ),
            req_f,
        ));
    } else if page != 0 && mem % page != 0 {
        c.push(Cause::invalid(
            format!("{req_f} '{req}' is not a multiple of the page size {page_f} '{page_text}'"),
            req_f,
        ));
    }
}

fn validate_guest_memory_limit(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    if cfg.live_update() {
        return;
    }
    let d = &spec.domain;
    let Some(guest) = d.memory.as_ref().and_then(|m| m.guest.as_ref()) else {
        return;
    };
    let lim = resource_value(d, true, "memory");
    let g = value_of(guest).map_or(0, |q| q.value());
    if lim != 0 && lim < g {
        let f = field.children(&["domain", "memory", "guest"]);
        c.push(Cause::invalid(
            format!(
                "{f} '{}' must be equal to or less than the memory limit {} '{}'",
                guest.0,
                field.children(&["domain", "resources", "limits", "memory"]),
                shown(resource(d, true, "memory"))
            ),
            f,
        ));
    }
}

/// Shell-style glob match supporting `*` and `?` (enough for machine-type patterns).
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some((b'*', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some((b'?', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some((ch, rest)) => t.first() == Some(ch) && go(rest, &t[1..]),
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

fn validate_emulated_machine(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let Some(t) = spec
        .domain
        .machine
        .as_ref()
        .and_then(|m| m.type_.as_deref())
        .filter(|t| !t.is_empty())
    else {
        return;
    };
    let allowed = cfg.emulated_machines_for(
        spec.architecture
            .as_deref()
            .unwrap_or(&cfg.default_architecture),
    );
    if !allowed.iter().any(|p| glob_match(p, t)) {
        let f = field.children(&["domain", "machine", "type"]);
        c.push(Cause::invalid(
            format!(
                "{f} is not supported: {t} (allowed values: [{}])",
                allowed.join(" ")
            ),
            f,
        ));
    }
}

fn validate_cpu_resources(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let d = &spec.domain;
    let req_f = field.children(&["domain", "resources", "requests", "cpu"]);
    let lim_f = field.children(&["domain", "resources", "limits", "cpu"]);
    let req = resource_millis(d, false, "cpu");
    let lim = resource_millis(d, true, "cpu");
    if req < 0 {
        c.push(Cause::invalid(
            format!(
                "{req_f} '{}': {MUST_BE_POSITIVE}",
                shown(resource(d, false, "cpu"))
            ),
            &req_f,
        ));
    }
    if lim < 0 {
        c.push(Cause::invalid(
            format!(
                "{lim_f} '{}': {MUST_BE_POSITIVE}",
                shown(resource(d, true, "cpu"))
            ),
            &lim_f,
        ));
    }
    if lim > 0 && req > lim {
        c.push(Cause::invalid(
            format!(
                "{req_f} '{}' is greater than {lim_f} '{}'",
                shown(resource(d, false, "cpu")),
                shown(resource(d, true, "cpu"))
            ),
            &req_f,
        ));
    }
}

fn validate_cpu_pinning(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let d = &spec.domain;
    let Some(cpu) = d
        .cpu
        .as_ref()
        .filter(|cpu| cpu.dedicated_cpu_placement == Some(true))
    else {
        return;
    };
    let ded_f = field.children(&["domain", "cpu", "dedicatedCpuPlacement"]);
    let req_cpu_f = field.children(&["domain", "resources", "requests", "cpu"]);
    let lim_cpu_f = field.children(&["domain", "resources", "limits", "cpu"]);
    let cores_f = field.children(&["domain", "cpu", "cores"]);
    let req_mem_f = field.children(&["domain", "resources", "requests", "memory"]);
    let lim_mem_f = field.children(&["domain", "resources", "limits", "memory"]);
    let (req_m, lim_m) = (
        resource_millis(d, false, "cpu"),
        resource_millis(d, true, "cpu"),
    );
    let (req, lim) = (
        resource_value(d, false, "cpu"),
        resource_value(d, true, "cpu"),
    );
    let (mreq, mlim) = (
        resource_millis(d, false, "memory"),
        resource_millis(d, true, "memory"),
    );
    let guest_set = d
        .memory
        .as_ref()
        .and_then(|m| m.guest.as_ref())
        .and_then(value_of)
        .is_some_and(|g| !g.is_zero());
    let hugepages = d.memory.as_ref().is_some_and(|m| m.hugepages.is_some());
    if mlim == 0 && mreq == 0 && !hugepages && !guest_set {
        c.push(Cause::invalid(
            format!(
                "{req_mem_f}, {lim_mem_f}, {} or {} should be provided",
                field.children(&["domain", "memory", "hugepages"]),
                field.children(&["domain", "memory", "guest"])
            ),
            &lim_mem_f,
        ));
    }
    if req > 0 && req * 1000 != req_m {
        c.push(Cause::invalid(
            "provided resources CPU requests must be an interger",
            &req_cpu_f,
        ));
    }
    if lim > 0 && lim * 1000 != lim_m {
        c.push(Cause::invalid(
            "provided resources CPU limits must be an interger",
            &lim_cpu_f,
        ));
    }
    let (mreq_value, mlim_value) = (
        resource_value(d, false, "memory"),
        resource_value(d, true, "memory"),
    );
    if mreq_value > 0 && mlim_value > 0 && mreq_value != mlim_value {
        c.push(Cause::invalid(
            format!("{req_mem_f} must be equal to {lim_mem_f}"),
            &req_mem_f,
        ));
    }
    let vcpus = vcpus(cpu);
    if req == 0 && lim == 0 && vcpus == 0 {
        c.push(Cause::invalid(
            format!("either {req_cpu_f} or {lim_cpu_f} or {cores_f} must be provided when DedicatedCPUPlacement is true "),
            &ded_f,
        ));
    }
    if req > 0 && lim > 0 && req != lim {
        c.push(Cause::invalid(
            format!("{req_cpu_f} or {lim_cpu_f} must be equal when DedicatedCPUPlacement is true "),
            &ded_f,
        ));
    }
    if (req > 0 || lim > 0) && vcpus > 0 && req != vcpus && lim != vcpus {
        c.push(Cause::invalid(
            format!("{req_cpu_f} or {lim_cpu_f} must not be provided at the same time with {cores_f} when DedicatedCPUPlacement is true "),
            &ded_f,
        ));
    }
    if cpu.threads.unwrap_or(0) > 2 {
        c.push(Cause::invalid(
            format!(
                "Not more than two threads must be provided at {} (got {}) when DedicatedCPUPlacement is true",
                field.children(&["domain", "cpu", "threads"]),
                cpu.threads.unwrap_or(0)
            ),
            &ded_f,
        ));
    }
}

/// Number of vCPUs of a topology (unset dimensions count as one; all unset is zero).
pub(crate) fn vcpus(cpu: &kubevirt_api::v1::Cpu) -> i128 {
    let (s, co, t) = (
        cpu.sockets.unwrap_or(0),
        cpu.cores.unwrap_or(0),
        cpu.threads.unwrap_or(0),
    );
    if s == 0 && co == 0 && t == 0 {
        return 0;
    }
    i128::from(s.max(1)) * i128::from(co.max(1)) * i128::from(t.max(1))
}

fn validate_numa_and_isolation(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    let Some(cpu) = &spec.domain.cpu else { return };
    let dedicated = cpu.dedicated_cpu_placement == Some(true);
    if cpu.isolate_emulator_thread == Some(true) && !dedicated {
        c.push(Cause::invalid(
            "IsolateEmulatorThread should be only set in combination with DedicatedCPUPlacement",
            field.children(&["domain", "cpu", "isolateEmulatorThread"]),
        ));
    }
    if cpu
        .numa
        .as_ref()
        .is_some_and(|n| n.guest_mapping_passthrough.is_some())
    {
        let f = field.children(&["domain", "cpu", "numa", "guestMappingPassthrough"]);
        if !cfg.gate(gates::NUMA) {
            c.push(Cause::invalid(
                format!("NUMA feature gate is not enabled in kubevirt-config, invalid entry {f}"),
                &f,
            ));
        }
        if !dedicated {
            c.push(Cause::invalid(
                format!(
                    "{} must be set to true when NUMA topology strategy is set in {f}",
                    field.children(&["domain", "cpu", "dedicatedCpuPlacement"])
                ),
                &f,
            ));
        }
        if spec
            .domain
            .memory
            .as_ref()
            .and_then(|m| m.hugepages.as_ref())
            .is_none()
        {
            c.push(Cause::invalid(
                format!(
                    "{} must be requested when NUMA topology strategy is set in {f}",
                    field.children(&["domain", "memory", "hugepages"])
                ),
                &f,
            ));
        }
    }
}

fn validate_cpu_features(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let Some(cpu) = &spec.domain.cpu else { return };
    for (i, f) in cpu.features.iter().enumerate() {
        let policy = f.policy.as_deref().unwrap_or("");
        if !["", "force", "require", "optional", "disable", "forbid"].contains(&policy) {
            c.push(Cause::new(
                reason::NOT_SUPPORTED,
                format!(
                    "CPU feature {} uses policy {policy} that is not supported.",
                    f.name
                ),
                field
                    .children(&["domain", "cpu", "features"])
                    .index(i)
                    .child("policy"),
            ));
        }
    }
    let arch = spec.architecture.as_deref().unwrap_or("");
    if arch == "arm64" && cpu.threads.unwrap_or(0) > 1 {
        c.push(Cause::invalid(
            format!(
                "threads must not be greater than 1 at {} (got {}) when {} is arm64",
                field.children(&["domain", "cpu", "threads"]),
                cpu.threads.unwrap_or(0),
                field.child("architecture")
            ),
            field.child("architecture"),
        ));
    }
}

fn validate_cpu_hotplug(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let Some(cpu) = &spec.domain.cpu else { return };
    let (sockets, max) = (cpu.sockets.unwrap_or(0), cpu.max_sockets.unwrap_or(0));
    if max != 0 && sockets > max {
        c.push(Cause::invalid(
            "Number of sockets in CPU topology is greater than the maximum sockets allowed",
            field.children(&["domain", "cpu", "sockets"]),
        ));
    }
}

fn validate_start_strategy(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let Some(s) = &spec.start_strategy else {
        return;
    };
    let f = field.child("startStrategy");
    if s.as_str() != "Paused" {
        c.push(Cause::invalid(
            format!("{f} is set with an unrecognized option: {}", s.as_str()),
            &f,
        ));
    } else if spec.liveness_probe.is_some() {
        c.push(Cause::invalid(
            format!("either {f} or {} should be provided.Pausing VMI with LivenessProbe is not supported", field.child("livenessProbe")),
            &f,
        ));
    }
}

fn validate_realtime(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let Some(cpu) = spec
        .domain
        .cpu
        .as_ref()
        .filter(|cpu| cpu.realtime.is_some())
    else {
        return;
    };
    let rt = field.children(&["domain", "cpu", "realtime"]);
    if cpu.dedicated_cpu_placement != Some(true) {
        let f = field.children(&["domain", "cpu", "dedicatedCpuPlacement"]);
        c.push(Cause::required(
            format!("{f} must be set to true when {rt} is used"),
            f,
        ));
    }
    if cpu
        .numa
        .as_ref()
        .and_then(|n| n.guest_mapping_passthrough.as_ref())
        .is_none()
    {
        let f = field.children(&["domain", "cpu", "numa", "guestMappingPassthrough"]);
        c.push(Cause::required(
            format!("{f} must be defined when {rt} is used"),
            f,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_type_globs_match_like_filepath_match() {
        assert!(glob_match("q35*", "q35"));
        assert!(glob_match("pc-q35*", "pc-q35-rhel9.2.0"));
        assert!(!glob_match("q35*", "pc-i440fx"));
        assert!(glob_match("a?c", "abc"));
    }
}
