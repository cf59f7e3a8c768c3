//! End-to-end: `kubevirt-rs server --nodes 2` runs two nodes on one machine, each with its own
//! node agent, pod network and virt-handler; VMs run on the node the scheduler picks and are
//! synced by that node's handler. Runs with `--fake-qemu` (a control-plane test).

use std::path::Path;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn vm(name: &str, node: &str) -> String {
    format!(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Always
  template:
    spec:
      nodeSelector:
        kubernetes.io/hostname: {node}
      domain:
        memory: {{guest: 128Mi}}
        devices: {{}}
"
    )
}

fn jsonpath(server: &ServerProcess, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let template = format!("jsonpath={path}");
    args.extend(["-o", template.as_str()]);
    server.ok(&args).unwrap_or_default()
}

#[test]
fn two_nodes_run_vms_each_synced_by_its_own_handler() -> anyhow::Result<()> {
    let server = ServerProcess::start(
        Path::new(BIN),
        "server",
        &["--fake-qemu", "--nodes", "2", "--node-name", "kvnode"],
    )?;
    let ready = r#"{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}"#;
    wait_until(DEADLINE, "two Ready nodes", || {
        let nodes = jsonpath(&server, &["nodes"], ready);
        (nodes.trim() == "kvnode=True kvnode-2=True").then_some(())
    })
    .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", server.log()))?;

    // The node agents, the scheduler and the proxies run as themselves, not as admin.
    for (file, user) in [
        ("node-kvnode", "system:node:kvnode"),
        ("node-kvnode-2", "system:node:kvnode-2"),
        ("scheduler", "system:kube-scheduler"),
        ("controller-manager", "system:kube-controller-manager"),
        ("proxy-kvnode", "system:kube-proxy"),
    ] {
        let kubeconfig = server.data_dir().join(format!("kubeconfig-{file}"));
        let kubeconfig = kubeconfig.to_string_lossy();
        let whoami = server.ok(&[
            "--kubeconfig",
            &kubeconfig,
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])?;
        assert_eq!(whoami, user);
        let out = server.kubectl(&[
            "--kubeconfig",
            &kubeconfig,
            "auth",
            "can-i",
            "create",
            "secrets",
        ]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "no",
            "{user} may create secrets"
        );
    }

    server.apply(&vm("on-first", "kvnode"))?;
    server.apply(&vm("on-second", "kvnode-2"))?;
    for (vm, node) in [("on-first", "kvnode"), ("on-second", "kvnode-2")] {
        wait_until(DEADLINE, &format!("{vm} Running on {node}"), || {
            let got = jsonpath(&server, &["vmi", vm], "{.status.phase} {.status.nodeName}");
            (got == format!("Running {node}")).then_some(())
        })
        .map_err(|e| anyhow::anyhow!("{e}\nserver log:\n{}", server.log()))?;
        // Handlers sync only the VMIs labelled with their node: Running came from this one.
        let label = jsonpath(
            &server,
            &["vmi", vm],
            "{.metadata.labels.kubevirt\\.io/nodeName}",
        );
        assert_eq!(label, node, "{vm}");
    }

    // As root the nodes' pods have their own networks, one pod CIDR per node.
    if nix::unistd::geteuid().is_root() {
        let cidrs = jsonpath(&server, &["nodes"], "{.items[*].spec.podCIDR}");
        let cidrs: Vec<&str> = cidrs.split_whitespace().collect();
        assert_eq!(cidrs.len(), 2, "{cidrs:?}");
        assert_ne!(cidrs[0], cidrs[1], "each node has its own pod CIDR");
        for (vm, cidr) in [("on-first", cidrs[0]), ("on-second", cidrs[1])] {
            let ip = wait_until(DEADLINE, &format!("the pod IP of {vm}"), || {
                let ip = jsonpath(
                    &server,
                    &["pods", "-l", &format!("vm.kubevirt.io/name={vm}")],
                    "{.items[0].status.podIP}",
                );
                (!ip.is_empty()).then_some(ip)
            })?;
            let prefix = cidr.rsplit_once('.').map(|(p, _)| p).unwrap_or(cidr);
            assert!(
                ip.starts_with(&format!("{prefix}.")),
                "{vm}'s pod IP {ip} is not in its node's {cidr}"
            );
        }
    }
    Ok(())
}
