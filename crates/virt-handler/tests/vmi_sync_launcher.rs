//! The handler's VMI sync against a real API server (in-process, temporary SQLite) and real
//! launchers (in-process `run_launcher`): fake QEMU for the phase machine, and one real TCG
//! guest when `KUBEVIRT_RS_TEST_GUEST` points at the test guest.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube::api::{Api, DeleteParams, PostParams};
use kubevirt_api::cluster_config::ClusterConfigWatch;
use kubevirt_api::v1::VirtualMachineInstance;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use virt_handler::images::{ImageStore, ImportFile, import};
use virt_handler::vmi_sync::{self, VmiSyncConfig};
use virt_launcher::LauncherOptions;
use virt_launcher::protocol::{Command, LauncherClient};

const NODE: &str = "node01";
const DEADLINE: Duration = Duration::from_secs(30);
// Pod UIDs as the API server writes them (the handler follows only UUID keys of activePods).
const POD_ALPHA: &str = "0a7e3c52-1b1f-4d47-9c1e-6b2d1f0a0001";
const POD_BETA: &str = "0a7e3c52-1b1f-4d47-9c1e-6b2d1f0a0002";
const POD_GAMMA: &str = "0a7e3c52-1b1f-4d47-9c1e-6b2d1f0a0003";
const POD_REAL: &str = "0a7e3c52-1b1f-4d47-9c1e-6b2d1f0a0004";

struct Cluster {
    inner: testkit::InProcessCluster,
    data: PathBuf,
    /// A short symlink to `data/pods` (removed on drop): launchers here run without a mount
    /// namespace and bind their sockets at node paths, which must fit a socket address.
    pods: ShortLink,
    client: kube::Client,
}

/// A symlink `/tmp/kvp-<pid>-<n>` to a directory, removed when dropped.
struct ShortLink(PathBuf);

impl ShortLink {
    fn to(target: &std::path::Path) -> anyhow::Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let link = PathBuf::from(format!("/tmp/kvp-{}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::fs::create_dir_all(target)?;
        std::os::unix::fs::symlink(target, &link)?;
        Ok(Self(link))
    }
}

impl Drop for ShortLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Cluster {
    async fn start() -> anyhow::Result<Self> {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "virt_handler=debug,virt_launcher=info".into()),
            )
            .with_test_writer()
            .try_init();
        let inner = testkit::InProcessCluster::start().await?;
        Ok(Self {
            data: inner.data_dir().to_owned(),
            pods: ShortLink::to(&inner.data_dir().join("pods"))?,
            client: inner.client.clone(),
            inner,
        })
    }

    fn sync_config(&self) -> VmiSyncConfig {
        VmiSyncConfig {
            node_name: NODE.into(),
            kubelet_pods_dir: self.pods.0.clone(),
            launcher_dir_in_pod: None,
            images: ImageStore::new(&self.data),
            host_disk_dir: self.data.join("hostdisks"),
            use_emulation: Some(true),
            cluster: ClusterConfigWatch::fixed(vmi_sync::ClusterSettings::default()),
            migration_ip: None,
            migration_tls: None,
        }
    }

    fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        virt_handler::vmi_sync::worker::launcher_dir_on_host(&self.pods.0, pod_uid)
    }

    fn vmis(&self) -> Api<VirtualMachineInstance> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// Creates a VMI as the VMI controller leaves it at Scheduled (CRD not served yet → retry);
    /// returns its UID.
    async fn create_scheduled_vmi(&self, name: &str, pod_uid: &str) -> anyhow::Result<String> {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {
                "name": name, "namespace": "default",
                "labels": {"kubevirt.io/nodeName": NODE},
                "finalizers": ["test.kubevirt-rs.io/hold"],
            },
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "domain": {
                    "features": {"acpi": {}},
                    "cpu": {"cores": 1},
                    "memory": {"guest": "128Mi"},
                    "firmware": {"kernelBoot": {
                        "kernelArgs": "console=ttyS0 panic=-1 quiet tg.quiet=1",
                        "container": {
                            "image": "kubevirt-rs/test-guest:latest",
                            "kernelPath": "/vmlinux",
                            "initrdPath": "/initramfs.cpio.gz"
                        }
                    }},
                    "devices": {"interfaces": [{"name": "default", "masquerade": {}}]}
                },
                "networks": [{"name": "default", "pod": {}}]
            },
            "status": {
                "phase": "Scheduled",
                "nodeName": NODE,
                "activePods": {pod_uid: NODE},
                "phaseTransitionTimestamps": [
                    {"phase": "Scheduled", "phaseTransitionTimestamp": "2026-11-30T10:00:00Z"}
                ]
            }
        }))?;
        let start = Instant::now();
        loop {
            match self.vmis().create(&PostParams::default(), &vmi).await {
                Ok(created) => return created.metadata.uid.context("the created VMI's uid"),
                Err(e) if start.elapsed() < DEADLINE => {
                    tracing::debug!(error = %e, "CRD not served yet");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).context("creating the VMI"),
            }
        }
    }

    async fn wait_vmi(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> anyhow::Result<serde_json::Value> {
        let start = Instant::now();
        loop {
            let vmi = serde_json::to_value(self.vmis().get(name).await?)?;
            if check(&vmi) {
                return Ok(vmi);
            }
            if start.elapsed() > DEADLINE {
                bail!(
                    "timed out waiting for {what}; VMI status: {}",
                    vmi["status"]
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(mut self) {
        self.inner.stop().await;
    }
}

fn import_guest(data: &Path, kernel: &Path, initrd: &Path) -> anyhow::Result<()> {
    import(
        data,
        "kubevirt-rs/test-guest:latest",
        &[
            ImportFile {
                source: kernel.to_owned(),
                destination: Some("/vmlinux".into()),
            },
            ImportFile {
                source: initrd.to_owned(),
                destination: Some("/initramfs.cpio.gz".into()),
            },
        ],
    )?;
    Ok(())
}

/// Starts a launcher of the VMI `vmi_uid` for `pod_dir` in this process, as the pod runner
/// would in its own.
fn spawn_launcher(
    pod_dir: &Path,
    vmi_uid: &str,
    fake: bool,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    std::fs::create_dir_all(pod_dir)?;
    let mut opts = LauncherOptions::new(pod_dir.join("launcher.sock"));
    opts.fake_qemu = fake;
    opts.vmi_uid = Some(vmi_uid.to_owned());
    opts.base_dir = Some(pod_dir.to_owned());
    Ok(tokio::spawn(async move {
        let _ = virt_launcher::run_launcher(opts).await;
    }))
}

fn phase_is(phase: &'static str) -> impl Fn(&serde_json::Value) -> bool {
    move |v| v["status"]["phase"] == phase
}

async fn release(cluster: &Cluster, name: &str) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"finalizers": null}});
    cluster
        .vmis()
        .patch(name, &Default::default(), &kube::api::Patch::Merge(patch))
        .await?;
    Ok(())
}

#[tokio::test]
async fn fake_launchers_drive_vmis_to_running_succeeded_and_failed_and_survive_a_handler_restart()
-> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let files = cluster.data.join("guest-src");
    std::fs::create_dir_all(&files)?;
    std::fs::write(files.join("vmlinux"), "kernel")?;
    std::fs::write(files.join("initramfs.cpio.gz"), "initrd")?;
    import_guest(
        &cluster.data,
        &files.join("vmlinux"),
        &files.join("initramfs.cpio.gz"),
    )?;

    let alpha = cluster.create_scheduled_vmi("alpha", POD_ALPHA).await?;
    let beta = cluster.create_scheduled_vmi("beta", POD_BETA).await?;
    let launcher_a = spawn_launcher(&cluster.pod_dir(POD_ALPHA), &alpha, true)?;
    let launcher_b = spawn_launcher(&cluster.pod_dir(POD_BETA), &beta, true)?;

    let cancel = CancellationToken::new();
    let handler = tokio::spawn(vmi_sync::run(
        cluster.client.clone(),
        cluster.sync_config(),
        kube::runtime::reflector::store().1,
        cancel.clone(),
    ));
    let running = cluster
        .wait_vmi("alpha", "alpha Running", phase_is("Running"))
        .await?;
    let status = &running["status"];
    assert_eq!(status["interfaces"][0]["name"], "default");
    // These launchers share the test's network (no pod network namespace): user-mode
    // networking, which has no address to report.
    assert_eq!(status["interfaces"][0]["infoSource"], "domain");
    assert!(status["interfaces"][0].get("ipAddress").is_none());
    assert_eq!(status["currentCPUTopology"]["cores"], 1);
    assert_eq!(status["memory"]["guestAtBoot"], "128Mi");
    let stamps = status["phaseTransitionTimestamps"]
        .as_array()
        .context("stamps")?;
    assert_eq!(stamps.len(), 2);
    assert_eq!(stamps[1]["phase"], "Running");
    let conditions = status["conditions"].as_array().context("conditions")?;
    assert!(
        conditions
            .iter()
            .any(|c| c["type"] == "SoftwareEmulation" && c["status"] == "True")
    );
    assert!(conditions.iter().any(|c| c["type"] == "LiveMigratable"));
    assert!(
        cluster.pod_dir(POD_ALPHA).join("boot/kernel").exists(),
        "the kernel was linked into the pod directory"
    );
    cluster
        .wait_vmi("beta", "beta Running", phase_is("Running"))
        .await?;

    // Handler restart: a new sync loop re-attaches and does not restart or re-stamp.
    cancel.cancel();
    handler.await?;
    let cancel = CancellationToken::new();
    let handler = tokio::spawn(vmi_sync::run(
        cluster.client.clone(),
        cluster.sync_config(),
        kube::runtime::reflector::store().1,
        cancel.clone(),
    ));

    // QEMU killed behind the handler's back (here: through the launcher socket) → Failed.
    let mut client =
        LauncherClient::connect(&cluster.pod_dir(POD_BETA).join("launcher.sock")).await?;
    client
        .request(Command::Kill)
        .await?
        .map_err(anyhow::Error::msg)?;
    let failed = cluster
        .wait_vmi("beta", "beta Failed", phase_is("Failed"))
        .await?;
    assert!(failed["status"].get("reason").is_none());

    let alpha = serde_json::to_value(cluster.vmis().get("alpha").await?)?;
    assert_eq!(alpha["status"]["phase"], "Running");
    assert_eq!(
        alpha["status"]["phaseTransitionTimestamps"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "re-attaching wrote no new transition"
    );

    // Deleting the VMI powers the guest off; the VMI ends Succeeded.
    cluster
        .vmis()
        .delete("alpha", &DeleteParams::default())
        .await?;
    let done = cluster
        .wait_vmi("alpha", "alpha Succeeded", phase_is("Succeeded"))
        .await?;
    let phases: Vec<_> = done["status"]["phaseTransitionTimestamps"]
        .as_array()
        .context("stamps")?
        .iter()
        .map(|s| s["phase"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(phases, ["Scheduled", "Running", "Succeeded"]);

    release(&cluster, "alpha").await?;
    release(&cluster, "beta").await?;
    cancel.cancel();
    handler.await?;
    launcher_a.abort();
    launcher_b.abort();
    cluster.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_missing_image_is_reported_as_err_image_pull_and_the_vmi_stays_scheduled()
-> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let gamma = cluster.create_scheduled_vmi("gamma", POD_GAMMA).await?;
    let launcher = spawn_launcher(&cluster.pod_dir(POD_GAMMA), &gamma, true)?;
    let cancel = CancellationToken::new();
    let handler = tokio::spawn(vmi_sync::run(
        cluster.client.clone(),
        cluster.sync_config(),
        kube::runtime::reflector::store().1,
        cancel.clone(),
    ));
    let vmi = cluster
        .wait_vmi("gamma", "a Synchronized=False condition", |v| {
            v["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Synchronized"))
        })
        .await?;
    assert_eq!(vmi["status"]["phase"], "Scheduled");
    let condition = vmi["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Synchronized").cloned())
        .context("condition")?;
    // Not imported, so pulled from its registry (Docker Hub, where it does not exist).
    assert_eq!(condition["reason"], "ErrImagePull");
    assert!(
        condition["message"].as_str().is_some_and(
            |m| m.starts_with("Failed to pull image \"kubevirt-rs/test-guest:latest\"")
        ),
        "{condition}"
    );
    release(&cluster, "gamma").await?;
    cancel.cancel();
    handler.await?;
    launcher.abort();
    cluster.stop().await;
    Ok(())
}

#[tokio::test]
async fn an_active_pod_key_naming_another_vmis_launcher_gets_no_spec() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let files = cluster.data.join("guest-src");
    std::fs::create_dir_all(&files)?;
    std::fs::write(files.join("vmlinux"), "kernel")?;
    std::fs::write(files.join("initramfs.cpio.gz"), "initrd")?;
    import_guest(
        &cluster.data,
        &files.join("vmlinux"),
        &files.join("initramfs.cpio.gz"),
    )?;
    // The launcher in POD_ALPHA is "victim"'s; "intruder"'s status names that pod (whoever
    // may patch a VMI's status can write any key). The victim's own status names a pod with
    // no launcher yet, so nothing else starts the domain.
    let victim = cluster.create_scheduled_vmi("victim", POD_BETA).await?;
    cluster.create_scheduled_vmi("intruder", POD_ALPHA).await?;
    let launcher = spawn_launcher(&cluster.pod_dir(POD_ALPHA), &victim, true)?;
    let cancel = CancellationToken::new();
    let handler = tokio::spawn(vmi_sync::run(
        cluster.client.clone(),
        cluster.sync_config(),
        kube::runtime::reflector::store().1,
        cancel.clone(),
    ));
    let intruder = cluster
        .wait_vmi("intruder", "a Synchronized=False condition", |v| {
            v["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Synchronized"))
        })
        .await?;
    assert_eq!(intruder["status"]["phase"], "Scheduled");
    let condition = intruder["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Synchronized").cloned())
        .context("condition")?;
    assert_eq!(condition["status"], "False");
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not run this VMI")),
        "{condition}"
    );
    // The launcher was never given the intruder's spec: its domain has not started.
    let mut client =
        LauncherClient::connect(&cluster.pod_dir(POD_ALPHA).join("launcher.sock")).await?;
    let status: virt_launcher::protocol::DomainStatus = serde_json::from_value(
        client
            .request(Command::Status)
            .await?
            .map_err(anyhow::Error::msg)?,
    )?;
    assert_eq!(status.state, virt_launcher::protocol::DomainState::Pending);
    release(&cluster, "victim").await?;
    release(&cluster, "intruder").await?;
    cancel.cancel();
    handler.await?;
    launcher.abort();
    cluster.stop().await;
    Ok(())
}

/// Kills QEMU (by its pid file) when the test ends, even on failure.
struct QemuGuard(PathBuf);

impl Drop for QemuGuard {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(&self.0)
            && let Ok(pid) = pid.trim().parse::<i32>()
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test]
async fn a_real_tcg_guest_boots_to_running_and_powers_off_on_delete() -> anyhow::Result<()> {
    let Some(guest) = test_prerequisites::available(test_prerequisites::test_guest()) else {
        return Ok(());
    };
    let cluster = Cluster::start().await?;
    import_guest(&cluster.data, &guest.kernel(), &guest.initrd())?;
    let real = cluster.create_scheduled_vmi("real", POD_REAL).await?;
    let pod = cluster.pod_dir(POD_REAL);
    let _qemu = QemuGuard(pod.join("qemu.pid"));
    let launcher = spawn_launcher(&pod, &real, false)?;
    let cancel = CancellationToken::new();
    let handler = tokio::spawn(vmi_sync::run(
        cluster.client.clone(),
        cluster.sync_config(),
        kube::runtime::reflector::store().1,
        cancel.clone(),
    ));
    cluster
        .wait_vmi("real", "real Running", phase_is("Running"))
        .await?;
    let serial = pod.join("guest-console-log.log");
    let start = Instant::now();
    while !std::fs::read_to_string(&serial).is_ok_and(|s| s.contains("GUEST-READY")) {
        if start.elapsed() > Duration::from_secs(60) {
            bail!(
                "no GUEST-READY on the serial console: {:?}",
                std::fs::read_to_string(&serial)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster
        .vmis()
        .delete("real", &DeleteParams::default())
        .await?;
    cluster
        .wait_vmi(
            "real",
            "real Succeeded after ACPI power-down",
            phase_is("Succeeded"),
        )
        .await?;
    let console = std::fs::read_to_string(&serial)?;
    assert!(console.contains("ACPI-POWER-BUTTON"), "{console}");
    release(&cluster, "real").await?;
    cancel.cancel();
    handler.await?;
    launcher.abort();
    cluster.stop().await;
    Ok(())
}
