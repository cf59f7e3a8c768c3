//! `deploy/` applied with the real kubectl to a real API server (the embedded one, on a
//! temporary SQLite file): every object is accepted, and the RBAC it installs answers
//! `kubectl auth can-i` as least privilege says it should.

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Runs kubectl against `kubeconfig`; returns (success, stdout + stderr).
fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("running kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `kubectl auth can-i` as `user` (with `system:authenticated`).
fn can_i(kubeconfig: &Path, user: &str, args: &[&str]) -> bool {
    let mut all = vec![
        "auth",
        "can-i",
        "--as",
        user,
        "--as-group",
        "system:authenticated",
    ];
    all.extend_from_slice(args);
    let (_, text) = kubectl(kubeconfig, &all);
    // stdout (the answer) comes first; warnings on stderr follow.
    match text.lines().next().unwrap_or_default().trim() {
        "yes" => true,
        "no" => false,
        other => panic!("kubectl {all:?}: {other}"),
    }
}

/// A SubjectAccessReview of `user`: may it `verb` `(group, resource, subresource)` in `ns`?
fn review(
    kubeconfig: &Path,
    user: &str,
    (group, resource, sub): (&str, &str, &str),
    verb: &str,
    ns: &str,
) -> bool {
    use std::io::Write;
    let body = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:authenticated"],
            "resourceAttributes": {
                "group": group, "resource": resource, "subresource": sub, "verb": verb, "namespace": ns,
            },
        },
    });
    let mut child = Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["create", "-o", "jsonpath={.status.allowed}", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SubjectAccessReview: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    answer.trim() == "true"
}

/// The RBAC checks run against an installation into this namespace: the embedded server's
/// bootstrap policy makes the components' identities in `kubevirt` cluster admins (its own
/// components' kubeconfigs), which would hide what the roles grant.
const RBAC_NS: &str = "kv-rbac";
const CONTROLLER: &str = "system:serviceaccount:kv-rbac:kubevirt-controller";
const HANDLER: &str = "system:serviceaccount:kv-rbac:kubevirt-handler";
const API: &str = "system:serviceaccount:kv-rbac:kubevirt-apiserver";

/// Applies the namespace and RBAC groups of an installation into [`RBAC_NS`].
fn apply_rbac_in_own_namespace(kubeconfig: &Path) {
    let config = kubevirt_install::InstallConfig {
        namespace: RBAC_NS.into(),
        ..kubevirt_install::InstallConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    for group in kubevirt_install::manifests(&config).unwrap() {
        if !matches!(group.file, "00-namespace.yaml" | "20-rbac.yaml") {
            continue;
        }
        let path = dir.path().join(group.file);
        std::fs::write(&path, kubevirt_install::render_file(&group).unwrap()).unwrap();
        let (ok, text) = kubectl(kubeconfig, &["apply", "-f", path.to_str().unwrap()]);
        assert!(ok, "kubectl apply -f {}: {text}", group.file);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_applies_to_an_api_server_and_its_rbac_is_least_privilege() {
    let dir = tempfile::tempdir().unwrap();
    let server = kubevirt_apiserver::start(kubevirt_apiserver::Config {
        data_dir: dir.path().to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        initial_objects: Vec::new(),
    })
    .await
    .unwrap();
    let kc = server.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        apply_deploy(&kc);
        check_components(&kc);
        check_users(&kc);
    })
    .await
    .unwrap();
    server.stop().await;
}

/// Applies `deploy/` as a user does (`kubectl apply -f kubevirt-operator.yaml`, then
/// `-f kubevirt-cr.yaml`), then the install strategy the operator would install; checks the
/// operator's Deployment, the CR and the workloads are there.
fn apply_deploy(kc: &Path) {
    let kustomization = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).unwrap();
    let files: Vec<&str> = kustomization
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .collect();
    assert_eq!(files, ["kubevirt-operator.yaml", "kubevirt-cr.yaml"]);
    let path = |file: &str| deploy_dir().join(file).display().to_string();
    let (ok, text) = kubectl(kc, &["apply", "-f", &path(files[0])]);
    assert!(ok, "kubectl apply -f {}: {text}", files[0]);
    let (ok, text) = kubectl(
        kc,
        &[
            "wait",
            "--for",
            "condition=Established",
            "crd/kubevirts.kubevirt.io",
            "--timeout",
            "60s",
        ],
    );
    assert!(ok, "{text}");
    let (ok, text) = kubectl(kc, &["apply", "-f", &path(files[1])]);
    assert!(ok, "kubectl apply -f {}: {text}", files[1]);
    let (ok, text) = kubectl(
        kc,
        &[
            "get", "kubevirt", "kubevirt", "-n", "kubevirt", "-o", "name",
        ],
    );
    assert!(ok && text.contains("kubevirt.io/kubevirt"), "{text}");

    // What the operator installs is accepted too (`create`: the CRDs are larger than
    // client-side apply's annotation allows).
    let strategy =
        kubevirt_install::install_strategy(&kubevirt_install::InstallConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let strategy_file = dir.path().join("strategy.yaml");
    std::fs::write(
        &strategy_file,
        kubevirt_install::render_yaml(&strategy).unwrap(),
    )
    .unwrap();
    let (ok, text) = kubectl(kc, &["create", "-f", strategy_file.to_str().unwrap()]);
    assert!(ok, "kubectl create -f <install strategy>: {text}");
    let (ok, text) = kubectl(
        kc,
        &[
            "get",
            "deployments,daemonsets",
            "-n",
            "kubevirt",
            "-o",
            "name",
        ],
    );
    assert!(ok, "{text}");
    for name in [
        "deployment.apps/virt-operator",
        "deployment.apps/virt-api",
        "deployment.apps/virt-controller",
        "daemonset.apps/virt-handler",
    ] {
        assert!(text.contains(name), "{name} missing: {text}");
    }
}

/// The components' roles grant their work and no more.
fn check_components(kc: &Path) {
    // Each component may do its job …
    apply_rbac_in_own_namespace(kc);
    let ns = ["-n", RBAC_NS];
    assert!(can_i(
        kc,
        CONTROLLER,
        &[&["update", "leases.coordination.k8s.io"][..], &ns].concat()
    ));
    assert!(can_i(kc, CONTROLLER, &["create", "pods", "-n", "default"]));
    assert!(can_i(
        kc,
        CONTROLLER,
        &["patch", "virtualmachineinstances.kubevirt.io", "-A"]
    ));
    assert!(can_i(kc, HANDLER, &["patch", "nodes"]));
    assert!(can_i(
        kc,
        HANDLER,
        &["update", "virtualmachineinstances.kubevirt.io", "-A"]
    ));
    assert!(can_i(
        kc,
        API,
        &["patch", "virtualmachines.kubevirt.io", "-A"]
    ));
    // … and no more.
    assert!(!can_i(kc, HANDLER, &["create", "pods", "-n", "default"]));
    // The handler reads a VMI's imagePullSecret by name, and can neither list nor watch.
    assert!(can_i(kc, HANDLER, &["get", "secrets", "-n", "default"]));
    assert!(!can_i(kc, HANDLER, &["list", "secrets", "-n", RBAC_NS]));
    assert!(!can_i(kc, HANDLER, &["watch", "secrets", "-n", "default"]));
    assert!(!can_i(kc, API, &["get", "secrets", "-n", RBAC_NS]));
    assert!(!can_i(kc, API, &["create", "pods", "-n", "default"]));
    assert!(!can_i(kc, CONTROLLER, &["get", "secrets", "-n", "default"]));
    assert!(!can_i(
        kc,
        CONTROLLER,
        &["create", "clusterroles.rbac.authorization.k8s.io"]
    ));
}

/// The user roles, alone and aggregated.
fn check_users(kc: &Path) {
    // Users: every authenticated user reads the KubeVirt CR (`kubevirt.io:default`); a
    // namespace admin manages VMs through the aggregated `kubevirt.io:admin`.
    assert!(can_i(
        kc,
        "alice",
        &["get", "kubevirts.kubevirt.io", "-n", "kubevirt"]
    ));
    assert!(!can_i(
        kc,
        "alice",
        &["create", "virtualmachines.kubevirt.io", "-n", "demo"]
    ));
    let (ok, text) = kubectl(kc, &["create", "namespace", "demo"]);
    assert!(ok, "{text}");
    let (ok, text) = kubectl(
        kc,
        &[
            "create",
            "rolebinding",
            "alice-admin",
            "--clusterrole",
            "admin",
            "--user",
            "alice",
            "-n",
            "demo",
        ],
    );
    assert!(ok, "{text}");
    assert!(can_i(
        kc,
        "alice",
        &["create", "virtualmachines.kubevirt.io", "-n", "demo"]
    ));
    // kubectl cannot name a resource of a group that discovery does not list (no virt-api
    // runs here), so the subresource is asked for with a SubjectAccessReview.
    let start = ("subresources.kubevirt.io", "virtualmachines", "start");
    assert!(review(kc, "alice", start, "update", "demo"));
    let (ok, text) = kubectl(
        kc,
        &[
            "create",
            "rolebinding",
            "bob-view",
            "--clusterrole",
            "view",
            "--user",
            "bob",
            "-n",
            "demo",
        ],
    );
    assert!(ok, "{text}");
    assert!(can_i(
        kc,
        "bob",
        &["list", "virtualmachines.kubevirt.io", "-n", "demo"]
    ));
    assert!(
        !review(kc, "bob", start, "update", "demo"),
        "view cannot start VMs"
    );
    assert!(!can_i(
        kc,
        "alice",
        &["create", "virtualmachines.kubevirt.io", "-n", "default"]
    ));
    check_narrow_users(kc);
}

/// A user bound to `kubevirt.io:view` only (in namespace `demo`, which exists), and a service
/// account bound to nothing.
fn check_narrow_users(kc: &Path) {
    // Bound to KubeVirt's own view role only, in one namespace: VMs there, nothing else.
    let (ok, text) = kubectl(
        kc,
        &[
            "create",
            "rolebinding",
            "carol-kubevirt-view",
            "--clusterrole",
            "kubevirt.io:view",
            "--user",
            "carol",
            "-n",
            "demo",
        ],
    );
    assert!(ok, "{text}");
    assert!(can_i(
        kc,
        "carol",
        &["list", "virtualmachines.kubevirt.io", "-n", "demo"]
    ));
    assert!(!can_i(
        kc,
        "carol",
        &["list", "virtualmachines.kubevirt.io", "-n", "default"]
    ));
    assert!(!can_i(kc, "carol", &["create", "pods", "-n", "demo"]));
    assert!(!can_i(
        kc,
        "carol",
        &["delete", "virtualmachines.kubevirt.io", "-n", "demo"]
    ));
    // A service account nobody bound can do nothing (beyond discovery and reviews).
    let nobody = "system:serviceaccount:demo:nobody";
    for args in [
        &["list", "virtualmachines.kubevirt.io", "-n", "demo"][..],
        &["get", "pods", "-n", "demo"],
        &["create", "pods", "-n", "demo"],
        &["list", "secrets", "-n", "demo"],
        &["list", "nodes"],
    ] {
        assert!(!can_i(kc, nobody, args), "{nobody} may {args:?}");
    }
}
