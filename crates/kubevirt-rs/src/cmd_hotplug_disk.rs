//! `kubevirt-rs hotplug-disk`: the container of a hotplug attachment pod (upstream's
//! `container-disk --copy-path /path/hp`).
//!
//! The pod exists to mount the hotplugged claims on the VMI's node; this process only keeps
//! it running and listens on a unix socket in the pod's emptyDir. virt-handler connects to the
//! socket to learn the process's pid (`SO_PEERCRED`) and opens each claim's disk through
//! `/proc/<pid>/root`, i.e. as this container's mount namespace sees it. Every connection is
//! accepted and closed at once. Exits on SIGTERM or SIGINT, removing the socket.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct HotplugDiskArgs {
    /// The socket to listen on (the attachment pod's `/path/hp.sock`).
    #[arg(long)]
    pub socket: PathBuf,
}

pub fn run(args: &HotplugDiskArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: &HotplugDiskArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // A restarted container finds its predecessor's socket.
    let _ = std::fs::remove_file(&args.socket);
    let listener = virt_launcher::unix_socket::bind(&args.socket)
        .with_context(|| format!("listening on {}", args.socket.display()))?;
    let mut term = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    tracing::info!(socket = %args.socket.display(), "hotplug attachment pod ready");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Err(e) = accepted {
                    tracing::warn!(error = %e, "accepting a connection");
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}
