//! The API server's outgoing HTTPS client: admission webhooks ([`crate::webhook`]),
//! aggregated APIs ([`crate::aggregation`]) and node log servers ([`crate::logs`]).
//!
//! Two ways to send:
//! - [`send`] / [`send_as`]: one TLS connection per request (HTTP/1.1), its task spawned
//!   with upgrades enabled, so a `101 Switching Protocols` answer (log streams, exec) can be
//!   taken over with `hyper::upgrade::on`.
//! - [`ConnectionPool::send_collect`]: keep-alive connections reused per (address, server
//!   name, trust), for calls made on every write: admission webhooks (each create or update
//!   of a KubeVirt object calls virt-api twice; a TLS handshake per call was most of a
//!   write's latency). A request whose reused connection turns out closed is sent again on
//!   a new one, so a server's idle timeout never fails a call.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use axum::body::{Body, Bytes};
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
    let mut sender = connect(tls, &host, port, server_name, true).await?;
    to_origin_form(&mut req)?;
    sender.send_request(req).await.map_err(ClientError::Http)
}

/// A new HTTP/1.1 connection over TLS to `host:port`, the certificate verified for
/// `server_name` (else `host`); its task serves upgrades when `upgrades` is set.
async fn connect(
    tls: Arc<rustls::ClientConfig>,
    host: &str,
    port: u16,
    server_name: Option<&str>,
    upgrades: bool,
) -> Result<http1::SendRequest<Body>, ClientError> {
    let addr = format!("{host}:{port}");
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| ClientError::Connect(addr.clone(), e))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(server_name.unwrap_or(host).to_owned())
        .map_err(|_| ClientError::Url(addr.clone()))?;
    let stream = TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| ClientError::Handshake(addr.clone(), e))?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(ClientError::Http)?;
    tokio::spawn(async move {
        let ended = if upgrades {
            conn.with_upgrades().await
        } else {
            conn.await
        };
        if let Err(e) = ended {
            tracing::debug!(error = %e, "outgoing connection ended with an error");
        }
    });
    Ok(sender)
}

/// Rewrites an absolute request URI to origin form and sets `Host` (unless set).
fn to_origin_form<B>(req: &mut http::Request<B>) -> Result<(), ClientError> {
    let uri = req.uri().clone();
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
    Ok(())
}

/// Idle connections kept per key: more than the calls one burst makes at once to a
/// webhook is waste.
const IDLE_PER_KEY: usize = 16;

/// What a kept connection is good for: the same address, verified for the same name
/// against the same trust.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct PoolKey {
    addr: String,
    server_name: String,
    trust: u64,
}

/// Keep-alive connections and client configurations for repeated calls (see the module
/// documentation).
#[derive(Default)]
pub struct ConnectionPool {
    idle: std::sync::Mutex<HashMap<PoolKey, Vec<http1::SendRequest<Body>>>>,
    configs: std::sync::Mutex<HashMap<u64, Arc<rustls::ClientConfig>>>,
}

fn trust_key(ca_pem: &[u8]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ca_pem.hash(&mut hasher);
    hasher.finish()
}

impl ConnectionPool {
    /// The client configuration trusting `ca_pem`, built once per bundle.
    ///
    /// # Errors
    /// When the bundle is unusable.
    pub fn tls_for(&self, ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, ClientError> {
        let key = trust_key(ca_pem);
        if let Some(config) = self.configs.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(config);
        }
        let config = Arc::new(tls_config(&TlsOptions {
            ca_pem: ca_pem.to_vec(),
            ..TlsOptions::default()
        })?);
        if let Ok(mut configs) = self.configs.lock() {
            configs.insert(key, Arc::clone(&config));
        }
        Ok(config)
    }

    /// Sends `req` (absolute `https://` URI) to a server trusting `ca_pem` and reads the
    /// whole answer, on a kept connection when one is open, else on a new one; the
    /// connection is kept for the next call once the answer is read.
    ///
    /// # Errors
    /// When the connection, the handshake or the exchange fails (a kept connection that
    /// fails is retried once on a new connection first).
    pub async fn send_collect(
        &self,
        ca_pem: &[u8],
        server_name: Option<&str>,
        req: http::Request<Bytes>,
    ) -> Result<(http::StatusCode, Bytes), ClientError> {
        let (host, port) = host_port(req.uri())?;
        let key = PoolKey {
            addr: format!("{host}:{port}"),
            server_name: server_name.unwrap_or(&host).to_owned(),
            trust: trust_key(ca_pem),
        };
        let mut req = req;
        to_origin_form(&mut req)?;
        while let Some(mut sender) = self.take_idle(&key) {
            if sender.ready().await.is_err() {
                continue;
            }
            match exchange(&mut sender, &req).await {
                Ok(answer) => {
                    self.keep(key, sender, &answer);
                    return Ok((answer.0, answer.1));
                }
                // Closed by the server while idle: a new connection below.
                Err(e) => {
                    tracing::debug!(error = %e, addr = %key.addr, "kept connection failed; reconnecting")
                }
            }
        }
        let tls = self.tls_for(ca_pem)?;
        let mut sender = connect(tls, &host, port, server_name, false).await?;
        let answer = exchange(&mut sender, &req).await?;
        self.keep(key, sender, &answer);
        Ok((answer.0, answer.1))
    }

    fn take_idle(&self, key: &PoolKey) -> Option<http1::SendRequest<Body>> {
        let mut idle = self.idle.lock().ok()?;
        let senders = idle.get_mut(key)?;
        while let Some(sender) = senders.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn keep(&self, key: PoolKey, sender: http1::SendRequest<Body>, answer: &Answer) {
        if !answer.2 || sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            let senders = idle.entry(key).or_default();
            senders.retain(|s| !s.is_closed());
            if senders.len() < IDLE_PER_KEY {
                senders.push(sender);
            }
        }
    }
}

/// Status, body, and whether the connection may be used again.
type Answer = (http::StatusCode, Bytes, bool);

async fn exchange(
    sender: &mut http1::SendRequest<Body>,
    req: &http::Request<Bytes>,
) -> Result<Answer, ClientError> {
    let mut copy = http::Request::builder()
        .method(req.method().clone())
        .uri(req.uri().clone())
        .body(Body::from(req.body().clone()))
        .map_err(|_| ClientError::Url(req.uri().to_string()))?;
    *copy.headers_mut() = req.headers().clone();
    let resp = sender.send_request(copy).await.map_err(ClientError::Http)?;
    let status = resp.status();
    let reusable = !resp
        .headers()
        .get(http::header::CONNECTION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(ClientError::Http)?
        .to_bytes();
    Ok((status, body, reusable))
}
