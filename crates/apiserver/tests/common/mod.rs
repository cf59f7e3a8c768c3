//! Shared pieces of the API server's integration tests: a server on a temporary data
//! directory with an admin HTTPS client, and an HTTPS backend (webhook, aggregated API,
//! log server) with its own CA.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kubevirt_apiserver::client::{self, TlsOptions};
use kubevirt_apiserver::{Config, RunningServer};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// Our API server on a temporary directory; stopped when dropped.
pub struct TestServer {
    pub server: RunningServer,
    pub dir: tempfile::TempDir,
    pub tls: Arc<rustls::ClientConfig>,
}

/// A reply: status, headers, body.
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Sends `req` with `tls` and reads the whole reply.
pub async fn send(tls: &Arc<rustls::ClientConfig>, req: http::Request<Body>) -> Reply {
    let resp = client::send(tls.clone(), req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::start_in(tempfile::tempdir().unwrap()).await
    }

    /// A server on `dir` (which may hold the data of an earlier server).
    pub async fn start_in(dir: tempfile::TempDir) -> TestServer {
        let server = kubevirt_apiserver::start(Config {
            data_dir: dir.path().to_owned(),
            listen: "127.0.0.1:0".parse().unwrap(),
            initial_objects: Vec::new(),
        })
        .await
        .unwrap();
        let pki = dir.path().join("pki");
        let tls = client::tls_config(&TlsOptions {
            ca_pem: read(&pki.join("ca.crt")).into_bytes(),
            insecure: false,
            identity: Some((read(&pki.join("admin.crt")), read(&pki.join("admin.key")))),
            server_name: None,
        })
        .unwrap();
        TestServer {
            server,
            dir,
            tls: Arc::new(tls),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.server.addr)
    }

    /// Stops the server and hands back its data directory.
    pub async fn stop(self) -> tempfile::TempDir {
        self.server.stop().await;
        self.dir
    }

    /// Sends a request; `body` as JSON (or `content_type` when given).
    pub async fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Reply {
        self.request_with(method, path, body, "application/json", &[])
            .await
    }

    /// Sends `body` as it is (not re-encoded), with `content_type`.
    pub async fn request_raw(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        content_type: &str,
    ) -> Reply {
        let req = http::Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("content-type", content_type)
            .body(Body::from(body))
            .unwrap();
        send(&self.tls, req).await
    }

    pub async fn request_with(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut b = http::Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("content-type", content_type);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b
            .body(match body {
                Some(v) => Body::from(serde_json::to_vec(v).unwrap()),
                None => Body::empty(),
            })
            .unwrap();
        send(&self.tls, req).await
    }
}

/// An HTTPS server for `app` with a fresh CA; aborted when dropped.
pub struct Backend {
    pub addr: SocketAddr,
    pub ca_pem: String,
    /// TCP connections accepted so far.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Backend {
    pub async fn start(app: Router) -> Backend {
        Backend::start_for(app, &["127.0.0.1", "localhost"]).await
    }

    /// An HTTPS server for `app` whose certificate names only `names` (a Service's
    /// `<name>.<namespace>.svc`, say), with a fresh CA.
    pub async fn start_for(app: Router, names: &[&str]) -> Backend {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let cert =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
        Backend::start_with(app, &cert.pem(), &key.serialize_pem(), None, ca_cert.pem()).await
    }

    /// A backend presenting `cert_pem`/`key_pem`; with `client_ca`, clients must present
    /// a certificate it signed.
    pub async fn start_with(
        app: Router,
        cert_pem: &str,
        key_pem: &str,
        client_ca: Option<&str>,
        ca_pem: String,
    ) -> Backend {
        use rustls::pki_types::pem::PemObject;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
                    roots.add(c.unwrap()).unwrap();
                }
                let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(v)
            }
            None => builder.with_no_client_auth(),
        };
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let mut cfg = builder.with_single_cert(certs, key).unwrap();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(cfg));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let app = app.clone();
                conns.spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            app.clone().oneshot(req.map(Body::new))
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Backend {
            addr,
            ca_pem,
            connections,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }
}

/// Runs kubectl with `kubeconfig`; (exit code, stdout, stderr).
pub async fn kubectl(kubeconfig: std::path::PathBuf, args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("kubectl")
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}
