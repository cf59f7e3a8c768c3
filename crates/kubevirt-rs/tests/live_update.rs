//! End-to-end: template changes reach a running VM without a restart (the `LiveUpdate`
//! rollout strategy). One real guest gets a second CPU socket and 128 MiB more memory and
//! reports both on its console while its QEMU keeps running; a node selector follows into the
//! VMI; what cannot change live (fewer sockets, unaligned memory, another machine type) sets
//! `RestartRequired` with upstream's message. Skips (saying why) when the test guest or QEMU
//! is missing.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, guest_reports, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// The samples of `family` that virt-controller's pods serve on their HTTPS port (only the
/// leader runs the controllers that fill them), verified against the cluster's CA bundle.
fn controller_samples(server: &ServerProcess, family: &str) -> anyhow::Result<Vec<String>> {
    server.metric_samples("virt-controller", "virt-controller.kubevirt.svc", family)
}

fn boots(server: &ServerProcess, pod: &str) -> usize {
    server.guest_console(pod).matches("GUEST-READY").count()
}

fn patch_template(server: &ServerProcess, spec: &str) -> anyhow::Result<()> {
    let patch = format!(r#"{{"spec":{{"template":{{"spec":{spec}}}}}}}"#);
    server.ok(&["patch", "vm", "hot", "--type", "merge", "-p", &patch])?;
    Ok(())
}

/// `status message` of the VM's `RestartRequired` condition, empty when absent.
fn restart_required(server: &ServerProcess) -> String {
    server.get(
        &["vm", "hot"],
        r#"{.status.conditions[?(@.type=="RestartRequired")].status} {.status.conditions[?(@.type=="RestartRequired")].message}"#,
    )
}

fn wait_restart_required(server: &ServerProcess, message: &str) -> anyhow::Result<()> {
    let expected = format!("True {message}");
    wait_until(DEADLINE, &format!("RestartRequired: {message}"), || {
        (restart_required(server) == expected).then_some(())
    })
}

fn wait_no_restart_required(server: &ServerProcess) -> anyhow::Result<()> {
    wait_until(DEADLINE, "RestartRequired to go", || {
        restart_required(server).trim().is_empty().then_some(())
    })
}

#[test]
fn sockets_memory_and_placement_change_on_the_running_guest_and_the_rest_asks_for_a_restart()
-> anyhow::Result<()> {
    let Some(guest) = testkit::available(testkit::test_guest()) else {
        return Ok(());
    };
    let mut server = ServerProcess::start(Path::new(BIN), "server", &[])?;
    server.import_test_guest(guest)?;
    server.apply(&testkit::test_guest_vm(
        "hot",
        &[
            "cpu: {sockets: 1, cores: 1, threads: 1}",
            "memory: {guest: 1Gi}",
        ],
    ))?;
    wait_until(DEADLINE, "the VMI Running", || {
        (server.get(&["vmi", "hot"], "{.status.phase}") == "Running").then_some(())
    })?;
    let pod = server.get(
        &["pods", "-l", "vm.kubevirt.io/name=hot"],
        "{.items[0].metadata.name} {.items[0].metadata.uid}",
    );
    let (pod, uid) = pod
        .split_once(' ')
        .ok_or_else(|| anyhow::anyhow!("no launcher pod"))?;
    let qemu_pid = || {
        std::fs::read_to_string(testkit::launcher_dir(server.data_dir(), uid).join("qemu.pid"))
            .unwrap_or_default()
    };
    wait_until(DEADLINE, "the guest to boot", || {
        (boots(&server, pod) == 1).then_some(())
    })?;
    let pid = qemu_pid();
    wait_for_vmi_metrics(&server, pod)?;
    let at_boot = guest_reports(&server.guest_console(pod))
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no GUEST-SEES report at boot"))?;
    assert_eq!(at_boot.cpus, "0", "one vCPU at boot");
    let mem_at_boot = at_boot.mem_kib;
    // The webhook gave the VMI room to grow (upstream's ratio 4).
    assert_eq!(
        server.get(
            &["vmi", "hot"],
            "{.spec.domain.cpu.maxSockets} {.spec.domain.memory.maxGuest}"
        ),
        "4 4Gi"
    );

    patch_template(
        &server,
        r#"{"domain":{"cpu":{"sockets":2},"memory":{"guest":"1152Mi"}}}"#,
    )?;
    let seen = wait_until(
        DEADLINE,
        "the guest to see 2 vCPUs and 128 MiB more",
        || {
            guest_reports(&server.guest_console(pod))
                .into_iter()
                .find(|r| r.cpus == "0-1" && r.mem_kib == mem_at_boot + 128 * 1024)
        },
    )?;
    eprintln!("guest sees {seen:?} (booted with {mem_at_boot} KiB)");
    wait_until(
        DEADLINE,
        "the VMI status to show the plugged resources",
        || {
            (server.get(
            &["vmi", "hot"],
            r#"{.status.currentCPUTopology.sockets} {.status.memory.guestCurrent} {.status.conditions[?(@.type=="HotVCPUChange")].status}{.status.conditions[?(@.type=="HotMemoryChange")].status}"#,
        ) == "2 1152Mi ")
            .then_some(())
        },
    )?;
    assert_eq!(qemu_pid(), pid, "the same QEMU");
    assert_eq!(boots(&server, pod), 1, "the guest never rebooted");
    assert_eq!(restart_required(&server).trim(), "", "no restart asked");

    // Placement follows into the VMI.
    patch_template(
        &server,
        r#"{"nodeSelector":{"kubevirt.io/schedulable":"true"}}"#,
    )?;
    wait_until(DEADLINE, "the VMI's nodeSelector", || {
        (server.get(&["vmi", "hot"], "{.spec.nodeSelector}")
            == r#"{"kubevirt.io/schedulable":"true"}"#)
            .then_some(())
    })?;
    assert_eq!(restart_required(&server).trim(), "");

    restart_required_cases(&server)?;
    assert_eq!(
        server.get(&["vmi", "hot"], "{.spec.domain.cpu.sockets}"),
        "2"
    );
    assert_eq!(qemu_pid(), pid, "still the same QEMU");
    assert_eq!(boots(&server, pod), 1);
    Ok(())
}

/// Waits until virt-controller's metrics count the running VMI (upstream's families).
fn wait_for_vmi_metrics(server: &ServerProcess, pod: &str) -> anyhow::Result<()> {
    wait_until(
        DEADLINE,
        "kubevirt_vmi_phase_count of the running VMI",
        || {
            let counts = controller_samples(server, "kubevirt_vmi_phase_count").ok()?;
            let info = controller_samples(server, "kubevirt_vmi_info").ok()?;
            let running = counts.iter().find(|l| l.contains(r#"phase="running""#))?;
            let hot = info.iter().find(|l| l.contains(r#"name="hot""#))?;
            (running.ends_with("} 1") && hot.contains(&format!(r#"vmi_pod="{pod}""#))).then_some(())
        },
    )
}

/// What only a restart applies sets `RestartRequired` with upstream's message, and undoing it
/// removes the condition.
fn restart_required_cases(server: &ServerProcess) -> anyhow::Result<()> {
    patch_template(server, r#"{"domain":{"cpu":{"sockets":1}}}"#)?;
    wait_restart_required(server, "Reduction of CPU socket count requires a restart")?;
    patch_template(server, r#"{"domain":{"cpu":{"sockets":2}}}"#)?;
    wait_no_restart_required(server)?;
    patch_template(server, r#"{"domain":{"memory":{"guest":"1153Mi"}}}"#)?;
    wait_restart_required(
        server,
        "memory hotplug not supported, Guest memory must be 2Mi aligned",
    )?;
    patch_template(server, r#"{"domain":{"memory":{"guest":"1152Mi"}}}"#)?;
    wait_no_restart_required(server)?;
    patch_template(server, r#"{"domain":{"machine":{"type":"pc-q35-7.2"}}}"#)?;
    wait_restart_required(
        server,
        "a non-live-updatable field was changed in the template spec",
    )?;
    Ok(())
}
