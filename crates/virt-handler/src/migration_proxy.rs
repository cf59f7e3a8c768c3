//! The migration proxies (upstream's `migration-proxy`): QEMU on either side of a live
//! migration only ever sees a unix socket in its launcher directory, and the two handlers
//! carry each of its connections over TCP between their own addresses.
//!
//! - [`target_proxy`]: a TCP listener of the target handler; each accepted connection is
//!   forwarded to the target QEMU's incoming socket.
//! - [`source_proxy`]: a unix listener in the source pod's directory; each connection of the
//!   source QEMU is forwarded to the target handler's port.
//!
//! The TCP leg runs in mutual TLS ([`MigrationTls`]) unless the migration's configuration
//! sets `disableTLS`, as upstream. Identities are checked as upstream checks them:
//! - the target presents virt-handler's serving certificate (Secret
//!   `kubevirt-virt-handler-server-certs`); the source accepts it when it chains to the
//!   KubeVirt CA and names [`HANDLER_SERVER_NAME`] — the target is dialled by its pod IP,
//!   which the certificate does not hold, so the name stands for the node identity upstream
//!   reads from the common name;
//! - the source presents virt-handler's client certificate (`kubevirt-virt-handler-certs`);
//!   the target accepts it when it chains to the KubeVirt CA and its common name is one of
//!   [`CLIENT_COMMON_NAMES`] (upstream's `--migration-cn-types` default).
//!
//! Certificates are read from their mounted files at each handshake, so the operator's
//! renewals apply to the next connection and never to one in flight.
//!
//! Difference from upstream: its newest releases give the migration client a Secret of its
//! own (`kubevirt-virt-handler-migration-client-certs`, common name
//! `kubevirt.io:system:client:migration`); the handler here presents the client certificate
//! it already has, which upstream's target accepts too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kubevirt_api::constants::HANDLER_SERVER_NAME;
use kubevirt_tls::{ClientAuth, PeerCertificates, ServerTrust, SwappableCert};
use tokio::task::JoinHandle;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tracing::{debug, warn};

/// The client common names a target accepts (upstream's `kubevirt.io:system:client:` with
/// the default `--migration-cn-types` `virt-handler` and `migration`).
pub const CLIENT_COMMON_NAMES: &[&str] = &[
    "kubevirt.io:system:client:virt-handler",
    "kubevirt.io:system:client:migration",
];

/// How long a TLS handshake of either proxy may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS both proxies speak: the target's server side and the source's client side.
#[derive(Clone)]
pub struct MigrationTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl std::fmt::Debug for MigrationTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MigrationTls")
    }
}

impl MigrationTls {
    /// From the mounted certificate Secrets: `server_dir` (`tls.crt`, `tls.key` and the
    /// KubeVirt CA bundle `ca.crt`) and `client_dir` (`tls.crt`, `tls.key`, `ca.crt`).
    ///
    /// # Errors
    /// When a file is missing or unusable now.
    pub fn from_mounted(
        server_dir: &Path,
        client_dir: &Path,
    ) -> Result<Self, kubevirt_tls::ConfigError> {
        let serving = SwappableCert::following_files(
            &server_dir.join("tls.crt"),
            &server_dir.join("tls.key"),
        )?;
        let mut server = kubevirt_tls::server_config(
            serving,
            &ClientAuth::RequiredFile(server_dir.join("ca.crt")),
        )?;
        // A byte stream, not HTTP.
        server.alpn_protocols.clear();
        let mut client = kubevirt_tls::client_config_following(
            &ServerTrust::CaFile(&client_dir.join("ca.crt")),
            (&client_dir.join("tls.crt"), &client_dir.join("tls.key")),
        )?;
        client.alpn_protocols.clear();
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }
}

/// A running proxy; dropping it stops it (and every connection it forwards).
#[derive(Debug)]
pub struct MigrationProxy {
    task: JoinHandle<()>,
}

impl Drop for MigrationProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward<A, B>(mut a: A, mut b: B)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::io::copy_bidirectional(&mut a, &mut b).await {
        Ok((up, down)) => debug!(up, down, "migration proxy connection closed"),
        Err(e) => debug!(error = %e, "migration proxy connection ended"),
    }
}

/// Whether the verified client certificate of a target connection is a handler's.
fn client_is_a_handler(
    certificates: Option<&[tokio_rustls::rustls::pki_types::CertificateDer<'static>]>,
) -> Result<(), String> {
    let certificates = certificates.ok_or("no client certificate provided")?;
    let name = PeerCertificates(Arc::from(certificates)).common_name();
    match name {
        Some(name) if CLIENT_COMMON_NAMES.contains(&name.as_str()) => Ok(()),
        other => Err(format!(
            "common name is invalid, got {}",
            other.unwrap_or_default()
        )),
    }
}

/// One accepted TCP connection of the target proxy, to the QEMU socket `socket`.
async fn serve_target_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    socket: PathBuf,
    tls: Option<MigrationTls>,
) {
    let connect = || async {
        virt_launcher::unix_socket::connect(&socket)
            .await
            .inspect_err(|e| warn!(socket = %socket.display(), error = %e, "migration proxy: the target QEMU does not listen"))
            .ok()
    };
    let Some(tls) = tls else {
        if let Some(unix) = connect().await {
            forward(tcp, unix).await;
        }
        return;
    };
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            warn!(%peer, error = %e, "migration proxy: TLS handshake refused");
            return;
        }
        Err(_) => {
            warn!(%peer, "migration proxy: TLS handshake timed out");
            return;
        }
    };
    if let Err(why) = client_is_a_handler(stream.get_ref().1.peer_certificates()) {
        warn!(%peer, reason = %why, "migration proxy: refused a client");
        return;
    }
    if let Some(unix) = connect().await {
        forward(stream, unix).await;
    }
}

/// The target proxy: a TCP listener on `ip` (port chosen by the kernel) forwarding to the
/// target QEMU's incoming `socket`, in TLS unless `tls` is `None`. Returns the port.
///
/// # Errors
/// When the listener cannot be bound.
pub async fn target_proxy(
    ip: std::net::IpAddr,
    socket: PathBuf,
    tls: Option<MigrationTls>,
) -> std::io::Result<(u16, MigrationProxy)> {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0)).await?;
    let port = listener.local_addr()?.port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, peer)) = listener.accept().await else {
                return;
            };
            debug!(%peer, tls = tls.is_some(), "migration proxy: incoming connection");
            tokio::spawn(serve_target_connection(
                tcp,
                peer,
                socket.clone(),
                tls.clone(),
            ));
        }
    });
    Ok((port, MigrationProxy { task }))
}

/// One connection of the source QEMU, to the target handler at `target`.
async fn serve_source_connection(
    unix: tokio::net::UnixStream,
    target: SocketAddr,
    tls: Option<MigrationTls>,
) {
    let tcp = match tokio::net::TcpStream::connect(target).await {
        Ok(tcp) => tcp,
        Err(e) => {
            warn!(%target, error = %e, "migration proxy: cannot reach the target handler");
            return;
        }
    };
    let Some(tls) = tls else {
        forward(unix, tcp).await;
        return;
    };
    let name = ServerName::try_from(HANDLER_SERVER_NAME).expect("a valid DNS name");
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connector.connect(name, tcp)).await {
        Ok(Ok(stream)) => forward(unix, stream).await,
        Ok(Err(e)) => {
            warn!(%target, error = %e, "migration proxy: the target handler's certificate is refused")
        }
        Err(_) => {
            warn!(%target, "migration proxy: TLS handshake with the target handler timed out")
        }
    }
}

/// The source proxy: a unix listener on `socket` (`<pod dir>/migration-source.sock`, or
/// `migration-source-block.sock` for the disks) forwarding each connection of the source QEMU
/// to the target handler at `target`, in TLS unless `tls` is `None`.
///
/// # Errors
/// When the socket cannot be bound.
pub fn source_proxy(
    socket: &Path,
    target: SocketAddr,
    tls: Option<MigrationTls>,
) -> std::io::Result<MigrationProxy> {
    let socket = socket.to_owned();
    if std::fs::symlink_metadata(&socket).is_ok() {
        std::fs::remove_file(&socket)?;
    }
    let listener = virt_launcher::unix_socket::bind(&socket)?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((unix, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve_source_connection(unix, target, tls.clone()));
        }
    });
    Ok(MigrationProxy { task })
}

#[cfg(test)]
mod tests;
