//! `kubevirt-rs launcher`: the process of a launcher pod's `compute` container.
//!
//! Runs `virt_launcher::run_launcher` with its command socket at
//! `<pod dir>/launcher.sock` (`--pod-dir`: the pod's `public` emptyDir as the container sees
//! it, `/var/run/kubevirt`) and every host path of the spec confined to the pod directory. On SIGTERM or
//! SIGINT (pod deletion) it asks its own launcher for an ACPI power-down with the grace
//! period (the launcher kills QEMU when the guest has not powered off by then) and exits once
//! the final state was delivered; with no domain started it exits at once.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use virt_launcher::protocol::{Command, LauncherClient};
use virt_launcher::{LauncherOptions, run_launcher};

#[derive(Args)]
pub struct LauncherArgs {
    /// Namespace of the VMI.
    #[arg(long)]
    pub namespace: String,
    /// Name of the VMI.
    #[arg(long)]
    pub name: String,
    /// UID of the VMI.
    #[arg(long)]
    pub uid: String,
    /// Seconds the guest gets to power off after SIGTERM before QEMU is killed.
    #[arg(long, default_value_t = 45)]
    pub grace_period_seconds: u64,
    /// Report a running domain without starting QEMU (control-plane tests; the embedded
    /// server's launcher image sets it in its environment under `--fake-qemu`).
    #[arg(long, env = "KUBEVIRT_RS_FAKE_QEMU")]
    pub fake_qemu: bool,
    /// The QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    pub qemu: PathBuf,
    /// The pod directory (socket, disks, logs).
    #[arg(long)]
    pub pod_dir: PathBuf,
}

pub fn run(args: LauncherArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let layout = virt_launcher::pod_layout::PodLayout::new(&args.pod_dir);
        let socket = layout.launcher_socket();
        let mut opts = LauncherOptions::new(&socket);
        opts.qemu_binary = args.qemu;
        opts.base_dir = Some(args.pod_dir.clone());
        opts.fake_qemu = args.fake_qemu;
        opts.qemu_log_path = Some(layout.qemu_log());
        tracing::info!(vmi = %format!("{}/{}", args.namespace, args.name), uid = %args.uid, "launcher starting");
        let mut launcher = tokio::spawn(run_launcher(opts));
        tokio::select! {
            done = &mut launcher => return Ok(done.context("launcher task")??),
            () = crate::shutdown_signal() => {}
        }
        tracing::info!(grace = args.grace_period_seconds, "terminating: powering the guest off");
        let powered_down = match LauncherClient::connect(&socket).await {
            Ok(mut client) => client
                .request(Command::Shutdown {
                    grace_period_seconds: args.grace_period_seconds,
                })
                .await
                .ok()
                .is_some_and(|ack| ack.is_ok()),
            Err(_) => false,
        };
        if !powered_down {
            // No domain was started (or it already ended): nothing to wait for.
            launcher.abort();
            return Ok(());
        }
        Ok(launcher.await.context("launcher task")??)
    })
}
