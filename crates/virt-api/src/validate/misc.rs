//! Remaining spec rules: hostname and subdomain, ACPI tables, firmware, IO threads, probes,
//! DNS, eviction strategy, topology spread, launch security and the service account name.

use kubevirt_api::v1::{
    DomainSpec, EvictionStrategy, IoThreadsPolicy, Probe, VirtualMachineInstanceSpec,
};

use super::{Cause, FieldPath, reason};
use crate::config::ClusterConfig;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Kubernetes' `IsDNS1123Label` messages for `s` (empty when valid).
#[must_use]
pub fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !is_label(s) {
        errs.push(format!(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{DNS1123_LABEL_FMT}')"
        ));
    }
    errs
}

/// Kubernetes' `IsDNS1123Subdomain` messages for `s` (empty when valid).
#[must_use]
pub fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_owned());
    }
    if !s.split('.').all(is_label) {
        errs.push(format!(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*')"
        ));
    }
    errs
}

/// `hostname` must be a DNS-1123 label, `subdomain` a DNS-1123 subdomain.
pub fn validate_hostname(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    if let Some(h) = spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        let errs = dns1123_label_errors(h);
        if !errs.is_empty() {
            let f = field.child("hostname");
            c.push(Cause::invalid(
                format!(
                    "{f} does not conform to the kubernetes DNS_LABEL rules : {}",
                    errs.join(", ")
                ),
                f,
            ));
        }
    }
    if let Some(s) = spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        let errs = dns1123_subdomain_errors(s);
        if !errs.is_empty() {
            let f = field.child("subdomain");
            c.push(Cause::invalid(
                format!(
                    "{f} does not conform to the kubernetes DNS_SUBDOMAIN rules : {}",
                    errs.join(", ")
                ),
                f,
            ));
        }
    }
}

/// `firmware.acpi` needs a SLIC or MSDM reference to a secret volume; `field` is `<spec>.acpi`
/// (upstream's path).
pub fn validate_firmware_acpi(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let Some(acpi) = spec.domain.firmware.as_ref().and_then(|f| f.acpi.as_ref()) else {
        return;
    };
    let slic = acpi.slic_name_ref.as_deref().unwrap_or("");
    let msdm = acpi.msdm_name_ref.as_deref().unwrap_or("");
    if slic.is_empty() && msdm.is_empty() {
        c.push(Cause::invalid(
            "ACPI was set but no SLIC nor MSDM volume reference was set",
            field,
        ));
        return;
    }
    for (name, child) in [(slic, "slicNameRef"), (msdm, "msdmNameRef")] {
        if name.is_empty() {
            continue;
        }
        match spec.volumes.iter().find(|v| v.name == name) {
            Some(v) if v.volume_source.secret.is_some() => {}
            Some(_) => c.push(Cause::invalid(
                format!("{field} refers to Volume of unsupported type."),
                field.child(child),
            )),
            None => c.push(Cause::invalid(
                format!("{field} does not have a matching Volume."),
                field.child(child),
            )),
        }
    }
}

/// Bootloader exclusivity, kernel boot, and Secure Boot's need for SMM.
pub fn validate_firmware(field: &FieldPath, domain: &DomainSpec, c: &mut Vec<Cause>) {
    let dom_f = field.child("domain");
    let fw_f = dom_f.child("firmware");
    if let Some(fw) = &domain.firmware {
        if fw
            .bootloader
            .as_ref()
            .is_some_and(|b| b.bios.is_some() && b.efi.is_some())
        {
            let f = fw_f.child("bootloader");
            c.push(Cause::invalid(
                format!("{f} has both EFI and BIOS configured, but they are mutually exclusive."),
                f,
            ));
        }
        if let Some(kb) = &fw.kernel_boot {
            let kb_f = fw_f.child("kernelBoot");
            match &kb.container {
                None => {
                    if kb.kernel_args.as_deref().is_some_and(|a| !a.is_empty()) {
                        c.push(Cause::invalid(
                            "kernel arguments cannot be provided without an external kernel",
                            kb_f.child("kernelArgs"),
                        ));
                    }
                }
                Some(ct) => {
                    let ct_f = kb_f.child("container");
                    if ct.image.is_empty() {
                        c.push(Cause::required(
                            format!("{ct_f} must be defined with an image"),
                            ct_f.child("image"),
                        ));
                    }
                    let empty = |s: &Option<String>| s.as_deref().unwrap_or("").is_empty();
                    if empty(&ct.kernel_path) && empty(&ct.initrd_path) {
                        c.push(Cause::required(
                            format!("{ct_f} must be defined with at least one of the following: kernelPath, initrdPath"),
                            &ct_f,
                        ));
                    }
                }
            }
        }
    }
    let secure_boot = domain
        .firmware
        .as_ref()
        .and_then(|f| f.bootloader.as_ref())
        .and_then(|b| b.efi.as_ref())
        .is_some_and(|e| e.secure_boot != Some(false));
    let smm = domain
        .features
        .as_ref()
        .and_then(|f| f.smm.as_ref())
        .is_some_and(|s| s.enabled != Some(false));
    let tdx = domain
        .launch_security
        .as_ref()
        .is_some_and(|l| l.tdx.is_some());
    if secure_boot && !smm && !tdx {
        c.push(Cause::invalid(
            format!("{dom_f} has EFI SecureBoot enabled. SecureBoot requires SMM, which is currently disabled."),
            &dom_f,
        ));
    }
}

/// `ioThreadsPolicy` value and the supplemental pool size.
pub fn validate_io_threads_policy(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    let Some(p) = &spec.domain.io_threads_policy else {
        return;
    };
    if !p.is_known() {
        c.push(Cause::invalid(
            format!("Invalid IOThreadsPolicy ({})", p.as_str()),
            field.children(&["domain", "ioThreadsPolicy"]),
        ));
    }
    let count = spec
        .domain
        .io_threads
        .as_ref()
        .and_then(|t| t.supplemental_pool_thread_count)
        .unwrap_or(0);
    if *p == IoThreadsPolicy::SupplementalPool && count < 1 {
        c.push(Cause::invalid(
            "the number of iothreads needs to be set and positive for the dedicated policy",
            field.children(&["domain", "ioThreads", "count"]),
        ));
    }
}

fn validate_probe(f: &FieldPath, probe: &Probe, pod_network: bool, c: &mut Vec<Cause>) {
    let handlers = usize::from(probe.http_get.is_some())
        + usize::from(probe.tcp_socket.is_some())
        + usize::from(probe.exec.is_some())
        + usize::from(probe.guest_agent_ping.is_some());
    if handlers > 1 {
        c.push(Cause::invalid(
            format!("{f} must have exactly one probe type set"),
            f,
        ));
    }
    if handlers == 0 {
        c.push(Cause::required(
            format!(
                "either {}, {} or {} must be set if a {f} is specified",
                f.child("tcpSocket"),
                f.child("exec"),
                f.child("httpGet")
            ),
            f,
        ));
    }
    if !pod_network {
        for (set, child) in [
            (probe.http_get.is_some(), "httpGet"),
            (probe.tcp_socket.is_some(), "tcpSocket"),
        ] {
            if set {
                let pf = f.child(child);
                c.push(Cause::invalid(
                    format!("{pf} is only allowed if the Pod Network is attached"),
                    pf,
                ));
            }
        }
    }
}

/// Readiness and liveness probes: exactly one handler; network probes need the pod network.
pub fn validate_probes(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let pod_network = spec.networks.iter().any(|n| n.network_source.pod.is_some());
    if let Some(p) = &spec.readiness_probe {
        validate_probe(&field.child("readinessProbe"), p, pod_network, c);
    }
    if let Some(p) = &spec.liveness_probe {
        validate_probe(&field.child("livenessProbe"), p, pod_network, c);
    }
}

/// `dnsPolicy` and `dnsConfig` (Kubernetes' pod rules; the nameserver fields are relative, as
/// upstream reports them).
pub fn validate_dns(field: &FieldPath, spec: &VirtualMachineInstanceSpec, c: &mut Vec<Cause>) {
    let policy = spec.dns_policy.as_deref().unwrap_or("");
    const POLICIES: [&str; 4] = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
    if !policy.is_empty() && !POLICIES.contains(&policy) {
        c.push(Cause::new(
            reason::NOT_SUPPORTED,
            format!(
                "DNSPolicy: {policy} is not supported, valid values: [\"{}\"]",
                POLICIES.join("\" \"")
            ),
            field.child("dnsPolicy"),
        ));
    }
    let cfg = spec.dns_config.as_ref();
    if policy == "None" {
        match cfg {
            None => c.push(Cause::required(
                "must provide `dnsConfig` when `dnsPolicy` is None",
                field.child("dnsConfig"),
            )),
            Some(d) if d.nameservers.as_ref().is_none_or(Vec::is_empty) => {
                c.push(Cause::required(
                    "must provide at least one DNS nameserver when `dnsPolicy` is None",
                    "nameservers",
                ));
            }
            Some(_) => {}
        }
    }
    let Some(d) = cfg else { return };
    let nameservers = d.nameservers.clone().unwrap_or_default();
    if nameservers.len() > 3 {
        c.push(Cause::invalid(
            format!(
                "must not have more than 3 nameservers: [{}]",
                nameservers.join(" ")
            ),
            "nameservers",
        ));
    }
    for ns in &nameservers {
        if ns.parse::<std::net::IpAddr>().is_err() {
            c.push(Cause::invalid(
                format!("must be valid IP address: {ns}"),
                "nameservers",
            ));
        }
    }
    let searches = d.searches.clone().unwrap_or_default();
    if searches.len() > 6 {
        c.push(Cause::invalid(
            "must not have more than 6 search paths",
            "searchDomains",
        ));
    }
    if searches.join(" ").len() > 256 {
        c.push(Cause::invalid(
            "must not have more than 256 characters (including spaces) in the search list",
            "searchDomains",
        ));
    }
    for s in &searches {
        for msg in dns1123_subdomain_errors(s.trim_end_matches('.')) {
            c.push(Cause::invalid(msg, "searchDomains"));
        }
    }
    if d.options
        .as_ref()
        .is_some_and(|o| o.iter().any(|o| o.name.as_deref().unwrap_or("").is_empty()))
    {
        c.push(Cause::invalid("Option.Name must not be empty", "options"));
    }
}

/// `evictionStrategy` must be a known value.
pub fn validate_eviction_strategy(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    if let Some(EvictionStrategy::Other(s)) = &spec.eviction_strategy {
        let f = field.child("evictionStrategy");
        c.push(Cause::invalid(
            format!("{f} is set with an unrecognized option: {s}"),
            f,
        ));
    }
}

/// `topologySpreadConstraints`: Kubernetes' basic checks.
pub fn validate_topology_spread(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    c: &mut Vec<Cause>,
) {
    for (i, t) in spec.topology_spread_constraints.iter().enumerate() {
        let at = field.child("topologySpreadConstraints").index(i);
        if t.max_skew <= 0 {
            let f = at.child("maxSkew");
            c.push(Cause::invalid(
                format!(
                    "{f}: Invalid value: {}: must be greater than zero",
                    t.max_skew
                ),
                f,
            ));
        }
        if t.topology_key.is_empty() {
            let f = at.child("topologyKey");
            c.push(Cause::invalid(
                format!("{f}: Required value: can not be empty"),
                f,
            ));
        }
        if !["DoNotSchedule", "ScheduleAnyway"].contains(&t.when_unsatisfiable.as_str()) {
            let f = at.child("whenUnsatisfiable");
            c.push(Cause::invalid(
                format!("{f}: Unsupported value: \"{}\": supported values: \"DoNotSchedule\", \"ScheduleAnyway\"", t.when_unsatisfiable),
                f,
            ));
        }
    }
}

/// Launch security per architecture and the service account name.
pub fn validate_arch_features(
    field: &FieldPath,
    spec: &VirtualMachineInstanceSpec,
    _cfg: &ClusterConfig,
    c: &mut Vec<Cause>,
) {
    if spec.domain.launch_security.is_some() {
        let arch = spec.architecture.as_deref().unwrap_or("");
        if !matches!(arch, "amd64" | "s390x") {
            c.push(Cause::invalid(
                format!("No launchSecurity support for architecture: {arch}"),
                field.child("architecture"),
            ));
        }
    }
    let Some(sa) = spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
    else {
        return;
    };
    let f = field.child("serviceAccountName");
    let errs = dns1123_subdomain_errors(sa);
    if !errs.is_empty() {
        c.push(Cause::invalid(
            format!(
                "{f} is not a valid service account name: {}",
                errs.join("; ")
            ),
            &f,
        ));
    }
    let other = spec.volumes.iter().find_map(|v| {
        v.volume_source
            .service_account
            .as_ref()
            .map(|s| s.service_account_name.clone().unwrap_or_default())
            .filter(|n| n != sa)
    });
    if let Some(other) = other {
        c.push(Cause::invalid(
            format!("spec.serviceAccountName {sa:?} and serviceAccount volume {other:?} must reference the same service account"),
            &f,
        ));
    }
}
