//! The server's PKI: a private CA, the serving certificate, the admin client certificate,
//! per-component bearer tokens, and the kubeconfig files that carry them.
//!
//! Layout under the data directory:
//! `pki/ca.{crt,key}`, `pki/server.{crt,key}`, `pki/admin.{crt,key}`,
//! `pki/front-proxy-client.{crt,key}` (CN `front-proxy-client`: the server's identity
//! towards aggregated API backends, which trust the `X-Remote-User`/`X-Remote-Group`
//! headers of a client presenting it), `pki/apiserver-kubelet-client.{crt,key}` (CN
//! `kube-apiserver-kubelet-client`, O `system:masters`: the server's identity towards node
//! log servers, see [`crate::logs`]), `tokens`
//! (`token,user` lines), `kubeconfig` (admin, client certificate) and
//! `kubeconfig-{controller,handler,api}` (bearer tokens). Every file is written atomically
//! (temporary file + rename); keys and tokens are mode 0600.
//!
//! Caveat: certificates are long-lived and not rotated yet.

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
    /// Client certificate and key presented to aggregated API backends.
    pub proxy_client: (String, String),
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

fn ca_params() -> Result<CertificateParams, PkiError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|source| PkiError::Cert {
        what: "CA parameters",
        source,
    })?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kubevirt-rs-ca");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(p)
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

/// Loads the PKI from `data_dir`, creating whatever is missing. The serving certificate is
/// re-issued on every start.
pub fn load_or_create(data_dir: &Path) -> Result<Pki, PkiError> {
    let dir = data_dir.join("pki");
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let (ca_crt, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
    let (ca_pem, ca_key_pair) = match (read(&ca_crt), read(&ca_key)) {
        (Some(c), Some(k)) => {
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
            let cert = ca_params()?
                .self_signed(&key)
                .map_err(|source| PkiError::Cert {
                    what: "CA certificate",
                    source,
                })?;
            write_atomic(&ca_key, key.serialize_pem().as_bytes(), true)?;
            write_atomic(&ca_crt, cert.pem().as_bytes(), false)?;
            (cert.pem(), key)
        }
    };
    let issuer = Issuer::new(ca_params()?, ca_key_pair);
    let (server_cert_pem, server_key_pem) = leaf(
        vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
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
        (Some(c), Some(k)) => (c, k),
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
    let proxy_client = client_cert(
        &dir,
        &issuer,
        "front-proxy-client",
        None,
        "front-proxy-client",
        "front proxy client certificate",
    )?;
    let kubelet_client = client_cert(
        &dir,
        &issuer,
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
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
}
