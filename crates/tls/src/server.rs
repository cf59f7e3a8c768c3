//! Server configuration: a swappable certificate and the client authentication policy.
//!
//! # Guarantees
//! [`SwappableCert::swap`] takes effect for every handshake that starts after it returns;
//! connections already established keep the certificate they were served. A certificate
//! that follows its files ([`SwappableCert::following_files`]) and a client CA bundle that
//! follows its file ([`ClientAuth::RequiredFile`]) are looked at on every handshake (see
//! [`crate::follow`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::RootCertStore;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;

use crate::follow::Followed;
use crate::pem::{self, PemError};

/// Failures to build a TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The PEM material could not be read.
    #[error("reading PEM material")]
    Pem(#[from] PemError),
    /// The private key is of a kind the crypto provider cannot sign with.
    #[error("loading the private key")]
    LoadPrivateKey(#[source] rustls::Error),
    /// The private key does not belong to the certificate.
    #[error("matching the private key to the certificate")]
    KeyMismatch(#[source] rustls::Error),
    /// A CA certificate could not be added to the trust store.
    #[error("adding a CA certificate to the trust store")]
    AddCaCertificate(#[source] rustls::Error),
    /// The client certificate verifier could not be built.
    #[error("building the client certificate verifier")]
    ClientVerifier(#[source] rustls::server::VerifierBuilderError),
    /// The server certificate verifier could not be built.
    #[error("building the server certificate verifier")]
    ServerVerifier(#[source] rustls::client::VerifierBuilderError),
    /// The protocol versions are not supported by the crypto provider.
    #[error("choosing the protocol versions")]
    ProtocolVersions(#[source] rustls::Error),
    /// The client identity could not be used.
    #[error("setting the client identity")]
    ClientIdentity(#[source] rustls::Error),
}

/// A server certificate resolver whose certificate and key can be replaced while serving
/// (certificate rotation without restart): swapped in by the caller, or read again from
/// their files whenever those change.
#[derive(Debug)]
pub struct SwappableCert {
    current: RwLock<Arc<CertifiedKey>>,
    files: Option<Followed<CertifiedKey>>,
}

impl SwappableCert {
    /// A resolver serving the PEM certificate chain and key.
    ///
    /// # Errors
    /// When the PEM is unusable or the key does not match the certificate.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<Self>, ConfigError> {
        Ok(Arc::new(Self {
            current: RwLock::new(certified_key(cert_pem, key_pem)?),
            files: None,
        }))
    }

    /// A resolver serving the certificate chain and key of the two PEM files as they are at
    /// each handshake: a renewal written to them (in place, or by switching a volume's
    /// `..data` link) is served from the next handshake on; a pair that does not match yet
    /// (one file written, not the other) is not, the previous pair is served meanwhile.
    ///
    /// # Errors
    /// When a file cannot be read now or its content is unusable.
    pub fn following_files(cert: &Path, key: &Path) -> Result<Arc<Self>, ConfigError> {
        let files = Followed::new(vec![cert.to_owned(), key.to_owned()], |c| {
            certified_key(&c[0], &c[1])
        })?;
        Ok(Arc::new(Self {
            current: RwLock::new(files.current()),
            files: Some(files),
        }))
    }

    /// A resolver serving the certificate chain and key in the two PEM files.
    ///
    /// # Errors
    /// When a file cannot be read or its content is unusable.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Arc<Self>, ConfigError> {
        Self::from_pem(&pem::read(cert)?, &pem::read(key)?)
    }

    /// Serves a new certificate chain and key to the next handshakes.
    ///
    /// # Errors
    /// When the PEM is unusable; the current certificate then stays.
    pub fn swap_pem(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), ConfigError> {
        let key = certified_key(cert_pem, key_pem)?;
        self.swap(key);
        Ok(())
    }

    /// Serves `key` to the next handshakes (of a resolver made from PEM; one that follows its
    /// files serves what they hold).
    pub fn swap(&self, key: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = key;
    }

    /// The certificate and key currently served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        if let Some(files) = &self.files {
            return files.current();
        }
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesServerCert for SwappableCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// A certificate chain with its signing key, checked to belong together.
pub(crate) fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<CertifiedKey>, ConfigError> {
    let certs = pem::certificates_from_pem(cert_pem)?;
    let key = pem::private_key_from_pem(key_pem)?;
    let signing = crate::provider()
        .key_provider
        .load_private_key(key)
        .map_err(ConfigError::LoadPrivateKey)?;
    let key = CertifiedKey::new(certs, signing);
    key.keys_match().map_err(ConfigError::KeyMismatch)?;
    Ok(Arc::new(key))
}

/// Whether and how clients authenticate with a certificate.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// No client certificates are asked for.
    None,
    /// A client may present a certificate; if it does, it must chain to this PEM CA
    /// bundle. Requests of clients without one carry no [`crate::PeerCertificates`].
    Optional(Vec<u8>),
    /// Every client must present a certificate chaining to this PEM CA bundle; the
    /// handshake fails otherwise.
    Required(Vec<u8>),
    /// As [`ClientAuth::Required`], with the CA bundle of this PEM file as it is at each
    /// handshake (a renewed bundle is trusted from the next handshake on).
    RequiredFile(PathBuf),
}

/// The trust store of a PEM CA bundle.
pub(crate) fn root_store(ca_pem: &[u8]) -> Result<RootCertStore, ConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in pem::certificates_from_pem(ca_pem)? {
        roots.add(cert).map_err(ConfigError::AddCaCertificate)?;
    }
    Ok(roots)
}

/// A server configuration serving `cert`, authenticating clients as `client_auth` says,
/// offering HTTP/1.1 by ALPN.
///
/// # Errors
/// When the client CA bundle is unusable.
pub fn server_config(
    cert: Arc<SwappableCert>,
    client_auth: &ClientAuth,
) -> Result<rustls::ServerConfig, ConfigError> {
    let provider = crate::provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::ProtocolVersions)?;
    let builder = match client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::RequiredFile(path) => builder.with_client_cert_verifier(Arc::new(
            crate::verify::FollowedClientVerifier::new(path, provider)?,
        )),
        ClientAuth::Optional(ca) | ClientAuth::Required(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(ca)?), provider);
            let verifier = if matches!(client_auth, ClientAuth::Optional(_)) {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder
                .with_client_cert_verifier(verifier.build().map_err(ConfigError::ClientVerifier)?)
        }
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![crate::ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// A self-signed serving certificate and key (PEM) for `names`, as kubelet makes one when it
/// is given none.
///
/// # Errors
/// When key generation or signing fails.
pub fn self_signed_pem(names: Vec<String>) -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(names)?.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}
