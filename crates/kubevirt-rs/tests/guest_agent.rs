//! End-to-end: the guest agent of a real guest (the test guest runs Debian's `qemu-ga`, TCG).
//! Once the guest opens its `org.qemu.guest_agent.0` port the VMI gets `AgentConnected` and
//! `guestOSInfo`; `virtctl guestosinfo`, `userlist` and `fslist` answer from the agent;
//! `virtctl soft-reboot` reboots the guest through the agent (its console shows a second boot,
//! its QEMU keeps its pid); with the agent stopped the condition goes, and a soft reboot
//! presses the ACPI power button and turns the guest's power-off into a reset (a third boot,
//! same QEMU). Skips (saying why) when the test guest, QEMU or virtctl is missing.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn agent_connected(server: &ServerProcess) -> String {
    server.get(
        &["vmi", "agent"],
        r#"{.status.conditions[?(@.type=="AgentConnected")].status}"#,
    )
}

fn boots(server: &ServerProcess, pod: &str) -> usize {
    server.guest_console(pod).matches("GUEST-READY").count()
}

#[test]
fn the_guest_agent_reports_the_guest_and_soft_reboots_it_with_and_without_the_agent()
-> anyhow::Result<()> {
    let Some(server) = ServerProcess::start_with_test_guest(Path::new(BIN))? else {
        return Ok(());
    };
    let result = scenario(&server);
    testkit::with_log(&server, result)
}

fn scenario(server: &ServerProcess) -> anyhow::Result<()> {
    server.apply(&testkit::test_guest_vm(
        "agent",
        &["memory: {guest: 128Mi}"],
    ))?;
    let (pod, uid) = wait_until(DEADLINE, "the launcher pod Running", || {
        server.running_launcher("agent")
    })?;
    wait_until(DEADLINE, "AgentConnected", || {
        (agent_connected(server) == "True").then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nguest console:\n{}", server.guest_console(&pod)))?;
    let os_id = wait_until(DEADLINE, "guestOSInfo", || {
        Some(server.get(&["vmi", "agent"], "{.status.guestOSInfo.id}")).filter(|id| !id.is_empty())
    })?;
    assert_eq!(os_id, "kubevirt-rs-test-guest");

    let info: serde_json::Value =
        serde_json::from_str(&server.virtctl(&["guestosinfo", "agent"])?)?;
    assert_eq!(info["os"]["id"], "kubevirt-rs-test-guest", "{info}");
    assert_eq!(info["hostname"], "testguest", "{info}");
    assert!(
        info["guestAgentVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{info}"
    );
    let ping = info["supportedCommands"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "guest-ping");
    assert_eq!(
        ping.map(|c| &c["enabled"]),
        Some(&serde_json::json!(true)),
        "{info}"
    );
    assert_eq!(
        server.get(
            &["vmi", "agent"],
            r#"{.status.conditions[?(@.type=="AgentVersionNotSupported")].status}"#,
        ),
        "",
        "Debian's agent has every required command"
    );
    // The answers are upstream's list types (the busybox guest has no logins).
    let users: serde_json::Value = serde_json::from_str(&server.virtctl(&["userlist", "agent"])?)?;
    assert!(users.is_object(), "{users}");
    let filesystems: serde_json::Value =
        serde_json::from_str(&server.virtctl(&["fslist", "agent"])?)?;
    assert!(filesystems.is_object(), "{filesystems}");

    let qemu_pid = || {
        std::fs::read_to_string(testkit::launcher_dir(server.data_dir(), &uid).join("qemu.pid"))
            .unwrap_or_default()
    };
    let pid = qemu_pid();
    assert!(!pid.trim().is_empty(), "QEMU's pid file");
    wait_until(DEADLINE, "the first boot on the console", || {
        (boots(server, &pod) == 1).then_some(())
    })?;

    // Through the agent.
    let said = server.virtctl(&["soft-reboot", "agent"])?;
    assert!(said.contains("was scheduled to soft-reboot"), "{said}");
    wait_until(DEADLINE, "the guest to boot again", || {
        (boots(server, &pod) == 2).then_some(())
    })?;
    let console = server.guest_console(&pod);
    assert!(
        console.contains("GUEST-AGENT-SHUTDOWN"),
        "the agent rebooted it: {}",
        testkit::tail(&console, 20)
    );
    assert_eq!(qemu_pid(), pid, "the same QEMU runs the rebooted guest");
    wait_until(DEADLINE, "AgentConnected after the reboot", || {
        (agent_connected(server) == "True").then_some(())
    })?;

    // Without the agent: the condition goes, and the power button reboots the guest.
    let stopped = server.guest_run("agent", "killall qemu-ga")?;
    assert!(stopped.contains("RUN-DONE rc=0"), "{stopped}");
    wait_until(DEADLINE, "AgentConnected removed", || {
        agent_connected(server).is_empty().then_some(())
    })?;
    server.virtctl(&["soft-reboot", "agent"])?;
    wait_until(DEADLINE, "the guest to boot a third time", || {
        (boots(server, &pod) == 3).then_some(())
    })?;
    let console = server.guest_console(&pod);
    assert!(
        console.contains("ACPI-POWER-BUTTON"),
        "the power button rebooted it: {}",
        testkit::tail(&console, 20)
    );
    assert_eq!(qemu_pid(), pid, "the power-off became a reset");
    assert_eq!(server.get(&["vmi", "agent"], "{.status.phase}"), "Running");
    let paused = server.get(
        &["vmi", "agent"],
        r#"{.status.conditions[?(@.type=="Paused")].status}"#,
    );
    assert_eq!(paused, "", "the reboot's pause is not reported");
    Ok(())
}
