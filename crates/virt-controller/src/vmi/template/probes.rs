//! The `compute` container's probes and ports, from the VMI as upstream renders them.
//!
//! `spec.readinessProbe` and `spec.livenessProbe` become the container's probes with
//! Kubernetes' defaults filled in (timeout 1 s, period 10 s, success 1, failure 3: upstream's
//! `SetDefaults_Probe`) and upstream's `LibvirtStartupDelay` of 10 s added to the initial
//! delay. `httpGet` and `tcpSocket` are copied: kubelet probes the pod IP, which reaches the
//! guest through the masquerade binding's port forwarding (or the guest owns it, with bridge).
//!
//! `exec` and `guestAgentPing` become `exec` probes of upstream's `virt-probe` command
//! (`--domainName <ns>_<name> --timeoutSeconds T`, then `--command C -- ARGS` or
//! `--guestAgentPing`), here the launcher image's `virt-probe`; it runs the
//! command in the guest, or pings, through the guest agent. As upstream the pod probe's
//! timeout is one second longer than the VMI's, for the extra steps.
//!
//! The container's `ports` are the interfaces' `ports` (protocol `TCP` unless given), so an
//! `httpGet`/`tcpSocket` probe may name a port.

use k8s_openapi::api::core::v1::{ContainerPort, ExecAction, Probe};
use kubevirt_api::v1::{Probe as VmiProbe, VirtualMachineInstance};

/// Upstream's `LibvirtStartupDelay`: added to each custom probe's initial delay.
pub const LIBVIRT_STARTUP_DELAY_SECONDS: i32 = 10;

/// The pod probe for a VMI probe of the VMI `namespace/name`.
pub fn compute_probe(probe: Option<&VmiProbe>, namespace: &str, name: &str) -> Option<Probe> {
    let probe = probe?;
    let timeout = probe.timeout_seconds.filter(|t| *t > 0).unwrap_or(1);
    let mut virt_probe = vec![
        kubevirt_api::constants::PROBE_PROGRAM.to_owned(),
        "--domainName".to_owned(),
        format!("{namespace}_{name}"),
        "--timeoutSeconds".to_owned(),
        timeout.to_string(),
    ];
    let exec = if probe.guest_agent_ping.is_some() {
        virt_probe.push("--guestAgentPing".to_owned());
        Some(virt_probe)
    } else if let Some((program, args)) = probe
        .exec
        .as_ref()
        .and_then(|e| e.command.as_deref())
        .and_then(<[String]>::split_first)
    {
        virt_probe.extend(["--command".to_owned(), program.clone(), "--".to_owned()]);
        virt_probe.extend(args.iter().cloned());
        Some(virt_probe)
    } else {
        None
    };
    if exec.is_none() && probe.http_get.is_none() && probe.tcp_socket.is_none() {
        return None;
    }
    Some(Probe {
        http_get: probe.http_get.clone(),
        tcp_socket: probe.tcp_socket.clone(),
        timeout_seconds: Some(timeout + i32::from(exec.is_some())),
        exec: exec.map(|command| ExecAction {
            command: Some(command),
        }),
        initial_delay_seconds: Some(
            probe.initial_delay_seconds.unwrap_or(0) + LIBVIRT_STARTUP_DELAY_SECONDS,
        ),
        period_seconds: Some(probe.period_seconds.filter(|p| *p > 0).unwrap_or(10)),
        success_threshold: Some(probe.success_threshold.filter(|s| *s > 0).unwrap_or(1)),
        failure_threshold: Some(probe.failure_threshold.filter(|f| *f > 0).unwrap_or(3)),
        ..Probe::default()
    })
}

/// Upstream's `containerPortsFromVMI`: every interface's ports, `TCP` unless given.
pub fn container_ports(vmi: &VirtualMachineInstance) -> Option<Vec<ContainerPort>> {
    let ports: Vec<ContainerPort> = vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .flat_map(|i| &i.ports)
        .map(|p| ContainerPort {
            container_port: p.port,
            name: p.name.clone(),
            protocol: Some(
                p.protocol
                    .clone()
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| "TCP".to_owned()),
            ),
            ..ContainerPort::default()
        })
        .collect();
    (!ports.is_empty()).then_some(ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(spec: &serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({"metadata": {"name": "v"}, "spec": spec})).expect("vmi")
    }

    #[test]
    fn a_tcp_probe_gets_kubernetes_defaults_and_the_startup_delay() {
        let vmi = vmi(&json!({
            "domain": {"devices": {}},
            "readinessProbe": {"tcpSocket": {"port": 8080}, "initialDelaySeconds": 5},
        }));
        let probe = compute_probe(vmi.spec.readiness_probe.as_ref(), "ns", "v").expect("probe");
        assert_eq!(
            serde_json::to_value(probe).expect("json"),
            json!({"tcpSocket": {"port": 8080}, "initialDelaySeconds": 15, "timeoutSeconds": 1,
                "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
        );
    }

    #[test]
    fn agent_probes_run_virt_probe_and_ports_come_from_the_interfaces() {
        let vmi = vmi(&json!({
            "domain": {"devices": {"interfaces": [
                {"name": "default", "masquerade": {}, "ports": [{"name": "http", "port": 80}, {"port": 53, "protocol": "UDP"}]},
            ]}},
            "livenessProbe": {"guestAgentPing": {}},
            "readinessProbe": {"exec": {"command": ["cat", "/tmp/ready"]}, "timeoutSeconds": 3},
        }));
        let live = compute_probe(vmi.spec.liveness_probe.as_ref(), "ns", "v").expect("liveness");
        assert_eq!(
            serde_json::to_value(live).expect("json"),
            json!({"exec": {"command": ["virt-probe", "--domainName", "ns_v",
                    "--timeoutSeconds", "1", "--guestAgentPing"]},
                "initialDelaySeconds": 10, "timeoutSeconds": 2, "periodSeconds": 10,
                "successThreshold": 1, "failureThreshold": 3})
        );
        let ready = compute_probe(vmi.spec.readiness_probe.as_ref(), "ns", "v").expect("readiness");
        assert_eq!(
            ready.exec.and_then(|e| e.command),
            Some(
                [
                    "virt-probe",
                    "--domainName",
                    "ns_v",
                    "--timeoutSeconds",
                    "3",
                    "--command",
                    "cat",
                    "--",
                    "/tmp/ready"
                ]
                .map(String::from)
                .to_vec()
            )
        );
        assert_eq!(ready.timeout_seconds, Some(4));
        assert_eq!(
            serde_json::to_value(container_ports(&vmi)).expect("json"),
            json!([{"containerPort": 80, "name": "http", "protocol": "TCP"},
                {"containerPort": 53, "protocol": "UDP"}])
        );
    }
}
