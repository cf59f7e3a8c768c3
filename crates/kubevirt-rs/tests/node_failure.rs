//! End-to-end: a node whose virt-handler stops beating (`kubevirt-rs server --nodes 2
//! --fake-qemu`). The handler of the VM's node is frozen (SIGSTOP: the process lives, so its
//! node agent does not restart it, but it beats no more) and the VM's launcher pod is killed;
//! virt-controller's node controller then marks the node `kubevirt.io/schedulable=false` with
//! a `NodeUnresponsive` event, fails the VMI with reason `NodeUnresponsive`, and the
//! `runStrategy: Always` VM runs again on the other node.
//!
//! The heartbeat timeout and interval are shortened through the KubeVirt CR's
//! `customizeComponents.flags` (virt-controller's `--node-heartbeat-timeout`, virt-handler's
//! `--heartbeat-interval`), which virt-operator renders into the components' arguments.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// Long enough for the operator to roll both components out with their new flags.
const ROLLOUT: Duration = Duration::from_secs(240);

const VM: &str = r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: survivor
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 64Mi}
        devices: {}
";

/// Waits until `kind/name` in `kubevirt` runs its pods with `flag` in their arguments and
/// the rollout is complete.
fn rolled_out_with(server: &ServerProcess, what: &str, flag: &str) -> anyhow::Result<()> {
    wait_until(ROLLOUT, &format!("{what} with {flag}"), || {
        let args = server.get(
            &["-n", "kubevirt", what],
            "{.spec.template.spec.containers[0].args}",
        );
        args.contains(flag).then_some(())
    })?;
    let out = server.kubectl(&[
        "-n",
        "kubevirt",
        "rollout",
        "status",
        what,
        "--timeout=240s",
    ]);
    anyhow::ensure!(
        out.status.success(),
        "rollout of {what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Sets a 20 s heartbeat timeout and a 2 s heartbeat through the KubeVirt CR and waits until
/// both components run with them and both nodes are schedulable again.
fn shorten_heartbeats(server: &ServerProcess) -> anyhow::Result<()> {
    let flags = r#"{"spec":{"customizeComponents":{"flags":{
        "controller":{"node-heartbeat-timeout":"20s"},
        "handler":{"heartbeat-interval":"2s"}}}}}"#;
    server.patch_kubevirt(flags)?;
    testkit::with_log(
        server,
        rolled_out_with(
            server,
            "deployment/virt-controller",
            "--node-heartbeat-timeout",
        ),
    )?;
    testkit::with_log(
        server,
        rolled_out_with(server, "daemonset/virt-handler", "--heartbeat-interval"),
    )?;
    // Both handlers beat again, so both nodes are schedulable.
    let schedulable =
        r"{range .items[*]}{.metadata.name}={.metadata.labels.kubevirt\.io/schedulable} {end}";
    testkit::with_log(
        server,
        wait_until(DEADLINE, "both nodes schedulable", || {
            (server.get(&["nodes"], schedulable).trim() == "kvnode=true kvnode-2=true")
                .then_some(())
        }),
    )?;
    Ok(())
}

/// Freezes the handler of `node` (SIGSTOP) and kills the VM's launcher pod, both containers.
fn freeze_node(server: &ServerProcess, node: &str) -> anyhow::Result<()> {
    let handler = server.ok(&[
        "-n",
        "kubevirt",
        "get",
        "pods",
        "-l",
        "kubevirt.io=virt-handler",
        "--field-selector",
        &format!("spec.nodeName={node}"),
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    let handler_pid = server.container_pid("kubevirt", &handler, "virt-handler")?;
    kill(Pid::from_raw(handler_pid), Signal::SIGSTOP)?;
    let launcher = server.ok(&[
        "get",
        "pods",
        "-l",
        "vm.kubevirt.io/name=survivor",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])?;
    for container in ["compute", "guest-console-log"] {
        let pid = server.container_pid("default", &launcher, container)?;
        // Each container is its own process group (the launcher's QEMU with it).
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    }
    Ok(())
}

#[test]
fn a_node_whose_handler_stops_beating_is_cordoned_and_its_vm_runs_elsewhere() -> anyhow::Result<()>
{
    let server = ServerProcess::start(
        Path::new(BIN),
        "server",
        &["--fake-qemu", "--nodes", "2", "--node-name", "kvnode"],
    )?;
    shorten_heartbeats(&server)?;

    server.apply(VM)?;
    let (first_uid, node_b) = testkit::with_log(
        &server,
        wait_until(DEADLINE, "survivor Running", || {
            let got = server.get(
                &["vmi", "survivor"],
                "{.status.phase} {.metadata.uid} {.status.nodeName}",
            );
            match got.split_whitespace().collect::<Vec<_>>()[..] {
                ["Running", uid, node] => Some((uid.to_owned(), node.to_owned())),
                _ => None,
            }
        }),
    )?;
    let node_a = if node_b == "kvnode" {
        "kvnode-2"
    } else {
        "kvnode"
    };
    let vmi_watch = server.watch(&[
        "get",
        "vmi",
        "survivor",
        "-w",
        "-o",
        "jsonpath={.metadata.uid} {.status.phase} {.status.reason}{\"\\n\"}",
    ])?;

    freeze_node(&server, &node_b)?;

    // The old VMI fails with upstream's reason; the VM gets a new VMI on node A.
    let failed = testkit::with_log(
        &server,
        vmi_watch.wait_for(
            &format!("{first_uid} Failed NodeUnresponsive"),
            Duration::from_secs(120),
        ),
    )?;
    assert!(failed.starts_with(&first_uid), "{failed}");
    let label = server.get(
        &["node", &node_b],
        r"{.metadata.labels.kubevirt\.io/schedulable}",
    );
    assert_eq!(label, "false", "{node_b} is still schedulable");
    let events = |object: &str, namespace: &str| {
        server.get(
            &[
                "events",
                "-n",
                namespace,
                "--field-selector",
                &format!("involvedObject.name={object},reason=NodeUnresponsive"),
            ],
            "{range .items[*]}{.message}|{end}",
        )
    };
    testkit::with_log(
        &server,
        wait_until(DEADLINE, "the NodeUnresponsive events", || {
            let on_node = events(&node_b, "default");
            let on_vmi = events("survivor", "default");
            (on_node.contains("virt-handler is not responsive, marking node as unresponsive")
                && on_vmi.contains(&format!(
                    "virt-handler on node {node_b} is not responsive, marking VMI as failed"
                )))
            .then_some(())
        }),
    )?;
    testkit::with_log(
        &server,
        wait_until(
            Duration::from_secs(120),
            "survivor Running on node A",
            || {
                let got = server.get(
                    &["vmi", "survivor"],
                    "{.status.phase} {.metadata.uid} {.status.nodeName}",
                );
                match got.split_whitespace().collect::<Vec<_>>()[..] {
                    ["Running", uid, node] if uid != first_uid && node == node_a => Some(()),
                    _ => None,
                }
            },
        ),
    )?;
    // Node A keeps beating: it stays schedulable.
    let label = server.get(
        &["node", node_a],
        r"{.metadata.labels.kubevirt\.io/schedulable}",
    );
    assert_eq!(label, "true", "{node_a}");
    // The frozen handler is SIGKILLed with every other pod process when the server drops.
    Ok(())
}
