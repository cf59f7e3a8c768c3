//! End-to-end: `kubevirt-rs server` boots real guests (QEMU under TCG here) from VM manifests
//! applied with the real `kubectl`, shows their console through `kubectl logs`, powers them
//! off through ACPI, keeps them running across a `kill -9` of the server, and restarts them
//! when QEMU dies. Skips (saying why) when the test guest or QEMU is missing.

use std::path::Path;
use std::process::Command;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn start_server_with_guest() -> anyhow::Result<Option<ServerProcess>> {
    let Some(guest) = testkit::available(testkit::test_guest()) else {
        return Ok(None);
    };
    let mut server = ServerProcess::start(Path::new(BIN), "server", &[])?;
    server.import_test_guest(guest)?;
    Ok(Some(server))
}

/// A VM manifest booting the test guest (as `examples/vm-demo.yaml`) named `name`.
fn guest_vm(name: &str, run_strategy: &str, labels: &str) -> String {
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: {run_strategy}
  template:
    metadata:
      labels: {{{labels}}}
    spec:
      terminationGracePeriodSeconds: 30
      domain:
        memory: {{guest: 128Mi}}
        firmware:
          kernelBoot:
            kernelArgs: "console=ttyS0 panic=-1 quiet tg.quiet=1"
            container:
              image: kubevirt-rs/test-guest:latest
              kernelPath: /vmlinux
              initrdPath: /initramfs.cpio.gz
        devices: {{}}
"#
    )
}

fn jsonpath(server: &ServerProcess, what: &str, path: &str) -> String {
    server
        .ok(&["get", what, "-o", &format!("jsonpath={path}")])
        .unwrap_or_default()
}

fn wait_phase(server: &ServerProcess, vmi: &str, phase: &str) -> anyhow::Result<()> {
    wait_until(DEADLINE, &format!("VMI {vmi} phase {phase}"), || {
        (jsonpath(server, &format!("vmi/{vmi}"), "{.status.phase}") == phase).then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", testkit::tail(&server.log(), 40)))
}

fn launcher_pod(server: &ServerProcess, vm: &str) -> String {
    server
        .ok(&[
            "get",
            "pods",
            "-l",
            &format!("vm.kubevirt.io/name={vm}"),
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])
        .unwrap_or_default()
}

/// The pid of the QEMU of VM `name` in this server (from its launcher pod's directory).
fn qemu_pid(server: &ServerProcess, name: &str) -> Option<i32> {
    let uid = server
        .ok(&[
            "get",
            "pods",
            "-l",
            &format!("vm.kubevirt.io/name={name}"),
            "-o",
            "jsonpath={.items[0].metadata.uid}",
        ])
        .ok()?;
    let pid = std::fs::read_to_string(
        testkit::launcher_dir(server.data_dir(), uid.trim()).join("qemu.pid"),
    )
    .ok()?;
    pid.trim().parse().ok().filter(|p| is_running(*p))
}

/// Whether `pid` runs (and is not a zombie waiting to be reaped).
fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

#[test]
fn a_vm_boots_shows_its_console_and_powers_off_through_acpi() -> anyhow::Result<()> {
    let Some(server) = start_server_with_guest()? else {
        return Ok(());
    };
    server.apply(&guest_vm("demo", "Always", "app: demo"))?;
    wait_phase(&server, "demo", "Running")?;

    let row = server.ok(&["get", "vmi", "demo", "--no-headers"])?;
    assert!(row.contains("Running"), "kubectl get vmi: {row}");
    // With a pod network (root) the launcher pod has its own IP and masquerade reports it;
    // without one (the pod shares the host's network) the interface is user-mode and has
    // no address to show.
    let pod = launcher_pod(&server, "demo");
    let pod_ip = jsonpath(&server, &format!("pod/{pod}"), "{.status.podIP}");
    let host_ip = jsonpath(&server, &format!("pod/{pod}"), "{.status.hostIP}");
    let vmi_ip = jsonpath(&server, "vmi/demo", "{.status.interfaces[0].ipAddress}");
    if pod_ip != host_ip {
        assert!(
            !pod_ip.is_empty() && vmi_ip == pod_ip && row.contains(&pod_ip),
            "kubectl get vmi shows the pod IP {pod_ip}: {row}"
        );
    } else {
        assert!(vmi_ip.is_empty(), "user-mode interface reports {vmi_ip}");
    }
    let node = jsonpath(&server, "vmi/demo", "{.status.nodeName}");
    assert!(
        !node.is_empty() && row.contains(&node),
        "node missing: {row}"
    );

    let console = wait_until(DEADLINE, "GUEST-READY in kubectl logs", || {
        let out = server.kubectl(&["logs", &pod, "-c", "guest-console-log"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("GUEST-READY").then_some(text)
    })?;
    assert!(console.contains("GUEST-READY"));
    wait_until(DEADLINE, "VM printableStatus Running", || {
        (jsonpath(&server, "vm/demo", "{.status.printableStatus}") == "Running").then_some(())
    })?;
    let qemu = qemu_pid(&server, "demo").ok_or_else(|| anyhow::anyhow!("no QEMU for demo"))?;
    // Followed from before the stop: the pod and its logs go with the VM.
    let serial = server.watch(&["logs", "-f", &pod, "-c", "guest-console-log"])?;
    let launcher = server.watch(&["logs", "-f", &pod, "-c", "compute"])?;

    server.ok(&[
        "patch",
        "vm",
        "demo",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"runStrategy":"Halted"}}"#,
    ])?;
    wait_until(DEADLINE, "the VMI to be removed", || {
        let out = server.kubectl(&["get", "vmi", "demo"]);
        (!out.status.success()).then_some(())
    })?;
    wait_until(DEADLINE, "VM printableStatus Stopped", || {
        (jsonpath(&server, "vm/demo", "{.status.printableStatus}") == "Stopped").then_some(())
    })?;
    assert!(!is_running(qemu), "QEMU still runs after the VM stopped");
    // The guest saw the power button (its acpid prints this before it powers off), and
    // QEMU ended because the guest shut down, not on a signal.
    serial.wait_for("ACPI-POWER-BUTTON", DEADLINE)?;
    let ended = launcher.wait_for("QEMU ended", DEADLINE)?;
    assert!(
        ended.contains("GuestShutdown")
            && ended.contains("exit status: 0")
            && !ended.contains("signal"),
        "QEMU did not end by the guest's power-off: {ended}"
    );
    Ok(())
}

/// One HTTP GET of `/` from this (host) process; the body on success.
fn http_get(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let mut stream =
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .ok()?;
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text)
}

#[test]
fn a_masquerade_guest_gets_its_address_by_dhcp_and_is_reached_through_the_pod_ip()
-> anyhow::Result<()> {
    let Some(server) = start_server_with_guest()? else {
        return Ok(());
    };
    server.apply(&testkit::serving_guest_vm(
        "web",
        "masquerade: {}, ports: [{name: http, port: 8080}]",
        &[],
    ))?;
    wait_phase(&server, "web", "Running")?;
    let pod = launcher_pod(&server, "web");
    let pod_ip = jsonpath(&server, &format!("pod/{pod}"), "{.status.podIP}");
    let host_ip = jsonpath(&server, &format!("pod/{pod}"), "{.status.hostIP}");
    if pod_ip == host_ip {
        eprintln!("skipped: the server has no pod network (needs root and the CNI plugins)");
        return Ok(());
    }
    let started = std::time::Instant::now();
    let console = wait_until(DEADLINE, "NET-READY in the guest console", || {
        let out = server.kubectl(&["logs", &pod, "-c", "guest-console-log"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.contains("NET-READY").then_some(text)
    })?;
    let compute = server.kubectl(&["logs", &pod, "-c", "compute"]);
    assert!(
        console.contains("NET-READY 10.0.2.2"),
        "the guest got 10.0.2.2 by DHCP:\n{console}\nlauncher:\n{}",
        testkit::tail(&String::from_utf8_lossy(&compute.stdout), 40)
    );
    let dhcp = started.elapsed();
    let body = wait_until(
        DEADLINE,
        "the guest's HTTP server through the pod IP",
        || http_get(&format!("{pod_ip}:8080")).filter(|t| t.contains("hello-from-web")),
    )?;
    eprintln!(
        "masquerade: DHCP lease {:.1}s after Running, HTTP through {pod_ip}:8080 after {:.1}s",
        dhcp.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(body.starts_with("HTTP/1."), "{body}");
    assert_eq!(
        jsonpath(&server, "vmi/web", "{.status.interfaces[0].ipAddress}"),
        pod_ip
    );
    // A Service in front of the VM (as `virtctl expose` makes one) gets the launcher pod as
    // its ready endpoint, on the guest's port.
    server.apply(
        r"apiVersion: v1
kind: Service
metadata:
  name: web-svc
spec:
  selector:
    vm.kubevirt.io/name: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
",
    )?;
    let endpoint = wait_until(DEADLINE, "the Service's endpoint", || {
        let got = server
            .ok(&[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web-svc",
                "-o",
                "jsonpath={.items[0].endpoints[*].addresses[0]} \
                 {.items[0].endpoints[*].conditions.ready} {.items[0].ports[0].port}",
            ])
            .unwrap_or_default();
        got.starts_with(&pod_ip).then_some(got)
    })?;
    assert_eq!(endpoint, format!("{pod_ip} true 8080"));
    server.ok(&["delete", "vm", "web", "--wait=false"])?;
    Ok(())
}

#[test]
fn guests_keep_running_across_a_server_kill_and_are_reattached() -> anyhow::Result<()> {
    let Some(mut server) = start_server_with_guest()? else {
        return Ok(());
    };
    server.apply(&guest_vm("vm-a", "Always", "app: a"))?;
    server.apply(&guest_vm("vm-b", "Always", "app: b"))?;
    wait_phase(&server, "vm-a", "Running")?;
    wait_phase(&server, "vm-b", "Running")?;
    let before: Vec<i32> = ["vm-a", "vm-b"]
        .iter()
        .map(|n| qemu_pid(&server, n).unwrap_or(0))
        .collect();
    assert!(before.iter().all(|p| *p > 0), "QEMU pids {before:?}");
    let transitions = jsonpath(&server, "vmi/vm-a", "{.status.phaseTransitionTimestamps}");
    let node_version = jsonpath(&server, "nodes", "{.items[0].metadata.resourceVersion}");

    server.kill_server();
    for pid in &before {
        assert!(is_running(*pid), "QEMU {pid} died with the server");
    }
    server.restart()?;
    // Wait until the restarted handler has re-attached (VMIs reconciled by the new process).
    wait_until(DEADLINE, "the restarted server to serve the VMIs", || {
        let out = server.kubectl(&[
            "get",
            "vmi",
            "vm-a",
            "vm-b",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ]);
        (String::from_utf8_lossy(&out.stdout) == "Running Running").then_some(())
    })?;
    // The new handler has started once it re-registered the node.
    wait_until(
        DEADLINE,
        "the restarted handler to register the node",
        || {
            let now = jsonpath(&server, "nodes", "{.items[0].metadata.resourceVersion}");
            (!now.is_empty() && now != node_version).then_some(())
        },
    )?;
    let after: Vec<i32> = ["vm-a", "vm-b"]
        .iter()
        .map(|n| qemu_pid(&server, n).unwrap_or(0))
        .collect();
    assert_eq!(before, after, "guests were restarted");
    assert_eq!(
        transitions,
        jsonpath(&server, "vmi/vm-a", "{.status.phaseTransitionTimestamps}"),
        "the VMI went through new phases after the restart"
    );
    Ok(())
}

#[test]
fn a_killed_qemu_fails_the_vmi_and_run_strategy_always_starts_a_new_one() -> anyhow::Result<()> {
    let Some(server) = start_server_with_guest()? else {
        return Ok(());
    };
    server.apply(&guest_vm("crashy", "Always", "app: crashy"))?;
    wait_phase(&server, "crashy", "Running")?;
    let first_uid = jsonpath(&server, "vmi/crashy", "{.metadata.uid}");
    let pid = qemu_pid(&server, "crashy").ok_or_else(|| anyhow::anyhow!("no QEMU for crashy"))?;
    Command::new("kill")
        .args(["-s", "KILL", &pid.to_string()])
        .status()?;

    // The failed VMI is replaced by a new one that runs again.
    wait_until(DEADLINE, "a new VMI to run", || {
        let uid = jsonpath(&server, "vmi/crashy", "{.metadata.uid}");
        let phase = jsonpath(&server, "vmi/crashy", "{.status.phase}");
        (!uid.is_empty() && uid != first_uid && phase == "Running").then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", testkit::tail(&server.log(), 40)))?;
    Ok(())
}

#[test]
fn a_vm_whose_guest_cannot_start_goes_into_crash_loop_back_off() -> anyhow::Result<()> {
    let Some(server) = start_server_with_guest()? else {
        return Ok(());
    };
    // An image whose "kernel" is not a kernel: QEMU refuses to start, the VMI fails before
    // it ever ran, and the VM backs off (10 s, 40 s, … as upstream).
    let junk = server.data_dir().join("not-a-kernel");
    std::fs::write(&junk, "this is not a kernel\n")?;
    let status = Command::new(BIN)
        .args(["images", "--data-dir"])
        .arg(server.data_dir())
        .args(["import", "kubevirt-rs/broken-guest:latest"])
        .arg(&junk)
        .status()?;
    anyhow::ensure!(status.success(), "importing the broken image failed");
    let manifest = guest_vm("broken", "Always", "app: broken")
        .replace(
            "kubevirt-rs/test-guest:latest",
            "kubevirt-rs/broken-guest:latest",
        )
        .replace("kernelPath: /vmlinux", "kernelPath: /not-a-kernel")
        .replace("              initrdPath: /initramfs.cpio.gz\n", "");
    server.apply(&manifest)?;
    wait_until(DEADLINE, "VM printableStatus CrashLoopBackOff", || {
        (jsonpath(&server, "vm/broken", "{.status.printableStatus}") == "CrashLoopBackOff")
            .then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", testkit::tail(&server.log(), 40)))?;
    let row = server.ok(&["get", "vm", "broken", "--no-headers"])?;
    assert!(row.contains("CrashLoopBackOff"), "kubectl get vm: {row}");
    let failures = jsonpath(
        &server,
        "vm/broken",
        "{.status.startFailure.consecutiveFailCount}",
    );
    assert!(
        failures.parse::<u32>().is_ok_and(|n| n >= 1),
        "startFailure: {failures}"
    );
    Ok(())
}

/// Waits for VM `name`'s VMI to run and returns its uid.
fn running_vmi_uid(server: &ServerProcess, name: &str) -> anyhow::Result<String> {
    wait_phase(server, name, "Running")?;
    Ok(jsonpath(server, &format!("vmi/{name}"), "{.metadata.uid}"))
}

#[test]
fn rerun_on_failure_restarts_a_crashed_guest_and_once_does_not() -> anyhow::Result<()> {
    let Some(server) = start_server_with_guest()? else {
        return Ok(());
    };
    server.apply(&guest_vm("rerun", "RerunOnFailure", "app: rerun"))?;
    server.apply(&guest_vm("once", "Once", "app: once"))?;
    let rerun_uid = running_vmi_uid(&server, "rerun")?;
    let once_uid = running_vmi_uid(&server, "once")?;
    for name in ["rerun", "once"] {
        let pid = qemu_pid(&server, name).ok_or_else(|| anyhow::anyhow!("no QEMU for {name}"))?;
        Command::new("kill")
            .args(["-s", "KILL", &pid.to_string()])
            .status()?;
    }
    // RerunOnFailure: the failed VMI is replaced and runs again.
    wait_until(DEADLINE, "a new rerun VMI to run", || {
        let uid = jsonpath(&server, "vmi/rerun", "{.metadata.uid}");
        let phase = jsonpath(&server, "vmi/rerun", "{.status.phase}");
        (!uid.is_empty() && uid != rerun_uid && phase == "Running").then_some(())
    })?;
    // Once: the failed VMI stays, final, and nothing starts it again.
    wait_phase(&server, "once", "Failed")?;
    wait_until(DEADLINE, "the Once VM to show Stopped", || {
        (jsonpath(&server, "vm/once", "{.status.printableStatus}") == "Stopped").then_some(())
    })?;
    assert_eq!(
        jsonpath(&server, "vmi/once", "{.metadata.uid}"),
        once_uid,
        "Once started a new VMI"
    );
    Ok(())
}

#[test]
fn a_manual_vm_starts_only_when_asked() -> anyhow::Result<()> {
    let Some(server) = start_server_with_guest()? else {
        return Ok(());
    };
    server.apply(&guest_vm("manual", "Manual", "app: manual"))?;
    wait_until(DEADLINE, "the Manual VM to show Stopped", || {
        (jsonpath(&server, "vm/manual", "{.status.printableStatus}") == "Stopped").then_some(())
    })?;
    assert!(
        !server.kubectl(&["get", "vmi", "manual"]).status.success(),
        "Manual started by itself"
    );
    // The start subresource adds a Start state change request (through the aggregation proxy).
    let body = server.data_dir().join("start.json");
    std::fs::write(&body, "{}")?;
    server.ok(&[
        "replace",
        "--raw",
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/manual/start",
        "-f",
        &body.display().to_string(),
    ])?;
    running_vmi_uid(&server, "manual")?;
    Ok(())
}
