//! End-to-end: readiness and liveness probes of a VMI, run by the node against the guest
//! through the pod IP (masquerade forwards the interface's ports). A guest serving the probed
//! port makes the VMI and the VM Ready; once it stops serving, the VMI is no longer Ready; a
//! failing liveness probe ends the VMI and its VM (`runStrategy: Always`) starts a new one.
//! An `exec` readiness probe runs its command in the guest through the guest agent (the VMI
//! turns Ready once the file it reads exists), and a `guestAgentPing` liveness probe keeps a
//! guest with a running agent alive.
//! Needs root and the CNI plugins (a pod network), the test guest and QEMU; skips, saying
//! why, without them.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// A serving VM ([`testkit::serving_guest_vm`]) forwarding 8080 and 8081, with `probes` (lines
/// of the template's spec).
fn probed_vm(name: &str, probes: &[&str]) -> String {
    testkit::serving_guest_vm(
        name,
        "masquerade: {}, ports: [{name: http, port: 8080}, {port: 8081}]",
        probes,
    )
}

fn condition(server: &ServerProcess, vmi: &str, type_: &str) -> String {
    server.get(
        &["vmi", vmi],
        &format!(r#"{{.status.conditions[?(@.type=="{type_}")].status}}"#),
    )
}

fn has_pod_network(server: &ServerProcess, vm: &str) -> bool {
    let pod = server.get(
        &["pods", "-l", &format!("vm.kubevirt.io/name={vm}")],
        "{.items[0].metadata.name}",
    );
    let ip = server.get(&["pod", &pod], "{.status.podIP}");
    !ip.is_empty() && ip != server.get(&["pod", &pod], "{.status.hostIP}")
}

#[test]
fn probes_decide_readiness_and_a_failing_liveness_probe_restarts_the_vm() -> anyhow::Result<()> {
    let Some(server) = ServerProcess::start_with_test_guest(Path::new(BIN))? else {
        return Ok(());
    };
    let result = scenario(&server);
    testkit::with_log(&server, result)
}

fn scenario(server: &ServerProcess) -> anyhow::Result<()> {
    server.apply(&probed_vm(
        "ready",
        &["readinessProbe: {httpGet: {port: http, path: /index.html}, periodSeconds: 1, failureThreshold: 1}"],
    ))?;
    wait_until(DEADLINE, "VMI ready Running", || {
        (server.get(&["vmi", "ready"], "{.status.phase}") == "Running").then_some(())
    })?;
    if !has_pod_network(server, "ready") {
        eprintln!("skipped: the server has no pod network (needs root and the CNI plugins)");
        return Ok(());
    }
    let pod = server.get(
        &["pods", "-l", "vm.kubevirt.io/name=ready"],
        "{.items[0].metadata.name}",
    );
    let probe = server.get(
        &["pod", &pod],
        r#"{.spec.containers[?(@.name=="compute")].readinessProbe.initialDelaySeconds}"#,
    );
    assert_eq!(probe, "10", "upstream's startup delay is added");
    wait_until(DEADLINE, "the VMI Ready by its probe", || {
        (condition(server, "ready", "Ready") == "True").then_some(())
    })?;
    wait_until(DEADLINE, "the VM ready", || {
        (server.get(&["vm", "ready"], "{.status.ready}") == "true").then_some(())
    })?;
    // The guest stops serving: the probe fails and the VMI is no longer Ready.
    let stopped = server.guest_run("ready", "killall httpd")?;
    assert!(stopped.contains("RUN-DONE rc=0"), "{stopped}");
    wait_until(DEADLINE, "the VMI not Ready", || {
        (condition(server, "ready", "Ready") == "False").then_some(())
    })?;
    assert_eq!(server.get(&["vmi", "ready"], "{.status.phase}"), "Running");
    server.ok(&["delete", "vm", "ready", "--wait=false"])?;
    agent_probes(server)?;

    // Nothing serves 8081: the liveness probe fails, the VMI ends and the VM starts another.
    server.apply(&probed_vm(
        "doomed",
        &["livenessProbe: {tcpSocket: {port: 8081}, periodSeconds: 1, failureThreshold: 1}"],
    ))?;
    let first = wait_until(DEADLINE, "VMI doomed", || {
        Some(server.get(&["vmi", "doomed"], "{.metadata.uid}")).filter(|u| !u.is_empty())
    })?;
    wait_until(
        DEADLINE,
        "a new VMI after the liveness probe failed",
        || {
            let uid = server.get(&["vmi", "doomed"], "{.metadata.uid}");
            (!uid.is_empty() && uid != first).then_some(())
        },
    )?;
    Ok(())
}

/// `exec` and `guestAgentPing` probes, run through the guest agent.
fn agent_probes(server: &ServerProcess) -> anyhow::Result<()> {
    server.apply(&probed_vm(
        "agent",
        &[
            "readinessProbe: {exec: {command: [cat, /tmp/ready]}, periodSeconds: 1, failureThreshold: 1}",
            "livenessProbe: {guestAgentPing: {}, periodSeconds: 1, failureThreshold: 1}",
        ],
    ))?;
    wait_until(DEADLINE, "VMI agent Running", || {
        (server.get(&["vmi", "agent"], "{.status.phase}") == "Running").then_some(())
    })?;
    let uid = server.get(&["vmi", "agent"], "{.metadata.uid}");
    wait_until(DEADLINE, "the guest agent connected", || {
        (condition(server, "agent", "AgentConnected") == "True").then_some(())
    })?;
    let made = server.guest_run("agent", "touch /tmp/ready")?;
    assert!(made.contains("RUN-DONE rc=0"), "{made}");
    wait_until(DEADLINE, "the VMI Ready by its exec probe", || {
        (condition(server, "agent", "Ready") == "True").then_some(())
    })?;
    let removed = server.guest_run("agent", "rm /tmp/ready")?;
    assert!(removed.contains("RUN-DONE rc=0"), "{removed}");
    wait_until(DEADLINE, "the VMI not Ready once the file is gone", || {
        (condition(server, "agent", "Ready") == "False").then_some(())
    })?;
    // The agent answers its pings all along: the liveness probe never ended the VMI.
    assert_eq!(server.get(&["vmi", "agent"], "{.metadata.uid}"), uid);
    assert_eq!(server.get(&["vmi", "agent"], "{.status.phase}"), "Running");
    server.ok(&["delete", "vm", "agent", "--wait=false"])?;
    Ok(())
}
