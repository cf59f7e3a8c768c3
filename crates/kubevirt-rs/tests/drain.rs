//! End-to-end: `kubectl drain` and the eviction API against `kubevirt-rs server --nodes 2
//! --fake-qemu`. The embedded API server serves `pods/eviction` (budgets honoured) and calls
//! virt-api's launcher eviction webhook, which applies the VMI's `evictionStrategy`:
//! - `None`: the launcher pod is evicted, the guest stops, and the `runStrategy: Always` VM
//!   starts again on the node that is left; the drain finishes;
//! - `External`: the eviction is refused with upstream's message (429, so `kubectl drain`
//!   would retry) and the VMI is marked with `status.evacuationNodeName`; a second eviction
//!   says the evacuation is in progress;
//! - `LiveMigrate`: a `LiveMigratable` VMI is marked alike, one that is not migratable is
//!   refused with upstream's message and left unmarked; the evacuation controller creates a
//!   `kubevirt-evacuation-…` migration for the marked one, which the migration controller and
//!   the handlers carry out: the VMI moves to the other node.

use std::path::Path;
use std::time::Duration;

use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");

fn vm(name: &str, strategy: &str) -> String {
    vm_with_devices(name, strategy, "{}", "")
}

/// A VM with `devices` and, when `networks` is not empty, `spec.networks`.
fn vm_with_devices(name: &str, strategy: &str, devices: &str, networks: &str) -> String {
    let networks = if networks.is_empty() {
        String::new()
    } else {
        format!("      networks: {networks}\n")
    };
    format!(
        r"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Always
  template:
    spec:
      evictionStrategy: {strategy}
      domain:
        memory: {{guest: 64Mi}}
        devices: {devices}
{networks}"
    )
}

/// Waits until VMI `name` runs (on `node`, if given) with another UID than `not_uid`;
/// returns its UID and node.
fn running(
    server: &ServerProcess,
    name: &str,
    not_uid: Option<&str>,
    node: Option<&str>,
    deadline: Duration,
) -> anyhow::Result<(String, String)> {
    wait_until(deadline, &format!("{name} Running"), || {
        let got = server.get(
            &["vmi", name],
            "{.status.phase} {.metadata.uid} {.status.nodeName}",
        );
        match got.split_whitespace().collect::<Vec<_>>()[..] {
            ["Running", uid, at]
                if not_uid.is_none_or(|u| u != uid) && node.is_none_or(|n| n == at) =>
            {
                Some((uid.to_owned(), at.to_owned()))
            }
            _ => None,
        }
    })
}

fn launcher_pod(server: &ServerProcess, vm: &str) -> anyhow::Result<String> {
    server.ok(&[
        "get",
        "pods",
        "-l",
        &format!("vm.kubevirt.io/name={vm}"),
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ])
}

/// POSTs an Eviction for `pod`; returns kubectl's error output (empty on success).
fn evict(server: &ServerProcess, pod: &str) -> anyhow::Result<String> {
    let body = format!(
        r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{pod}","namespace":"default"}}}}"#
    );
    let file = server.data_dir().join(format!("eviction-{pod}.json"));
    std::fs::write(&file, body)?;
    let file = file.to_string_lossy();
    // -v=6 logs the response code.
    let out = server.kubectl(&[
        "-v=6",
        "create",
        "--raw",
        &format!("/api/v1/namespaces/default/pods/{pod}/eviction"),
        "-f",
        &file,
    ]);
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `External`: refused with upstream's message, the VMI marked for evacuation.
fn external_is_marked(server: &ServerProcess) -> anyhow::Result<()> {
    // External: refused with upstream's message, the VMI marked for evacuation.
    server.apply(&vm("external", "External"))?;
    let (_, node) = testkit::with_log(server, running(server, "external", None, None, DEADLINE))?;
    let pod = launcher_pod(server, "external")?;
    let refused = evict(server, &pod)?;
    assert!(
        refused.contains("Eviction triggered evacuation of VMI \"default/external\""),
        "{refused}"
    );
    assert!(refused.contains(" 429 Too Many Requests"), "{refused}");
    let marked = server.get(&["vmi", "external"], "{.status.evacuationNodeName}");
    assert_eq!(marked, node);
    let again = evict(server, &pod)?;
    assert!(again.contains("Evacuation in progress"), "{again}");
    assert!(
        server.ok(&["get", "pod", &pod, "-o", "name"]).is_ok(),
        "the refused pod is gone"
    );
    server.ok(&["delete", "vm", "external", "--wait=false"])?;

    Ok(())
}

/// `LiveMigrate`: marked when `LiveMigratable`, refused unmarked otherwise.
fn live_migrate_is_marked_only_when_migratable(server: &ServerProcess) -> anyhow::Result<()> {
    // LiveMigrate: a migratable VMI (masquerade) is marked the same way and migrated away.
    // One that cannot migrate (the default bridge interface) is refused without a mark.
    let masquerade = "{interfaces: [{name: default, masquerade: {}}]}";
    server.apply(&vm_with_devices(
        "migratable",
        "LiveMigrate",
        masquerade,
        "[{name: default, pod: {}}]",
    ))?;
    server.apply(&vm("pinned", "LiveMigrate"))?;
    for name in ["migratable", "pinned"] {
        testkit::with_log(server, running(server, name, None, None, DEADLINE))?;
    }
    let live_migratable = r#"{.status.conditions[?(@.type=="LiveMigratable")].status}"#;
    testkit::with_log(
        server,
        wait_until(DEADLINE, "LiveMigratable conditions", || {
            let m = server.get(&["vmi", "migratable"], live_migratable);
            let p = server.get(&["vmi", "pinned"], live_migratable);
            (m == "True" && p == "False").then_some(())
        }),
    )?;
    let node = server.get(&["vmi", "migratable"], "{.status.nodeName}");
    let refused = evict(server, &launcher_pod(server, "migratable")?)?;
    assert!(
        refused.contains("Eviction triggered evacuation of VMI \"default/migratable\""),
        "{refused}"
    );
    let marked = server.get(
        &["vmi", "migratable"],
        "{.status.evacuationNodeName}{.status.migrationState.sourceNode}",
    );
    assert!(
        marked.starts_with(&node),
        "marked or migrating off {node}: {marked}"
    );
    let refused = evict(server, &launcher_pod(server, "pinned")?)?;
    assert!(
        refused.contains(
            "VMI pinned is configured with an eviction strategy but is not live-migratable"
        ),
        "{refused}"
    );
    assert!(refused.contains(" 429 Too Many Requests"), "{refused}");
    assert_eq!(
        server.get(&["vmi", "pinned"], "{.status.evacuationNodeName}"),
        ""
    );
    // The evacuation controller asks for the migration of the marked VMI (and of no other).
    let migrations = r#"{range .items[*]}{.metadata.name} {.spec.vmiName} {.spec.priority} {.metadata.annotations.kubevirt\.io/evacuationMigration}{"\n"}{end}"#;
    let created = testkit::with_log(
        server,
        wait_until(DEADLINE, "an evacuation migration", || {
            let all = server.get(&["vmim"], migrations);
            all.lines()
                .find(|l| l.starts_with("kubevirt-evacuation-"))
                .map(str::to_owned)
        }),
    )?;
    let fields: Vec<&str> = created.split_whitespace().collect();
    assert_eq!(
        fields[1..],
        ["migratable", "system-critical", node.as_str()],
        "{created}"
    );
    assert_eq!(
        server.get(&["vmim"], migrations).lines().count(),
        1,
        "only the LiveMigrate VMI is migrated"
    );
    // The migration controller carries the evacuation out: the VMI leaves the node.
    let name = fields[0];
    testkit::with_log(
        server,
        wait_until(DEADLINE, "the evacuation migration to succeed", || {
            let state = server.get(
                &["vmim", name],
                "{.status.phase} {.status.migrationState.sourceNode}",
            );
            (state == format!("Succeeded {node}")).then_some(())
        }),
    )?;
    let moved = server.get(
        &["vmi", "migratable"],
        "{.status.phase} {.status.nodeName} {.status.evacuationNodeName}",
    );
    let fields: Vec<&str> = moved.split_whitespace().collect();
    assert!(
        fields.len() == 2 && fields[0] == "Running" && fields[1] != node,
        "the evacuated VMI runs elsewhere and is no longer marked: {moved}"
    );
    server.ok(&["delete", "vm", "migratable", "pinned", "--wait=false"])?;

    Ok(())
}

#[test]
fn drain_evicts_a_none_vm_and_migrating_strategies_mark_the_vmi_instead() -> anyhow::Result<()> {
    let server = ServerProcess::start(
        Path::new(BIN),
        "server",
        &["--fake-qemu", "--nodes", "2", "--node-name", "kvnode"],
    )?;
    // Discovery names the subresource as kubectl drain looks for it.
    let resources = server.ok(&["get", "--raw", "/api/v1"])?;
    let resources: serde_json::Value = serde_json::from_str(&resources)?;
    let eviction = resources["resources"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == "pods/eviction"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (&eviction["kind"], &eviction["group"], &eviction["version"]),
        (&"Eviction".into(), &"policy".into(), &"v1".into()),
        "{eviction}"
    );

    external_is_marked(&server)?;
    live_migrate_is_marked_only_when_migratable(&server)?;

    // None: kubectl drain evicts the launcher; the VM runs again on the other node.
    server.apply(&vm("plain", "None"))?;
    let (first_uid, node) =
        testkit::with_log(&server, running(&server, "plain", None, None, DEADLINE))?;
    let other = if node == "kvnode" {
        "kvnode-2"
    } else {
        "kvnode"
    };
    let pod = launcher_pod(&server, "plain")?;
    let out = server.kubectl(&[
        "drain",
        &node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=180s",
    ]);
    let drain_log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    testkit::with_log(
        &server,
        if out.status.success() {
            Ok(())
        } else {
            Err(anyhow::anyhow!("kubectl drain failed:\n{drain_log}"))
        },
    )?;
    assert!(
        drain_log.contains(&format!("pod/{pod} evicted")),
        "{drain_log}"
    );
    assert_eq!(
        server.get(&["node", &node], "{.spec.unschedulable}"),
        "true",
        "the drained node is cordoned"
    );
    testkit::with_log(
        &server,
        running(
            &server,
            "plain",
            Some(&first_uid),
            Some(other),
            Duration::from_secs(120),
        ),
    )?;
    assert!(
        server.ok(&["get", "pod", &pod, "-o", "name"]).is_err(),
        "the evicted launcher pod is still there"
    );
    server.ok(&["uncordon", &node])?;
    Ok(())
}
