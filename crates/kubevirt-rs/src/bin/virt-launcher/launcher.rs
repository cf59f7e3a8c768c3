//! `virt-launcher`: the process of a launcher pod's `compute` container.
//!
//! Runs `virt_launcher::run_launcher` with its command socket at
//! `<pod dir>/launcher.sock` (`--pod-dir`: the pod's `public` emptyDir as the container sees
//! it, `/var/run/kubevirt`) and every host path of the spec confined to the pod directory. On SIGTERM or
//! SIGINT (pod deletion) it asks its own launcher for an ACPI power-down with the grace
//! period (the launcher kills QEMU when the guest has not powered off by then) and exits once
//! the final state was delivered; with no domain started it exits at once.
//!
//! Two flags serve upstream's functional tests, set by virt-controller from VMI annotations:
//! `--simulate-crash` fails at once (a crash loop without a guest), and `--keep-after-failure`
//! keeps a failed launcher's container running until it is told to stop, so it can be
//! inspected.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use virt_launcher::protocol::{Command, LauncherClient};
use virt_launcher::{LauncherOptions, run_launcher};

#[derive(Args)]
pub struct LauncherArgs {
    #[command(flatten)]
    pub vmi: crate::VmiArgs,
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
    /// Fail at once (upstream's `--simulate-crash`, for crash-loop tests).
    #[arg(long)]
    pub simulate_crash: bool,
    /// After a failure, keep running until SIGTERM/SIGINT (upstream's `--keep-after-failure`).
    #[arg(long)]
    pub keep_after_failure: bool,
}

pub fn run(args: LauncherArgs) -> anyhow::Result<()> {
    // One thread: the launcher waits on QEMU, QMP and its socket, and a thread per core
    // would cost every VM's pod memory for nothing.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let keep = args.keep_after_failure;
    runtime.block_on(async move {
        let outcome = serve(args).await;
        if keep && let Err(e) = &outcome {
            tracing::error!(error = %format!("{e:#}"), "launcher failed; keeping the container alive (--keep-after-failure)");
            crate::shutdown_signal().await;
        }
        outcome
    })
}

async fn serve(args: LauncherArgs) -> anyhow::Result<()> {
    if args.simulate_crash {
        anyhow::bail!("Simulated virt-launcher crash");
    }
    let layout = virt_launcher::pod_layout::PodLayout::new(&args.vmi.pod_dir);
    let socket = layout.launcher_socket();
    let mut opts = LauncherOptions::new(&socket);
    opts.qemu_binary = args.qemu;
    opts.base_dir = Some(args.vmi.pod_dir.clone());
    opts.claim_disks_dir = Some(virt_launcher::pod_layout::CLAIM_DISKS_DIR.into());
    opts.fake_qemu = args.fake_qemu;
    opts.qemu_log_path = Some(layout.qemu_log());
    opts.vmi_uid = Some(args.vmi.uid.clone());
    tracing::info!(vmi = %format!("{}/{}", args.vmi.namespace, args.vmi.name), uid = %args.vmi.uid, "launcher starting");
    let mut launcher = tokio::spawn(run_launcher(opts));
    tokio::select! {
        done = &mut launcher => return Ok(done.context("launcher task")??),
        () = crate::shutdown_signal() => {}
    }
    tracing::info!(
        grace = args.grace_period_seconds,
        "terminating: powering the guest off"
    );
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        launcher: LauncherArgs,
    }

    #[test]
    fn simulate_crash_fails_before_anything_starts() {
        let dir = std::env::temp_dir().join(format!("simulate-crash-{}", std::process::id()));
        let cli = Cli::parse_from([
            "launcher",
            "--namespace",
            "ns",
            "--name",
            "vmi",
            "--uid",
            "u1",
            "--pod-dir",
            dir.to_str().unwrap_or_default(),
            "--simulate-crash",
        ]);
        let err = run(cli.launcher).expect_err("a simulated crash");
        assert_eq!(err.to_string(), "Simulated virt-launcher crash");
        assert!(!dir.join("launcher.sock").exists(), "no socket was created");
    }
}
