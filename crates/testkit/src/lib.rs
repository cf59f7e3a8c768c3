//! Test helpers shared by the workspace's tests: the embedded API server in the test's process
//! with KubeVirt's CRDs ([`InProcessCluster`]); a `kubevirt-rs` server process on a temporary
//! data directory and a free port ([`ServerProcess`]) with real `kubectl` against it, a kube-rs
//! client and background `kubectl get -w` watchers; the test guest and other host
//! prerequisites ([`available`]); polling with a deadline ([`wait_until`]).
//!
//! # Guarantees
//! Dropping a [`ServerProcess`] kills the server (SIGKILL by pid) and then every launcher
//! process group the server's pod runner started under the data directory (their records
//! are `DATA/node/pods/<uid>/<container>.json`), so a failing test leaves no QEMU behind.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
pub use test_prerequisites::{GuestSees, TestGuest, available, command, guest_reports, test_guest};

mod cluster;
pub use cluster::{InProcessCluster, client_for};

/// What `kubevirt-rs server` logs once every component is started and registered.
pub const SERVER_READY: &str = "kubevirt-rs server ready";

/// The default deadline for conditions in end-to-end tests.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A `runStrategy: Always` VM `name` that boots the imported test guest
/// ([`ServerProcess::import_test_guest`]) with `domain` (flow-style YAML lines such as
/// `memory: {guest: 128Mi}`, one per line) in its template's `domain`.
pub fn test_guest_vm(name: &str, domain: &[&str]) -> String {
    test_guest_vm_with(name, domain, "{}", &[])
}

/// [`test_guest_vm`] with `devices` (a YAML flow mapping, e.g. `{disks: [{name: d, disk: {}}]}`)
/// and more lines of the template's `spec` (`volumes: [...]`, `networks: [...]`).
pub fn test_guest_vm_with(name: &str, domain: &[&str], devices: &str, spec: &[&str]) -> String {
    guest_vm(name, "", domain, devices, spec)
}

/// A `runStrategy: Always` VM `name` whose test guest takes its address on the pod network by
/// DHCP and serves `hello-from-<name>` over HTTP on port 8080 (busybox `httpd`, started by its
/// cloud-init user data). `binding` is the interface's binding and ports as flow YAML (e.g.
/// `masquerade: {}, ports: [{name: http, port: 8080}]`); `spec` holds more lines of the
/// template's `spec` (probes, say), indented as its fields.
pub fn serving_guest_vm(name: &str, binding: &str, spec: &[&str]) -> String {
    serving_guest_vm_running(name, binding, &[], spec)
}

/// [`serving_guest_vm`] whose user data also runs the shell lines `user_data` (after the
/// HTTP server has started).
pub fn serving_guest_vm_running(
    name: &str,
    binding: &str,
    user_data: &[&str],
    spec: &[&str],
) -> String {
    let devices = format!(
        "{{disks: [{{name: cloudinit, disk: {{bus: virtio}}}}], interfaces: [{{name: default, {binding}}}]}}"
    );
    let page = format!("        mkdir -p /www && echo hello-from-{name} > /www/index.html");
    let script: Vec<String> = user_data.iter().map(|l| format!("        {l}")).collect();
    let mut lines = vec![
        "terminationGracePeriodSeconds: 0",
        "networks: [{name: default, pod: {}}]",
        "volumes:",
        "  - name: cloudinit",
        "    cloudInitNoCloud:",
        "      userData: |",
        "        #!/bin/sh",
        &page,
        "        httpd -p 8080 -h /www",
    ];
    lines.extend(script.iter().map(String::as_str));
    lines.extend_from_slice(spec);
    guest_vm(
        name,
        " tg.net=dhcp",
        &["memory: {guest: 128Mi}"],
        &devices,
        &lines,
    )
}

/// The test-guest VM both builders above write; `kernel_args` are appended to the guest's
/// usual command line.
fn guest_vm(
    name: &str,
    kernel_args: &str,
    domain: &[&str],
    devices: &str,
    spec: &[&str],
) -> String {
    let fields: String = domain.iter().map(|f| format!("        {f}\n")).collect();
    let extra: String = spec.iter().map(|f| format!("      {f}\n")).collect();
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
{fields}        firmware:
          kernelBoot:
            kernelArgs: "console=ttyS0 panic=-1 quiet tg.quiet=1{kernel_args}"
            container:
              image: kubevirt-rs/test-guest:latest
              kernelPath: /vmlinux
              initrdPath: /initramfs.cpio.gz
        devices: {devices}
{extra}"#
    )
}

/// `virtctl` built next to the binary `bin` (cargo puts every binary of the workspace in one
/// target directory), or why it cannot be used; for [`available`].
///
/// # Errors
/// When it is not built.
pub fn virtctl_beside(bin: &Path) -> Result<PathBuf, String> {
    let virtctl = bin.with_file_name("virtctl");
    if virtctl.exists() {
        Ok(virtctl)
    } else {
        Err(format!(
            "{} is not built (cargo build -p virtctl)",
            virtctl.display()
        ))
    }
}

/// Polls `check` every 50 ms until it returns `Some`, or fails after `deadline` naming `what`.
pub fn wait_until<T>(
    deadline: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Async version of [`wait_until`].
pub async fn wait_until_async<T, F, Fut>(
    deadline: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `kubevirt-rs` server (or apiserver) process; killed with everything it started on drop.
pub struct ServerProcess {
    binary: PathBuf,
    subcommand: String,
    extra_args: Vec<String>,
    child: Option<Child>,
    data: tempfile::TempDir,
    /// The test guest imported into the server's image store, holding the guest lock for as
    /// long as the server (and its guests) live.
    guest: Option<TestGuest>,
}

impl ServerProcess {
    /// Starts `binary subcommand --data-dir <tmp> --listen 127.0.0.1:0 extra_args…` and waits
    /// for its kubeconfig.
    pub fn start(
        binary: &Path,
        subcommand: &str,
        extra_args: &[&str],
    ) -> anyhow::Result<ServerProcess> {
        let data = tempfile::Builder::new()
            .prefix("kubevirt-rs-test")
            .tempdir()
            .context("temp dir")?;
        let mut server = ServerProcess {
            binary: binary.to_owned(),
            subcommand: subcommand.to_owned(),
            extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
            child: None,
            data,
            guest: None,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let kubeconfig = self.kubeconfig();
        let _ = std::fs::remove_file(&kubeconfig);
        // A restart appends to the log: readiness is read from what this process writes.
        let log_start = std::fs::metadata(self.data.path().join("server.log"))
            .map(|m| m.len() as usize)
            .unwrap_or(0);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.path().join("server.log"))
            .context("server log")?;
        let child = Command::new(&self.binary)
            .arg(&self.subcommand)
            .arg("--data-dir")
            .arg(self.data.path())
            .args(["--listen", "127.0.0.1:0"])
            .args(&self.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let child = self.child.as_mut().context("child")?;
        wait_until(DEADLINE, "the server's kubeconfig", || {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(Err(anyhow::anyhow!("server exited early: {status}")));
            }
            let text = std::fs::read_to_string(&kubeconfig).ok()?;
            text.contains("server: https://").then_some(Ok(()))
        })??;
        // The whole server is ready only once KubeVirt's webhooks are registered, some time
        // after the API server wrote the kubeconfig; a VMI created before would miss them.
        if self.subcommand == "server" {
            let log = self.data.path().join("server.log");
            let child = self.child.as_mut().context("child")?;
            let ready = wait_until(DEADLINE, "the server to be ready", || {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some(Err(anyhow::anyhow!("server exited early: {status}")));
                }
                let text = std::fs::read(&log).ok()?;
                let text = String::from_utf8_lossy(text.get(log_start..)?);
                text.contains(SERVER_READY).then_some(Ok(()))
            });
            match ready {
                Ok(Ok(())) => {}
                Ok(Err(e)) | Err(e) => bail!("{e}\nserver log:\n{}", self.log()),
            }
        }
        Ok(())
    }

    /// A `binary server` with the test guest imported, or `None` (the reason printed, as
    /// [`available`] does) when the test guest or `virtctl` beside `binary` is missing.
    ///
    /// # Errors
    /// When the server does not start or the import fails.
    pub fn start_with_test_guest(binary: &Path) -> anyhow::Result<Option<ServerProcess>> {
        let Some(guest) = available(test_guest()) else {
            return Ok(None);
        };
        if available(virtctl_beside(binary)).is_none() {
            return Ok(None);
        }
        let mut server = ServerProcess::start(binary, "server", &[])?;
        server.import_test_guest(guest)?;
        Ok(Some(server))
    }

    /// The running launcher pod of VM `vm`: `(name, uid)`.
    pub fn running_launcher(&self, vm: &str) -> Option<(String, String)> {
        let pod = self.get(
            &["pods", "-l", &format!("vm.kubevirt.io/name={vm}")],
            r#"{range .items[?(@.status.phase=="Running")]}{.metadata.name} {.metadata.uid}{end}"#,
        );
        let (name, uid) = pod.split_once(' ')?;
        Some((name.to_owned(), uid.to_owned()))
    }

    /// Runs `virtctl args` (the one built beside the server's binary) against the server and
    /// returns its stdout.
    ///
    /// # Errors
    /// When virtctl is missing or fails; the error carries its output.
    pub fn virtctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let virtctl = virtctl_beside(&self.binary).map_err(anyhow::Error::msg)?;
        let out = Command::new(virtctl)
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "virtctl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Imports the test guest into the server's image store as `kubevirt-rs/test-guest:latest`
    /// and keeps it (and so the guest lock) until the server is dropped.
    pub fn import_test_guest(&mut self, guest: TestGuest) -> anyhow::Result<()> {
        let status = Command::new(&self.binary)
            .args(["images", "--data-dir"])
            .arg(self.data.path())
            .args(["import", "kubevirt-rs/test-guest:latest"])
            .arg(guest.kernel())
            .arg(guest.initrd())
            .status()
            .context("running kubevirt-rs images import")?;
        anyhow::ensure!(status.success(), "importing the test guest failed");
        self.guest = Some(guest);
        Ok(())
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.data.path().join("kubeconfig")
    }

    /// The server's log so far, and for `server` the last lines of KubeVirt's component pods
    /// (for assertion messages).
    pub fn log(&self) -> String {
        let mut text =
            std::fs::read_to_string(self.data.path().join("server.log")).unwrap_or_default();
        if self.subcommand == "server" {
            let pods = self.kubectl(&[
                "-n",
                "kubevirt",
                "logs",
                "-l",
                "kubevirt.io",
                "--all-containers",
                "--prefix",
                "--tail=80",
                "--max-log-requests=20",
            ]);
            text.push_str("\n--- KubeVirt's pods (last lines) ---\n");
            text.push_str(&String::from_utf8_lossy(&pods.stdout));
            text.push_str(&String::from_utf8_lossy(&pods.stderr));
        }
        text
    }

    /// The server's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILLs the server process only (launchers keep running, as after a crash).
    pub fn kill_server(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data directory.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill_server();
        self.spawn()
    }

    /// The pid the node agent recorded for container `container` of pod `namespace/pod`
    /// (`DATA/node/pods/<uid>/<container>.json`, or `DATA/nodes/<name>/pods/…` for a pod of a
    /// further node).
    ///
    /// # Errors
    /// When the pod or its record is missing.
    pub fn container_pid(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> anyhow::Result<i32> {
        let uid = self.ok(&[
            "-n",
            namespace,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ])?;
        let in_node = |node: &Path| {
            node.join("pods")
                .join(uid.trim())
                .join(format!("{container}.json"))
        };
        let further = std::fs::read_dir(self.data_dir().join("nodes"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| in_node(&e.path()));
        let first = in_node(&self.data_dir().join("node"));
        let record = std::iter::once(first.clone())
            .chain(further)
            .find(|p| p.exists())
            .unwrap_or(first);
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(&record).with_context(|| format!("reading {}", record.display()))?,
        )?;
        let pid = record["pid"]
            .as_i64()
            .ok_or_else(|| anyhow::anyhow!("no pid in {record}"))?;
        Ok(i32::try_from(pid)?)
    }

    /// Runs `command` in the guest of the VM `vm` (the test guest's `run` console command)
    /// through `virtctl console` and returns what the guest printed up to its `RUN-DONE` line.
    ///
    /// # Errors
    /// When virtctl is not built, cannot connect, or the guest does not answer in time.
    pub fn guest_run(&self, vm: &str, command: &str) -> anyhow::Result<String> {
        let pty = nix::pty::openpty(None, None)?;
        let slave: OwnedFd = pty.slave;
        let mut child = Command::new(virtctl_beside(&self.binary).map_err(anyhow::Error::msg)?)
            .args(["console", vm])
            .env("KUBECONFIG", self.kubeconfig())
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave))
            .spawn()?;
        let mut master = std::fs::File::from(pty.master);
        nix::fcntl::fcntl(
            &master,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        let result = (|| {
            let banner = read_until(&mut master, "escape sequence is ^]", DEADLINE);
            anyhow::ensure!(
                banner.contains(&format!("Successfully connected to {vm} console")),
                "virtctl console: {banner}"
            );
            wait_until(DEADLINE, &format!("the guest to run {command:?}"), || {
                master
                    .write_all(format!("run {command}\r").as_bytes())
                    .ok()?;
                let seen = read_until(&mut master, "RUN-DONE", Duration::from_secs(5));
                seen.contains("RUN-DONE").then_some(seen)
            })
        })();
        let _ = master.write_all(&[0x1d]); // Ctrl+]
        let _ = wait_until(Duration::from_secs(10), "virtctl console to exit", || {
            child.try_wait().ok().flatten()
        });
        let _ = child.kill();
        let _ = child.wait();
        result
    }

    /// What the guest of launcher pod `pod` wrote on its serial console so far (the pod's
    /// `guest-console-log` container); empty when kubectl cannot read it yet.
    pub fn guest_console(&self, pod: &str) -> String {
        let out = self.kubectl(&["logs", pod, "-c", "guest-console-log"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl against the server.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_command(self.data.path(), args)
            .output()
            .unwrap_or_else(|e| Output {
                status: std::os::unix::process::ExitStatusExt::from_raw(127 << 8),
                stdout: Vec::new(),
                stderr: format!("cannot run kubectl: {e}").into_bytes(),
            })
    }

    /// The samples of metric family `family` (lines `family{…} value`, or `family value`
    /// for a family without labels) that the pods of
    /// component `component` (`kubevirt.io=<component>` in namespace `kubevirt`) serve on
    /// their port 8443, trusted through the cluster CA for `server_name`.
    ///
    /// # Errors
    /// When a scrape fails or does not answer 200.
    pub fn metric_samples(
        &self,
        component: &str,
        server_name: &str,
        family: &str,
    ) -> anyhow::Result<Vec<String>> {
        let ca = self.get(
            &["configmap", "kubevirt-ca", "-n", "kubevirt"],
            "{.data.ca-bundle}",
        );
        let selector = format!("kubevirt.io={component}");
        let ips = self.get(
            &["pods", "-n", "kubevirt", "-l", &selector],
            r#"{range .items[*]}{.status.podIP}{"\n"}{end}"#,
        );
        let mut samples = Vec::new();
        for ip in ips.lines().filter(|l| !l.is_empty()) {
            let (status, text) = https_get(&format!("{ip}:8443"), "/metrics", &ca, server_name)?;
            anyhow::ensure!(status == 200, "{component} at {ip}: {status} {text}");
            samples.extend(
                text.lines()
                    .filter(|l| {
                        l.starts_with(&format!("{family}{{"))
                            || l.starts_with(&format!("{family} "))
                    })
                    .map(str::to_owned),
            );
        }
        Ok(samples)
    }

    /// `kubectl get WHAT… -o jsonpath=TEMPLATE`; empty when kubectl fails (the object is not
    /// there yet), so that a polling caller just looks again.
    pub fn get(&self, what: &[&str], template: &str) -> String {
        let template = format!("jsonpath={template}");
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend(["-o", template.as_str()]);
        self.ok(&args).unwrap_or_default()
    }

    /// Runs kubectl, fails unless it succeeds, returns stdout.
    pub fn ok(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.kubectl(args);
        if !out.status.success() {
            bail!(
                "kubectl {args:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs kubectl, fails unless kubectl fails, returns stderr.
    pub fn fails(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.kubectl(args);
        if out.status.success() {
            bail!(
                "kubectl {args:?} unexpectedly succeeded: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// `kubectl apply -f` of `yaml`; fails unless it succeeds, returns stdout.
    pub fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        let path = self.manifest(yaml)?;
        self.ok(&["apply", "-f", &path.display().to_string()])
    }

    /// `kubectl patch kubevirt kubevirt -n kubevirt --type merge -p PATCH`: changes the KubeVirt
    /// CR; fails unless kubectl succeeds.
    pub fn patch_kubevirt(&self, merge_patch: &str) -> anyhow::Result<String> {
        self.ok(&[
            "patch",
            "kubevirt",
            "kubevirt",
            "-n",
            "kubevirt",
            "--type",
            "merge",
            "-p",
            merge_patch,
        ])
    }

    /// `kubectl apply -f` of `yaml`, whatever its outcome.
    pub fn apply_output(&self, yaml: &str) -> anyhow::Result<Output> {
        let path = self.manifest(yaml)?;
        Ok(self.kubectl(&["apply", "-f", &path.display().to_string()]))
    }

    /// Writes `yaml` to a new file in the data directory.
    fn manifest(&self, yaml: &str) -> anyhow::Result<PathBuf> {
        let path = self.data.path().join(format!("manifest-{}.yaml", unique()));
        std::fs::write(&path, yaml).context("write manifest")?;
        Ok(path)
    }

    /// The `host:port` the server listens on (from its kubeconfig).
    pub fn address(&self) -> anyhow::Result<String> {
        let text = std::fs::read_to_string(self.kubeconfig()).context("kubeconfig")?;
        text.lines()
            .find_map(|l| l.trim().strip_prefix("server: https://"))
            .map(str::to_owned)
            .context("no server line in the kubeconfig")
    }

    /// A kube-rs client with the admin credentials.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_for(&self.kubeconfig()).await
    }

    /// Starts `kubectl args…` in the background (e.g. `get vm -w`).
    pub fn watch(&self, args: &[&str]) -> anyhow::Result<Watcher> {
        let mut child = kubectl_command(self.data.path(), args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("start kubectl")?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Watcher { child, lines })
    }

    /// Kills every launcher process group recorded under the data directory.
    fn kill_launchers(&self) {
        kill_launchers(self.data.path());
    }
}

/// Kills every launcher process group a server's pod runner recorded under `data_dir`
/// (`DATA/node/pods/<uid>/<container>.json`, `DATA/nodes/<name>/…` for further nodes), for
/// tests that start servers by other means; then releases the pods' networks (CNI DEL, their
/// namespaces under `…/netns`), so no namespace mount keeps the test's directory from being
/// removed.
pub fn kill_launchers(data_dir: &Path) {
    let extra_nodes = std::fs::read_dir(data_dir.join("nodes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path());
    for node in std::iter::once(data_dir.join("node")).chain(extra_nodes) {
        for pod in std::fs::read_dir(node.join("pods"))
            .into_iter()
            .flatten()
            .flatten()
        {
            for file in std::fs::read_dir(pod.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let path = file.path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                let Some(pid) = std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| v.get("pid").and_then(serde_json::Value::as_i64))
                    .and_then(|p| i32::try_from(p).ok())
                    .filter(|p| *p > 1)
                else {
                    continue;
                };
                // The runner started it as a process group leader: its pid is the group id.
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        kubevirt_node::release_pod_networks(&node);
        // What the killed server's node would have removed on a clean shutdown.
        if let Some(network) = kubevirt_node::saved_pod_network(&node) {
            let _ = network.delete_bridge_if_unused(&node);
            let _ = kubevirt_service_proxy::remove_table(&kubevirt_service_proxy::table_name(
                &network.bridge,
            ));
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill_server();
        self.kill_launchers();
    }
}

fn kubectl_command(data: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("kubectl");
    command
        .args(args)
        .env("KUBECONFIG", data.join("kubeconfig"))
        .env("KUBECACHEDIR", data.join("kubecache"));
    command
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A background kubectl (e.g. `get -w`), killed on drop; its lines arrive on a channel.
pub struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    /// Waits for a line containing `needle`.
    pub fn wait_for(&self, needle: &str, deadline: Duration) -> anyhow::Result<String> {
        let start = Instant::now();
        while let Some(left) = deadline.checked_sub(start.elapsed()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return Ok(line),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        bail!("kubectl never printed {needle:?}")
    }

    /// The lines printed since the last call (or the start), without waiting.
    pub fn lines_so_far(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The launcher directory of launcher pod `pod_uid` of a server with `data_dir`: the pod's
/// `public` emptyDir in the pod directory of the embedded node that runs it (the first
/// node's, `node/`, or a further one's under `nodes/`; the first node's when none has it yet).
pub fn launcher_dir(data_dir: &Path, pod_uid: &str) -> std::path::PathBuf {
    let in_node = |node: &Path| {
        node.join("pods")
            .join(pod_uid)
            .join("volumes/kubernetes.io~empty-dir/public")
    };
    let first = in_node(&data_dir.join("node"));
    std::fs::read_dir(data_dir.join("nodes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| in_node(&e.path()))
        .find(|dir| dir.exists())
        .filter(|_| !first.exists())
        .unwrap_or(first)
}

/// `GET path` over HTTPS at `address` (`ip:port`), verifying the server's certificate against
/// `ca_pem` for `server_name`; the status code and the body (of a response without chunked
/// encoding, as our servers send for small bodies).
///
/// # Errors
/// When the connection, the handshake (an untrusted or misnamed certificate) or the request
/// fails.
pub fn https_get(
    address: &str,
    path: &str,
    ca_pem: &str,
    server_name: &str,
) -> anyhow::Result<(u16, String)> {
    use rustls::pki_types::pem::PemObject;
    use std::io::{Read, Write};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())?;
    let tcp = std::net::TcpStream::connect(address)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name)?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    write!(
        tls,
        "GET {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    // A server closing without close_notify ends the read with an error after the data.
    if let Err(e) = tls.read_to_end(&mut answer)
        && answer.is_empty()
    {
        return Err(e.into());
    }
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP answer: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status line: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Reads from the pty master until `needle` appears or the deadline passes.
fn read_until(master: &mut std::fs::File, needle: &str, deadline: Duration) -> String {
    let start = Instant::now();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < deadline && !seen.contains(needle) {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => break,
        }
    }
    seen
}

/// The last `lines` lines of `text` (a server log, a console), for failure messages.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `result` with the last 200 lines of `server`'s log added to its error.
///
/// # Errors
/// `result`'s error, with the log.
pub fn with_log<T>(server: &ServerProcess, result: anyhow::Result<T>) -> anyhow::Result<T> {
    result.map_err(|e| anyhow::anyhow!("{e}\nserver log (tail):\n{}", tail(&server.log(), 200)))
}

/// Detaches, when dropped, every loop device still attached to a `Block` volume's image of the
/// server's data directory `0` (a failed test leaves its volumes behind, and the server's
/// temporary directory goes with the test while the kernel would keep the devices).
pub struct DetachLoopsOnDrop(pub std::path::PathBuf);

impl Drop for DetachLoopsOnDrop {
    fn drop(&mut self) {
        let images = std::fs::read_dir(self.0.join("node/storage"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("block.img"))
            .filter(|p| p.exists());
        for image in images {
            let listed = std::process::Command::new("losetup")
                .args(["--list", "--noheadings", "--output", "NAME", "--associated"])
                .arg(&image)
                .output();
            let listed = listed
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for device in listed.split_whitespace() {
                let _ = std::process::Command::new("losetup")
                    .args(["--detach", device])
                    .status();
            }
        }
    }
}
