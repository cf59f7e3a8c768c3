//! End-to-end: the guest agent of a real guest (the test guest runs Debian's `qemu-ga`, TCG).
//! Once the guest opens its `org.qemu.guest_agent.0` port the VMI gets `AgentConnected` and
//! `guestOSInfo`; `virtctl guestosinfo`, `userlist` and `fslist` answer from the agent;
//! `virtctl soft-reboot` reboots the guest through the agent (its console shows a second boot,
//! its QEMU keeps its pid); with the agent stopped the condition goes, and a soft reboot
//! presses the ACPI power button and turns the guest's power-off into a reset (a third boot,
//! same QEMU). `virtctl freeze` freezes the guest's filesystems through the agent until
//! `virtctl unfreeze` or its timeout, and virt-handler's `/metrics` counts what the guest did
//! (the bytes it wrote to a disk, the DHCP exchange on its interface). Skips (saying why) when
//! the test guest, QEMU or virtctl is missing.

use std::os::unix::process::CommandExt as _;
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
    server.apply(&testkit::test_guest_vm_with(
        "agent",
        &["memory: {guest: 128Mi}"],
        "{disks: [{name: scratch, disk: {bus: virtio}}]}",
        &["volumes: [{name: scratch, emptyDisk: {capacity: 16Mi}}]"],
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
    handler_events(server)?;
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
    freeze_and_thaw(server)?;
    domain_metrics(server)?;

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
    let node = server.get(&["vmi", "agent"], "{.status.nodeName}");
    wait_event(
        server,
        &format!("Normal/SoftRebooted/virt-handler@{node}/VirtualMachineInstance soft rebooted"),
    )?;
    wait_until(DEADLINE, "AgentConnected after the reboot", || {
        (agent_connected(server) == "True").then_some(())
    })?;

    without_the_agent(server, (&pod, &uid), &pid, &qemu_pid)
}

/// Without the agent: the condition goes, a freeze is refused with upstream's Event, and the
/// power button reboots the guest in the same QEMU.
fn without_the_agent(
    server: &ServerProcess,
    (pod, uid): (&str, &str),
    pid: &str,
    qemu_pid: &dyn Fn() -> String,
) -> anyhow::Result<()> {
    let node = server.get(&["vmi", "agent"], "{.status.nodeName}");
    let stopped = server.guest_run("agent", "killall qemu-ga")?;
    assert!(stopped.contains("RUN-DONE rc=0"), "{stopped}");
    wait_until(DEADLINE, "AgentConnected removed", || {
        agent_connected(server).is_empty().then_some(())
    })?;
    // A freeze needs the agent: refused, and recorded as upstream's handler records it.
    let refused = server.virtctl(&["freeze", "agent"]);
    assert!(refused.is_err(), "{refused:?}");
    wait_until(DEADLINE, "a FreezeError event", || {
        vmi_events(server)
            .lines()
            .any(|l| {
                l.starts_with(&format!(
                    "Warning/FreezeError/virt-handler@{node}/Failed to freeze VMI: "
                ))
            })
            .then_some(())
    })?;
    // A `guestAgentPing` probe (virt-probe, as kubelet runs it in the compute container)
    // fails, and the launcher has the handler record upstream's Event.
    let probe = std::process::Command::new(env!("CARGO_BIN_EXE_virt-launcher"))
        .arg0("virt-probe")
        .args(["--domainName", "default_agent", "--guestAgentPing"])
        .arg("--pod-dir")
        .arg(testkit::launcher_dir(server.data_dir(), uid))
        .output()?;
    assert!(!probe.status.success(), "{probe:?}");
    wait_event(
        server,
        &format!(
            "Warning/GuestAgentPingFailed/virt-handler@{node}/GuestAgentPing probe failed for VMI agent"
        ),
    )?;
    server.virtctl(&["soft-reboot", "agent"])?;
    wait_until(DEADLINE, "the guest to boot a third time", || {
        (boots(server, pod) == 3).then_some(())
    })?;
    let console = server.guest_console(pod);
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

fn freeze_status(server: &ServerProcess) -> String {
    server.get(&["vmi", "agent"], "{.status.fsFreezeStatus}")
}

/// A freeze with a short timeout thaws by itself; one with a long timeout holds until
/// `unfreeze`. The agent answers while frozen (`guestosinfo` says so).
fn freeze_and_thaw(server: &ServerProcess) -> anyhow::Result<()> {
    let said = server.virtctl(&["freeze", "agent", "--unfreeze-timeout", "5s"])?;
    assert!(said.contains("was frozen"), "{said}");
    let info: serde_json::Value =
        serde_json::from_str(&server.virtctl(&["guestosinfo", "agent"])?)?;
    assert_eq!(info["fsFreezeStatus"], "frozen", "{info}");
    wait_until(DEADLINE, "the automatic thaw", || {
        let info: serde_json::Value =
            serde_json::from_str(&server.virtctl(&["guestosinfo", "agent"]).ok()?).ok()?;
        info.get("fsFreezeStatus").is_none().then_some(())
    })?;

    server.virtctl(&["freeze", "agent"])?;
    wait_until(DEADLINE, "fsFreezeStatus frozen", || {
        (freeze_status(server) == "frozen").then_some(())
    })?;
    let said = server.virtctl(&["unfreeze", "agent"])?;
    assert!(said.contains("was unfrozen"), "{said}");
    wait_until(DEADLINE, "fsFreezeStatus cleared", || {
        freeze_status(server).is_empty().then_some(())
    })?;
    Ok(())
}

/// The value of the handler's sample of `family` for the VMI `agent` whose labels include
/// each of `labels`.
fn handler_sample(server: &ServerProcess, family: &str, labels: &[&str]) -> Option<f64> {
    let samples = server
        .metric_samples("virt-handler", "virt-handler", family)
        .ok()?;
    samples
        .iter()
        .find(|l| l.contains(r#"name="agent""#) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}

/// virt-handler's domain families for the VMI match its definition and grow with what the
/// guest does.
fn domain_metrics(server: &ServerProcess) -> anyhow::Result<()> {
    let domain = wait_until(DEADLINE, "kubevirt_vmi_memory_domain_bytes", || {
        handler_sample(server, "kubevirt_vmi_memory_domain_bytes", &[])
    })?;
    assert!((domain - 134_217_728.0).abs() < 1.0, "128Mi: {domain}");
    let ready = server.metric_samples(
        "virt-handler",
        "virt-handler",
        "kubevirt_virt_handler_ready_status",
    )?;
    assert_eq!(ready, ["kubevirt_virt_handler_ready_status 1"]);
    let resident = handler_sample(server, "kubevirt_vmi_memory_resident_bytes", &[]);
    assert!(resident.is_some_and(|r| r > 0.0), "{resident:?}");
    let vcpu = handler_sample(
        server,
        "kubevirt_vmi_vcpu_seconds_total",
        &[r#"id="0""#, r#"state="running""#],
    );
    assert!(vcpu.is_some_and(|s| s > 0.0), "vCPU 0 ran: {vcpu:?}");

    let scratch = [r#"drive="scratch""#];
    let written = "kubevirt_vmi_storage_write_traffic_bytes_total";
    let before = handler_sample(server, written, &scratch).unwrap_or(f64::NAN);
    assert!(before.is_finite(), "the scratch disk has a sample");
    let ran = server.guest_run(
        "agent",
        "dd if=/dev/urandom of=/dev/vda bs=65536 count=64 conv=fsync",
    )?;
    assert!(ran.contains("RUN-DONE rc=0"), "{ran}");
    wait_until(DEADLINE, "the 4 MiB written counted", || {
        handler_sample(server, written, &scratch).filter(|after| *after >= before + 4_194_304.0)
    })?;
    let writes = handler_sample(server, "kubevirt_vmi_storage_iops_write_total", &scratch);
    assert!(writes.is_some_and(|w| w >= 1.0), "{writes:?}");
    // A filesystem the guest mounts is reported by its agent with its size.
    let mounted = server.guest_run(
        "agent",
        "mkdosfs /dev/vda && mkdir -p /mnt/scratch && mount -t vfat /dev/vda /mnt/scratch",
    )?;
    assert!(mounted.contains("RUN-DONE rc=0"), "{mounted}");
    let filesystem = [
        r#"mount_point="/mnt/scratch""#,
        r#"file_system_type="vfat""#,
    ];
    let capacity = wait_until(DEADLINE, "the mounted filesystem's capacity", || {
        handler_sample(
            server,
            "kubevirt_vmi_filesystem_capacity_bytes",
            &filesystem,
        )
    })?;
    assert!(
        capacity > 8.0 * 1024.0 * 1024.0 && capacity <= 16.0 * 1024.0 * 1024.0,
        "the 16Mi disk's filesystem: {capacity}"
    );
    let used = handler_sample(server, "kubevirt_vmi_filesystem_used_bytes", &filesystem);
    assert!(used.is_some_and(|u| u < capacity), "{used:?}");

    let iface = [r#"interface="default""#];
    let sent = "kubevirt_vmi_network_transmit_packets_total";
    let received = "kubevirt_vmi_network_receive_packets_total";
    let (sent_before, received_before) = (
        handler_sample(server, sent, &iface).unwrap_or(f64::NAN),
        handler_sample(server, received, &iface).unwrap_or(f64::NAN),
    );
    assert!(
        sent_before.is_finite() && received_before.is_finite(),
        "the interface has samples"
    );
    // A DHCP exchange with the launcher's server: packets both ways.
    server.guest_run(
        "agent",
        "ip link set eth0 up && udhcpc -i eth0 -q -n -t 5 -T 1 -s /etc/udhcpc.script",
    )?;
    wait_until(DEADLINE, "the DHCP exchange counted", || {
        let sent = handler_sample(server, sent, &iface)?;
        let received = handler_sample(server, received, &iface)?;
        (sent > sent_before && received > received_before).then_some(())
    })?;
    Ok(())
}

/// The VMIs' Events, one `type/reason/component@host/message` line each.
fn vmi_events(server: &ServerProcess) -> String {
    server.get(
        &["events"],
        r#"{range .items[?(@.involvedObject.kind=="VirtualMachineInstance")]}{.type}/{.reason}/{.source.component}@{.source.host}/{.message}{"\n"}{end}"#,
    )
}

/// Waits for the VMI Event line `line` (see [`vmi_events`]).
fn wait_event(server: &ServerProcess, line: &str) -> anyhow::Result<()> {
    wait_until(DEADLINE, line, || {
        vmi_events(server).lines().any(|l| l == line).then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nevents:\n{}", vmi_events(server)))
}

/// virt-handler's events on the VMI, as upstream's handler records them, from its node.
fn handler_events(server: &ServerProcess) -> anyhow::Result<()> {
    let node = server.get(&["vmi", "agent"], "{.status.nodeName}");
    wait_event(
        server,
        &format!("Normal/Created/virt-handler@{node}/VirtualMachineInstance defined."),
    )?;
    wait_event(
        server,
        &format!("Normal/Started/virt-handler@{node}/VirtualMachineInstance started."),
    )
}
