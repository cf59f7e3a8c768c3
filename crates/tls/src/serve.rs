//! The accept loop shared by every HTTPS listener.
//!
//! Data flow: wait for a connection slot → `accept` → TLS handshake (bounded by
//! [`ServeOptions::handshake_timeout`]) → hyper HTTP/1.1 with upgrades, on tokio's timer →
//! the service, with the client's verified certificates in [`PeerCertificates`].
//!
//! # Guarantees
//! - At most [`ServeOptions::max_connections`] connections are open (handshaking or
//!   serving). Excess connections are not refused: they are not accepted until a slot
//!   frees, so they wait in the kernel's listen backlog (and a client gives up on its own
//!   connect timeout). Refusing would need accepting first, which is the resource the cap
//!   protects.
//! - A client that does not send a complete request head within
//!   [`ServeOptions::header_read_timeout`] is disconnected; hyper arms the same timer while
//!   a kept-alive connection waits for its next request, so it is also the idle timeout.
//! - An accept error (`EMFILE` when out of file descriptors …) is logged and followed by a
//!   pause doubling from 5 ms up to one second, so the loop never spins.
//! - On cancellation the listener is closed at once; open connections finish the request
//!   in flight and close (keep-alive is ended), within [`ServeOptions::shutdown_grace`];
//!   connections still open after it are dropped.
//!
//! # Caveats
//! Upgraded connections (websockets, exec streams) are not HTTP any more: they end at
//! the grace deadline.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};
use tracing::{debug, warn};

/// The certificate chain a client presented and the server's verifier accepted (leaf
/// first), in the extensions of every request of that connection. Absent when the
/// client presented none.
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<[CertificateDer<'static>]>);

impl PeerCertificates {
    /// The subject common name of the client's certificate (the leaf), if it has one: the
    /// user name kube's x509 authentication takes from it.
    #[must_use]
    pub fn common_name(&self) -> Option<String> {
        let (_, leaf) = x509_parser::parse_x509_certificate(self.0.first()?).ok()?;
        let name = leaf.subject().iter_common_name().next()?.as_str().ok()?;
        Some(name.to_owned())
    }
}

/// Limits and timeouts of [`serve`].
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Deadline of the TLS handshake.
    pub handshake_timeout: Duration,
    /// Deadline of a request head, and of the wait for the next one on a kept-alive
    /// connection.
    pub header_read_timeout: Duration,
    /// Connections open at once, at most.
    pub max_connections: usize,
    /// How long in-flight requests may take to finish after shutdown begins.
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

const FIRST_ACCEPT_BACKOFF: Duration = Duration::from_millis(5);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Serves `service` over TLS on `listener` until `shutdown` is cancelled and the open
/// connections have finished (or the grace period has passed). See the module
/// documentation for the guarantees.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: S,
    options: ServeOptions,
    shutdown: CancellationToken,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let mut conns = JoinSet::new();
    let mut backoff = FIRST_ACCEPT_BACKOFF;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            accepted = accept(&listener, &slots) => accepted,
        };
        let (tcp, permit) = match accepted {
            Ok(x) => {
                backoff = FIRST_ACCEPT_BACKOFF;
                x
            }
            Err(e) => {
                warn!(error = %e, pause = ?backoff, "accepting a connection failed");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        let connection = connection(
            tcp,
            acceptor.clone(),
            service.clone(),
            options.clone(),
            shutdown.clone(),
        );
        conns.spawn(async move {
            connection.await;
            drop(permit);
        });
    }
    drop(listener);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(options.shutdown_grace, drain)
        .await
        .is_err()
    {
        debug!(
            open = conns.len(),
            "closing connections still open after the grace period"
        );
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
}

/// Waits for a free slot, then for a connection.
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    // The semaphore is never closed, so acquiring only waits.
    let permit = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(std::io::Error::other)?;
    let (tcp, _) = listener.accept().await?;
    Ok((tcp, permit))
}

/// One connection: handshake, then HTTP until it ends or shutdown asks it to.
async fn connection<S, B>(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    service: S,
    options: ServeOptions,
    shutdown: CancellationToken,
) where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let peer = tcp.peer_addr().ok();
    let _ = tcp.set_nodelay(true);
    let stream = tokio::select! {
        () = shutdown.cancelled() => return,
        handshake = tokio::time::timeout(options.handshake_timeout, acceptor.accept(tcp)) => {
            match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    debug!(?peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    debug!(?peer, "TLS handshake timed out");
                    return;
                }
            }
        }
    };
    let certs = stream
        .get_ref()
        .1
        .peer_certificates()
        .filter(|c| !c.is_empty())
        .map(|c| PeerCertificates(c.iter().map(|c| c.clone().into_owned()).collect()));
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        if let Some(certs) = &certs {
            req.extensions_mut().insert(certs.clone());
        }
        service.clone().oneshot(req)
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), svc)
        .with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        debug!(?peer, error = %e, "connection ended with an error");
    }
}

/// Errors of [`spawn_serving`].
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The certificate, key or client CA could not be used.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// Binding the listen address failed.
    #[error("binding {0}")]
    Bind(std::net::SocketAddr, #[source] std::io::Error),
}

/// Serves `service` on `listen` with [`ServeOptions::default`] until the returned task is
/// dropped or aborted: presents `serving` (certificate and key, PEM; a self-signed one for
/// the listen address when `None`, as kubelet does by default) and authenticates clients as
/// `client_auth` says. Returns the bound address.
///
/// # Errors
/// [`SpawnError`] when the TLS set-up or the bind fails.
pub async fn spawn_serving<S, B>(
    listen: std::net::SocketAddr,
    serving: Option<&(String, String)>,
    client_auth: &crate::ClientAuth,
    service: S,
) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>), SpawnError>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls_err = |e: &dyn std::fmt::Display| SpawnError::Tls(e.to_string());
    let (cert_pem, key_pem) = match serving {
        Some(pair) => pair.clone(),
        None => crate::self_signed_pem(vec![listen.ip().to_string(), "localhost".to_owned()])
            .map_err(|e| tls_err(&e))?,
    };
    let cert = crate::SwappableCert::from_pem(cert_pem.as_bytes(), key_pem.as_bytes())
        .map_err(|e| tls_err(&e))?;
    spawn_serving_cert(listen, cert, client_auth, service).await
}

/// As [`spawn_serving`], presenting `cert` (a certificate that may follow its files, see
/// [`crate::SwappableCert::following_files`]).
///
/// # Errors
/// [`SpawnError`] when the TLS set-up or the bind fails.
pub async fn spawn_serving_cert<S, B>(
    listen: std::net::SocketAddr,
    cert: Arc<crate::SwappableCert>,
    client_auth: &crate::ClientAuth,
    service: S,
) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>), SpawnError>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls =
        crate::server_config(cert, client_auth).map_err(|e| SpawnError::Tls(e.to_string()))?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| SpawnError::Bind(listen, e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| SpawnError::Bind(listen, e))?;
    let task = tokio::spawn(serve(
        listener,
        Arc::new(tls),
        service,
        ServeOptions::default(),
        CancellationToken::new(),
    ));
    Ok((addr, task))
}
