//! Upstream's two-step install onto a bare embedded Kubernetes (`kubevirt-rs server
//! --no-kubevirt`, node agents but no KubeVirt): plain `kubectl apply -f
//! deploy/kubevirt-operator.yaml` and `-f deploy/kubevirt-cr.yaml`; virt-operator, as the
//! Deployment of that manifest, installs its install strategy (CRDs included), reports
//! upstream's status, applies `customizeComponents.patches`, prunes what left the strategy,
//! validates the CR through its own admission webhooks (`virt-operator-validator`: lifetimes
//! with their field paths, one CR only, and no uninstall while a VM exists under
//! `BlockUninstallIfWorkloadsExist`), and uninstalls on the CR's deletion.

use std::path::Path;
use std::time::Duration;

use testkit::{ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");
/// Installing (images are this binary, but pods start one after another on two cores).
const INSTALL_DEADLINE: Duration = Duration::from_secs(240);

fn deploy(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(file)
        .display()
        .to_string()
}

fn jsonpath(server: &ServerProcess, args: &[&str], path: &str) -> String {
    let path = format!("jsonpath={path}");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", &path]);
    server.ok(&all).unwrap_or_default()
}

const KV: [&str; 5] = ["-n", "kubevirt", "get", "kubevirt", "kubevirt"];

const VM: &str = "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: keeps-kubevirt\n  namespace: default\nspec:\n  runStrategy: Halted\n  template:\n    spec:\n      domain:\n        devices: {}\n        resources: {requests: {memory: 64Mi}}\n";

#[test]
fn kubectl_apply_of_deploy_installs_kubevirt_through_the_operator_and_deleting_the_cr_removes_it()
-> anyhow::Result<()> {
    let server = ServerProcess::start(Path::new(BIN), "server", &["--no-kubevirt"])?;
    let fail = |e: anyhow::Error| {
        let operator = server.kubectl(&[
            "-n",
            "kubevirt",
            "logs",
            "deployment/virt-operator",
            "--tail",
            "80",
        ]);
        anyhow::anyhow!(
            "{e}\n--- operator log ---\n{}\n--- server log ---\n{}",
            String::from_utf8_lossy(&operator.stdout),
            server.log()
        )
    };
    server.ok(&["apply", "-f", &deploy("kubevirt-operator.yaml")])?;
    server.ok(&[
        "wait",
        "--for",
        "condition=Established",
        "crd/kubevirts.kubevirt.io",
        "--timeout",
        "60s",
    ])?;
    server.ok(&["apply", "-f", &deploy("kubevirt-cr.yaml")])?;

    // Deploying first (the components take seconds to become ready), then Deployed.
    let mut phases = Vec::new();
    wait_until(INSTALL_DEADLINE, "phase Deployed", || {
        let phase = jsonpath(&server, &KV, "{.status.phase}");
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
    assert_deployed(&server);
    assert_install_strategy(&server)?;
    the_operators_metrics_say_which_replica_leads(&server)?;

    patches_reach_their_resource_and_pruning_follows(&server, &fail)?;
    the_operators_webhooks_validate_the_cr(&server)?;
    a_vm_blocks_the_uninstallation(&server, &fail)?;
    // … until it is gone.
    server.ok(&["-n", "default", "delete", "vm", "keeps-kubevirt"])?;
    server.ok(&[
        "-n",
        "kubevirt",
        "delete",
        "kubevirt",
        "kubevirt",
        "--wait=false",
    ])?;
    wait_until(INSTALL_DEADLINE, "the CR to disappear", || {
        let out = server.kubectl(&KV);
        (!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"))
            .then_some(())
    })
    .map_err(fail)?;
    assert_uninstalled(&server)
}

type Fail<'a> = &'a dyn Fn(anyhow::Error) -> anyhow::Error;

/// Both operator replicas serve `/metrics` on 8443 with the certificate the operator issued
/// itself (`kubevirt-operator-certs`, trusted through the KubeVirt CA bundle); the Lease's
/// holder alone reports leading, both report ready.
fn the_operators_metrics_say_which_replica_leads(server: &ServerProcess) -> anyhow::Result<()> {
    let get = |what: &[&str], path: &str| {
        jsonpath(
            server,
            &[&["-n", "kubevirt", "get"][..], what].concat(),
            path,
        )
    };
    let ca = get(&["configmap", "kubevirt-ca"], "{.data.ca-bundle}");
    let holder = get(&["lease", "virt-operator"], "{.spec.holderIdentity}");
    let pods = get(
        &["pods", "-l", "kubevirt.io=virt-operator"],
        r#"{range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}"#,
    );
    let mut leaders = 0;
    for line in pods.lines() {
        let (pod, ip) = line.split_once(' ').unwrap_or_default();
        let (status, metrics) = testkit::https_get(
            &format!("{ip}:8443"),
            "/metrics",
            &ca,
            "kubevirt-operator-webhook.kubevirt.svc",
        )?;
        assert_eq!(status, 200, "{pod}: {metrics}");
        let gauge = |name: &str| {
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .map(str::to_owned)
        };
        let leads = holder.starts_with(&format!("{pod}_"));
        leaders += usize::from(leads);
        assert_eq!(
            gauge("kubevirt_virt_operator_leading_status").as_deref(),
            Some(if leads { "1" } else { "0" }),
            "{pod} (holder {holder}): {metrics}"
        );
        assert_eq!(
            gauge("kubevirt_virt_operator_ready_status").as_deref(),
            Some("1"),
            "{pod}: {metrics}"
        );
        assert!(
            metrics.contains("kubevirt_rest_client_requests_total{"),
            "{pod}: {metrics}"
        );
    }
    assert_eq!(
        leaders, 1,
        "one of the replicas leads: {pods}, holder {holder}"
    );
    Ok(())
}

/// A patch of the CR reaches its resource; an object of the operator's that left the strategy
/// is pruned on that reinstallation.
fn patches_reach_their_resource_and_pruning_follows(
    server: &ServerProcess,
    fail: Fail<'_>,
) -> anyhow::Result<()> {
    server.apply(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: left-the-strategy\n  namespace: kubevirt\n  labels: {app.kubernetes.io/managed-by: virt-operator}\nspec:\n  ports: [{port: 80}]\n",
    )?;
    server.patch_kubevirt(r#"{"spec":{"customizeComponents":{"patches":[{"resourceType":"Deployment","resourceName":"virt-controller","type":"strategic","patch":"{\"metadata\":{\"labels\":{\"patched-by\":\"customize-components\"}}}"}]}}}"#)?;
    wait_until(INSTALL_DEADLINE, "the patch on virt-controller", || {
        let label = jsonpath(
            server,
            &["-n", "kubevirt", "get", "deployment", "virt-controller"],
            "{.metadata.labels.patched-by}",
        );
        (label == "customize-components").then_some(())
    })
    .map_err(fail)?;
    wait_until(INSTALL_DEADLINE, "the stale Service to be pruned", || {
        let out = server.kubectl(&["-n", "kubevirt", "get", "service", "left-the-strategy"]);
        (!out.status.success()).then_some(())
    })
    .map_err(fail)?;

    Ok(())
}

/// The operator's webhooks: an unreadable certificate lifetime is refused with its field
/// path and nothing changes; a second KubeVirt CR is refused.
fn the_operators_webhooks_validate_the_cr(server: &ServerProcess) -> anyhow::Result<()> {
    let out = server.kubectl(&[
        "-n",
        "kubevirt",
        "patch",
        "kubevirt",
        "kubevirt",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"certificateRotateStrategy":{"selfSigned":{"server":{"duration":"a day"}}}}}"#,
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    // kubectl prints the 422's causes with their field paths.
    assert!(
        said.contains(
            "spec.certificateRotateStrategy.selfSigned.server.duration: \"a day\" is not a positive duration"
        ),
        "{said}"
    );
    assert_eq!(
        jsonpath(
            server,
            &KV,
            "{.spec.certificateRotateStrategy.selfSigned.server.duration}"
        ),
        "",
        "nothing written"
    );
    let out = server.apply_output(
        "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: second, namespace: default}\nspec: {}\n",
    )?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("Kubevirt is already created"),
        "{said}"
    );
    Ok(())
}

/// With `BlockUninstallIfWorkloadsExist`, the deletion of the CR is refused at admission while
/// a VM exists, with upstream's message, and the CR and its components stay.
fn a_vm_blocks_the_uninstallation(server: &ServerProcess, fail: Fail<'_>) -> anyhow::Result<()> {
    server.apply(VM)?;
    server.patch_kubevirt(r#"{"spec":{"uninstallStrategy":"BlockUninstallIfWorkloadsExist"}}"#)?;
    // The status is Deployed once the operator saw the patch; the webhook reads the CR.
    wait_until(INSTALL_DEADLINE, "the strategy to be observed", || {
        (jsonpath(server, &KV, "{.spec.uninstallStrategy} {.status.phase}")
            == "BlockUninstallIfWorkloadsExist Deployed")
            .then_some(())
    })
    .map_err(fail)?;
    let out = server.kubectl(&[
        "-n",
        "kubevirt",
        "delete",
        "kubevirt",
        "kubevirt",
        "--wait=false",
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(
            "Rejecting the uninstall request, since there are still Virtual Machines present."
        ),
        "{said}"
    );
    assert_eq!(jsonpath(server, &KV, "{.metadata.deletionTimestamp}"), "");
    server.ok(&["-n", "kubevirt", "get", "deployment", "virt-api"])?;
    Ok(())
}

/// The install strategy ConfigMap carries upstream's label and annotations, and its
/// identifier is the CR's `observedDeploymentID`; the operator installed the CRDs.
fn assert_install_strategy(server: &ServerProcess) -> anyhow::Result<()> {
    let names = jsonpath(
        server,
        &[
            "-n",
            "kubevirt",
            "get",
            "configmap",
            "-l",
            "kubevirt.io/install-strategy",
        ],
        "{.items[*].metadata.name}",
    );
    assert!(names.starts_with("kubevirt-install-strategy-"), "{names:?}");
    assert!(!names.contains(' '), "one strategy: {names:?}");
    let cm = ["-n", "kubevirt", "get", "configmap", names.as_str()];
    let version = jsonpath(
        server,
        &cm,
        r"{.metadata.annotations.kubevirt\.io/install-strategy-version} {.metadata.annotations.kubevirt\.io/install-strategy-registry}",
    );
    assert_eq!(
        version,
        format!("{} kubevirt-rs", env!("CARGO_PKG_VERSION"))
    );
    let id = jsonpath(
        server,
        &cm,
        r"{.metadata.annotations.kubevirt\.io/install-strategy-identifier}",
    );
    assert!(!id.is_empty());
    assert_eq!(jsonpath(server, &KV, "{.status.observedDeploymentID}"), id);
    let crd = jsonpath(
        server,
        &["get", "crd", "virtualmachines.kubevirt.io"],
        r"{.metadata.labels.app\.kubernetes\.io/managed-by}",
    );
    assert_eq!(crd, "virt-operator");
    let operators = jsonpath(
        server,
        &["-n", "kubevirt", "get", "deployment", "virt-operator"],
        "{.status.readyReplicas}/{.spec.replicas}",
    );
    assert_eq!(operators, "2/2");
    Ok(())
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
    // The strategy's CRDs and ConfigMap go; the operator's manifest stays (the user
    // deletes it with `kubectl delete -f deploy/kubevirt-operator.yaml`).
    let out = server.kubectl(&["get", "crd", "virtualmachines.kubevirt.io"]);
    assert!(!out.status.success(), "the VM CRD is gone");
    let strategies = server.ok(&[
        "-n",
        "kubevirt",
        "get",
        "configmap",
        "-l",
        "kubevirt.io/install-strategy",
        "-o",
        "name",
    ])?;
    assert!(strategies.trim().is_empty(), "{strategies}");
    server.ok(&["get", "namespace", "kubevirt"])?;
    server.ok(&["get", "crd", "kubevirts.kubevirt.io"])?;
    server.ok(&["-n", "kubevirt", "get", "deployment", "virt-operator"])?;
    Ok(())
}
