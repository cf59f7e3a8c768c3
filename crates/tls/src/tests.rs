//! Round trips over loopback with a generated CA.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::*;

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf for `localhost` (server) or any client: (certificate PEM, key PEM).
fn leaf(ca: &Ca, cn: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let who = match req.extensions().get::<PeerCertificates>() {
        Some(certs) => format!("client with {} certificate(s)", certs.0.len()),
        None => "anonymous".to_owned(),
    };
    Ok(Response::new(Full::new(Bytes::from(who))))
}

struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

async fn start<S, B>(config: rustls::ServerConfig, service: S, options: ServeOptions) -> Server
where
    S: tower::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        Arc::new(config),
        service,
        options,
        shutdown.clone(),
    ));
    Server {
        addr,
        shutdown,
        task,
    }
}

async fn connect(
    addr: SocketAddr,
    ca: &Ca,
    identity: Option<&(String, String)>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let config = client_config(
        &ServerTrust::CaPem(ca.pem.as_bytes()),
        identity.map(|(c, k)| (c.as_bytes(), k.as_bytes())),
    )
    .unwrap();
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// Sends `GET /` on a fresh connection and returns the body.
async fn get(stream: TlsStream<TcpStream>) -> hyper::Result<String> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let resp = sender
        .send_request(Request::get("/").body(Empty::<Bytes>::new()).unwrap())
        .await?;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn served_leaf(stream: &TlsStream<TcpStream>) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn a_client_trusting_the_ca_gets_an_answer_and_its_certificate_reaches_the_handler() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config =
        server_config(resolver, &ClientAuth::Optional(ca.pem.clone().into_bytes())).unwrap();
    let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;

    let anonymous = get(connect(server.addr, &ca, None).await.unwrap())
        .await
        .unwrap();
    assert_eq!(anonymous, "anonymous");
    let client = leaf(&ca, "admin");
    let authenticated = get(connect(server.addr, &ca, Some(&client)).await.unwrap())
        .await
        .unwrap();
    assert_eq!(authenticated, "client with 1 certificate(s)");
}

#[tokio::test]
async fn a_required_client_ca_refuses_a_client_without_a_certificate() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config =
        server_config(resolver, &ClientAuth::Required(ca.pem.clone().into_bytes())).unwrap();
    let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;

    // TLS 1.3: the client learns of the refusal when it first reads.
    let refused = match connect(server.addr, &ca, None).await {
        Ok(stream) => get(stream).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a client without a certificate is refused");
    let client = leaf(&ca, "admin");
    let answer = get(connect(server.addr, &ca, Some(&client)).await.unwrap())
        .await
        .unwrap();
    assert_eq!(answer, "client with 1 certificate(s)");
}

#[tokio::test]
async fn a_swapped_certificate_is_served_to_the_next_connection() {
    let ca = ca("ca");
    let (first, first_key) = leaf(&ca, "first");
    let (second, second_key) = leaf(&ca, "second");
    let resolver = SwappableCert::from_pem(first.as_bytes(), first_key.as_bytes()).unwrap();
    let config = server_config(resolver.clone(), &ClientAuth::None).unwrap();
    let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;

    let before = connect(server.addr, &ca, None).await.unwrap();
    resolver
        .swap_pem(second.as_bytes(), second_key.as_bytes())
        .unwrap();
    let after = connect(server.addr, &ca, None).await.unwrap();

    let der = |pem: &str| certificates_from_pem(pem.as_bytes()).unwrap()[0].to_vec();
    assert_eq!(served_leaf(&before), der(&first));
    assert_eq!(served_leaf(&after), der(&second));
    assert_eq!(
        get(before).await.unwrap(),
        "anonymous",
        "the old connection still works"
    );
}

#[test]
fn a_key_that_does_not_belong_to_the_certificate_is_refused() {
    let ca = ca("ca");
    let (cert, _) = leaf(&ca, "server");
    let (_, other_key) = leaf(&ca, "other");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), other_key.as_bytes());
    assert!(matches!(resolver, Err(ConfigError::KeyMismatch(_))));
}

#[tokio::test]
async fn a_client_that_never_sends_headers_is_disconnected() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config = server_config(resolver, &ClientAuth::None).unwrap();
    let options = ServeOptions {
        header_read_timeout: Duration::from_millis(100),
        ..ServeOptions::default()
    };
    let server = start(config, tower::service_fn(hello), options).await;

    let mut stream = connect(server.addr, &ca, None).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // The head never ends; the server closes the connection (the read returns 0 bytes
    // or an error) instead of waiting for ever.
    let mut buf = Vec::new();
    let _ = stream.read_to_end(&mut buf).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(!text.contains("anonymous"), "no request was served: {text}");
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_by_the_server() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config = server_config(resolver, &ClientAuth::None).unwrap();
    let options = ServeOptions {
        header_read_timeout: Duration::from_millis(100),
        ..ServeOptions::default()
    };
    let server = start(config, tower::service_fn(hello), options).await;

    let stream = connect(server.addr, &ca, None).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let resp = sender
        .send_request(Request::get("/").body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    resp.into_body().collect().await.unwrap();
    // The client keeps the connection for a next request; the server ends it.
    let _ = conn.await.unwrap();
    assert!(sender.is_closed());
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_until_a_slot_frees() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config = server_config(resolver, &ClientAuth::None).unwrap();
    let options = ServeOptions {
        max_connections: 1,
        ..ServeOptions::default()
    };
    let server = start(config, tower::service_fn(hello), options).await;

    let first = connect(server.addr, &ca, None).await.unwrap();
    let addr = server.addr;
    let ca2 = Ca {
        pem: ca.pem.clone(),
        issuer: ca.issuer,
    };
    let mut second = tokio::spawn(async move {
        get(connect(addr, &ca2, None).await?)
            .await
            .map_err(std::io::Error::other)
    });
    // The second connection is not accepted while the first one holds the slot, so its
    // handshake cannot complete, however long it waits.
    let waited = tokio::time::timeout(Duration::from_millis(100), &mut second).await;
    assert!(
        waited.is_err(),
        "the second connection was served too early"
    );
    drop(first);
    assert_eq!(second.await.unwrap().unwrap(), "anonymous");
}

/// Counts the serve loop's "accepting a connection failed" warnings.
struct AcceptFailures(Arc<std::sync::atomic::AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AcceptFailures {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 |= format!("{value:?}").contains("accepting a connection failed");
                }
            }
        }
        let mut m = Message(false);
        event.record(&mut m);
        if m.0 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Out of file descriptors (EMFILE), the accept loop backs off instead of spinning, and
/// serves the waiting connection once descriptors are free again. nextest runs each test in a
/// process of its own, so the lowered limit is this test's alone.
#[tokio::test]
async fn out_of_file_descriptors_the_accept_loop_backs_off_and_recovers() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    use std::sync::atomic::Ordering;
    use tracing_subscriber::layer::SubscriberExt;
    let failures = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let subscriber = tracing_subscriber::registry().with(AcceptFailures(failures.clone()));
    let _guard = tracing::subscriber::set_default(subscriber);

    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config = server_config(resolver, &ClientAuth::None).unwrap();
    let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;

    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    setrlimit(Resource::RLIMIT_NOFILE, open + 16, hard).unwrap();
    let mut filler = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => filler.push(f),
            Err(e) if e.raw_os_error() == Some(nix::libc::EMFILE) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // One descriptor for the client's socket; none is left for the server's accept.
    drop(filler.pop());
    let client = std::net::TcpStream::connect(server.addr).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while failures.load(Ordering::SeqCst) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "no accept failure seen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(filler);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    client.set_nonblocking(true).unwrap();
    let tcp = TcpStream::from_std(client).unwrap();
    let connector = TlsConnector::from(Arc::new(
        client_config(&ServerTrust::CaPem(ca.pem.as_bytes()), None).unwrap(),
    ));
    let stream = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(
        get(stream).await.unwrap(),
        "anonymous",
        "the waiting connection is served"
    );
    // Doubling pauses from 5 ms: a handful of retries, where a spinning loop makes thousands.
    let retries = failures.load(Ordering::SeqCst);
    assert!(
        retries < 100,
        "{retries} accept attempts while out of descriptors"
    );
    server.shutdown.cancel();
}

#[tokio::test]
async fn shutdown_lets_the_request_in_flight_finish_and_stops_accepting() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config = server_config(resolver, &ClientAuth::None).unwrap();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let service = {
        let (entered, release) = (entered.clone(), release.clone());
        tower::service_fn(move |_req: Request<Incoming>| {
            let (entered, release) = (entered.clone(), release.clone());
            async move {
                entered.notify_one();
                release.notified().await;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("finished"))))
            }
        })
    };
    let server = start(config, service, ServeOptions::default()).await;

    let stream = connect(server.addr, &ca, None).await.unwrap();
    let in_flight = tokio::spawn(get(stream));
    entered.notified().await;
    server.shutdown.cancel();
    release.notify_one();
    assert_eq!(in_flight.await.unwrap().unwrap(), "finished");
    server.task.await.unwrap();
    assert!(
        TcpStream::connect(server.addr).await.is_err(),
        "the listener is closed"
    );
}

/// A response body fed by a channel: the handler's stream of a watch or `logs -f`.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(hyper::body::Frame::data(c))))
    }
}

/// Longer than the idle timeout of the servers below (100 ms), by a wide margin.
const QUIET: Duration = Duration::from_millis(500);

#[tokio::test]
async fn a_streamed_response_quiet_for_longer_than_the_idle_timeout_is_not_cut() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config = server_config(resolver, &ClientAuth::None).unwrap();
    let options = ServeOptions {
        header_read_timeout: Duration::from_millis(100),
        ..ServeOptions::default()
    };
    let service = tower::service_fn(|_req: Request<Incoming>| async {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            let _ = tx.send(Bytes::from_static(b"first ")).await;
            tokio::time::sleep(QUIET).await;
            let _ = tx.send(Bytes::from_static(b"second")).await;
        });
        Ok::<_, Infallible>(Response::new(ChannelBody(rx)))
    });
    let server = start(config, service, options).await;
    let stream = connect(server.addr, &ca, None).await.unwrap();
    assert_eq!(get(stream).await.unwrap(), "first second");
    server.shutdown.cancel();
    server.task.await.unwrap();
}

#[tokio::test]
async fn an_upgraded_connection_quiet_for_longer_than_the_idle_timeout_is_not_cut() {
    let ca = ca("ca");
    let (cert, key) = leaf(&ca, "server");
    let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let config = server_config(resolver, &ClientAuth::None).unwrap();
    let options = ServeOptions {
        header_read_timeout: Duration::from_millis(100),
        ..ServeOptions::default()
    };
    // An exec/attach/port-forward stream: after `101`, echo what the client sends.
    let service = tower::service_fn(|mut req: Request<Incoming>| async move {
        let upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            let mut io = TokioIo::new(upgrade.await.unwrap());
            let mut buf = [0u8; 64];
            loop {
                match io.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if io.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let resp = Response::builder()
            .status(101)
            .header("connection", "upgrade")
            .header("upgrade", "SPDY/3.1")
            .body(Empty::<Bytes>::new())
            .unwrap();
        Ok::<_, Infallible>(resp)
    });
    let server = start(config, service, options).await;
    let stream = connect(server.addr, &ca, None).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = Request::get("/exec")
        .header("connection", "upgrade")
        .header("upgrade", "SPDY/3.1")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 101);
    let mut io = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    for round in ["one", "two"] {
        // Silence longer than the idle timeout, then the stream still answers.
        tokio::time::sleep(QUIET).await;
        io.write_all(round.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; round.len()];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(buf, round.as_bytes());
    }
    drop(io);
    server.shutdown.cancel();
    server.task.await.unwrap();
}

mod following {
    //! Certificates and bundles followed in files, written as a volume writer does.

    use super::*;
    use std::path::Path;

    /// Writes `files` into a new directory of `dir` and switches `dir/..data` to it
    /// atomically, the top-level names being links through `..data` (a Secret volume).
    fn publish(dir: &Path, generation: u32, files: &[(&str, &str)]) {
        let target = format!("..gen{generation}");
        std::fs::create_dir(dir.join(&target)).unwrap();
        for (name, content) in files {
            std::fs::write(dir.join(&target).join(name), content).unwrap();
            let link = dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
            }
        }
        std::os::unix::fs::symlink(&target, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    }

    fn der(pem: &str) -> Vec<u8> {
        certificates_from_pem(pem.as_bytes()).unwrap()[0].to_vec()
    }

    #[tokio::test]
    async fn a_renewal_published_by_switching_the_data_link_is_served_at_the_next_handshake() {
        let ca = ca("ca");
        let dir = tempfile::tempdir().unwrap();
        let first = leaf(&ca, "first");
        publish(
            dir.path(),
            1,
            &[("tls.crt", &first.0), ("tls.key", &first.1)],
        );
        let resolver = SwappableCert::following_files(
            &dir.path().join("tls.crt"),
            &dir.path().join("tls.key"),
        )
        .unwrap();
        let config = server_config(resolver, &ClientAuth::None).unwrap();
        let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;
        let before = connect(server.addr, &ca, None).await.unwrap();
        assert_eq!(served_leaf(&before), der(&first.0));

        let second = leaf(&ca, "second");
        publish(
            dir.path(),
            2,
            &[("tls.crt", &second.0), ("tls.key", &second.1)],
        );
        let after = connect(server.addr, &ca, None).await.unwrap();
        assert_eq!(served_leaf(&after), der(&second.0));
        assert_eq!(get(before).await.unwrap(), "anonymous");
    }

    #[tokio::test]
    async fn a_certificate_written_before_its_key_is_not_served_until_the_key_follows() {
        let ca = ca("ca");
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let first = leaf(&ca, "first");
        std::fs::write(&crt, &first.0).unwrap();
        std::fs::write(&key, &first.1).unwrap();
        let resolver = SwappableCert::following_files(&crt, &key).unwrap();
        let config = server_config(resolver, &ClientAuth::None).unwrap();
        let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;

        let second = leaf(&ca, "second");
        std::fs::write(&crt, &second.0).unwrap();
        let half = connect(server.addr, &ca, None).await.unwrap();
        assert_eq!(served_leaf(&half), der(&first.0), "the old pair meanwhile");
        std::fs::write(&key, &second.1).unwrap();
        let whole = connect(server.addr, &ca, None).await.unwrap();
        assert_eq!(served_leaf(&whole), der(&second.0));
    }

    #[tokio::test]
    async fn a_client_ca_file_is_trusted_as_it_is_at_each_handshake() {
        let (old_ca, new_ca) = (ca("old"), ca("new"));
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("ca.crt");
        std::fs::write(&bundle, &old_ca.pem).unwrap();
        let (cert, key) = leaf(&old_ca, "server");
        let resolver = SwappableCert::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let config = server_config(resolver, &ClientAuth::RequiredFile(bundle.clone())).unwrap();
        let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;
        // The client of the new CA is refused while the bundle holds the old CA only.
        assert!(refused(server.addr, &old_ca, leaf(&new_ca, "new-client")).await);
        assert!(!refused(server.addr, &old_ca, leaf(&old_ca, "old-client")).await);

        // The bundle grows to both CAs (old kept for the leaves it signed): both accepted.
        std::fs::write(&bundle, format!("{}{}", new_ca.pem, old_ca.pem)).unwrap();
        assert!(!refused(server.addr, &old_ca, leaf(&new_ca, "new-client")).await);
        assert!(!refused(server.addr, &old_ca, leaf(&old_ca, "old-client")).await);

        // The old CA leaves the bundle: its clients are refused from the next handshake on.
        std::fs::write(&bundle, &new_ca.pem).unwrap();
        assert!(refused(server.addr, &old_ca, leaf(&old_ca, "old-client")).await);
        assert!(!refused(server.addr, &old_ca, leaf(&new_ca, "new-client")).await);
    }

    /// Whether a client presenting `identity` (and trusting `trust`) is refused.
    async fn refused(addr: SocketAddr, trust: &Ca, identity: (String, String)) -> bool {
        match connect(addr, trust, Some(&identity)).await {
            Ok(stream) => get(stream).await.is_err(),
            Err(_) => true,
        }
    }

    #[tokio::test]
    async fn a_following_client_presents_its_renewed_identity_and_trusts_the_renewed_bundle() {
        let (old_ca, new_ca) = (ca("old"), ca("new"));
        let dir = tempfile::tempdir().unwrap();
        let (crt, key, bundle) = (
            dir.path().join("tls.crt"),
            dir.path().join("tls.key"),
            dir.path().join("ca.crt"),
        );
        let old_client = leaf(&old_ca, "client");
        std::fs::write(&crt, &old_client.0).unwrap();
        std::fs::write(&key, &old_client.1).unwrap();
        std::fs::write(&bundle, &old_ca.pem).unwrap();
        let client =
            Arc::new(client_config_following(&ServerTrust::CaFile(&bundle), (&crt, &key)).unwrap());
        // A server of the new CA, accepting clients of either CA.
        let (cert, skey) = leaf(&new_ca, "server");
        let resolver = SwappableCert::from_pem(cert.as_bytes(), skey.as_bytes()).unwrap();
        let both = format!("{}{}", old_ca.pem, new_ca.pem).into_bytes();
        let config = server_config(resolver, &ClientAuth::Required(both)).unwrap();
        let server = start(config, tower::service_fn(hello), ServeOptions::default()).await;
        let dial = || {
            let client = client.clone();
            async move {
                let tcp = TcpStream::connect(server.addr).await?;
                TlsConnector::from(client)
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await
            }
        };
        assert!(
            dial().await.is_err(),
            "the new CA's server is not trusted with the old bundle"
        );
        let new_client = leaf(&new_ca, "client");
        std::fs::write(&crt, &new_client.0).unwrap();
        std::fs::write(&key, &new_client.1).unwrap();
        std::fs::write(&bundle, &new_ca.pem).unwrap();
        let stream = dial().await.unwrap();
        let presented = stream.get_ref().1.peer_certificates().is_some();
        assert!(presented);
        assert_eq!(get(stream).await.unwrap(), "client with 1 certificate(s)");
    }
}
