//! Verifiers and a client identity that follow their PEM files (see [`crate::follow`]): a
//! renewed CA bundle or client certificate is used from the next handshake on.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::follow::Followed;
use crate::server::{ConfigError, certified_key, root_store};

/// Client certificates must chain to the CA bundle of a file, as it is at each handshake.
#[derive(Debug)]
pub(crate) struct FollowedClientVerifier(Followed<dyn ClientCertVerifier>);

impl FollowedClientVerifier {
    pub(crate) fn new(ca: &Path, provider: Arc<CryptoProvider>) -> Result<Self, ConfigError> {
        Ok(Self(Followed::new(vec![ca.to_owned()], move |c| {
            let verifier: Arc<dyn ClientCertVerifier> =
                WebPkiClientVerifier::builder_with_provider(
                    Arc::new(root_store(&c[0])?),
                    provider.clone(),
                )
                .build()
                .map_err(ConfigError::ClientVerifier)?;
            Ok(verifier)
        })?))
    }
}

impl ClientCertVerifier for FollowedClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // The hints are optional; the bundle they would name may change under us.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().supported_verify_schemes()
    }
}

/// Server certificates must chain to the CA bundle of a file, as it is at each handshake.
#[derive(Debug)]
pub(crate) struct FollowedServerVerifier(Followed<dyn ServerCertVerifier>);

impl FollowedServerVerifier {
    pub(crate) fn new(ca: &Path, provider: Arc<CryptoProvider>) -> Result<Self, ConfigError> {
        Ok(Self(Followed::new(vec![ca.to_owned()], move |c| {
            let verifier: Arc<dyn ServerCertVerifier> =
                WebPkiServerVerifier::builder_with_provider(
                    Arc::new(root_store(&c[0])?),
                    provider.clone(),
                )
                .build()
                .map_err(ConfigError::ServerVerifier)?;
            Ok(verifier)
        })?))
    }
}

impl ServerCertVerifier for FollowedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0.current().verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.current().supported_verify_schemes()
    }
}

/// The client certificate and key of two PEM files, as they are at each handshake.
#[derive(Debug)]
pub(crate) struct FollowedIdentity(Followed<CertifiedKey>);

impl FollowedIdentity {
    pub(crate) fn new(cert: &Path, key: &Path) -> Result<Self, ConfigError> {
        Ok(Self(Followed::new(
            vec![cert.to_owned(), key.to_owned()],
            |c| certified_key(&c[0], &c[1]),
        )?))
    }
}

impl ResolvesClientCert for FollowedIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
