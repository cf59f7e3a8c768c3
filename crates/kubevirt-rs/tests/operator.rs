//! `kubevirt-rs operator` installs KubeVirt onto a bare embedded Kubernetes
//! (`kubevirt-rs server --no-kubevirt`, node agents but no KubeVirt) for the KubeVirt CR of
//! `deploy/`, reports upstream's status on the CR, and uninstalls on the CR's deletion.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use testkit::{ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");
/// Installing (images are this binary, but pods start one after another on two cores).
const INSTALL_DEADLINE: Duration = Duration::from_secs(180);

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(file)
}

/// The operator process, killed on drop; its stderr goes to `log`.
struct Operator {
    child: Child,
    log: PathBuf,
}

impl Operator {
    fn start(server: &ServerProcess) -> anyhow::Result<Operator> {
        let log = server.data_dir().join("operator.log");
        let file = std::fs::File::create(&log).context("operator log")?;
        let child = Command::new(BIN)
            .arg("operator")
            .arg("--kubeconfig")
            .arg(server.kubeconfig())
            .args(["--namespace", "kubevirt"])
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .context("starting kubevirt-rs operator")?;
        Ok(Operator { child, log })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn jsonpath(server: &ServerProcess, args: &[&str], path: &str) -> String {
    let path = format!("jsonpath={path}");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", &path]);
    server.ok(&all).unwrap_or_default()
}

#[test]
fn the_operator_deploys_kubevirt_for_its_cr_reports_status_and_uninstalls_on_deletion()
-> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--no-kubevirt"])?;
    server.ok(&["create", "namespace", "kubevirt"])?;
    server.ok(&["apply", "-f", &deploy("10-crds.yaml").display().to_string()])?;
    wait_until(INSTALL_DEADLINE, "the KubeVirt CRD to be served", || {
        server
            .kubectl(&["get", "kubevirts", "-n", "kubevirt"])
            .status
            .success()
            .then_some(())
    })?;
    let operator = Operator::start(&server)?;
    let fail = |e: anyhow::Error| {
        anyhow::anyhow!(
            "{e}\n--- operator log ---\n{}\n--- server log ---\n{}",
            operator.log(),
            server.log()
        )
    };
    server.ok(&[
        "apply",
        "-f",
        &deploy("60-kubevirt-cr.yaml").display().to_string(),
    ])?;
    let kv = ["-n", "kubevirt", "get", "kubevirt", "kubevirt"];

    // Deploying first (the components take seconds to become ready), then Deployed.
    let mut phases = Vec::new();
    wait_until(INSTALL_DEADLINE, "phase Deployed", || {
        let phase = jsonpath(&server, &kv, "{.status.phase}");
        if phases.last() != Some(&phase) {
            phases.push(phase.clone());
        }
        (phase == "Deployed").then_some(())
    })
    .map_err(fail)?;
    assert!(
        phases.iter().any(|p| p == "Deploying"),
        "phases seen: {phases:?}"
    );
    assert!(
        !phases
            .iter()
            .skip_while(|p| *p != "Deploying")
            .any(|p| p.is_empty()),
        "{phases:?}"
    );

    assert_deployed(&server);

    // Deletion: the operator uninstalls, then lets the CR go.
    server.ok(&[
        "-n",
        "kubevirt",
        "delete",
        "kubevirt",
        "kubevirt",
        "--wait=false",
    ])?;
    wait_until(INSTALL_DEADLINE, "the CR to disappear", || {
        let out = server.kubectl(&kv);
        (!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"))
            .then_some(())
    })
    .map_err(fail)?;
    assert_uninstalled(&server)
}

/// The CR's status is upstream's for a complete deployment, and the components run.
fn assert_deployed(server: &ServerProcess) {
    let kv = ["-n", "kubevirt", "get", "kubevirt", "kubevirt"];
    let available = jsonpath(
        server,
        &kv,
        r#"{.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].reason} {.status.conditions[?(@.type=="Available")].message}"#,
    );
    assert_eq!(
        available,
        "True AllComponentsReady All components are ready."
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        jsonpath(
            server,
            &kv,
            "{.status.observedKubeVirtVersion} {.status.targetKubeVirtVersion} {.status.observedKubeVirtRegistry} {.status.operatorVersion}"
        ),
        format!("{version} {version} kubevirt-rs {version}")
    );
    assert_eq!(
        jsonpath(server, &kv, "{.metadata.finalizers}"),
        r#"["kubevirt.io/foregroundDeleteKubeVirt"]"#
    );
    assert_eq!(
        jsonpath(server, &kv, "{.status.observedGeneration}"),
        jsonpath(server, &kv, "{.metadata.generation}")
    );
    for name in ["virt-api", "virt-controller"] {
        let ready = jsonpath(
            server,
            &["-n", "kubevirt", "get", "deployment", name],
            "{.status.readyReplicas}/{.spec.replicas}",
        );
        assert_eq!(ready, "2/2", "{name}");
    }
    let handler = jsonpath(
        server,
        &["-n", "kubevirt", "get", "daemonset", "virt-handler"],
        "{.status.numberReady}/{.status.desiredNumberScheduled}",
    );
    assert_eq!(handler, "1/1");
    assert!(
        !jsonpath(
            server,
            &[
                "get",
                "validatingwebhookconfiguration",
                "virt-api-validator"
            ],
            "{.webhooks[0].clientConfig.caBundle}"
        )
        .is_empty(),
        "the webhooks trust the KubeVirt CA"
    );
}

/// What the operator installed is gone; the namespace and the CRDs stay.
fn assert_uninstalled(server: &ServerProcess) -> anyhow::Result<()> {
    for (kind, name) in [
        ("deployment", "virt-api"),
        ("deployment", "virt-controller"),
        ("daemonset", "virt-handler"),
        ("secret", "kubevirt-virt-api-certs"),
    ] {
        let out = server.kubectl(&["-n", "kubevirt", "get", kind, name]);
        assert!(!out.status.success(), "{kind} {name} is gone");
    }
    for (kind, name) in [
        ("validatingwebhookconfiguration", "virt-api-validator"),
        ("apiservice", "v1.subresources.kubevirt.io"),
        ("clusterrole", "kubevirt-controller"),
    ] {
        let out = server.kubectl(&["get", kind, name]);
        assert!(!out.status.success(), "{kind} {name} is gone");
    }
    // The namespace and the CRDs stay (they are not the operator's).
    server.ok(&["get", "namespace", "kubevirt"])?;
    server.ok(&["get", "crd", "kubevirts.kubevirt.io"])?;
    Ok(())
}
