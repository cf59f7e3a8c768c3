//! `kubevirt-rs-bench`: benchmarks that print figures (never timed tests). `scripts/bench.sh`
//! runs them and writes `docs/benchmarks.md`.

mod apiserver;
mod plot;
mod stats;
mod vms;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kubevirt-rs-bench", about = "kubevirt-rs benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// API server: create throughput (1 and 16 clients), mutating latency, watch delivery latency.
    Apiserver {
        /// Objects created per measurement.
        #[arg(long, default_value_t = 4000)]
        objects: usize,
    },
    /// VMs: density (fake and real QEMU), API writes per VMI, memory, boot overhead, label
    /// sync latency. Starts its own `kubevirt-rs server` processes on temporary directories.
    Vms {
        /// The `kubevirt-rs` binary (default: the one next to this binary).
        #[arg(long)]
        server_binary: Option<PathBuf>,
        /// VMs per batch with fake QEMU (paced and all at once; also label sync).
        #[arg(long, default_value_t = 100)]
        vms: usize,
        /// Control-plane scale batches with fake QEMU (all at once), comma-separated; each on
        /// a server of its own with a node per 200 VMs (a node's pod CIDR is a /24). 0 for none.
        #[arg(long, value_delimiter = ',', default_value = "1000")]
        scale_vms: Vec<usize>,
        /// VMs per batch with real QEMU guests (TCG; every one is a QEMU process).
        #[arg(long, default_value_t = 2)]
        real_vms: usize,
        /// Milliseconds between paced creates.
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        /// The test guest directory (`vmlinux`, `initramfs.cpio.gz`) for the boot overhead.
        #[arg(long)]
        guest_dir: Option<PathBuf>,
        /// Boots through the stack and with plain QEMU, each.
        #[arg(long, default_value_t = 3)]
        boot_runs: usize,
        /// The creation→Running CDF (PNG).
        #[arg(long, default_value = "vms-cdf.png")]
        plot: PathBuf,
        /// Copy each server's log and its KubeVirt component pods' logs here before the
        /// data directory is removed (for profiling from timestamps).
        #[arg(long)]
        keep_logs: Option<PathBuf>,
        /// Skip the real-QEMU server (its batches and the boot measurement).
        #[arg(long)]
        fake_only: bool,
    },
}

fn main() -> anyhow::Result<()> {
    let _ = rustls_provider();
    let runtime = tokio::runtime::Runtime::new()?;
    match Cli::parse().command {
        Command::Apiserver { objects } => {
            let report = runtime.block_on(apiserver::run(objects))?;
            println!("{report}");
        }
        Command::Vms {
            server_binary,
            vms,
            scale_vms,
            real_vms,
            interval_ms,
            guest_dir,
            boot_runs,
            plot,
            keep_logs,
            fake_only,
        } => {
            let options = vms::VmsOptions {
                server_binary,
                vms,
                scale_vms,
                real_vms,
                interval: Duration::from_millis(interval_ms),
                guest_dir,
                boot_runs,
                plot,
                keep_logs,
                fake_only,
            };
            // The benchmark future owns every server and VM: dropping it on a signal kills
            // them (see `vms::cluster`).
            let report = runtime.block_on(async {
                tokio::select! {
                    report = vms::run(options) => report.map(Some),
                    () = interrupted() => Ok(None),
                }
            })?;
            match report {
                Some(report) => println!("{report}"),
                None => {
                    eprintln!("interrupted: servers and VMs stopped");
                    std::process::exit(130);
                }
            }
        }
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// kube-rs and the server both use ring; make it the process default.
fn rustls_provider() -> Result<(), std::sync::Arc<rustls::crypto::CryptoProvider>> {
    rustls::crypto::ring::default_provider().install_default()
}
