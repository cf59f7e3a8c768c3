//! The launcher process: serves the command socket and supervises one QEMU.
//!
//! Data flow: [`run_launcher`] listens on the per-VMI socket. Each handler connection
//! ([`connection`]) exchanges hellos, receives commands and executes them on the shared
//! [`domain::Domain`] (the files that come with `passFile` are kept in `passed_files` for the
//! disks that name them), which starts QEMU on `sync`, talks to it over QMP and publishes
//! every state change into a `watch` channel. Each connection forwards the latest state
//! as a `domain` event. When QEMU has exited, the launcher returns once a connected
//! handler has been sent the final state, or after [`LauncherOptions::linger`].
//!
//! # Guarantees
//! - QEMU runs in the launcher's process group (stopping the pod's group stops both), dies
//!   with the launcher ([`qemu_process`]: a launcher killed alone takes QEMU with it) and does
//!   not depend on the handler connection:
//!   a handler may disconnect and reconnect at any time; a reconnecting handler first
//!   receives the current state.
//! - Every command gets exactly one ack on the connection that sent it.
//!
//! # Caveats
//! - Events carry the latest state, not a log: two quick transitions can reach a handler
//!   as one event with the later state (`status` always tells the truth).

mod connection;
mod domain;
mod guest_agent;
mod host_paths;
mod live;
mod live_nic;
mod migration;
mod passed_files;
mod qemu_process;
mod soft_reboot;
mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;

/// Settings of one launcher.
#[derive(Debug, Clone)]
pub struct LauncherOptions {
    /// The command socket to listen on (created; a stale socket is replaced).
    pub socket_path: PathBuf,
    /// The QEMU binary.
    pub qemu_binary: PathBuf,
    /// Where QEMU's stdout and stderr go (appended); `<socket_path>.qemu.log` by default.
    pub qemu_log_path: Option<PathBuf>,
    /// When set, every host path in a spec (disks, kernel, initrd, EFI variables, sockets,
    /// logs) must lie below this directory and be reachable without symlinks.
    pub base_dir: Option<PathBuf>,
    /// Where claim-backed volumes are mounted ([`crate::pod_layout::CLAIM_DISKS_DIR`] in a
    /// launcher pod): disks may lie below it besides `base_dir`, and a disk with a
    /// `create_size` is created there when it does not exist.
    pub claim_disks_dir: Option<PathBuf>,
    /// Report a Running domain without starting QEMU (control-plane tests, benchmarks).
    pub fake_qemu: bool,
    /// How long to wait, after QEMU exited, for a handler to receive the final state.
    pub linger: Duration,
    /// How long QEMU may take to open its QMP socket.
    pub qmp_timeout: Duration,
    /// Look for the pod interface in an own network namespace at start (on by default; off
    /// in tests that must not see the machine's network).
    pub discover_pod_network: bool,
    /// The UID of the VMI this launcher runs, reported in its hello so that a handler talks
    /// only to the launcher of the VMI it follows ([`crate::protocol::Hello::vmi_uid`]).
    pub vmi_uid: Option<String>,
}

/// The pod interface the masquerade binding serves (upstream's primary pod interface).
pub const POD_INTERFACE: &str = "eth0";

impl LauncherOptions {
    /// Options with defaults: `qemu-system-x86_64` from `PATH`, no base directory, real
    /// QEMU, 10 s linger, 30 s QMP timeout.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        Self {
            socket_path: socket_path.into(),
            qemu_binary: PathBuf::from("qemu-system-x86_64"),
            qemu_log_path: None,
            base_dir: None,
            claim_disks_dir: None,
            fake_qemu: false,
            linger: Duration::from_secs(10),
            qmp_timeout: Duration::from_secs(30),
            discover_pod_network: true,
            vmi_uid: None,
        }
    }

    fn qemu_log(&self) -> PathBuf {
        self.qemu_log_path.clone().unwrap_or_else(|| {
            let mut name = self.socket_path.clone().into_os_string();
            name.push(".qemu.log");
            PathBuf::from(name)
        })
    }
}

/// The launcher could not run.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// The command socket could not be created.
    #[error("cannot listen on {path:?}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Accepting a handler connection failed.
    #[error("accepting a handler connection failed")]
    Accept(#[source] std::io::Error),
}

/// Runs the launcher until its QEMU has exited and the final state was delivered.
///
/// # Errors
/// [`LauncherError`] when the socket cannot be served; failures of QEMU are reported to
/// the handler as domain states, not returned.
pub async fn run_launcher(opts: LauncherOptions) -> Result<(), LauncherError> {
    let listener = listen(&opts.socket_path)?;
    let socket_path = opts.socket_path.clone();
    let linger = opts.linger;
    let pod_interface = if opts.discover_pod_network {
        tokio::task::spawn_blocking(|| crate::netsetup::discover(POD_INTERFACE))
            .await
            .ok()
            .flatten()
    } else {
        None
    };
    let pod_ipv4 = match &pod_interface {
        Some(pod) => {
            tracing::info!(interface = %pod.name, ips = ?pod.ip_addresses, "launcher has its own pod network");
            let name = pod.name.clone();
            tokio::task::spawn_blocking(move || crate::netsetup::bridge::discover_ipv4(&name))
                .await
                .ok()
                .flatten()
        }
        None => None,
    };
    let domain = Arc::new(domain::Domain::new(opts, pod_interface, pod_ipv4));
    tracing::info!(socket = %socket_path.display(), "launcher listening");
    let mut status = domain.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => spawn_connection(&domain, accepted)?,
            _ = status.wait_for(crate::protocol::DomainStatus::is_final) => break,
        }
    }
    record_final_state(&socket_path, &status.borrow());
    // Keep accepting so that a reconnecting handler can still collect the final state.
    let mut delivered = domain.subscribe_delivered();
    let deadline = tokio::time::sleep(linger);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => {
                tracing::info!("final state not collected by a handler before the linger ended");
                break;
            }
            _ = delivered.wait_for(|d| *d) => break,
            accepted = listener.accept() => spawn_connection(&domain, accepted)?,
        }
    }
    let _ = std::fs::remove_file(&socket_path);
    Ok(())
}

/// Writes the final state next to the socket (atomically), for handlers that miss the event.
fn record_final_state(socket_path: &std::path::Path, status: &crate::protocol::DomainStatus) {
    let Some(dir) = socket_path.parent() else {
        return;
    };
    let path = dir.join(crate::protocol::FINAL_STATE_FILE);
    let written = serde_json::to_vec(status)
        .map_err(std::io::Error::other)
        .and_then(|bytes| crate::private_fs::write_atomic(&path, &bytes));
    if let Err(e) = written {
        tracing::warn!(path = %path.display(), error = %e, "cannot record the final domain state");
    }
}

fn spawn_connection(
    domain: &Arc<domain::Domain>,
    accepted: std::io::Result<(tokio::net::UnixStream, tokio::net::unix::SocketAddr)>,
) -> Result<(), LauncherError> {
    let (stream, _) = accepted.map_err(LauncherError::Accept)?;
    tokio::spawn(connection::serve(Arc::clone(domain), stream));
    Ok(())
}

fn listen(path: &std::path::Path) -> Result<UnixListener, LauncherError> {
    use std::os::unix::fs::FileTypeExt;
    let listen_error = |source| LauncherError::Listen {
        path: path.to_owned(),
        source,
    };
    // Replace a socket left by an earlier launcher, but never anything else.
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_socket()
    {
        std::fs::remove_file(path).map_err(listen_error)?;
    }
    // The socket is made owner-only right after bind; until then it lies in the pod
    // directory, which is owner-only itself.
    let listener = UnixListener::bind(path).map_err(listen_error)?;
    crate::private_fs::set_mode(path, crate::private_fs::FILE_MODE).map_err(listen_error)?;
    Ok(listener)
}

#[cfg(test)]
mod tests;
