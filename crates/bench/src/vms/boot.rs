//! Boot overhead: `kubectl apply` of the demo VM (the test guest, kernelBoot) until its ready
//! marker appears in the serial console log, against plain `qemu-system-x86_64` with the very
//! arguments the launcher used (read from the running QEMU's `/proc/<pid>/cmdline`, pod paths
//! rewritten into a temporary directory). Runs alternate, one guest at a time.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube::api::DeleteParams;

use super::cluster::Cluster;
use crate::stats::Percentiles;

/// The line the test guest prints on its serial console once booted.
const READY_MARKER: &str = "GUEST-READY";
/// The demo VM of the repository (boots the test guest).
const DEMO_VM: &str = include_str!("../../../../examples/vm-demo.yaml");
/// Image name the demo VM's kernelBoot container refers to.
const GUEST_IMAGE: &str = "kubevirt-rs/test-guest:latest";

pub struct BootResult {
    pub stack: Percentiles,
    /// `kubectl apply` start → QEMU started by the launcher: kubectl, the control plane and
    /// the pod start.
    pub to_qemu: Percentiles,
    /// kubectl's own part of that: until `kubectl apply` returned (the VM was created).
    pub kubectl: Percentiles,
    pub plain: Percentiles,
    /// QEMU's `-accel` as the launcher chose it.
    pub accel: String,
}

/// Imports the test guest from `guest_dir` into the server's image store.
pub fn import_guest(binary: &Path, cluster: &Cluster, guest_dir: &Path) -> anyhow::Result<()> {
    let out = Command::new(binary)
        .arg("images")
        .arg("--data-dir")
        .arg(cluster.data_dir())
        .args(["import", GUEST_IMAGE])
        .arg(guest_dir.join("vmlinux"))
        .arg(guest_dir.join("initramfs.cpio.gz"))
        .output()
        .context("running kubevirt-rs images import")?;
    if !out.status.success() {
        bail!(
            "importing the test guest failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn pod_dirs(cluster: &Cluster) -> HashSet<PathBuf> {
    super::cluster::pod_dirs(cluster.data_dir())
        .into_iter()
        .map(|d| d.join(super::cluster::LAUNCHER_DIR_IN_POD_DIR))
        .collect()
}

fn log_has_marker(path: &Path) -> bool {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).contains(READY_MARKER))
        .unwrap_or(false)
}

/// One stack boot's times from `kubectl apply` starting.
struct StackBoot {
    /// Until the guest's ready marker.
    total: Duration,
    /// Until `kubectl apply` returned.
    kubectl: Duration,
    /// Until the launcher started QEMU.
    to_qemu: Duration,
}

/// One boot through the whole stack; returns its times and, with `capture`, QEMU's argv
/// rewritten into that directory (boot files copied there before the pod goes away).
async fn stack_boot(
    cluster: &Cluster,
    capture: Option<&Path>,
) -> anyhow::Result<(StackBoot, Option<Vec<String>>)> {
    let manifest = cluster.data_dir().join("bench-demo-vm.yaml");
    std::fs::write(&manifest, DEMO_VM).context("writing the demo manifest")?;
    let before = pod_dirs(cluster);
    let start = Instant::now();
    let out = Command::new("kubectl")
        .arg("apply")
        .arg("-f")
        .arg(&manifest)
        .env("KUBECONFIG", cluster.server.kubeconfig())
        .env("KUBECACHEDIR", cluster.data_dir().join("kubecache"))
        .stdout(Stdio::null())
        .output()
        .context("running kubectl apply")?;
    if !out.status.success() {
        bail!(
            "kubectl apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let kubectl = start.elapsed();
    let pod_dir = testkit::wait_until_async(Duration::from_secs(120), READY_MARKER, || {
        let before = &before;
        async move {
            pod_dirs(cluster)
                .into_iter()
                .filter(|d| !before.contains(d))
                .find(|d| {
                    log_has_marker(&virt_launcher::pod_layout::PodLayout::new(d).serial_log())
                })
        }
    })
    .await?;
    let total = start.elapsed();
    let pid = super::procfs::pid_from_file(&pod_dir.join("qemu.pid"))
        .context("the demo VM's QEMU pid")?;
    let to_qemu = super::procfs::started_ago(pid)
        .and_then(|ago| start.elapsed().checked_sub(ago))
        .context("QEMU's start time")?;
    let took = StackBoot {
        total,
        kubectl,
        to_qemu,
    };
    let captured = if let Some(dir) = capture {
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).context("reading QEMU's cmdline")?;
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        Some(rewrite_argv(&argv, &pod_dir, dir)?)
    } else {
        None
    };
    cluster
        .vms()
        .delete("demo", &DeleteParams::default())
        .await
        .context("deleting the demo VM")?;
    cluster
        .wait_for(
            "demo pod gone",
            Duration::from_secs(120),
            |_| !pod_dir.join("qemu.pid").exists() || !qemu_alive(&pod_dir),
            |_| "waiting".into(),
        )
        .await?;
    Ok((took, captured))
}

fn qemu_alive(pod_dir: &Path) -> bool {
    super::procfs::pid_from_file(&pod_dir.join("qemu.pid"))
        .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists())
}

/// The launcher's argv (program first) made runnable outside its pod: every path under the
/// pod directory — as the node sees it (`pod_dir`) or as the launcher's mount namespace does
/// (`/var/run/kubevirt`) — moved under `dir`, with the files the guest boots from (kernel,
/// initrd) copied there; and the pod network's tap device, which exists only in the pod's
/// network namespace, replaced by QEMU's user networking (the guest's DHCP is answered
/// either way).
fn rewrite_argv(argv: &[String], pod_dir: &Path, dir: &Path) -> anyhow::Result<Vec<String>> {
    let to = dir.display().to_string();
    let boot = pod_dir.join("boot");
    if boot.is_dir() {
        std::fs::create_dir_all(dir.join("boot")).context("boot dir")?;
        for file in std::fs::read_dir(&boot).context("reading the pod's boot dir")? {
            let file = file?.path();
            if let Some(name) = file.file_name() {
                std::fs::copy(&file, dir.join("boot").join(name)).context("copying boot files")?;
            }
        }
    }
    Ok(argv
        .iter()
        .map(|a| rewrite_arg(a, &pod_dir.display().to_string(), &to))
        .collect())
}

/// The pod directory as the launcher's mount namespace shows it.
const POD_DIR_IN_POD: &str = "/var/run/kubevirt/";

fn rewrite_arg(arg: &str, pod_dir: &str, to: &str) -> String {
    if let Some(rest) = arg.strip_prefix("tap,") {
        let id = rest.split(',').find(|o| o.starts_with("id="));
        return id.map_or_else(|| "user".to_owned(), |id| format!("user,{id}"));
    }
    arg.replace(pod_dir, to)
        .replace(POD_DIR_IN_POD, &format!("{to}/"))
}

/// The `logfile=` of the serial chardev.
fn serial_log(args: &[String]) -> Option<String> {
    args.iter()
        .flat_map(|a| a.split(','))
        .find_map(|opt| opt.strip_prefix("logfile="))
        .map(str::to_owned)
}

/// One boot of plain QEMU with `args` (already rewritten into `dir`).
async fn plain_boot(program: &str, args: &[String], dir: &Path) -> anyhow::Result<Duration> {
    // Fresh sockets, pid file and serial log for every run; the boot files stay.
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if !path.is_dir() {
            let _ = std::fs::remove_file(&path);
        }
    }
    let log = serial_log(args).context("no serial log in QEMU's argv")?;
    let start = Instant::now();
    let stderr_path = dir.join("qemu-stderr.log");
    let stderr = std::fs::File::create(&stderr_path).context("QEMU's stderr file")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let waited = testkit::wait_until_async(Duration::from_secs(120), READY_MARKER, || {
        let log = log.clone();
        async move { log_has_marker(Path::new(&log)).then_some(()) }
    })
    .await;
    let took = start.elapsed();
    let _ = child.kill().await;
    waited.with_context(|| {
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        format!(
            "plain QEMU: {}",
            stderr.lines().last().unwrap_or("no output")
        )
    })?;
    Ok(took)
}

pub async fn run(cluster: &Cluster, runs: usize) -> anyhow::Result<BootResult> {
    let dir = tempfile::Builder::new()
        .prefix("kubevirt-rs-bench-qemu")
        .tempdir()
        .context("temp dir")?;
    let (mut stack, mut plain) = (Vec::new(), Vec::new());
    let (mut to_qemu, mut kubectl) = (Vec::new(), Vec::new());
    let mut plain_argv: Option<(String, Vec<String>)> = None;
    let mut accel = String::new();
    for run in 1..=runs {
        let capture = plain_argv.is_none().then_some(dir.path());
        let (took, captured) = stack_boot(cluster, capture).await?;
        eprintln!(
            "  boot {run}/{runs}: kubectl apply → {READY_MARKER} {:.2} s (kubectl {:.2} s, QEMU started at {:.2} s)",
            took.total.as_secs_f64(),
            took.kubectl.as_secs_f64(),
            took.to_qemu.as_secs_f64()
        );
        stack.push(took.total);
        to_qemu.push(took.to_qemu);
        kubectl.push(took.kubectl);
        if let Some(argv) = captured {
            accel = argv
                .windows(2)
                .find(|w| w[0] == "-accel")
                .map(|w| w[1].clone())
                .unwrap_or_default();
            let (program, args) = argv.split_first().context("empty QEMU argv")?;
            plain_argv = Some((program.clone(), args.to_vec()));
        }
        let (program, args) = plain_argv.as_ref().context("no QEMU argv captured")?;
        let took = plain_boot(program, args, dir.path()).await?;
        eprintln!(
            "  boot {run}/{runs}: plain qemu → {READY_MARKER} {:.2} s",
            took.as_secs_f64()
        );
        plain.push(took);
    }
    Ok(BootResult {
        stack: Percentiles::of(stack),
        to_qemu: Percentiles::of(to_qemu),
        kubectl: Percentiles::of(kubectl),
        plain: Percentiles::of(plain),
        accel,
    })
}

#[cfg(test)]
mod tests {
    use super::rewrite_arg;

    #[test]
    fn pod_paths_and_the_tap_device_are_rewritten_for_a_plain_qemu() {
        let arg = |a: &str| rewrite_arg(a, "/data/pods/u1/public", "/tmp/q");
        assert_eq!(
            arg(
                "socket,id=s,path=/var/run/kubevirt/serial0.sock,logfile=/var/run/kubevirt/guest-console-log.log"
            ),
            "socket,id=s,path=/tmp/q/serial0.sock,logfile=/tmp/q/guest-console-log.log"
        );
        assert_eq!(
            arg("/data/pods/u1/public/boot/kernel"),
            "/tmp/q/boot/kernel"
        );
        assert_eq!(
            arg("tap,id=netdev-0,ifname=tap0,script=no,downscript=no"),
            "user,id=netdev-0"
        );
        assert_eq!(arg("-accel"), "-accel");
    }
}
