//! End-to-end: an upgrade of KubeVirt by patching the KubeVirt CR's `imageTag` to a release
//! imported with `kubevirt-rs images import-release` replaces every component pod while two
//! real guests keep running on the same QEMU processes without a reboot. Skips (saying why)
//! when the test guest or QEMU is missing.

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// A tag newer than this build's by semantic version, so the operator takes upstream's
/// update path (virt-handler first, virt-api last).
fn next_release() -> String {
    let version = semver::Version::parse(env!("CARGO_PKG_VERSION")).expect("a version");
    format!("{}.{}.0", version.major, version.minor + 1)
}

fn guest_vm(name: &str) -> String {
    testkit::test_guest_vm(name, &["memory: {guest: 128Mi}"])
}

/// `name=image` of every pod of KubeVirt's components (not the operator's).
fn component_pods(server: &ServerProcess) -> Vec<(String, String)> {
    server
        .get(
            &["pods", "-n", "kubevirt"],
            r#"{range .items[*]}{.metadata.name}={.spec.containers[0].image}{"\n"}{end}"#,
        )
        .lines()
        .filter(|l| !l.starts_with("virt-operator"))
        .filter_map(|l| l.split_once('='))
        .map(|(n, i)| (n.to_owned(), i.to_owned()))
        .collect()
}

/// The pid recorded by the launcher of VM `name` for its QEMU, with the launcher pod's name.
fn launcher(server: &ServerProcess, name: &str) -> anyhow::Result<(String, i32)> {
    let pod = server.get(
        &["pods", "-l", &format!("vm.kubevirt.io/name={name}")],
        "{.items[0].metadata.name} {.items[0].metadata.uid}",
    );
    let (pod, uid) = pod
        .split_once(' ')
        .ok_or_else(|| anyhow::anyhow!("no launcher pod for {name}"))?;
    let pid =
        std::fs::read_to_string(testkit::launcher_dir(server.data_dir(), uid).join("qemu.pid"))?;
    Ok((pod.to_owned(), pid.trim().parse()?))
}

fn boots(server: &ServerProcess, pod: &str) -> usize {
    server.guest_console(pod).matches("GUEST-READY").count()
}

/// Imports this binary as release `next` and patches the CR's `imageTag` to it; returns the
/// component pods once the CR observed `next` and every component pod runs its images.
fn upgrade_to(server: &ServerProcess, next: &str) -> anyhow::Result<Vec<(String, String)>> {
    let imported = std::process::Command::new(BIN)
        .args(["images", "--data-dir"])
        .arg(server.data_dir())
        .args(["import-release", next, BIN])
        .output()?;
    anyhow::ensure!(imported.status.success(), "{imported:?}");
    server.patch_kubevirt(&format!(r#"{{"spec":{{"imageTag":"{next}"}}}}"#))?;
    let upgraded = wait_until(DEADLINE, "the CR to observe the new version", || {
        let status = server.get(
            &["kubevirt", "kubevirt", "-n", "kubevirt"],
            "{.status.phase} {.status.observedKubeVirtVersion}",
        );
        let pods = component_pods(server);
        let all_new = !pods.is_empty()
            && pods
                .iter()
                .all(|(_, image)| image.ends_with(&format!(":{next}")));
        (status == format!("Deployed {next}") && all_new).then_some(pods)
    })?;
    Ok(upgraded)
}

/// Waits until VM `vm` runs and its guest has booted once; its launcher pod and QEMU pid.
fn booted(server: &ServerProcess, vm: &str) -> anyhow::Result<(String, i32)> {
    wait_until(DEADLINE, &format!("{vm} Running"), || {
        (server.get(&["vmi", vm], "{.status.phase}") == "Running").then_some(())
    })?;
    let (pod, pid) = launcher(server, vm)?;
    wait_until(DEADLINE, &format!("{vm}'s guest to boot"), || {
        (boots(server, &pod) == 1).then_some(())
    })?;
    Ok((pod, pid))
}

/// The components whose rollout the operators logged, in order.
fn rollouts_logged(server: &ServerProcess) -> Vec<String> {
    server
        .get(
            &["pods", "-n", "kubevirt", "-l", "kubevirt.io=virt-operator"],
            "{.items[*].metadata.name}",
        )
        .split_whitespace()
        .flat_map(|pod| {
            let out = server.kubectl(&["logs", "-n", "kubevirt", pod]);
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("rolled out"))
                .filter_map(|l| {
                    let name = l.split("name=").nth(1)?.split_whitespace().next()?;
                    Some(name.trim_matches('"').to_owned())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// virt-handler's DaemonSet from now on: `<generation> <maxUnavailable>` per change.
fn watch_handler_max_unavailable(server: &ServerProcess) -> anyhow::Result<testkit::Watcher> {
    server.watch(&[
        "get",
        "daemonset",
        "virt-handler",
        "-n",
        "kubevirt",
        "--watch-only",
        "-o",
        r#"jsonpath={.metadata.generation} {.spec.updateStrategy.rollingUpdate.maxUnavailable}{"\n"}"#,
    ])
}

/// Upstream's canary rollout of virt-handler, as the DaemonSet's generations show it: the new
/// template with `maxUnavailable` 1 (the canary), then 10 % once the canary is Ready, and 1
/// again at the end.
fn canary_then_ten_percent_then_one(seen: &[String]) {
    let mut values: Vec<&str> = Vec::new();
    let mut generation = "";
    for line in seen {
        let (g, value) = line.split_once(' ').unwrap_or((line, ""));
        if g != generation {
            generation = g;
            values.push(value.trim());
        }
    }
    assert_eq!(
        values,
        ["1", "10%", "1"],
        "maxUnavailable per generation: {seen:#?}"
    );
}

/// `virtctl pause` and `unpause` of VM `vm`, each seen in its printable status.
fn pause_and_unpause(server: &ServerProcess, virtctl: &Path, vm: &str) -> anyhow::Result<()> {
    for (verb, want) in [("pause", "Paused"), ("unpause", "Running")] {
        let out = std::process::Command::new(virtctl)
            .args([verb, "vm", vm])
            .env("KUBECONFIG", server.kubeconfig())
            .output()?;
        anyhow::ensure!(out.status.success(), "virtctl {verb}: {out:?}");
        wait_until(DEADLINE, want, || {
            (server.get(&["vm", vm], "{.status.printableStatus}") == want).then_some(())
        })?;
    }
    Ok(())
}

fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn patching_the_image_tag_upgrades_every_component_and_the_guests_never_notice()
-> anyhow::Result<()> {
    let Some(guest) = testkit::available(testkit::test_guest()) else {
        return Ok(());
    };
    let Some(virtctl) = testkit::available(testkit::virtctl_beside(Path::new(BIN))) else {
        return Ok(());
    };
    // Two nodes, so that virt-handler's canary is one of two pods.
    let mut server = ServerProcess::start(Path::new(BIN), "server", &["--nodes", "2"])?;
    server.import_test_guest(guest)?;
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        let log = server.log();
        let lines: Vec<&str> = log.lines().collect();
        anyhow::anyhow!(
            "{what}: {e}\nserver log:\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n")
        )
    };
    let vms = ["up-a", "up-b"];
    for vm in vms {
        server.apply(&guest_vm(vm))?;
    }
    let mut before = vec![];
    for vm in vms {
        before.push(booted(&server, vm).map_err(|e| fail("boot", &e))?);
    }
    let old_pods = component_pods(&server);
    let old_launcher_image =
        server.get(&["vmi", "up-a"], "{.status.launcherContainerImageVersion}");
    // Every phase either VMI goes through from now on.
    let phases = server.watch(&[
        "get",
        "vmi",
        "--watch-only",
        "--no-headers",
        "-o",
        "custom-columns=NAME:.metadata.name,PHASE:.status.phase",
    ])?;

    let max_unavailable = watch_handler_max_unavailable(&server)?;

    let next = next_release();
    let upgraded = upgrade_to(&server, &next).map_err(|e| fail("upgrade", &e))?;
    canary_then_ten_percent_then_one(&max_unavailable.lines_so_far());
    drop(max_unavailable);
    for (name, _) in &old_pods {
        assert!(
            !upgraded.iter().any(|(n, _)| n == name),
            "{name} was not replaced: {upgraded:?}"
        );
    }
    for component in ["virt-api", "virt-controller", "virt-handler"] {
        assert!(
            upgraded.iter().any(|(n, _)| n.starts_with(component)),
            "no {component} pod after the upgrade: {upgraded:?}"
        );
    }

    // Upstream's update path: virt-handler rolled out first, virt-api last (the leading
    // operator logs each rollout).
    let rollouts = rollouts_logged(&server);
    assert_eq!(
        rollouts,
        ["virt-handler", "virt-controller", "virt-api"],
        "the order of the rollouts"
    );
    // The launchers are the old version's, labelled outdated by the new virt-controller.
    for (vm, (pod, _)) in vms.iter().zip(&before) {
        wait_until(DEADLINE, &format!("{pod} labelled outdated"), || {
            let labels = server.get(&["pod", pod], "{.metadata.labels}");
            labels
                .contains("kubevirt.io/outdatedLauncherImage")
                .then_some(())
        })
        .map_err(|e| fail("outdated label", &e))?;
        assert_eq!(
            server.get(&["vmi", vm], "{.status.launcherContainerImageVersion}"),
            old_launcher_image
        );
    }
    // The new virt-api and handler drive the old launchers: a pause and an unpause go
    // through them.
    pause_and_unpause(&server, &virtctl, "up-a").map_err(|e| fail("pause", &e))?;
    for (vm, (pod, pid)) in vms.iter().zip(&before) {
        let now = launcher(&server, vm)?;
        assert_eq!(
            &now,
            &(pod.clone(), *pid),
            "{vm}'s launcher or QEMU changed"
        );
        assert!(is_running(*pid), "{vm}'s QEMU {pid} is gone");
        assert_eq!(boots(&server, pod), 1, "{vm}'s guest booted again");
        assert_eq!(server.get(&["vmi", vm], "{.status.phase}"), "Running");
    }
    let seen = phases.lines_so_far();
    assert!(!seen.is_empty(), "the watch saw no VMI update at all");
    for line in &seen {
        assert!(
            line.split_whitespace().nth(1) == Some("Running"),
            "a VMI left Running during the upgrade: {line:?}\n{seen:#?}"
        );
    }
    drop(phases);
    workload_update_evicts_the_outdated(&server, &vms, &old_launcher_image)
        .map_err(|e| fail("workload update", &e))
}

/// The workload updater: the CR and the controller's gauge count both VMIs as outdated, and
/// listing `Evict` in the CR's `workloadUpdateStrategy` moves each to a launcher of the new
/// version (its launcher pod evicted, the VM's run strategy starting a new VMI).
fn workload_update_evicts_the_outdated(
    server: &ServerProcess,
    vms: &[&str],
    old_image: &str,
) -> anyhow::Result<()> {
    let outdated = || {
        server.get(
            &["kubevirt", "kubevirt", "-n", "kubevirt"],
            "{.status.outdatedVirtualMachineInstanceWorkloads}",
        )
    };
    wait_until(DEADLINE, "both VMIs counted as outdated", || {
        (outdated() == "2").then_some(())
    })?;
    let gauge = server.metric_samples(
        "virt-controller",
        "virt-controller.kubevirt.svc",
        "kubevirt_vmi_number_of_outdated",
    )?;
    assert_eq!(
        gauge,
        ["kubevirt_vmi_number_of_outdated 2"],
        "served by the leader"
    );
    let uids: Vec<String> = vms
        .iter()
        .map(|vm| server.get(&["vmi", vm], "{.metadata.uid}"))
        .collect();
    server.patch_kubevirt(
        r#"{"spec":{"workloadUpdateStrategy":{"workloadUpdateMethods":["Evict"]}}}"#,
    )?;
    for (vm, uid) in vms.iter().zip(&uids) {
        wait_until(
            DEADLINE,
            &format!("{vm} on a launcher of the new version"),
            || {
                let now = server.get(
                    &["vmi", vm],
                    "{.metadata.uid} {.status.phase} {.status.launcherContainerImageVersion}",
                );
                let fields: Vec<&str> = now.split(' ').collect();
                let [now_uid, phase, image] = fields[..] else {
                    return None;
                };
                (now_uid != uid && phase == "Running" && !image.is_empty() && image != old_image)
                    .then_some(())
            },
        )?;
    }
    wait_until(DEADLINE, "no outdated VMI left", || {
        (outdated() == "0").then_some(())
    })?;
    let evictions = server.get(
        &["events"],
        r#"{range .items[?(@.reason=="SuccessfulEvict")]}{.involvedObject.name}/{.source.component}{"\n"}{end}"#,
    );
    for vm in vms {
        assert!(
            evictions
                .lines()
                .any(|l| l == format!("{vm}/workload-update-controller")),
            "{evictions}"
        );
    }
    Ok(())
}
