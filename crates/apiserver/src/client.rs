//! The API server's outgoing HTTPS client: admission webhooks ([`crate::webhook`]),
//! aggregated APIs ([`crate::aggregation`]) and node log servers ([`crate::logs`]).
//!
//! One TLS connection per request (HTTP/1.1, no pooling): these calls are rare next to
//! the server's own traffic, and a fresh connection never sends a request into a
//! half-closed one. The connection task is spawned with upgrades enabled, so a `101
//! Switching Protocols` answer can be taken over with `hyper::upgrade::on`.

use std::sync::Arc;

use axum::body::Body;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use kubevirt_tls::ServerTrust;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Failures of an outgoing request.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The URL is not `https://host[:port]/…`.
    #[error("invalid URL {0:?}")]
    Url(String),
    /// The CA bundle or client identity could not be used.
    #[error("TLS configuration")]
    TlsConfig(#[source] kubevirt_tls::ConfigError),
    /// The TCP connection failed.
    #[error("dial tcp {0}")]
    Connect(String, #[source] std::io::Error),
    /// The TLS handshake failed (certificate not trusted …).
    #[error("tls: handshake with {0}")]
    Handshake(String, #[source] std::io::Error),
    /// The HTTP exchange failed.
    #[error("http")]
    Http(#[source] hyper::Error),
}

/// Whom to trust and who we are.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// PEM CA certificates the server certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// Skip server certificate verification (APIService `insecureSkipTLSVerify`).
    pub insecure: bool,
    /// Client certificate and key (PEM) to present.
    pub identity: Option<(String, String)>,
    /// The name the server certificate is verified for (and sent as SNI) instead of the
    /// URL's host: `<service>.<namespace>.svc` when a Service reference was routed to an
    /// endpoint address ([`crate::routing`]). Give it to [`send_as`].
    pub server_name: Option<String>,
}

/// Builds a rustls client configuration from `opts`.
///
/// # Errors
/// When the CA bundle is empty or unusable, or the identity is unusable.
pub fn tls_config(opts: &TlsOptions) -> Result<rustls::ClientConfig, ClientError> {
    let trust = if opts.insecure {
        ServerTrust::DangerAcceptAny
    } else {
        ServerTrust::CaPem(&opts.ca_pem)
    };
    let identity = opts
        .identity
        .as_ref()
        .map(|(cert, key)| (cert.as_bytes(), key.as_bytes()));
    kubevirt_tls::client_config(&trust, identity).map_err(ClientError::TlsConfig)
}

/// Host and port of an `https://` URL (`[::1]` brackets removed for the SNI name).
pub fn host_port(uri: &http::Uri) -> Result<(String, u16), ClientError> {
    if uri.scheme_str() != Some("https") {
        return Err(ClientError::Url(uri.to_string()));
    }
    let host = uri
        .host()
        .ok_or_else(|| ClientError::Url(uri.to_string()))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok((host, uri.port_u16().unwrap_or(443)))
}

/// Sends `req` (whose URI is absolute `https://…`) over a new TLS connection.
///
/// The request's URI is rewritten to origin form and `Host` is set (unless the request
/// sets it). The response body streams from the connection, which lives as long as the
/// body (or an upgrade) is used.
pub async fn send(
    tls: Arc<rustls::ClientConfig>,
    req: http::Request<Body>,
) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
    send_as(tls, None, req).await
}

/// [`send`], verifying the server certificate for `server_name` (when given) rather than
/// for the URI's host, which is then only where to connect.
pub async fn send_as(
    tls: Arc<rustls::ClientConfig>,
    server_name: Option<&str>,
    mut req: http::Request<Body>,
) -> Result<http::Response<hyper::body::Incoming>, ClientError> {
    let uri = req.uri().clone();
    let (host, port) = host_port(&uri)?;
    let addr = format!("{host}:{port}");
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| ClientError::Connect(addr.clone(), e))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(server_name.unwrap_or(&host).to_owned())
        .map_err(|_| ClientError::Url(uri.to_string()))?;
    let stream = TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| ClientError::Handshake(addr.clone(), e))?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ClientError::Http)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "outgoing connection ended with an error");
        }
    });
    let path = uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()
        .map_err(|_| ClientError::Url(uri.to_string()))?;
    *req.uri_mut() = path;
    let host_header = match uri.port_u16() {
        Some(p) => format!("{}:{p}", uri.host().unwrap_or("")),
        None => uri.host().unwrap_or("").to_owned(),
    };
    if !req.headers().contains_key(http::header::HOST)
        && let Ok(v) = http::HeaderValue::from_str(&host_header)
    {
        req.headers_mut().insert(http::header::HOST, v);
    }
    sender.send_request(req).await.map_err(ClientError::Http)
}
