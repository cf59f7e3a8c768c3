//! End-to-end: NIC hotplug on a running real guest (the test guest, TCG). A VM on the pod
//! network gets a second interface on a NetworkAttachmentDefinition (CNI `bridge`, layer 2)
//! added to its template, as upstream users do: the VM controller appends it to the VMI, the
//! VMI controller asks the node for the pod interface (the pod's networks annotation), the node
//! adds it to the running pod and reports it (`network-status`), virt-handler has the launcher
//! plug a virtio NIC into QEMU, and the guest sees a new interface while its QEMU keeps running
//! and `RestartRequired` stays away. Its `state` set `down` and `up` again, the guest sees the
//! carrier follow (QMP `set_link`). Marked `state: absent`, the interface leaves the guest,
//! the VMI and the VM template. A VM with the interface in its template from the start boots
//! with both NICs. Skips (saying why) when the test guest, QEMU or virtctl is
//! missing.

use std::path::Path;
use std::process::Command;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

/// Deletes the definition's bridge on the host when dropped (the `bridge` plugin never does).
struct BridgeGuard(String);

impl Drop for BridgeGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).output();
    }
}

fn definition(bridge: &str) -> String {
    format!(
        r#"apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: hotnet
spec:
  config: '{{"cniVersion": "0.3.1", "name": "hotnet", "type": "bridge", "bridge": "{bridge}"}}'
"#
    )
}

/// What the guest of VM `hot` prints for `shell` (its output on one line).
fn guest_says(server: &ServerProcess, shell: &str) -> anyhow::Result<String> {
    guest_of_says(server, "hot", shell)
}

/// What the guest of `vm` prints for `shell` (its output on one line).
fn guest_of_says(server: &ServerProcess, vm: &str, shell: &str) -> anyhow::Result<String> {
    let out = server.guest_run(vm, &format!("echo SAYS: $({shell})"))?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("SAYS: "))
        .next_back()
        .unwrap_or_default()
        .trim()
        .to_owned())
}

/// The guest's interfaces (`/sys/class/net`), as one line.
fn guest_links(server: &ServerProcess) -> anyhow::Result<String> {
    guest_says(server, "ls /sys/class/net")
}

/// Sets the template state of the hotplugged interface (the second).
fn set_state(server: &ServerProcess, state: &str) -> anyhow::Result<()> {
    let patch = format!(
        r#"[{{"op": "add", "path": "/spec/template/spec/domain/devices/interfaces/1/state", "value": "{state}"}}]"#
    );
    let out = server.kubectl(&["patch", "vm", "hot", "--type=json", "-p", &patch]);
    anyhow::ensure!(
        out.status.success(),
        "patch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The guest sees the carrier of `link` follow the interface's `state`.
fn link_follows_the_state(server: &ServerProcess, link: &str) -> anyhow::Result<()> {
    let carrier = format!("ip link set {link} up; cat /sys/class/net/{link}/carrier");
    for (state, expected) in [("down", "0"), ("up", "1")] {
        set_state(server, state)?;
        wait_until(
            DEADLINE,
            &format!("the guest's carrier {expected} ({state})"),
            || (guest_says(server, &carrier).ok()? == expected).then_some(()),
        )?;
        wait_until(
            DEADLINE,
            &format!("linkState {state} in the status"),
            || {
                let reported = server.get(
                    &["vmi", "hot"],
                    r#"{.status.interfaces[?(@.name=="blue")].linkState}"#,
                );
                (reported == state).then_some(())
            },
        )?;
    }
    Ok(())
}

fn wait_links(
    server: &ServerProcess,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> anyhow::Result<String> {
    let mut last = String::new();
    let found = wait_until(DEADLINE, what, || {
        let links = guest_links(server).ok()?;
        last.clone_from(&links);
        done(&links).then_some(links)
    });
    found.map_err(|e| {
        anyhow::anyhow!(
            "{e}\nlast seen: {last:?}\nVMI interfaces: {}\nVMI status: {}\npod annotations: {}",
            server.get(&["vmi", "hot"], "{.spec.domain.devices.interfaces}"),
            server.get(&["vmi", "hot"], "{.status.interfaces}"),
            server.get(
                &["pods", "-l", "kubevirt.io=virt-launcher"],
                "{.items[0].metadata.annotations}"
            ),
        )
    })
}

#[test]
fn a_bridge_nic_is_hotplugged_into_a_running_guest_and_unplugged() -> anyhow::Result<()> {
    let Some(server) = ServerProcess::start_with_test_guest(Path::new(BIN))? else {
        return Ok(());
    };
    let bridge = BridgeGuard(format!("kvnic{}", std::process::id() % 100_000));
    let result = scenario(&server, &bridge.0);
    testkit::with_log(&server, result)
}

fn scenario(server: &ServerProcess, bridge: &str) -> anyhow::Result<()> {
    server.apply(&definition(bridge))?;
    server.apply(&testkit::test_guest_vm_with(
        "hot",
        &["memory: {guest: 128Mi}"],
        "{interfaces: [{name: default, masquerade: {}}]}",
        &["networks: [{name: default, pod: {}}]"],
    ))?;
    let (pod, uid) = wait_until(DEADLINE, "the launcher pod Running", || {
        server.running_launcher("hot")
    })?;
    wait_until(DEADLINE, "the guest to boot", || {
        server
            .guest_console(&pod)
            .contains("GUEST-READY")
            .then_some(())
    })?;
    let before = guest_links(server)?;
    let count = |links: &str| links.split_whitespace().count();
    let qemu_pid = || {
        std::fs::read_to_string(testkit::launcher_dir(server.data_dir(), &uid).join("qemu.pid"))
            .unwrap_or_default()
    };
    let pid = qemu_pid();

    // Hotplug: add the interface and its network to the template.
    let add = r#"[{"op": "add", "path": "/spec/template/spec/networks/-", "value": {"name": "blue", "multus": {"networkName": "hotnet"}}},
                  {"op": "add", "path": "/spec/template/spec/domain/devices/interfaces/-", "value": {"name": "blue", "bridge": {}}}]"#;
    let out = server.kubectl(&["patch", "vm", "hot", "--type=json", "-p", add]);
    anyhow::ensure!(
        out.status.success(),
        "patch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = wait_links(server, "the guest to see a new interface", |links| {
        count(links) == count(&before) + 1
    })?;
    // The domain reports it (virt-handler), the pod has it (virt-controller).
    wait_until(
        DEADLINE,
        "the interface's status from the domain and the pod",
        || {
            let source = server.get(
                &["vmi", "hot"],
                r#"{.status.interfaces[?(@.name=="blue")].infoSource}"#,
            );
            (source == "domain, multus-status").then_some(())
        },
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\nVMI status: {}",
            server.get(&["vmi", "hot"], "{.status.interfaces}")
        )
    })?;
    let pod_iface = server.get(
        &["vmi", "hot"],
        r#"{.status.interfaces[?(@.name=="blue")].podInterfaceName}"#,
    );
    assert!(
        pod_iface.starts_with("pod") && pod_iface.len() == 14,
        "{pod_iface}"
    );
    let network_status = server.get(
        &["pods", &pod],
        r"{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}",
    );
    assert!(network_status.contains(&pod_iface), "{network_status}");
    assert_eq!(qemu_pid(), pid, "the domain was not restarted");
    let restart = server.get(
        &["vm", "hot"],
        r#"{.status.conditions[?(@.type=="RestartRequired")].status}"#,
    );
    assert_eq!(restart, "", "no RestartRequired for a hotplugged NIC");

    // Link state: down, then up again, as the guest sees it.
    let new_link = after
        .split_whitespace()
        .find(|l| !before.split_whitespace().any(|b| b == *l))
        .unwrap_or_default()
        .to_owned();
    link_follows_the_state(server, &new_link)?;

    // Unplug: mark it absent.
    set_state(server, "absent")?;
    wait_links(server, "the guest to lose the interface", |links| {
        count(links) == count(&before)
    })?;
    wait_until(
        DEADLINE,
        "the interface gone from the VMI, the VM and the pod",
        || {
            let vmi = server.get(&["vmi", "hot"], "{.spec.domain.devices.interfaces[*].name}");
            let vm = server.get(
                &["vm", "hot"],
                "{.spec.template.spec.domain.devices.interfaces[*].name}",
            );
            let network_status = server.get(
                &["pods", &pod],
                r"{.metadata.annotations.k8s\.v1\.cni\.cncf\.io/network-status}",
            );
            (vmi == "default" && vm == "default" && !network_status.contains(&pod_iface))
                .then_some(())
        },
    )?;
    assert_eq!(qemu_pid(), pid, "the domain was not restarted");
    eprintln!("guest interfaces: before {before:?}, with the hotplugged NIC {after:?}");
    boots_with_the_secondary_interface(server, count(&before) + 1)
}

/// A VM whose template has the secondary interface from the start boots with it: the pod
/// has its pod interface before the launcher starts, and the domain its NIC at boot.
fn boots_with_the_secondary_interface(server: &ServerProcess, links: usize) -> anyhow::Result<()> {
    server.kubectl(&["delete", "vm", "hot", "--wait=false"]);
    server.apply(&testkit::test_guest_vm_with(
        "boot",
        &["memory: {guest: 128Mi}"],
        "{interfaces: [{name: default, masquerade: {}}, {name: blue, bridge: {}}]}",
        &["networks: [{name: default, pod: {}}, {name: blue, multus: {networkName: hotnet}}]"],
    ))?;
    let (pod, _) = wait_until(DEADLINE, "the second launcher pod Running", || {
        server.running_launcher("boot")
    })?;
    wait_until(DEADLINE, "the second guest to boot", || {
        server
            .guest_console(&pod)
            .contains("GUEST-READY")
            .then_some(())
    })?;
    let seen = guest_of_says(server, "boot", "ls /sys/class/net")?;
    assert_eq!(seen.split_whitespace().count(), links, "{seen}");
    let source = server.get(
        &["vmi", "boot"],
        r#"{.status.interfaces[?(@.name=="blue")].infoSource}"#,
    );
    assert!(source.contains("domain"), "{source}");
    let restart = server.get(
        &["vm", "boot"],
        r#"{.status.conditions[?(@.type=="RestartRequired")].status}"#,
    );
    assert_eq!(restart, "", "no RestartRequired at boot");
    Ok(())
}
