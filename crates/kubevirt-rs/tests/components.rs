//! KubeVirt's components as processes of their own against a bare `kubevirt-rs apiserver`
//! (the KubeVirt CRDs applied with `kubevirt-rs crds | kubectl apply`), as they run in pods:
//! `kubevirt-rs api` serves and registers its webhooks and the subresource API, and
//! `kubevirt-rs controller`/`api` without `--kubeconfig` find the API server through the
//! in-cluster configuration (`KUBERNETES_SERVICE_HOST`/`PORT` and a service-account token).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");
const HEALTHZ: &str = "/apis/subresources.kubevirt.io/v1/healthz";

/// A component process, killed on drop; its stderr goes to `log`.
struct Component {
    child: Child,
    log: PathBuf,
}

impl Component {
    fn spawn(mut command: Command, log: PathBuf) -> anyhow::Result<Component> {
        let file = std::fs::File::create(&log).context("component log")?;
        let child = command
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .context("starting the component")?;
        Ok(Component { child, log })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails when the process has exited.
    fn running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!("component exited ({status}):\n{}", self.log());
        }
        Ok(())
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bare API server with KubeVirt's namespace (and its `kube-root-ca.crt`, as a pod there
/// would find it) and CRDs.
fn apiserver_with_crds() -> anyhow::Result<ServerProcess> {
    let server = ServerProcess::start(Path::new(BIN), "apiserver", &[])?;
    server.ok(&["create", "namespace", "kubevirt"])?;
    let crds = Command::new(BIN).arg("crds").output()?;
    anyhow::ensure!(crds.status.success(), "kubevirt-rs crds failed");
    server.apply(&String::from_utf8(crds.stdout)?)?;
    testkit::wait_until(testkit::DEADLINE, "kubevirt/kube-root-ca.crt", || {
        server
            .ok(&[
                "-n",
                "kubevirt",
                "get",
                "configmap",
                "kube-root-ca.crt",
                "-o",
                "name",
            ])
            .ok()
    })?;
    Ok(server)
}

/// Waits until the subresource API answers through the APIService.
fn wait_for_healthz(server: &ServerProcess, api: &mut Component) -> anyhow::Result<String> {
    wait_until(
        DEADLINE,
        "virt-api's healthz through the APIService",
        || {
            if let Err(e) = api.running() {
                return Some(Err(e));
            }
            let out = server.kubectl(&["get", "--raw", HEALTHZ]);
            out.status
                .success()
                .then(|| Ok(String::from_utf8_lossy(&out.stdout).into_owned()))
        },
    )?
}

#[test]
fn virt_api_as_its_own_process_validates_defaults_and_serves_subresources() -> anyhow::Result<()> {
    let server = apiserver_with_crds()?;
    let mut command = Command::new(BIN);
    command
        .arg("api")
        .arg("--kubeconfig")
        .arg(server.kubeconfig())
        .args(["--listen", "127.0.0.1", "--port", "0"])
        .args(["--advertise-url", "https://127.0.0.1:0"]);
    let mut api = Component::spawn(command, server.data_dir().join("virt-api.log"))?;

    let health = wait_for_healthz(&server, &mut api)?;
    assert!(health.contains("\"apiserver\":\"ok\""), "{health}");

    // The validating webhook refuses with upstream's message; nothing is stored.
    let out = server.apply_output(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: bad-firmware}\nspec:\n  domain:\n    devices: {}\n    firmware: {bootloader: {bios: {}, efi: {}}}\n",
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the invalid VMI was accepted");
    assert!(
        stderr.contains("is invalid")
            && stderr.contains("spec.domain.firmware.bootloader has both EFI and BIOS configured, but they are mutually exclusive."),
        "{stderr}"
    );
    assert!(
        !server
            .kubectl(&["get", "vmi", "bad-firmware"])
            .status
            .success()
    );

    // The mutating webhook fills upstream's defaults.
    server.apply(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: defaults}\nspec:\n  domain:\n    memory: {guest: 128Mi}\n    devices: {}\n",
    )?;
    let vmi: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "vmi", "defaults", "-o", "json"])?)?;
    assert_eq!(vmi["spec"]["domain"]["machine"]["type"], "q35", "{vmi}");
    assert_eq!(
        vmi["spec"]["networks"][0],
        serde_json::json!({"name": "default", "pod": {}})
    );

    // The serving certificate comes from the KubeVirt CA it created in `kubevirt-ca`, which
    // the registration objects trust.
    let secret: serde_json::Value = serde_json::from_str(&server.ok(&[
        "get",
        "secret",
        "kubevirt-ca",
        "-n",
        "kubevirt",
        "-o",
        "json",
    ])?)?;
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let ca = secret["data"]["tls.crt"].as_str().context("tls.crt")?;
    let bundle = server.ok(&[
        "get",
        "validatingwebhookconfiguration",
        "virt-api-validator",
        "-o",
        "jsonpath={.webhooks[0].clientConfig.caBundle}",
    ])?;
    assert_eq!(bundle, ca);
    let api_service_bundle = server.ok(&[
        "get",
        "apiservice",
        "v1.subresources.kubevirt.io",
        "-o",
        "jsonpath={.spec.caBundle}",
    ])?;
    assert_eq!(api_service_bundle, ca);
    Ok(())
}

/// Why a process cannot be given a pod's service-account mount here, if it cannot.
fn cannot_mount_service_account() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("needs root for a private mount namespace (unshare --mount)".into());
    }
    let unshare = Command::new("unshare").arg("--version").output();
    if !unshare.is_ok_and(|o| o.status.success()) {
        return Some("needs unshare (util-linux)".into());
    }
    None
}

/// `kubevirt-rs args…` as in a pod of `server`'s cluster: a private mount namespace with
/// `files` (token, ca.crt, namespace) at `/var/run/secrets/kubernetes.io/serviceaccount`
/// (on a tmpfs over `/run`, seen by this process only), `KUBERNETES_SERVICE_HOST`/`PORT`
/// naming the API server, and no kubeconfig.
fn in_pod(server: &ServerProcess, files: &Path, args: &[&str]) -> anyhow::Result<Command> {
    let address = server.address()?;
    let (host, port) = address.rsplit_once(':').context("host:port")?;
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(
            "mount -t tmpfs tmpfs /run && d=/run/secrets/kubernetes.io/serviceaccount && \
             mkdir -p $d && cp \"$0\"/token \"$0\"/ca.crt \"$0\"/namespace $d/ && exec \"$@\"",
        )
        .arg(files)
        .arg(BIN)
        .args(args)
        .env("KUBERNETES_SERVICE_HOST", host)
        .env("KUBERNETES_SERVICE_PORT", port)
        .env_remove("KUBECONFIG");
    Ok(command)
}

#[test]
fn components_without_a_kubeconfig_use_the_in_cluster_configuration() -> anyhow::Result<()> {
    if let Some(reason) = cannot_mount_service_account() {
        eprintln!("skipped: {reason}");
        return Ok(());
    }
    let server = apiserver_with_crds()?;
    // A service account for the components. RBAC is enforced: this test binds it to
    // cluster-admin (KubeVirt's least-privilege roles come with its install manifests).
    server.ok(&[
        "create",
        "serviceaccount",
        "kubevirt-controller",
        "-n",
        "kubevirt",
    ])?;
    server.ok(&[
        "create",
        "clusterrolebinding",
        "kubevirt-controller-test-admin",
        "--clusterrole=cluster-admin",
        "--serviceaccount=kubevirt:kubevirt-controller",
    ])?;
    let token = server.ok(&["create", "token", "kubevirt-controller", "-n", "kubevirt"])?;
    let files = server.data_dir().join("serviceaccount");
    std::fs::create_dir_all(&files)?;
    std::fs::write(files.join("token"), token.trim())?;
    std::fs::copy(
        server.data_dir().join("pki").join("ca.crt"),
        files.join("ca.crt"),
    )?;
    std::fs::write(files.join("namespace"), "kubevirt")?;

    // virt-controller takes its Lease in the pod's namespace.
    let mut controller = Component::spawn(
        in_pod(&server, &files, &["controller", "--port", "0"])?,
        server.data_dir().join("virt-controller.log"),
    )?;
    let holder = wait_until(DEADLINE, "the virt-controller Lease", || {
        if let Err(e) = controller.running() {
            return Some(Err(e));
        }
        let out = server.kubectl(&[
            "get",
            "lease",
            "virt-controller",
            "-n",
            "kubevirt",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        let holder = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && !holder.is_empty()).then_some(Ok(holder))
    })??;
    assert!(!holder.is_empty());
    assert!(
        controller.log().contains("in-cluster configuration"),
        "{}",
        controller.log()
    );

    // virt-api registers itself and answers through the APIService.
    let mut api = Component::spawn(
        in_pod(
            &server,
            &files,
            &[
                "api",
                "--listen",
                "127.0.0.1",
                "--port",
                "0",
                "--advertise-url",
                "https://127.0.0.1:0",
            ],
        )?,
        server.data_dir().join("virt-api.log"),
    )?;
    let health = wait_for_healthz(&server, &mut api)?;
    assert!(health.contains("\"apiserver\":\"ok\""), "{health}");
    assert!(
        api.log().contains("in-cluster configuration"),
        "{}",
        api.log()
    );
    Ok(())
}
