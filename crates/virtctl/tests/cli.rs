//! Runs the built `virtctl` binary: help, manifests and version need no cluster.

use std::process::{Command, Output};

fn virtctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_virtctl"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .output()
        .expect("running virtctl")
}

const COMMANDS: &[&[&str]] = &[
    &["start"],
    &["stop"],
    &["restart"],
    &["migrate"],
    &["migrate-cancel"],
    &["pause"],
    &["pause", "vm"],
    &["pause", "vmi"],
    &["unpause"],
    &["unpause", "vm"],
    &["unpause", "vmi"],
    &["soft-reboot"],
    &["addvolume"],
    &["removevolume"],
    &["guestosinfo"],
    &["console"],
    &["vnc"],
    &["expose"],
    &["create"],
    &["create", "vm"],
    &["version"],
];

#[test]
fn every_command_prints_help_and_exits_zero() {
    let out = virtctl(&["--help"]);
    assert!(out.status.success());
    let top = String::from_utf8_lossy(&out.stdout).into_owned();
    for cmd in COMMANDS {
        let mut args = cmd.to_vec();
        args.push("--help");
        let out = virtctl(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: virtctl"), "{args:?}: {text}");
        assert!(top.contains(cmd[0]), "top-level help lists {}", cmd[0]);
    }
}

#[test]
fn stop_flags_match_upstream() {
    let text = String::from_utf8_lossy(&virtctl(&["stop", "--help"]).stdout).into_owned();
    for flag in ["--grace-period", "--force", "--dry-run"] {
        assert!(text.contains(flag), "{flag}");
    }
    let text = String::from_utf8_lossy(&virtctl(&["start", "--help"]).stdout).into_owned();
    assert!(text.contains("--paused"));
}

#[test]
fn create_vm_prints_a_manifest_that_decodes_as_a_virtual_machine() {
    let out = virtctl(&[
        "create",
        "vm",
        "--name",
        "testvm",
        "--volume-containerdisk",
        "src:quay.io/containerdisks/fedora:latest",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vm: kubevirt_api::v1::VirtualMachine =
        serde_saphyr::from_str(&String::from_utf8_lossy(&out.stdout)).expect("a VirtualMachine");
    assert_eq!(vm.metadata.name.as_deref(), Some("testvm"));
    let spec = vm.spec.template.spec.expect("template spec");
    assert_eq!(spec.volumes[0].name, "testvm-containerdisk-0");
}

#[test]
fn version_prints_the_client_version_even_without_a_server() {
    let want = format!(
        "Client Version: version.Info{{GitVersion:\"v{}\"",
        env!("CARGO_PKG_VERSION")
    );
    let out = virtctl(&["version", "--client"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&want));
    let out = virtctl(&["version"]);
    assert!(!out.status.success(), "no server to ask");
}

#[test]
fn stop_with_force_but_no_grace_period_is_refused_before_any_request() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .unwrap();
    let out = virtctl(&[
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "stop",
        "vm",
        "--force",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Error: Must both use --force=true and set --grace-period."
    );
}
