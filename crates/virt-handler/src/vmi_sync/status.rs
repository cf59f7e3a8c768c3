//! What the handler writes on a VMI, computed from what it observed (pure).
//!
//! [`phase_for`] maps a launcher domain state to a VMI phase as upstream's
//! `calculateVmPhaseForStatusReason` does; [`desired_status`] takes the VMI as it is and an
//! [`Observation`] and returns the handler-owned status fields as they should be;
//! [`status_patch`] turns the difference into a JSON Patch that starts with a `test` of the
//! phase (and of the conditions when it rewrites them), so a concurrent writer makes the
//! patch fail instead of being overwritten. Nothing is written when nothing changed.
//!
//! Handler-owned fields: `phase` from Scheduled on (never `reason`, as upstream),
//! `phaseTransitionTimestamps` (appended on each phase change), `interfaces`, `machine`,
//! `currentCPUTopology`, `memory`, the hotplug phases `MountedToPod` and `Ready` in
//! `volumeStatus` (guarded by a `test` of the list), and the conditions `LiveMigratable`,
//! `StorageLiveMigratable`, `Paused`,
//! `SoftwareEmulation` and `Synchronized` (the last only while a sync fails); from the guest
//! agent ([`agent`]) `guestOSInfo`, the guest's interface names and the conditions
//! `AgentConnected` and `AgentVersionNotSupported`.

use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};
use serde_json::{Value, json};
use virt_launcher::protocol::PodInterface;
use virt_launcher::protocol::{CpuTopology, DomainState, DomainStatus, GuestMemory, StateReason};
use virt_launcher::spec::{Accel, InterfaceBinding, LauncherSpec};

/// What the handler knows about a VMI's domain.
#[derive(Debug, Clone, PartialEq)]
pub enum Observation {
    /// The launcher reported this state.
    Domain(DomainStatus),
    /// The launcher is gone without reporting a final state.
    LauncherGone(String),
    /// The launcher is up, the domain not started, and the spec could not be built or was
    /// refused: `(reason, message)`.
    SyncFailed(String, String),
}

/// Facts about how the handler runs the domain, for the status.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainFacts {
    /// The spec that was (or would be) sent, when it could be built.
    pub spec: Option<LauncherSpec>,
    /// Why this accelerator was chosen (condition message).
    pub accel_reason: String,
    /// The launcher's pod interface (from its hello), when it has its own network.
    pub pod_interface: Option<PodInterface>,
    /// The phases this handler gave hotplug volumes ([`super::hotplug`]).
    pub hotplug: std::collections::BTreeMap<String, super::hotplug::HandlerPhase>,
}

/// Whether the domain was given a graceful shutdown before being destroyed: a grace
/// period and ACPI in the domain, as upstream's `isACPIEnabled` (the converter puts ACPI in
/// the domain only when the VMI has `features` and does not disable `acpi`).
pub fn acpi_shutdown_attempted(vmi: &VirtualMachineInstance) -> bool {
    let grace = vmi
        .spec
        .termination_grace_period_seconds
        .unwrap_or(kubevirt_api::v1::DEFAULT_GRACE_PERIOD_SECONDS);
    let acpi = vmi
        .spec
        .domain
        .features
        .as_ref()
        .is_some_and(|f| f.acpi.as_ref().is_none_or(|a| a.enabled != Some(false)));
    grace > 0 && acpi
}

/// The phase a domain state means; `None` leaves the phase alone. `acpi_shutdown` is
/// [`acpi_shutdown_attempted`] for the VMI.
pub fn phase_for(domain: &DomainStatus, acpi_shutdown: bool) -> Option<Phase> {
    match domain.state {
        DomainState::Pending => None,
        DomainState::Running | DomainState::Paused => Some(Phase::Running),
        DomainState::Shutoff => match domain.reason {
            // Destroyed after a graceful shutdown was tried means the grace period ran out: a
            // failure. Without a grace period or ACPI a destroyed domain is fine, as upstream.
            StateReason::Destroyed if acpi_shutdown => Some(Phase::Failed),
            // Migrated away: the VMI runs on, on the target node.
            StateReason::Migrated => None,
            _ => Some(Phase::Succeeded),
        },
        DomainState::Crashed => Some(Phase::Failed),
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, now: &str) -> Value {
    let mut c = json!({
        "type": type_,
        "status": status,
        "lastTransitionTime": now,
    });
    if !reason.is_empty() {
        c["reason"] = json!(reason);
    }
    if !message.is_empty() {
        c["message"] = json!(message);
    }
    c
}

/// Replaces (or removes, with `None`) the condition of `type_`, keeping the old
/// `lastTransitionTime` when the status did not change.
fn set_condition(conditions: &mut Vec<Value>, type_: &str, new: Option<Value>) {
    let old = conditions.iter().position(|c| c["type"] == type_);
    match (old, new) {
        (Some(i), None) => {
            conditions.remove(i);
        }
        (None, Some(c)) => conditions.push(c),
        (Some(i), Some(mut c)) => {
            let same = |k: &str| conditions[i][k] == c[k];
            if same("status") && same("reason") && same("message") {
                return;
            }
            if same("status") {
                c["lastTransitionTime"] = conditions[i]["lastTransitionTime"].clone();
            }
            conditions[i] = c;
        }
        (None, None) => {}
    }
}

/// Upstream's `UpdateCondition`: appended when missing, replaced only when status or reason
/// changed.
fn update_condition(conditions: &mut Vec<Value>, new: Value) {
    match conditions.iter_mut().find(|c| c["type"] == new["type"]) {
        Some(old) if old["status"] == new["status"] && old["reason"] == new["reason"] => {}
        Some(old) => *old = new,
        None => conditions.push(new),
    }
}

fn mib_quantity(bytes: u64) -> String {
    format!("{}Mi", bytes >> 20)
}

/// The status fields the handler owns, as they should be given `observation`.
/// Returns the VMI's status (as JSON) with those fields updated.
pub fn desired_status(
    vmi: &VirtualMachineInstance,
    observation: &Observation,
    facts: &DomainFacts,
    now: &str,
) -> Value {
    let mut status = serde_json::to_value(&vmi.status).unwrap_or_else(|_| json!({}));
    if status.is_null() {
        status = json!({});
    }
    let old_phase = vmi.status.as_ref().and_then(|s| s.phase.clone());
    if old_phase
        .as_ref()
        .is_some_and(|p| matches!(p, Phase::Succeeded | Phase::Failed))
    {
        return status;
    }
    let mut conditions: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    let phase = match observation {
        Observation::Domain(domain) => phase_for(domain, acpi_shutdown_attempted(vmi))
            .unwrap_or_else(|| old_phase.clone().unwrap_or(Phase::Scheduled)),
        Observation::LauncherGone(_) => Phase::Failed,
        Observation::SyncFailed(..) => old_phase.clone().unwrap_or(Phase::Scheduled),
    };
    if let Observation::SyncFailed(reason, message) = observation {
        set_condition(
            &mut conditions,
            "Synchronized",
            Some(condition("Synchronized", "False", reason, message, now)),
        );
    } else {
        set_condition(&mut conditions, "Synchronized", None);
    }
    if let Observation::Domain(domain) = observation {
        // As upstream's `updatePausedConditions`: added once while paused (an existing
        // condition is left alone), removed once the domain runs again.
        let has_paused = conditions.iter().any(|c| c["type"] == "Paused");
        if domain.state != DomainState::Paused {
            set_condition(&mut conditions, "Paused", None);
        } else if !has_paused {
            // The launcher tells a `pause` command (User) from QEMU stopping on its own
            // (Emulator: in practice a disk with `werror=stop` hitting an I/O error); any
            // other reason adds no condition, as upstream's default case.
            let paused = match domain.reason {
                StateReason::User => Some(("PausedByUser", "VMI was paused by user")),
                StateReason::Emulator => Some((
                    "PausedIOError",
                    "VMI was paused, low-level IO error detected",
                )),
                _ => None,
            };
            if let Some((reason, message)) = paused {
                set_condition(
                    &mut conditions,
                    "Paused",
                    Some(condition("Paused", "True", reason, message, now)),
                );
            }
        }
    }
    if phase == Phase::Running {
        set_condition(
            &mut conditions,
            "LiveMigratable",
            Some(migratable::live_migratable(vmi)),
        );
        update_condition(&mut conditions, migratable::storage_live_migratable(vmi));
        status["migrationMethod"] = json!(migratable::migration_method(vmi));
        let tcg = facts.spec.as_ref().is_some_and(|s| s.accel == Accel::Tcg);
        let emulation = tcg.then(|| {
            condition(
                "SoftwareEmulation",
                "True",
                "SoftwareEmulation",
                &facts.accel_reason,
                now,
            )
        });
        set_condition(&mut conditions, "SoftwareEmulation", emulation);
        if let Some(spec) = &facts.spec {
            let domain = match observation {
                Observation::Domain(domain) => Some(domain),
                _ => None,
            };
            running_fields(&mut status, spec, facts.pod_interface.as_ref(), domain);
            finish_hotplug(vmi, &status, &mut conditions);
        }
        if let Observation::Domain(domain) = observation {
            let agent = domain.guest_agent.as_deref();
            agent::apply(&mut status, &mut conditions, vmi, agent, now);
        }
        if let Some(volumes) = super::hotplug::volume_status_with(vmi, &status, &facts.hotplug) {
            status["volumeStatus"] = volumes;
        }
    }
    if matches!(phase, Phase::Succeeded | Phase::Failed) {
        set_condition(&mut conditions, "Paused", None);
    }
    status["conditions"] = Value::Array(conditions);
    if old_phase.as_ref() != Some(&phase) {
        status["phase"] = json!(phase.as_str());
        let mut stamps = status["phaseTransitionTimestamps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        stamps.push(json!({"phase": phase.as_str(), "phaseTransitionTimestamp": now}));
        status["phaseTransitionTimestamps"] = Value::Array(stamps);
    }
    status
}

/// `status.interfaces` as upstream's handler reports it from the domain: name, MAC,
/// `infoSource: domain`, and for a masquerade interface the pod IPs (upstream reports the
/// pod's addresses, never the guest's NAT address), for a passt interface the pod IPs (the
/// guest holds them), for a bridge interface the pod's IPv4
/// address, which the guest holds. A user-mode interface has no address
/// anyone could reach, so it reports none.
///
/// A secondary (Multus) interface reports its own pod interface and no address; the
/// `multus-status` source virt-controller adds is kept, and so is an entry of an interface
/// the pod has that the domain has not (yet, or any more).
fn interface_status(spec: &LauncherSpec, pod: Option<&PodInterface>, previous: &Value) -> Value {
    let previous: &[Value] = previous.as_array().map_or(&[], Vec::as_slice);
    let multus = |name: &str| {
        previous.iter().any(|p| {
            p["name"] == name
                && p["infoSource"]
                    .as_str()
                    .is_some_and(|s| s.contains("multus-status"))
        })
    };
    let mut out: Vec<Value> = spec
        .interfaces
        .iter()
        .map(|i| {
            let pod_interface = match &i.binding {
                InterfaceBinding::Bridge(b) => b.pod_interface.as_str(),
                _ => "eth0",
            };
            let mut entry = json!({
                "name": i.name,
                "mac": i.mac_address,
                "podInterfaceName": pod_interface,
                "infoSource": if multus(&i.name) { "domain, multus-status" } else { "domain" },
                "queueCount": 1,
                "linkState": if i.link_down { "down" } else { "up" },
            });
            let secondary = pod.is_some_and(|p| p.name != pod_interface);
            let ips: Vec<&String> = match (&i.binding, pod.filter(|_| !secondary)) {
                // passt hands the pod's addresses to the guest.
                (InterfaceBinding::Masquerade(_) | InterfaceBinding::Passt(_), Some(pod)) => {
                    pod.ip_addresses.iter().collect()
                }
                // The guest holds the pod's IPv4 address; IPv6 is not handed to it (upstream).
                (InterfaceBinding::Bridge(_), Some(pod)) => pod
                    .ip_addresses
                    .iter()
                    .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
                    .collect(),
                _ => Vec::new(),
            };
            if let Some(first) = ips.first() {
                entry["ipAddress"] = json!(first);
                entry["ipAddresses"] = json!(ips);
            }
            entry
        })
        .collect();
    for kept in previous {
        let name = kept["name"].as_str().unwrap_or_default();
        if multus(name) && !spec.interfaces.iter().any(|i| i.name == name) {
            out.push(json!({
                "name": name,
                "podInterfaceName": kept["podInterfaceName"],
                "infoSource": "multus-status",
            }));
        }
    }
    Value::Array(out)
}

/// The fields of a running domain. vCPUs and memory are what the launcher reports the
/// domain has (a hotplug shows once QEMU plugged it, and `guestCurrent` once the guest took
/// the memory); a launcher too old to report them is described by the spec it was sent.
fn running_fields(
    status: &mut Value,
    spec: &LauncherSpec,
    pod: Option<&PodInterface>,
    domain: Option<&DomainStatus>,
) {
    status["interfaces"] = interface_status(spec, pod, &status["interfaces"]);
    status["machine"] = json!({"type": spec.machine_type});
    let cpu = domain.and_then(|d| d.cpu).unwrap_or(CpuTopology {
        sockets: spec.cpu.sockets,
        cores: spec.cpu.cores,
        threads: spec.cpu.threads,
    });
    status["currentCPUTopology"] = json!({
        "sockets": cpu.sockets,
        "cores": cpu.cores,
        "threads": cpu.threads,
    });
    let boot = spec.memory.guest_bytes;
    let reported = domain.and_then(|d| d.memory).unwrap_or(GuestMemory {
        at_boot_bytes: boot,
        current_bytes: boot,
        requested_bytes: boot + spec.memory.hotplugged_bytes,
    });
    let mut memory = status["memory"].as_object().cloned().unwrap_or_default();
    memory.insert(
        "guestAtBoot".into(),
        json!(mib_quantity(reported.at_boot_bytes)),
    );
    memory.insert(
        "guestCurrent".into(),
        json!(mib_quantity(reported.current_bytes)),
    );
    memory.insert(
        "guestRequested".into(),
        json!(mib_quantity(reported.requested_bytes)),
    );
    status["memory"] = Value::Object(memory);
}

/// Removes `HotVCPUChange` once the domain has the vCPUs the spec asks for and
/// `HotMemoryChange` once the domain was asked for the spec's memory (upstream's handler
/// removes them when its hotplug succeeded; the VMI controller adds them).
fn finish_hotplug(vmi: &VirtualMachineInstance, status: &Value, conditions: &mut Vec<Value>) {
    use kubevirt_api::live_update::vcpus;
    let now = &status["currentCPUTopology"];
    let count = |key: &str| now[key].as_u64().and_then(|n| u32::try_from(n).ok());
    let plugged = vcpus(count("sockets"), count("cores"), count("threads"));
    if vmi
        .spec
        .domain
        .cpu
        .as_ref()
        .is_none_or(|c| vcpus(c.sockets, c.cores, c.threads) == plugged)
    {
        set_condition(conditions, "HotVCPUChange", None);
    }
    let bytes = |v: &Value| {
        v.as_str()
            .and_then(|q| kubevirt_api::quantity::Quantity::parse(q).ok())
            .map(|q| q.value())
    };
    let guest = vmi
        .spec
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.guest.as_ref())
        .map(|q| json!(q.0));
    if guest.is_none_or(|g| bytes(&g) == bytes(&status["memory"]["guestRequested"])) {
        set_condition(conditions, "HotMemoryChange", None);
    }
}

/// The fields [`desired_status`] may change, in patch order.
const OWNED: &[&str] = &[
    "interfaces",
    "guestOSInfo",
    "fsFreezeStatus",
    "migrationMethod",
    "machine",
    "currentCPUTopology",
    "memory",
    "reason",
    "phaseTransitionTimestamps",
    "phase",
];

/// A JSON Patch from the VMI's status to `desired`, or `None` when nothing changes.
pub fn status_patch(vmi: &VirtualMachineInstance, desired: &Value) -> Option<Value> {
    let current = serde_json::to_value(&vmi.status).unwrap_or(Value::Null);
    let current = if current.is_null() {
        json!({})
    } else {
        current
    };
    let mut ops = Vec::new();
    if current.get("phase").is_some() {
        ops.push(json!({"op": "test", "path": "/status/phase", "value": current["phase"]}));
    }
    let mut changed = false;
    if current.as_object().is_none_or(serde_json::Map::is_empty) && vmi.status.is_none() {
        ops.push(json!({"op": "add", "path": "/status", "value": {}}));
    }
    let empty = Value::Array(Vec::new());
    let old_conditions = current.get("conditions").unwrap_or(&empty);
    let new_conditions = desired.get("conditions").unwrap_or(&empty);
    if old_conditions != new_conditions {
        if current.get("conditions").is_some() {
            ops.push(json!({"op": "test", "path": "/status/conditions", "value": old_conditions}));
        }
        ops.push(json!({"op": "add", "path": "/status/conditions", "value": new_conditions}));
        changed = true;
    }
    // virt-controller writes the volume status too (attachment pods): replace it only as read.
    if let Some(new) = desired.get("volumeStatus")
        && current.get("volumeStatus") != Some(new)
    {
        if let Some(old) = current.get("volumeStatus") {
            ops.push(json!({"op": "test", "path": "/status/volumeStatus", "value": old}));
        }
        ops.push(json!({"op": "add", "path": "/status/volumeStatus", "value": new}));
        changed = true;
    }
    for field in OWNED {
        if let Some(new) = desired.get(*field)
            && !same_field(current.get(*field), new)
        {
            // A field cleared (null) is removed, not stored as null.
            let op = if new.is_null() {
                json!({"op": "remove", "path": format!("/status/{field}")})
            } else {
                json!({"op": "add", "path": format!("/status/{field}"), "value": new})
            };
            ops.push(op);
            changed = true;
        }
    }
    changed.then_some(Value::Array(ops))
}

/// Whether a status field reads `new` already. The typed status omits empty lists and
/// objects when it is serialized, so an absent field equals an empty one: without this an
/// `interfaces: []` would be written again on every observation.
fn same_field(current: Option<&Value>, new: &Value) -> bool {
    let empty = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    match current {
        Some(current) => current == new || (empty(current) && empty(new)),
        None => empty(new),
    }
}

mod agent;
pub(crate) mod migratable;

#[cfg(test)]
mod tests;
