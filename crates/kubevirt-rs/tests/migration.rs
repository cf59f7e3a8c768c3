//! End-to-end: live migration between the two nodes of `kubevirt-rs server --nodes 2`. A real
//! guest (the test guest, TCG) runs on one node; `virtctl migrate` moves it to the other: the
//! migration reaches `Succeeded`, the VMI's `status.nodeName` changes, `migrationState` says
//! `completed`, the source launcher pod completes, and the guest did not reboot — a file it
//! wrote in its RAM-only root before the migration is still there afterwards, its uptime went
//! on, the target's console shows no boot, and what it wrote on its emptyDisk is on the
//! target's disk (block migration). Skips (saying why) when the test guest, QEMU
//! or virtctl is missing.
//!
//! Then a second migration, slowed to 1 MiB/s by the MigrationPolicy that selects the VMI, is cancelled while it
//! runs (`virtctl migrate-cancel`): the migration goes away, the VMI stays on its node with
//! `migrationState.failed` and upstream's abort reason, and the guest runs on. Last, a
//! migration whose target pod no node can take fails after the pending-pod timeout. Then a
//! guest without disks to copy is migrated with the policy allowing post-copy and a 1 s
//! completion timeout: the source switches to post-copy and the migration succeeds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");
/// A migration of a small guest under TCG, plus the target pod's start.
const MIGRATION_DEADLINE: Duration = Duration::from_secs(240);

/// A VM of the test guest named `name`, labelled for the `slow` policy, with `devices` and
/// more lines of the template's `spec` (indented as its fields).
fn vm(name: &str, devices: &[&str], spec: &[&str]) -> String {
    let devices: String = devices.iter().map(|l| format!("          {l}\n")).collect();
    let spec: String = spec.iter().map(|l| format!("      {l}\n")).collect();
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Always
  template:
    metadata:
      labels: {{moves: slowly}}
    spec:
      domain:
        memory: {{guest: 128Mi}}
        firmware:
          kernelBoot:
            kernelArgs: "console=ttyS0 panic=-1 quiet tg.quiet=1"
            container:
              image: kubevirt-rs/test-guest:latest
              kernelPath: /vmlinux
              initrdPath: /initramfs.cpio.gz
        devices:
{devices}          interfaces: [{{name: default, masquerade: {{}}}}]
      networks: [{{name: default, pod: {{}}}}]
{spec}"#
    )
}

/// The migrating VM: an emptyDisk makes its migrations block migrations.
fn mover() -> String {
    vm(
        "mover",
        &["disks: [{name: scratch, disk: {}}]"],
        &["volumes: [{name: scratch, emptyDisk: {capacity: 16Mi}}]"],
    )
}

fn virtctl() -> PathBuf {
    Path::new(BIN).with_file_name("virtctl")
}

fn guest_run(server: &ServerProcess, command: &str) -> anyhow::Result<String> {
    server.guest_run("mover", command)
}

/// The guest's uptime in seconds from a `MARK <tag> <uptime>` line.
fn uptime_after(output: &str, tag: &str) -> Option<f64> {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix(&format!("MARK {tag} ")))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

fn vmi_field(server: &ServerProcess, template: &str) -> String {
    server.get(&["vmi", "mover"], template)
}

fn virtctl_ok(server: &ServerProcess, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(virtctl())
        .args(args)
        .env("KUBECONFIG", server.kubeconfig())
        .output()?;
    anyhow::ensure!(out.status.success(), "virtctl {args:?}: {out:?}");
    Ok(())
}

/// The names of the migrations, in creation order.
fn migrations(server: &ServerProcess) -> Vec<String> {
    server
        .get(
            &["vmim", "--sort-by=.metadata.creationTimestamp"],
            "{.items[*].metadata.name}",
        )
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// `virtctl migrate mover`; returns the new migration's name.
fn start_migration(server: &ServerProcess) -> anyhow::Result<String> {
    let before = migrations(server);
    virtctl_ok(server, &["migrate", "mover"])?;
    wait_until(DEADLINE, "the new migration", || {
        migrations(server).into_iter().find(|m| !before.contains(m))
    })
}

/// Boots the VM and waits for its guest; returns its node and launcher pod.
fn boot_mover(server: &ServerProcess) -> anyhow::Result<(String, String)> {
    server.apply(&mover())?;
    testkit::with_log(
        server,
        wait_until(DEADLINE, "the VMI Running and LiveMigratable", || {
            (vmi_field(
                server,
                r#"{.status.phase} {.status.conditions[?(@.type=="LiveMigratable")].status}"#,
            ) == "Running True")
                .then_some(())
        }),
    )?;
    let node = vmi_field(server, "{.status.nodeName}");
    let pod = server.get(
        &["pods", "-l", "vm.kubevirt.io/name=mover"],
        "{.items[0].metadata.name}",
    );
    testkit::with_log(
        server,
        wait_until(DEADLINE, "the guest to boot", || {
            server
                .guest_console(&pod)
                .contains("GUEST-READY")
                .then_some(())
        }),
    )?;
    Ok((node, pod))
}

/// Runs the migration to its end and checks that the VMI moved; returns the target node
/// and pod.
fn migrate_away(
    server: &ServerProcess,
    source_node: &str,
    source_pod: &str,
) -> anyhow::Result<(String, String)> {
    let started = Instant::now();
    let name = start_migration(server)?;
    let phase = testkit::with_log(
        server,
        wait_until(MIGRATION_DEADLINE, "the migration to end", || {
            let phase = server.get(&["vmim", &name], "{.status.phase}");
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        }),
    )?;
    let events = server.kubectl(&["get", "events", "--sort-by=.lastTimestamp"]);
    let events = String::from_utf8_lossy(&events.stdout).into_owned();
    anyhow::ensure!(
        phase == "Succeeded",
        "the migration {phase}: {}\nevents:\n{events}\nserver log (tail):\n{}",
        server.get(&["vmim", &name], "{.status}"),
        testkit::tail(&server.log(), 200)
    );
    eprintln!("migration succeeded after {:?}", started.elapsed());
    for reason in [
        "SuccessfulCreate",
        "SuccessfulHandOver",
        "PreparingTarget",
        "Migrating",
        "Migrated",
        "SuccessfulMigration",
    ] {
        assert!(events.contains(reason), "event {reason} in:\n{events}");
    }
    let target_node = vmi_field(server, "{.status.nodeName}");
    assert_ne!(target_node, source_node, "status.nodeName moved");
    // The handlers carried it in mutual TLS with the certificates the operator issued.
    let handler_logs = server.kubectl(&[
        "-n",
        "kubevirt",
        "logs",
        "-l",
        "kubevirt.io=virt-handler",
        "--tail=-1",
    ]);
    let handler_logs = String::from_utf8_lossy(&handler_logs.stdout).into_owned();
    let listening: Vec<&str> = handler_logs
        .lines()
        .filter(|l| l.contains("migration target listening"))
        .collect();
    assert!(
        !listening.is_empty() && listening.iter().all(|l| l.contains("tls=true")),
        "the target proxies listen in TLS: {listening:?}"
    );
    assert_eq!(
        vmi_field(server, "{.status.migrationMethod}"),
        "BlockMigration"
    );
    assert_eq!(
        vmi_field(
            server,
            "{.status.phase} {.status.migrationState.completed} {.status.migrationState.sourceNode} {.status.migrationState.targetNode} {.metadata.labels.kubevirt\\.io/nodeName}"
        ),
        format!("Running true {source_node} {target_node} {target_node}")
    );
    // The migration keeps a copy of the final state.
    assert_eq!(
        server.get(&["vmim", &name], "{.status.migrationState.completed}"),
        "true"
    );
    // virt-controller's migration families name it as succeeded.
    let succeeded = server.metric_samples(
        "virt-controller",
        "virt-controller.kubevirt.svc",
        "kubevirt_vmi_migration_succeeded",
    )?;
    let sample = format!(
        r#"kubevirt_vmi_migration_succeeded{{vmi="mover",vmim="{name}",namespace="default"}} 1"#
    );
    assert!(succeeded.contains(&sample), "{succeeded:?}");
    let target_pod = vmi_field(server, "{.status.migrationState.targetPod}");
    assert_eq!(
        server.get(&["pod", &target_pod], "{.spec.nodeName}"),
        target_node
    );
    // A host-model guest (the default model) goes only where the source's host model runs,
    // and only to a CPU of the source's vendor.
    let selector = server.get(&["pod", &target_pod], "{.spec.nodeSelector}");
    assert!(
        selector.contains("cpu-model-migration.node.kubevirt.io/")
            && selector.contains("cpu-vendor.node.kubevirt.io/"),
        "the target pod's CPU placement: {selector}"
    );
    // The source launcher exits after handing over: its pod completes (or is gone).
    testkit::with_log(
        server,
        wait_until(DEADLINE, "the source pod to complete", || {
            let phase = server.get(
                &["pods", "--ignore-not-found", source_pod],
                "{.status.phase}",
            );
            (phase.is_empty() || phase == "Succeeded").then_some(())
        }),
    )?;
    Ok((target_node, target_pod))
}

/// Migration policies: `slow` selects the VMI by its label and the `default` namespace by
/// its name label, and slows it to 1 MiB/s; `other` asks for a label the VMI lacks.
const POLICIES: &str = r#"apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: slow}
spec:
  selectors:
    virtualMachineInstanceSelector: {moves: slowly}
    namespaceSelector: {kubernetes.io/metadata.name: default}
  bandwidthPerMigration: 1Mi
---
apiVersion: migrations.kubevirt.io/v1alpha1
kind: MigrationPolicy
metadata: {name: other}
spec:
  selectors:
    virtualMachineInstanceSelector: {moves: slowly, tier: gold, zone: a}
  bandwidthPerMigration: 1Gi
"#;

/// Slows the VMI's migrations down to 1 MiB/s (a MigrationPolicy's `bandwidthPerMigration`),
/// starts one, cancels it once it runs (`virtctl migrate-cancel`) and checks that the VMI
/// stayed on `node`.
fn cancel_slow_migration(server: &ServerProcess, node: &str) -> anyhow::Result<()> {
    server.apply(POLICIES)?;
    let name = start_migration(server)?;
    testkit::with_log(
        server,
        wait_until(MIGRATION_DEADLINE, "the slow migration to run", || {
            let phase = server.get(&["vmim", &name], "{.status.phase}");
            matches!(phase.as_str(), "Running" | "Succeeded" | "Failed").then_some(())
        }),
    )?;
    assert_eq!(
        server.get(&["vmim", &name], "{.status.phase}"),
        "Running",
        "the migration was to be still running"
    );
    assert_eq!(
        vmi_field(
            server,
            "{.status.migrationState.migrationPolicyName} {.status.migrationState.migrationConfiguration.bandwidthPerMigration}"
        ),
        "slow 1Mi"
    );
    // The source handler serves the transfer's progress while it runs.
    let progress = |family: &str| {
        let labels = format!(r#"{{node="{node}",namespace="default",name="mover"}} "#);
        server
            .metric_samples("virt-handler", "virt-handler", family)
            .ok()?
            .iter()
            .find_map(|l| {
                l.strip_prefix(&format!("{family}{labels}"))?
                    .parse::<f64>()
                    .ok()
            })
    };
    let (total, remaining) = testkit::with_log(
        server,
        wait_until(DEADLINE, "the migration's progress on the source", || {
            let total = progress("kubevirt_vmi_migration_data_bytes_total")?;
            let remaining = progress("kubevirt_vmi_migration_data_remaining_bytes")?;
            (remaining > 0.0).then_some((total, remaining))
        }),
    )?;
    assert!(
        total >= 128.0 * 1024.0 * 1024.0,
        "the guest's 128Mi to send: {total}"
    );
    assert!(remaining <= total, "{remaining} of {total}");
    let target_pod = vmi_field(server, "{.status.migrationState.targetPod}");
    virtctl_ok(server, &["migrate-cancel", "mover"])?;
    testkit::with_log(
        server,
        wait_until(MIGRATION_DEADLINE, "the cancelled migration to go", || {
            server
                .get(&["vmim", "--ignore-not-found", &name], "{.metadata.name}")
                .is_empty()
                .then_some(())
        }),
    )?;
    // The source handler reports the abort; the migration may have ended a moment before
    // (its target pod went down when the source stopped sending).
    let want = format!("Running {node} true Succeeded Live migration has been aborted");
    testkit::with_log(
        server,
        wait_until(DEADLINE, "the VMI to report the aborted migration", || {
            let state = vmi_field(
                server,
                "{.status.phase} {.status.nodeName} {.status.migrationState.failed} {.status.migrationState.abortStatus} {.status.migrationState.failureReason}",
            );
            (state == want).then_some(())
        }),
    )?;
    testkit::with_log(
        server,
        wait_until(
            DEADLINE,
            "the cancelled migration's target pod to go",
            || {
                let pod = server.get(
                    &["pod", "--ignore-not-found", &target_pod],
                    "{.metadata.name}:{.metadata.deletionTimestamp}",
                );
                (pod.is_empty() || !pod.ends_with(':')).then_some(())
            },
        ),
    )?;
    Ok(())
}

#[test]
fn virtctl_migrate_moves_a_running_guest_to_the_other_node_and_migrate_cancel_keeps_it()
-> anyhow::Result<()> {
    let Some(guest) = testkit::available(testkit::test_guest()) else {
        return Ok(());
    };
    if testkit::available(testkit::virtctl_beside(Path::new(BIN))).is_none() {
        return Ok(());
    }
    let mut server = ServerProcess::start(
        Path::new(BIN),
        "server",
        &["--nodes", "2", "--node-name", "mignode"],
    )?;
    server.import_test_guest(guest)?;
    let (source_node, source_pod) = boot_mover(&server)?;
    let before = guest_run(
        &server,
        "touch /tmp/before-migration; echo DISK-MARK-42 >/dev/vda; sync; echo MARK before $(cut -d' ' -f1 /proc/uptime)",
    )?;
    let up_before = uptime_after(&before, "before")
        .ok_or_else(|| anyhow::anyhow!("no uptime before the migration in {before:?}"))?;

    let (target_node, target_pod) = migrate_away(&server, &source_node, &source_pod)?;
    // The page cache is dropped first, so the disk's content is read from the target's disk.
    let after = guest_run(
        &server,
        "test -f /tmp/before-migration && echo 3 >/proc/sys/vm/drop_caches && echo DISK $(head -c 12 /dev/vda) && echo MARK after $(cut -d' ' -f1 /proc/uptime)",
    )?;
    assert!(
        after.contains("DISK DISK-MARK-42"),
        "the emptyDisk's content did not reach the target (block migration): {after:?}"
    );
    let up_after = uptime_after(&after, "after").ok_or_else(|| {
        anyhow::anyhow!("the guest lost what it wrote before the migration: {after:?}")
    })?;
    assert!(
        up_after > up_before,
        "uptime went on: {up_before} s before, {up_after} s after"
    );
    let target_console = server.guest_console(&target_pod);
    assert!(
        !target_console.contains("GUEST-READY") && !target_console.contains("UPTIME:"),
        "the guest booted again on the target: {target_console}"
    );
    eprintln!("guest uptime {up_before} s before, {up_after} s after the migration");

    cancel_slow_migration(&server, &target_node)?;
    let cancelled = guest_run(
        &server,
        "test -f /tmp/before-migration && echo MARK cancelled $(cut -d' ' -f1 /proc/uptime)",
    )?;
    let up_cancelled = uptime_after(&cancelled, "cancelled").ok_or_else(|| {
        anyhow::anyhow!("the guest is not the same after the cancel: {cancelled:?}")
    })?;
    assert!(up_cancelled > up_after, "uptime went on after the cancel");
    unschedulable_target_fails_the_migration(&server, &target_node)?;
    post_copy_moves_a_disk_less_guest(&server)
}

/// The `slow` policy now allows post-copy with a completion timeout of 1 s per GiB: at
/// 1 MiB/s the pre-copy of `light` cannot finish in time, so the source switches to post-copy
/// (`migrationState.mode: PostCopy`), the migration succeeds and the guest runs on.
fn post_copy_moves_a_disk_less_guest(server: &ServerProcess) -> anyhow::Result<()> {
    // At most two guests at once: the mover goes first.
    server.ok(&["delete", "vm", "mover", "--wait=false"])?;
    wait_until(DEADLINE, "the mover's VMI to go", || {
        (!server.kubectl(&["get", "vmi", "mover"]).status.success()).then_some(())
    })?;
    // A guest without disks to copy (post-copy does not combine with a block migration here).
    server.apply(&vm("light", &[], &[]))?;
    testkit::with_log(
        server,
        wait_until(DEADLINE, "light Running", || {
            (server.get(&["vmi", "light"], "{.status.phase}") == "Running").then_some(())
        }),
    )?;
    let pod = server.get(
        &["pods", "-l", "vm.kubevirt.io/name=light"],
        "{.items[0].metadata.name}",
    );
    wait_until(DEADLINE, "light's guest to boot", || {
        server
            .guest_console(&pod)
            .contains("GUEST-READY")
            .then_some(())
    })?;
    let node = server.get(&["vmi", "light"], "{.status.nodeName}");
    server.ok(&[
        "patch",
        "migrationpolicy",
        "slow",
        "--type=merge",
        "-p",
        r#"{"spec":{"allowPostCopy":true,"completionTimeoutPerGiB":1}}"#,
    ])?;
    server.apply(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstanceMigration\nmetadata: {name: post-copy}\nspec: {vmiName: light}\n",
    )?;
    let phase = testkit::with_log(
        server,
        wait_until(MIGRATION_DEADLINE, "the post-copy migration to end", || {
            let phase = server.get(&["vmim", "post-copy"], "{.status.phase}");
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        }),
    )?;
    let qemu_logs = || {
        ["sourcePod", "targetPod"]
            .iter()
            .map(|pod| {
                let pod = server.get(
                    &["vmim", "post-copy"],
                    &format!("{{.status.migrationState.{pod}}}"),
                );
                let uid = server.get(&["pod", &pod], "{.metadata.uid}");
                let log = testkit::launcher_dir(server.data_dir(), &uid).join("qemu.log");
                format!(
                    "{pod}: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    anyhow::ensure!(
        phase == "Succeeded",
        "the post-copy migration {phase}: {}\nQEMU:\n{}",
        server.get(&["vmim", "post-copy"], "{.status}"),
        qemu_logs(),
    );
    assert_eq!(
        server.get(
            &["vmim", "post-copy"],
            "{.status.migrationState.mode} {.status.migrationState.migrationConfiguration.allowPostCopy} {.status.migrationState.completed}"
        ),
        "PostCopy true true"
    );
    assert_ne!(
        server.get(&["vmi", "light"], "{.status.nodeName}"),
        node,
        "the VMI moved"
    );
    let alive = server.guest_run("light", "echo MARK light $(cut -d' ' -f1 /proc/uptime)")?;
    assert!(
        uptime_after(&alive, "light").is_some(),
        "the guest runs on after post-copy: {alive:?}"
    );
    Ok(())
}

/// A migration whose target pod cannot be scheduled (`addedNodeSelector` no node matches)
/// fails once upstream's pending-pod timeout (shortened by its annotations) passes.
fn unschedulable_target_fails_the_migration(
    server: &ServerProcess,
    node: &str,
) -> anyhow::Result<()> {
    server.apply(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata:
  name: nowhere
  annotations:
    kubevirt.io/migrationUnschedulablePodTimeoutSeconds: "5"
    kubevirt.io/migrationPendingPodTimeoutSeconds: "5"
spec:
  vmiName: mover
  addedNodeSelector: {example.com/no-such-node: "true"}
"#,
    )?;
    testkit::with_log(
        server,
        wait_until(
            MIGRATION_DEADLINE,
            "the unschedulable migration to fail",
            || (server.get(&["vmim", "nowhere"], "{.status.phase}") == "Failed").then_some(()),
        ),
    )?;
    let events = server.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=nowhere",
    ]);
    let events = String::from_utf8_lossy(&events.stdout).into_owned();
    assert!(
        events.contains("timeout period exceeded")
            && events.contains("Migration target pod was removed during active migration."),
        "{events}"
    );
    assert_eq!(
        vmi_field(server, "{.status.phase} {.status.nodeName}"),
        format!("Running {node}")
    );
    Ok(())
}
