use std::net::{IpAddr, Ipv4Addr};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use virt_launcher::pod_layout::PodLayout;

use super::*;

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca() -> Ca {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kubevirt.io");
    let cert = params.self_signed(&key).expect("ca");
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// Writes a mounted Secret's files: a leaf of `ca` with common name `cn` and DNS `names`.
fn secret(dir: &Path, ca: &Ca, cn: &str, names: &[&str]) -> PathBuf {
    let key = KeyPair::generate().expect("key");
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    let cert = params.signed_by(&key, &ca.issuer).expect("leaf");
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join("tls.crt"), cert.pem()).expect("write");
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).expect("write");
    std::fs::write(dir.join("ca.crt"), &ca.pem).expect("write");
    dir.to_owned()
}

/// The handler's pair of Secrets under `dir`: serving (`node:virt-handler`, DNS
/// `virt-handler`) and client (`client_cn`).
fn handler_tls(dir: &Path, ca: &Ca, server_names: &[&str], client_cn: &str) -> MigrationTls {
    let server = secret(
        &dir.join("server"),
        ca,
        "kubevirt.io:system:node:virt-handler",
        server_names,
    );
    let client = secret(&dir.join("client"), ca, client_cn, &[]);
    MigrationTls::from_mounted(&server, &client).expect("migration TLS")
}

/// A target (QEMU's incoming socket behind a target proxy) and a source proxy to it.
struct Pair {
    qemu_in: tokio::net::UnixListener,
    source_socket: PathBuf,
    _proxies: (MigrationProxy, MigrationProxy),
    _tmp: tempfile::TempDir,
}

async fn pair(
    tmp: tempfile::TempDir,
    target: Option<MigrationTls>,
    source: Option<MigrationTls>,
) -> Pair {
    let target_dir = tmp.path().join("target");
    let source_dir = tmp.path().join("source");
    std::fs::create_dir_all(&target_dir).expect("dir");
    std::fs::create_dir_all(&source_dir).expect("dir");
    let target_socket = PodLayout::new(&target_dir).migration_target_socket();
    let qemu_in = virt_launcher::unix_socket::bind(&target_socket).expect("bind");
    let (port, t) = target_proxy(IpAddr::V4(Ipv4Addr::LOCALHOST), target_socket, target)
        .await
        .expect("target proxy");
    let source_socket = PodLayout::new(&source_dir).migration_source_socket();
    let s = source_proxy(
        &source_socket,
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        source,
    )
    .expect("source proxy");
    Pair {
        qemu_in,
        source_socket,
        _proxies: (t, s),
        _tmp: tmp,
    }
}

impl Pair {
    /// The source QEMU sends `QEVM`; the target QEMU reads it.
    async fn carries_a_stream(&self) {
        let mut qemu_out = tokio::net::UnixStream::connect(&self.source_socket)
            .await
            .expect("connect");
        qemu_out.write_all(b"QEVM").await.expect("write");
        let (mut incoming, _) = self.qemu_in.accept().await.expect("accept");
        let mut buf = [0u8; 4];
        incoming.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"QEVM");
    }

    /// The source QEMU's connection is closed, and the target QEMU was never connected to.
    async fn refuses(self) {
        let mut qemu_out = tokio::net::UnixStream::connect(&self.source_socket)
            .await
            .expect("connect");
        // Written before the refusal or not at all; what comes back is at most a TLS alert.
        let _ = qemu_out.write_all(b"QEVM").await;
        let mut buf = Vec::new();
        let _ = qemu_out.read_to_end(&mut buf).await;
        assert!(
            !buf.windows(4).any(|w| w == b"QEVM"),
            "nothing of the stream comes back"
        );
        // The target proxy decides before it connects to QEMU, and the source connection
        // ends only after that decision.
        let listener = self.qemu_in.into_std().expect("std listener");
        listener.set_nonblocking(true).expect("nonblocking");
        assert_eq!(
            listener.accept().map(drop).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "the target QEMU was never connected to"
        );
    }
}

#[tokio::test]
async fn mutual_tls_between_two_handlers_carries_the_stream() {
    let ca = ca();
    let tmp = tempfile::tempdir().expect("tempdir");
    let target = handler_tls(
        &tmp.path().join("a"),
        &ca,
        &[HANDLER_SERVER_NAME],
        CLIENT_COMMON_NAMES[0],
    );
    let source = handler_tls(
        &tmp.path().join("b"),
        &ca,
        &[HANDLER_SERVER_NAME],
        CLIENT_COMMON_NAMES[1],
    );
    pair(tmp, Some(target), Some(source))
        .await
        .carries_a_stream()
        .await;
}

#[tokio::test]
async fn without_tls_the_proxies_carry_the_stream_in_the_clear() {
    let tmp = tempfile::tempdir().expect("tempdir");
    pair(tmp, None, None).await.carries_a_stream().await;
}

#[tokio::test]
async fn a_client_certificate_of_another_component_is_refused_by_the_target() {
    let ca = ca();
    let tmp = tempfile::tempdir().expect("tempdir");
    let target = handler_tls(
        &tmp.path().join("a"),
        &ca,
        &[HANDLER_SERVER_NAME],
        CLIENT_COMMON_NAMES[0],
    );
    // Signed by the same CA, but virt-api's identity.
    let source = handler_tls(
        &tmp.path().join("b"),
        &ca,
        &[HANDLER_SERVER_NAME],
        "kubevirt.io:system:client:virt-api",
    );
    pair(tmp, Some(target), Some(source)).await.refuses().await;
}

#[tokio::test]
async fn a_client_of_another_ca_or_without_tls_is_refused_by_the_target() {
    let certs = tempfile::tempdir().expect("tempdir");
    let target = handler_tls(
        &certs.path().join("a"),
        &ca(),
        &[HANDLER_SERVER_NAME],
        CLIENT_COMMON_NAMES[0],
    );
    let stranger = handler_tls(
        &certs.path().join("b"),
        &ca(),
        &[HANDLER_SERVER_NAME],
        CLIENT_COMMON_NAMES[0],
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    pair(tmp, Some(target.clone()), Some(stranger))
        .await
        .refuses()
        .await;
    let tmp = tempfile::tempdir().expect("tempdir");
    pair(tmp, Some(target), None).await.refuses().await;
}

#[tokio::test]
async fn a_target_whose_certificate_is_not_virt_handlers_is_refused_by_the_source() {
    let ca = ca();
    let tmp = tempfile::tempdir().expect("tempdir");
    // The CA's, but serving another name (virt-api's Service).
    let target = handler_tls(
        &tmp.path().join("a"),
        &ca,
        &["virt-api.kubevirt.svc"],
        CLIENT_COMMON_NAMES[0],
    );
    let source = handler_tls(
        &tmp.path().join("b"),
        &ca,
        &[HANDLER_SERVER_NAME],
        CLIENT_COMMON_NAMES[0],
    );
    pair(tmp, Some(target), Some(source)).await.refuses().await;
}
