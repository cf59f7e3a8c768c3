//! The server's PKI: a private CA, the serving certificate, the admin client certificate,
//! per-component bearer tokens, and the kubeconfig files that carry them.
//!
//! Layout under the data directory:
//! `pki/ca.{crt,key}`, `pki/server.{crt,key}`, `pki/admin.{crt,key}`,
//! `pki/front-proxy-ca.{crt,key}` (a CA of its own, as kubeadm's) and
//! `pki/front-proxy-client.{crt,key}` (CN `front-proxy-client`, signed by it: the server's
//! identity towards aggregated API backends, which trust the `X-Remote-User`/`X-Remote-Group`
//! headers of a client presenting it), `pki/apiserver-kubelet-client.{crt,key}` (CN
//! `kube-apiserver-kubelet-client`, no O: the server's identity towards node log servers,
//! see [`crate::logs`]), `tokens`
//! (`token,user` lines), `kubeconfig` (admin, client certificate) and
//! `kubeconfig-{controller,handler,api}` (bearer tokens). Every file is written atomically
//! (temporary file + rename); keys and tokens are mode 0600.
//!
//! # Identities
//! A client certificate of this CA authenticates to the API server as its subject (CN user,
//! O groups; see [`crate::auth`]): the admin certificate as `kubernetes-admin` in
//! `system:masters` (all rights); the kubelet client certificate as
//! `kube-apiserver-kubelet-client` with no groups and so no rights here; its one use is client
//! authentication towards node log servers. The front-proxy certificate is not of this CA and
//! authenticates nobody to the API server; aggregated API backends trust it through the
//! front-proxy CA the server publishes in `kube-system/extension-apiserver-authentication`
//! ([`crate::server`]). Every leaf has one extended key usage (server or
//! client authentication). The tokens-file users of [`COMPONENTS`] are bound to `cluster-admin` by the
//! bootstrap policy ([`crate::rbac::bootstrap`]).
//!
//! # Lifetimes
//! The CA is valid for [`CA_LIFETIME`] (10 years, kubeadm's default), every leaf for
//! [`LEAF_LIFETIME`] (1 year), each from five minutes before issue (clock skew). At start,
//! a stored certificate is issued anew when less than a fifth of its lifetime is left, when
//! it does not parse, or (leaves) when the current CA did not sign it; a new CA therefore
//! brings new leaves and kubeconfigs with it.
//!
//! # Caveats
//! Renewal happens only at start: a server running for more than ~290 days without a restart
//! serves a certificate that is past its renewal point (rotation at run time belongs to the
//! shared TLS set-up's swappable resolver).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::Rng;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// How long the embedded cluster's CA is valid.
pub const CA_LIFETIME: time::Duration = time::Duration::days(3650);

/// How long a serving or client certificate is valid.
pub const LEAF_LIFETIME: time::Duration = time::Duration::days(365);

/// A certificate is valid from this long before it is issued, for clocks that lag.
const CLOCK_SKEW: time::Duration = time::Duration::minutes(5);

/// The components that get their own bearer token and kubeconfig.
pub const COMPONENTS: &[(&str, &str)] = &[
    (
        "controller",
        "system:serviceaccount:kubevirt:kubevirt-controller",
    ),
    ("handler", "system:serviceaccount:kubevirt:kubevirt-handler"),
    ("api", "system:serviceaccount:kubevirt:kubevirt-apiserver"),
];

/// PKI set-up failures.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Reading or writing a file failed.
    #[error("writing or reading {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Generating or signing a certificate failed.
    #[error("generating {what}")]
    Cert {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
}

/// Loaded or freshly created credentials.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
    pub admin_cert_pem: String,
    pub admin_key_pem: String,
    /// Client certificate and key presented to aggregated API backends, signed by the
    /// front-proxy CA.
    pub proxy_client: (String, String),
    /// The front-proxy CA (PEM), published as `requestheader-client-ca-file`.
    pub front_proxy_ca_pem: String,
    /// Client certificate and key presented to node log servers.
    pub kubelet_client: (String, String),
    /// Bearer token → user name.
    pub tokens: HashMap<String, String>,
    /// Component → its token.
    pub component_tokens: Vec<(String, String)>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |source| PkiError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes `contents` to `path` atomically (temp file, fsync, rename); `private` → 0600.
pub fn write_atomic(path: &Path, contents: &[u8], private: bool) -> Result<(), PkiError> {
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if private { 0o600 } else { 0o644 });
    }
    let mut f = opts.open(&tmp).map_err(io_err(&tmp))?;
    f.write_all(contents).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// The cluster CA's common name.
const CLUSTER_CA_NAME: &str = "kubevirt-rs-ca";
/// The front-proxy CA's common name (kubeadm's `front-proxy-ca`).
const FRONT_PROXY_CA_NAME: &str = "front-proxy-ca";

fn ca_params() -> Result<CertificateParams, PkiError> {
    ca_params_named(CLUSTER_CA_NAME)
}

fn ca_params_named(name: &str) -> Result<CertificateParams, PkiError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|source| PkiError::Cert {
        what: "CA parameters",
        source,
    })?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    p.distinguished_name = dn;
    set_validity(&mut p, CA_LIFETIME);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
}

/// Valid from [`CLOCK_SKEW`] ago for `lifetime` from now.
fn set_validity(p: &mut CertificateParams, lifetime: time::Duration) {
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - CLOCK_SKEW;
    p.not_after = now + lifetime;
}

/// Whether a stored certificate must be issued anew: it does not parse, less than a fifth of
/// its lifetime is left, or (with `issuer_pem`) that CA did not sign it.
fn needs_renewal(cert_pem: &str, issuer_pem: Option<&str>) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return true;
    };
    let Ok(cert) = pem.parse_x509() else {
        return true;
    };
    let validity = cert.validity();
    let (start, end) = (
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    );
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    if end - now < (end - start) / 5 {
        return true;
    }
    let Some(issuer_pem) = issuer_pem else {
        return false;
    };
    let Ok((_, issuer)) = x509_parser::pem::parse_x509_pem(issuer_pem.as_bytes()) else {
        return true;
    };
    let Ok(issuer) = issuer.parse_x509() else {
        return true;
    };
    cert.verify_signature(Some(issuer.public_key())).is_err()
}

fn leaf(
    sans: Vec<String>,
    cn: &str,
    org: Option<&str>,
    eku: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, KeyPair>,
    what: &'static str,
) -> Result<(String, String), PkiError> {
    let cert_err = |source| PkiError::Cert { what, source };
    let key = KeyPair::generate().map_err(cert_err)?;
    let mut p = CertificateParams::new(sans).map_err(cert_err)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    p.distinguished_name = dn;
    set_validity(&mut p, LEAF_LIFETIME);
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![eku];
    p.use_authority_key_identifier_extension = true;
    let cert = p.signed_by(&key, issuer).map_err(cert_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Issues a client certificate and writes it as `pki/{file}.{crt,key}`.
fn client_cert(
    dir: &Path,
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    org: Option<&str>,
    file: &str,
    what: &'static str,
) -> Result<(String, String), PkiError> {
    let (c, k) = leaf(
        Vec::new(),
        cn,
        org,
        ExtendedKeyUsagePurpose::ClientAuth,
        issuer,
        what,
    )?;
    write_atomic(&dir.join(format!("{file}.key")), k.as_bytes(), true)?;
    write_atomic(&dir.join(format!("{file}.crt")), c.as_bytes(), false)?;
    Ok((c, k))
}

/// Issues a client certificate for user `cn` in group `org` (the subject's CN and O, which
/// is how the API server authenticates it) from the cluster CA in `data_dir`: the
/// credentials of the embedded wing's own components (`system:node:<name>` in
/// `system:nodes`, `system:kube-scheduler`, …). Returns certificate and key as PEM; nothing
/// is written.
///
/// # Errors
/// [`PkiError`] when the CA key cannot be read or the certificate not made.
pub fn issue_client_cert(
    data_dir: &Path,
    cn: &str,
    org: Option<&str>,
) -> Result<(String, String), PkiError> {
    let ca_key = data_dir.join("pki").join("ca.key");
    let pem = std::fs::read_to_string(&ca_key).map_err(io_err(&ca_key))?;
    let key = KeyPair::from_pem(&pem).map_err(|source| PkiError::Cert {
        what: "CA key (loading)",
        source,
    })?;
    let issuer = Issuer::new(ca_params()?, key);
    leaf(
        Vec::new(),
        cn,
        org,
        ExtendedKeyUsagePurpose::ClientAuth,
        &issuer,
        "component client certificate",
    )
}

/// Issues a serving certificate for `sans` (IP addresses or DNS names) from the cluster
/// CA in `data_dir` (which must exist): what a node's log server presents (see
/// [`crate::logs`]). Returns the certificate and key as PEM; nothing is written.
pub fn issue_serving_cert(
    data_dir: &Path,
    sans: Vec<String>,
) -> Result<(String, String), PkiError> {
    let ca_key = data_dir.join("pki").join("ca.key");
    let pem = std::fs::read_to_string(&ca_key).map_err(io_err(&ca_key))?;
    let key = KeyPair::from_pem(&pem).map_err(|source| PkiError::Cert {
        what: "CA key (loading)",
        source,
    })?;
    let issuer = Issuer::new(ca_params()?, key);
    let cn = sans.first().cloned().unwrap_or_default();
    leaf(
        sans,
        &cn,
        None,
        ExtendedKeyUsagePurpose::ServerAuth,
        &issuer,
        "node serving certificate",
    )
}

/// The stored CA when it has life left, else a new one (written to `dir`).
fn load_or_create_ca(dir: &Path) -> Result<(String, KeyPair), PkiError> {
    load_or_create_ca_named(dir, "ca", CLUSTER_CA_NAME)
}

/// The CA stored as `<stem>.{crt,key}` in `dir`, created (common name `name`) when missing,
/// unreadable or near its end.
fn load_or_create_ca_named(
    dir: &Path,
    stem: &str,
    name: &str,
) -> Result<(String, KeyPair), PkiError> {
    let (ca_crt, ca_key) = (
        dir.join(format!("{stem}.crt")),
        dir.join(format!("{stem}.key")),
    );
    let stored_ca = match (read(&ca_crt), read(&ca_key)) {
        (Some(c), Some(k)) if !needs_renewal(&c, None) => Some((c, k)),
        (Some(_), Some(_)) => {
            tracing::warn!(ca = %name, "a CA is near its end or unreadable: issuing a new one");
            None
        }
        _ => None,
    };
    Ok(match stored_ca {
        Some((c, k)) => {
            let key = KeyPair::from_pem(&k).map_err(|source| PkiError::Cert {
                what: "CA key (loading)",
                source,
            })?;
            (c, key)
        }
        _ => {
            let key = KeyPair::generate().map_err(|source| PkiError::Cert {
                what: "CA key",
                source,
            })?;
            let cert =
                ca_params_named(name)?
                    .self_signed(&key)
                    .map_err(|source| PkiError::Cert {
                        what: "CA certificate",
                        source,
                    })?;
            write_atomic(&ca_key, key.serialize_pem().as_bytes(), true)?;
            write_atomic(&ca_crt, cert.pem().as_bytes(), false)?;
            (cert.pem(), key)
        }
    })
}

/// Loads the PKI from `data_dir`, creating whatever is missing. The serving certificate is
/// re-issued on every start.
pub fn load_or_create(data_dir: &Path) -> Result<Pki, PkiError> {
    let dir = data_dir.join("pki");
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let (ca_pem, ca_key_pair) = load_or_create_ca(&dir)?;
    let issuer = Issuer::new(ca_params()?, ca_key_pair);
    let (server_cert_pem, server_key_pem) = leaf(
        vec![
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into(),
            // In-cluster clients: the `kubernetes` Service's address and names.
            crate::services::kubernetes_service_ip().to_string(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "kubernetes.default.svc.cluster.local".into(),
        ],
        "kubevirt-rs-apiserver",
        None,
        ExtendedKeyUsagePurpose::ServerAuth,
        &issuer,
        "serving certificate",
    )?;
    write_atomic(&dir.join("server.key"), server_key_pem.as_bytes(), true)?;
    write_atomic(&dir.join("server.crt"), server_cert_pem.as_bytes(), false)?;
    let (admin_crt, admin_key) = (dir.join("admin.crt"), dir.join("admin.key"));
    let (admin_cert_pem, admin_key_pem) = match (read(&admin_crt), read(&admin_key)) {
        (Some(c), Some(k)) if !needs_renewal(&c, Some(&ca_pem)) => (c, k),
        _ => {
            let (c, k) = leaf(
                Vec::new(),
                "kubernetes-admin",
                Some("system:masters"),
                ExtendedKeyUsagePurpose::ClientAuth,
                &issuer,
                "admin client certificate",
            )?;
            write_atomic(&admin_key, k.as_bytes(), true)?;
            write_atomic(&admin_crt, c.as_bytes(), false)?;
            (c, k)
        }
    };
    // The front proxy has a CA of its own, as kubeadm sets it up: aggregated API servers trust
    // `X-Remote-User` from certificates of this CA only, so no cluster-CA client certificate
    // (nodes, components, the admin) can speak for another user to them.
    let (front_proxy_ca_pem, front_proxy_key) =
        load_or_create_ca_named(&dir, "front-proxy-ca", FRONT_PROXY_CA_NAME)?;
    let front_proxy_issuer = Issuer::new(ca_params_named(FRONT_PROXY_CA_NAME)?, front_proxy_key);
    let proxy_client = client_cert(
        &dir,
        &front_proxy_issuer,
        "front-proxy-client",
        None,
        "front-proxy-client",
        "front proxy client certificate",
    )?;
    let kubelet_client = client_cert(
        &dir,
        &issuer,
        "kube-apiserver-kubelet-client",
        None,
        "apiserver-kubelet-client",
        "kubelet client certificate",
    )?;
    let tokens_path = data_dir.join("tokens");
    let mut tokens = HashMap::new();
    let mut component_tokens = Vec::new();
    let existing = read(&tokens_path).unwrap_or_default();
    let mut lines = Vec::new();
    for (component, user) in COMPONENTS {
        let token = existing
            .lines()
            .filter_map(|l| l.split_once(','))
            .find(|(_, u)| u == user)
            .map(|(t, _)| t.to_owned())
            .unwrap_or_else(random_token);
        lines.push(format!("{token},{user}"));
        tokens.insert(token.clone(), (*user).to_owned());
        component_tokens.push(((*component).to_owned(), token));
    }
    write_atomic(&tokens_path, (lines.join("\n") + "\n").as_bytes(), true)?;
    Ok(Pki {
        ca_pem,
        server_cert_pem,
        server_key_pem,
        admin_cert_pem,
        admin_key_pem,
        proxy_client,
        front_proxy_ca_pem,
        kubelet_client,
        tokens,
        component_tokens,
    })
}

/// How a kubeconfig authenticates.
#[derive(Clone, Copy)]
pub enum KubeAuth<'a> {
    ClientCert { cert_pem: &'a str, key_pem: &'a str },
    Token(&'a str),
}

/// A kubeconfig YAML for `server` (`https://127.0.0.1:6443`) trusting `ca_pem`.
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, user: &str, auth: KubeAuth<'_>) -> String {
    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    let creds = match auth {
        KubeAuth::ClientCert { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert_pem),
            b64(key_pem)
        ),
        KubeAuth::Token(t) => format!("    token: {t}\n"),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kubevirt-rs\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n{creds}contexts:\n- name: {user}@kubevirt-rs\n  context:\n    cluster: kubevirt-rs\n    user: {user}\n    namespace: default\ncurrent-context: {user}@kubevirt-rs\npreferences: {{}}\n",
        ca = b64(ca_pem),
    )
}

/// Writes `kubeconfig` (admin) and `kubeconfig-{component}` files for `server`.
pub fn write_kubeconfigs(data_dir: &Path, pki: &Pki, server: &str) -> Result<(), PkiError> {
    for (component, token) in &pki.component_tokens {
        let yaml = kubeconfig_yaml(server, &pki.ca_pem, component, KubeAuth::Token(token));
        write_atomic(
            &data_dir.join(format!("kubeconfig-{component}")),
            yaml.as_bytes(),
            true,
        )?;
    }
    let admin = kubeconfig_yaml(
        server,
        &pki.ca_pem,
        "kubernetes-admin",
        KubeAuth::ClientCert {
            cert_pem: &pki.admin_cert_pem,
            key_pem: &pki.admin_key_pem,
        },
    );
    write_atomic(&data_dir.join("kubeconfig"), admin.as_bytes(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pki_is_created_once_and_reused() {
        let dir = std::env::temp_dir().join(format!("kvrs-pki-{}", uuid::Uuid::new_v4()));
        let a = load_or_create(&dir).unwrap();
        let b = load_or_create(&dir).unwrap();
        assert_eq!(a.ca_pem, b.ca_pem);
        assert_eq!(a.admin_cert_pem, b.admin_cert_pem);
        assert_eq!(a.component_tokens, b.component_tokens);
        assert_eq!(a.tokens.len(), 3);
        write_kubeconfigs(&dir, &a, "https://127.0.0.1:1").unwrap();
        let kc = std::fs::read_to_string(dir.join("kubeconfig")).unwrap();
        assert!(kc.contains("server: https://127.0.0.1:1"));
        assert!(kc.contains("client-key-data: "));
        assert!(dir.join("kubeconfig-controller").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn validity_of(pem: &str) -> (i64, i64) {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        let v = cert.validity();
        (v.not_before.timestamp(), v.not_after.timestamp())
    }

    fn temp_dir() -> PathBuf {
        std::env::temp_dir().join(format!("kvrs-pki-{}", uuid::Uuid::new_v4()))
    }

    /// A client certificate valid from `from_days` to `to_days` around now, signed by `issuer`.
    fn client_cert_valid(issuer: &Issuer<'_, KeyPair>, from_days: i64, to_days: i64) -> String {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now + time::Duration::days(from_days);
        p.not_after = now + time::Duration::days(to_days);
        p.signed_by(&key, issuer).unwrap().pem()
    }

    fn stored_issuer(dir: &Path) -> Issuer<'static, KeyPair> {
        let key = std::fs::read_to_string(dir.join("pki/ca.key")).unwrap();
        Issuer::new(ca_params().unwrap(), KeyPair::from_pem(&key).unwrap())
    }

    #[test]
    fn certificates_have_bounded_lifetimes() {
        let dir = temp_dir();
        let pki = load_or_create(&dir).unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let day = 86_400;
        for (what, pem, lifetime) in [
            ("CA", &pki.ca_pem, CA_LIFETIME),
            ("serving", &pki.server_cert_pem, LEAF_LIFETIME),
            ("admin", &pki.admin_cert_pem, LEAF_LIFETIME),
            ("front proxy", &pki.proxy_client.0, LEAF_LIFETIME),
            ("front-proxy CA", &pki.front_proxy_ca_pem, CA_LIFETIME),
            ("kubelet client", &pki.kubelet_client.0, LEAF_LIFETIME),
        ] {
            let (start, end) = validity_of(pem);
            assert!(
                start <= now && start >= now - day,
                "{what} starts at {start}"
            );
            let left = end - now;
            assert!(
                left > lifetime.whole_seconds() - day && left <= lifetime.whole_seconds(),
                "{what} has {left} s left"
            );
        }
        assert!(CA_LIFETIME.whole_days() <= 3650 && LEAF_LIFETIME.whole_days() <= 366);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_front_proxy_certificate_is_signed_by_a_ca_of_its_own() {
        let dir = temp_dir();
        let pki = load_or_create(&dir).unwrap();
        assert_ne!(pki.front_proxy_ca_pem, pki.ca_pem);
        assert!(
            !needs_renewal(&pki.proxy_client.0, Some(&pki.front_proxy_ca_pem)),
            "signed by the front-proxy CA"
        );
        assert!(
            needs_renewal(&pki.proxy_client.0, Some(&pki.ca_pem)),
            "not by the cluster CA"
        );
        let again = load_or_create(&dir).unwrap();
        assert_eq!(
            again.front_proxy_ca_pem, pki.front_proxy_ca_pem,
            "kept across starts"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_admin_certificate_near_its_end_is_issued_anew() {
        let dir = temp_dir();
        load_or_create(&dir).unwrap();
        let old = client_cert_valid(&stored_issuer(&dir), -300, 10);
        std::fs::write(dir.join("pki/admin.crt"), &old).unwrap();
        let renewed = load_or_create(&dir).unwrap();
        assert_ne!(renewed.admin_cert_pem, old);
        let still_fresh = renewed.admin_cert_pem.clone();
        assert_eq!(load_or_create(&dir).unwrap().admin_cert_pem, still_fresh);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_admin_certificate_from_another_ca_is_issued_anew() {
        let dir = temp_dir();
        load_or_create(&dir).unwrap();
        let other = Issuer::new(ca_params().unwrap(), KeyPair::generate().unwrap());
        let foreign = client_cert_valid(&other, -1, 300);
        std::fs::write(dir.join("pki/admin.crt"), &foreign).unwrap();
        let pki = load_or_create(&dir).unwrap();
        assert_ne!(pki.admin_cert_pem, foreign);
        assert!(!needs_renewal(&pki.admin_cert_pem, Some(&pki.ca_pem)));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_ca_near_its_end_is_replaced_and_its_leaves_with_it() {
        let dir = temp_dir();
        let first = load_or_create(&dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = ca_params().unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(3000);
        params.not_after = now + time::Duration::days(30);
        let old_ca = params.self_signed(&key).unwrap().pem();
        std::fs::write(dir.join("pki/ca.crt"), &old_ca).unwrap();
        std::fs::write(dir.join("pki/ca.key"), key.serialize_pem()).unwrap();
        let pki = load_or_create(&dir).unwrap();
        assert_ne!(pki.ca_pem, old_ca);
        assert_ne!(pki.ca_pem, first.ca_pem);
        assert_ne!(pki.admin_cert_pem, first.admin_cert_pem);
        assert!(!needs_renewal(&pki.admin_cert_pem, Some(&pki.ca_pem)));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
