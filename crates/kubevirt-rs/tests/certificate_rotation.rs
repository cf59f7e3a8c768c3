//! Certificate rotation end to end (`kubevirt-rs server --fake-qemu`): the KubeVirt CR is
//! patched to accelerated lifetimes (CA 90 s, renewed 45 s before its end; leaves 40 s,
//! renewed 25 s before theirs: a leaf's margin outlasts a leader fail-over of the operator,
//! 15 s of lease plus its retries), and while the operator rotates, a loop creates, labels and
//! deletes VMs through `kubectl` (the webhooks on the path) and pauses and unpauses a running
//! VM through `virtctl` (virt-api's subresources, virt-api → virt-handler with the handler
//! client certificate). No request may fail; the serial served by virt-api on its pod IP
//! follows the Secret's; virt-handler's server refuses a client certificate of a foreign CA
//! and an expired one of the KubeVirt CA.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use testkit::{DEADLINE, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_kubevirt-rs");
/// The loop runs until this many rotations were seen, or this long.
const SERVER_ROTATIONS: usize = 10;
const CA_ROTATIONS: usize = 2;
const LOOP_LIMIT: Duration = Duration::from_secs(200);

fn virtctl() -> PathBuf {
    Path::new(BIN).with_file_name("virtctl")
}

fn get(server: &ServerProcess, args: &[&str], path: &str) -> String {
    let path = format!("jsonpath={path}");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["-o", &path]);
    server.ok(&all).unwrap_or_default()
}

/// A PEM (or base64 of a PEM) field of a Secret in `kubevirt`, decoded.
fn secret_pem(server: &ServerProcess, secret: &str, key: &str) -> Option<String> {
    let escaped = key.replace('.', "\\.");
    let b64 = get(
        server,
        &["-n", "kubevirt", "get", "secret", secret],
        &format!("{{.data.{escaped}}}"),
    );
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    String::from_utf8(bytes).ok().filter(|s| !s.is_empty())
}

fn serial_of_der(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.raw_serial_as_string())
}

fn serial_of_pem(pem: &str) -> Option<String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    serial_of_der(&pem.contents)
}

/// Accepts any server certificate: the test reads what is served, and what the handler
/// makes of the client's certificate.
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config(client: Option<(&str, &str)>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)));
    Ok(Arc::new(match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            use rustls::pki_types::pem::PemObject;
            let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()?;
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes())?;
            builder.with_client_auth_cert(certs, key)?
        }
    }))
}

/// A TLS session to `address`, driven through its handshake.
fn connect(
    address: &str,
    config: Arc<rustls::ClientConfig>,
) -> anyhow::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let tcp = TcpStream::connect(address)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let name = rustls::pki_types::ServerName::try_from("kubevirt.io")?.to_owned();
    let mut tls = rustls::StreamOwned::new(rustls::ClientConnection::new(config, name)?, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// The serial of the certificate served at `address`.
fn served_serial(address: &str) -> anyhow::Result<String> {
    let tls = connect(address, client_config(None)?)?;
    let chain = tls
        .conn
        .peer_certificates()
        .ok_or_else(|| anyhow::anyhow!("no peer certificate"))?;
    serial_of_der(&chain[0]).ok_or_else(|| anyhow::anyhow!("unparsable peer certificate"))
}

/// What an HTTP request to the handler answers with `client`'s certificate: its status line,
/// or the error that refused it.
fn handler_answer(address: &str, client: (&str, &str)) -> Result<String, String> {
    let attempt = || -> anyhow::Result<String> {
        let mut tls = connect(address, client_config(Some(client))?)?;
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: virt-handler\r\nConnection: close\r\n\r\n")?;
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer)?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let line = text.lines().next().unwrap_or_default().to_owned();
        anyhow::ensure!(line.starts_with("HTTP/"), "no HTTP answer: {text:?}");
        Ok(line)
    };
    attempt().map_err(|e| format!("{e:#}"))
}

/// A client certificate (PEM certificate, PEM key) signed by `issuer`, valid from
/// `not_before` to `not_after`.
fn client_cert(
    issuer: &rcgen::Issuer<'_, rcgen::KeyPair>,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        "kubevirt.io:system:client:virt-handler",
    );
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

#[derive(Default)]
struct Seen {
    /// Serials of the Secret `kubevirt-virt-api-certs`, in order of appearance.
    secret: Vec<String>,
    /// Serials of the KubeVirt CA (Secret `kubevirt-ca`).
    ca: Vec<String>,
    /// Serials served by virt-api's pods.
    served: BTreeSet<String>,
    /// The last serial each pod served.
    last_served: Vec<(String, String)>,
}

fn push_new(list: &mut Vec<String>, serial: Option<String>) {
    if let Some(serial) = serial
        && list.last() != Some(&serial)
    {
        list.push(serial);
    }
}

/// Polls the Secrets and what virt-api's pods serve until `stop`.
fn observe(server: &ServerProcess, api_pods: &[String], seen: &Mutex<Seen>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let secret = secret_pem(server, "kubevirt-virt-api-certs", "tls.crt")
            .and_then(|p| serial_of_pem(&p));
        let ca = secret_pem(server, "kubevirt-ca", "tls.crt").and_then(|p| serial_of_pem(&p));
        let served: Vec<(String, String)> = api_pods
            .iter()
            .filter_map(|ip| Some((ip.clone(), served_serial(&format!("{ip}:8443")).ok()?)))
            .collect();
        let mut seen = seen.lock().unwrap();
        push_new(&mut seen.secret, secret);
        push_new(&mut seen.ca, ca);
        for (_, serial) in &served {
            seen.served.insert(serial.clone());
        }
        seen.last_served = served;
        drop(seen);
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs one command; a failure is counted with its output.
fn run(failures: &mut Vec<String>, requests: &mut usize, what: &str, mut command: Command) {
    *requests += 1;
    match command.output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => failures.push(format!(
            "{what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
        Err(e) => failures.push(format!("{what}: {e}")),
    }
}

fn kubectl(server: &ServerProcess, args: &[&str]) -> Command {
    let mut c = Command::new("kubectl");
    c.arg("--kubeconfig").arg(server.kubeconfig()).args(args);
    c
}

#[test]
#[allow(clippy::too_many_lines)]
fn traffic_keeps_flowing_through_ten_leaf_and_two_ca_rotations() -> anyhow::Result<()> {
    if testkit::available(testkit::virtctl_beside(Path::new(BIN))).is_none() {
        return Ok(());
    }
    let started = Instant::now();
    let server = ServerProcess::start(Path::new(BIN), "server", &["--fake-qemu"])?;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{e}\nserver log:\n{}", server.log());
    server.patch_kubevirt(r#"{"spec":{"certificateRotateStrategy":{"selfSigned":{"ca":{"duration":"90s","renewBefore":"45s"},"server":{"duration":"40s","renewBefore":"25s"}}}}}"#)?;
    // The operator renews what outlives the new lifetimes at once.
    wait_until(
        DEADLINE,
        "a virt-api certificate of the new lifetime",
        || {
            let pem = secret_pem(&server, "kubevirt-virt-api-certs", "tls.crt")?;
            let (_, cert) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
            let cert = cert.parse_x509().ok()?;
            let v = cert.validity();
            (v.not_after.timestamp() - time::OffsetDateTime::now_utc().unix_timestamp() <= 40)
                .then_some(())
        },
    )
    .map_err(fail)?;

    server.apply(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: driven\nspec:\n  runStrategy: Always\n  template:\n    spec:\n      domain:\n        memory: {guest: 128Mi}\n        devices: {}\n",
    )?;
    let status = |s: &ServerProcess| get(s, &["get", "vm", "driven"], "{.status.printableStatus}");
    wait_until(DEADLINE, "driven Running", || {
        (status(&server) == "Running").then_some(())
    })
    .map_err(fail)?;

    let api_pods: Vec<String> = get(
        &server,
        &[
            "-n",
            "kubevirt",
            "get",
            "pods",
            "-l",
            "kubevirt.io=virt-api",
        ],
        "{.items[*].status.podIP}",
    )
    .split_whitespace()
    .map(str::to_owned)
    .collect();
    anyhow::ensure!(!api_pods.is_empty(), "no virt-api pod IP");
    let _ = served_serial(&format!("{}:8443", api_pods[0]))
        .map_err(|e| fail(e.context("reaching virt-api on its pod IP")))?;

    let seen = Mutex::new(Seen::default());
    let stop = AtomicBool::new(false);
    let mut failures = Vec::new();
    let mut requests = 0usize;
    let mut iterations = 0usize;
    let loop_start = Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| observe(&server, &api_pods, &seen, &stop));
        while loop_start.elapsed() < LOOP_LIMIT {
            {
                let seen = seen.lock().unwrap();
                if seen.secret.len() > SERVER_ROTATIONS
                    && seen.served.len() > SERVER_ROTATIONS
                    && seen.ca.len() > CA_ROTATIONS
                {
                    break;
                }
            }
            iterations += 1;
            let name = format!("churn-{iterations}");
            let path = server.data_dir().join("churn.yaml");
            let manifest = format!(
                "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: {name}\nspec:\n  runStrategy: Halted\n  template:\n    spec:\n      domain:\n        memory: {{guest: 64Mi}}\n        devices: {{}}\n"
            );
            if std::fs::write(&path, manifest).is_err() {
                failures.push("writing the manifest".to_owned());
                continue;
            }
            let path = path.display().to_string();
            run(
                &mut failures,
                &mut requests,
                "create",
                kubectl(&server, &["create", "-f", &path]),
            );
            run(
                &mut failures,
                &mut requests,
                "label",
                kubectl(&server, &["label", "vm", &name, "rotation=seen"]),
            );
            run(
                &mut failures,
                &mut requests,
                "delete",
                kubectl(&server, &["delete", "vm", &name, "--wait=false"]),
            );
            for (verb, want) in [("pause", "Paused"), ("unpause", "Running")] {
                let mut c = Command::new(virtctl());
                c.args([verb, "vm", "driven"])
                    .env("KUBECONFIG", server.kubeconfig());
                let before = failures.len();
                run(&mut failures, &mut requests, verb, c);
                if failures.len() == before
                    && let Err(e) =
                        wait_until(DEADLINE, want, || (status(&server) == want).then_some(()))
                {
                    failures.push(format!("{verb}: {e}"));
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let loop_time = loop_start.elapsed();
    let seen = seen.into_inner().unwrap();
    eprintln!(
        "rotation: {} virt-api serials in the Secret, {} served, {} CAs; {iterations} iterations, {requests} requests, {} failed, loop {loop_time:?}, total {:?}",
        seen.secret.len(),
        seen.served.len(),
        seen.ca.len(),
        failures.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {requests} requests failed:\n{}\nserver log:\n{}",
        failures.len(),
        failures.join("\n"),
        server.log()
    );
    assert!(
        seen.secret.len() > SERVER_ROTATIONS,
        "server rotations: {:?}",
        seen.secret
    );
    assert!(seen.ca.len() > CA_ROTATIONS, "CA rotations: {:?}", seen.ca);
    assert!(
        seen.served.len() > SERVER_ROTATIONS,
        "served serials: {:?} (secret: {:?})",
        seen.served,
        seen.secret
    );
    // What virt-api serves follows the Secret.
    wait_until(
        DEADLINE,
        "virt-api to serve the Secret's certificate",
        || {
            let secret = secret_pem(&server, "kubevirt-virt-api-certs", "tls.crt")
                .and_then(|p| serial_of_pem(&p))?;
            api_pods
                .iter()
                .all(|ip| served_serial(&format!("{ip}:8443")).ok().as_ref() == Some(&secret))
                .then_some(())
        },
    )
    .map_err(fail)?;

    handler_refuses_foreign_and_expired_clients(&server).map_err(fail)
}

/// CA parameters with the KubeVirt CA's subject.
fn ca_like() -> rcgen::CertificateParams {
    let mut ca = rcgen::CertificateParams::default();
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "kubevirt.io");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca
}

/// virt-handler's server answers virt-api's client certificate, and refuses one of a foreign
/// CA and an expired one of the KubeVirt CA.
fn handler_refuses_foreign_and_expired_clients(server: &ServerProcess) -> anyhow::Result<()> {
    let node = get(server, &["get", "nodes"], "{.items[0].metadata.name}");
    let endpoint = get(
        server,
        &["get", "node", &node],
        r"{.metadata.annotations.kubevirt-rs\.io/virt-handler-endpoint}",
    );
    anyhow::ensure!(!endpoint.is_empty(), "no handler endpoint on node {node}");
    let now = time::OffsetDateTime::now_utc();

    let cert = secret_pem(server, "kubevirt-virt-handler-certs", "tls.crt")
        .ok_or_else(|| anyhow::anyhow!("no handler client certificate"))?;
    let key = secret_pem(server, "kubevirt-virt-handler-certs", "tls.key")
        .ok_or_else(|| anyhow::anyhow!("no handler client key"))?;
    let answer = handler_answer(&endpoint, (&cert, &key));
    assert!(answer.is_ok(), "virt-api's certificate: {answer:?}");

    // A CA of the same subject, with a key of its own.
    let foreign = rcgen::Issuer::new(ca_like(), rcgen::KeyPair::generate()?);
    let (cert, key) = client_cert(
        &foreign,
        now - time::Duration::minutes(1),
        now + time::Duration::hours(1),
    )?;
    let answer = handler_answer(&endpoint, (&cert, &key));
    assert!(
        answer.is_err(),
        "a foreign CA's certificate was answered: {answer:?}"
    );

    let ca_key =
        secret_pem(server, "kubevirt-ca", "tls.key").ok_or_else(|| anyhow::anyhow!("no CA key"))?;
    // The CA's subject and key: what it signs verifies against the KubeVirt CA.
    let ca = rcgen::Issuer::new(ca_like(), rcgen::KeyPair::from_pem(&ca_key)?);
    let (cert, key) = client_cert(
        &ca,
        now - time::Duration::minutes(10),
        now - time::Duration::minutes(5),
    )?;
    let answer = handler_answer(&endpoint, (&cert, &key));
    assert!(
        answer.is_err(),
        "an expired certificate was answered: {answer:?}"
    );
    // The same CA's valid certificate is answered: the refusal was its expiry.
    let (cert, key) = client_cert(
        &ca,
        now - time::Duration::minutes(1),
        now + time::Duration::minutes(5),
    )?;
    let answer = handler_answer(&endpoint, (&cert, &key));
    assert!(answer.is_ok(), "a valid certificate of the CA: {answer:?}");
    Ok(())
}
