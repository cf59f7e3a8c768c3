//! What the guest agent adds to a running VMI's status, as upstream's handler writes it:
//! the `AgentConnected` and `AgentVersionNotSupported` conditions, `guestOSInfo`, and the
//! guest's own interface names in `status.interfaces`, and `fsFreezeStatus`.

use kubevirt_api::v1::VirtualMachineInstance;
use serde_json::{Value, json};
use virt_launcher::protocol::{GuestAgent, GuestAgentCommand};

/// The commands an agent must offer (upstream's `requiredGuestAgentCommands`).
const REQUIRED_COMMANDS: &[&str] = &[
    "guest-ping",
    "guest-get-time",
    "guest-info",
    "guest-shutdown",
    "guest-network-get-interfaces",
    "guest-get-fsinfo",
    "guest-get-host-name",
    "guest-get-users",
    "guest-get-timezone",
    "guest-get-osinfo",
];
/// What SSH keys propagated through the agent need (or, with older agents, the second set).
const SSH_COMMANDS: &[&str] = &[
    "guest-ssh-get-authorized-keys",
    "guest-ssh-add-authorized-keys",
    "guest-ssh-remove-authorized-keys",
];
const OLD_SSH_COMMANDS: &[&str] = &[
    "guest-exec-status",
    "guest-exec",
    "guest-file-open",
    "guest-file-close",
    "guest-file-read",
    "guest-file-write",
];
const PASSWORD_COMMANDS: &[&str] = &["guest-set-user-password"];

/// Writes what `agent` reports into a running VMI's `status` and `conditions`.
pub(super) fn apply(
    status: &mut Value,
    conditions: &mut Vec<Value>,
    vmi: &VirtualMachineInstance,
    agent: Option<&GuestAgent>,
    now: &str,
) {
    update_conditions(conditions, vmi, agent, now);
    if let Some(os) = guest_os_info(agent) {
        status["guestOSInfo"] = os;
    }
    // `frozen` while the guest's filesystems are frozen; cleared (null) once thawed.
    status["fsFreezeStatus"] = agent
        .filter(|a| a.connected)
        .and_then(|a| a.fs_freeze_status.clone())
        .map_or(Value::Null, Value::String);
    merge_interfaces(&mut status["interfaces"], agent);
}

/// Upstream's `isGuestAgentSupported`: `None` when supported, else the reason.
fn unsupported(
    vmi: &VirtualMachineInstance,
    commands: &[GuestAgentCommand],
) -> Option<&'static str> {
    let has_all = |wanted: &[&str]| {
        wanted
            .iter()
            .all(|w| commands.iter().any(|c| c.name == *w && c.enabled))
    };
    if !has_all(REQUIRED_COMMANDS) {
        return Some("This guest agent doesn't support required basic commands");
    }
    let credentials = &vmi.spec.access_credentials;
    let ssh = credentials.iter().any(|c| {
        c.ssh_public_key
            .as_ref()
            .is_some_and(|k| k.propagation_method.qemu_guest_agent.is_some())
    });
    let password = credentials.iter().any(|c| {
        c.user_password
            .as_ref()
            .is_some_and(|p| p.propagation_method.qemu_guest_agent.is_some())
    });
    if ssh && !has_all(SSH_COMMANDS) && !has_all(OLD_SSH_COMMANDS) {
        return Some("This guest agent doesn't support required public key commands");
    }
    if password && !has_all(PASSWORD_COMMANDS) {
        return Some("This guest agent doesn't support required password commands");
    }
    None
}

fn probed(type_: &str, reason: Option<&str>, now: &str) -> Value {
    // Upstream sets only the probe time on these two.
    let mut c = json!({"type": type_, "status": "True", "lastProbeTime": now});
    if let Some(reason) = reason {
        c["reason"] = json!(reason);
    }
    c
}

/// Upstream's `updateGuestAgentConditions`: `AgentConnected` added once while the agent is
/// connected and removed when it is not; `AgentVersionNotSupported` added once while a
/// connected agent lacks a required command, removed once it has them. An agent that has not
/// listed its commands yet leaves the second alone (upstream would then match its version
/// against `supportedGuestAgentVersions`; this launcher always lists the commands).
pub(super) fn update_conditions(
    conditions: &mut Vec<Value>,
    vmi: &VirtualMachineInstance,
    agent: Option<&GuestAgent>,
    now: &str,
) {
    let has = |conditions: &Vec<Value>, t: &str| conditions.iter().any(|c| c["type"] == t);
    let connected = agent.filter(|a| a.connected);
    let Some(agent) = connected else {
        conditions.retain(|c| c["type"] != "AgentConnected");
        return;
    };
    if !has(conditions, "AgentConnected") {
        conditions.push(probed("AgentConnected", None, now));
    }
    if agent.supported_commands.is_empty() {
        return;
    }
    match unsupported(vmi, &agent.supported_commands) {
        Some(reason) if !has(conditions, "AgentVersionNotSupported") => {
            conditions.push(probed("AgentVersionNotSupported", Some(reason), now));
        }
        Some(_) => {}
        None => conditions.retain(|c| c["type"] != "AgentVersionNotSupported"),
    }
}

/// `status.guestOSInfo` from the agent's `guest-get-osinfo`; `None` leaves the field as it is.
pub(super) fn guest_os_info(agent: Option<&GuestAgent>) -> Option<Value> {
    // The protocol's `GuestOs` has upstream's field names and omits absent ones.
    serde_json::to_value(agent?.os.as_ref()?).ok()
}

/// Adds what the agent sees to the domain's interfaces, matched by MAC: the guest's name for
/// the interface (`interfaceName`) and `guest-agent` in `infoSource` (upstream's
/// `domain, guest-agent`). The addresses stay the domain's: for masquerade upstream reports
/// the pod's, never the guest's NAT address.
pub(super) fn merge_interfaces(interfaces: &mut Value, agent: Option<&GuestAgent>) {
    let Some(agent) = agent.filter(|a| a.connected) else {
        return;
    };
    let Some(entries) = interfaces.as_array_mut() else {
        return;
    };
    for entry in entries {
        let mac = entry["mac"].as_str().map(str::to_ascii_lowercase);
        let seen = agent
            .interfaces
            .iter()
            .find(|i| i.mac.is_some() && i.mac == mac);
        if let Some(seen) = seen {
            entry["interfaceName"] = json!(seen.name);
            // `domain, guest-agent`, with `multus-status` kept where virt-controller put it.
            let multus = entry["infoSource"]
                .as_str()
                .is_some_and(|s| s.contains("multus-status"));
            entry["infoSource"] = json!(if multus {
                "domain, guest-agent, multus-status"
            } else {
                "domain, guest-agent"
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virt_launcher::protocol::{GuestInterface, GuestOs};

    fn vmi(extra_spec: Value) -> VirtualMachineInstance {
        let mut spec = json!({"domain": {"devices": {}}});
        if let (Some(s), Value::Object(e)) = (spec.as_object_mut(), extra_spec) {
            s.extend(e);
        }
        serde_json::from_value(json!({"metadata": {"name": "v"}, "spec": spec})).expect("vmi")
    }

    fn commands(names: &[&str]) -> Vec<GuestAgentCommand> {
        names
            .iter()
            .map(|n| GuestAgentCommand {
                name: (*n).into(),
                enabled: true,
            })
            .collect()
    }

    #[test]
    fn a_connected_agent_adds_its_condition_once_and_a_disconnected_one_removes_it() {
        let vmi = vmi(json!({}));
        let mut conditions = Vec::new();
        let agent = GuestAgent {
            connected: true,
            ..GuestAgent::default()
        };
        update_conditions(&mut conditions, &vmi, Some(&agent), "t1");
        update_conditions(&mut conditions, &vmi, Some(&agent), "t2");
        assert_eq!(
            conditions,
            vec![json!({"type": "AgentConnected", "status": "True", "lastProbeTime": "t1"})]
        );
        update_conditions(&mut conditions, &vmi, None, "t3");
        assert!(conditions.is_empty());
    }

    #[test]
    fn an_agent_without_the_basic_commands_is_not_supported_until_it_has_them() {
        let vmi = vmi(json!({}));
        let mut conditions = Vec::new();
        let mut agent = GuestAgent {
            connected: true,
            supported_commands: commands(&["guest-ping"]),
            ..GuestAgent::default()
        };
        update_conditions(&mut conditions, &vmi, Some(&agent), "t1");
        assert_eq!(
            conditions[1]["reason"],
            "This guest agent doesn't support required basic commands"
        );
        agent.supported_commands = commands(REQUIRED_COMMANDS);
        update_conditions(&mut conditions, &vmi, Some(&agent), "t2");
        assert_eq!(conditions.len(), 1, "{conditions:?}");
        // Keys propagated through the agent need its SSH commands.
        let with_keys = self::vmi(json!({"accessCredentials": [{"sshPublicKey": {
            "source": {"secret": {"secretName": "keys"}},
            "propagationMethod": {"qemuGuestAgent": {"users": ["root"]}}}}]}));
        update_conditions(&mut conditions, &with_keys, Some(&agent), "t3");
        assert_eq!(
            conditions[1]["reason"],
            "This guest agent doesn't support required public key commands"
        );
    }

    #[test]
    fn the_guest_names_the_interface_it_has_with_the_domains_mac() {
        let agent = GuestAgent {
            connected: true,
            interfaces: vec![GuestInterface {
                name: "eth0".into(),
                mac: Some("02:00:00:00:00:01".into()),
                ip_addresses: vec!["10.0.2.2".into()],
            }],
            os: Some(GuestOs {
                pretty_name: Some("test guest".into()),
                ..GuestOs::default()
            }),
            ..GuestAgent::default()
        };
        let mut interfaces = json!([
            {"name": "default", "mac": "02:00:00:00:00:01", "infoSource": "domain", "ipAddress": "10.244.0.5"},
            {"name": "other", "mac": "02:00:00:00:00:02", "infoSource": "domain"},
        ]);
        merge_interfaces(&mut interfaces, Some(&agent));
        assert_eq!(interfaces[0]["interfaceName"], "eth0");
        assert_eq!(interfaces[0]["infoSource"], "domain, guest-agent");
        assert_eq!(interfaces[0]["ipAddress"], "10.244.0.5");
        assert_eq!(interfaces[1]["infoSource"], "domain");
        assert_eq!(
            guest_os_info(Some(&agent)),
            Some(json!({"prettyName": "test guest"}))
        );
    }
}
