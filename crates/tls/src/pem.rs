//! PEM decoding of certificates and keys, from bytes or files.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Failures to read PEM material.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    /// Reading a PEM file failed.
    #[error("reading {0}")]
    ReadFile(PathBuf, #[source] std::io::Error),
    /// A certificate block could not be decoded.
    #[error("decoding a PEM certificate")]
    DecodeCertificate(#[source] rustls::pki_types::pem::Error),
    /// The PEM holds no certificate.
    #[error("no certificate in the PEM")]
    NoCertificate,
    /// The private key could not be decoded (or there is none).
    #[error("decoding the PEM private key")]
    DecodePrivateKey(#[source] rustls::pki_types::pem::Error),
}

/// Every certificate of a PEM bundle, in order; at least one.
///
/// # Errors
/// When a block is malformed or the bundle holds no certificate.
pub fn certificates_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(PemError::DecodeCertificate)?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM document.
///
/// # Errors
/// When there is no usable key.
pub fn private_key_from_pem(pem: &[u8]) -> Result<PrivateKeyDer<'static>, PemError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(PemError::DecodePrivateKey)
}

/// The bytes of a PEM file.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, PemError> {
    std::fs::read(path).map_err(|e| PemError::ReadFile(path.to_owned(), e))
}
