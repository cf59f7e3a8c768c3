//! Client configuration: whom to trust and who we are.

use std::path::Path;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::pem;
use crate::server::{ConfigError, root_store};

/// How a client verifies the server's certificate.
#[derive(Clone, Debug)]
pub enum ServerTrust<'a> {
    /// The certificate must chain to this PEM CA bundle and name the server.
    CaPem(&'a [u8]),
    /// As [`ServerTrust::CaPem`], with the bundle of this PEM file as it is at each
    /// handshake (a renewed bundle is trusted from the next handshake on).
    CaFile(&'a Path),
    /// Any certificate is accepted; see [`danger_accept_any_server_certificate`].
    DangerAcceptAny,
}

/// A client configuration verifying servers as `trust` says, presenting the PEM
/// `identity` (certificate chain, key) when given, offering HTTP/1.1 by ALPN.
///
/// # Errors
/// When the CA bundle or the identity is unusable.
pub fn client_config(
    trust: &ServerTrust<'_>,
    identity: Option<(&[u8], &[u8])>,
) -> Result<rustls::ClientConfig, ConfigError> {
    let provider = crate::provider();
    let verifier = verifier(trust, &provider)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::ProtocolVersions)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                pem::certificates_from_pem(cert)?,
                pem::private_key_from_pem(key)?,
            )
            .map_err(ConfigError::ClientIdentity)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![crate::ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// A client configuration verifying servers as `trust` says and presenting the client
/// certificate and key of the two PEM files `identity` as they are at each handshake (a
/// renewed pair is presented from the next handshake on; a pair that does not match yet is
/// not, the previous one is presented meanwhile), offering HTTP/1.1 by ALPN.
///
/// # Errors
/// When the CA bundle or the identity is unusable now.
pub fn client_config_following(
    trust: &ServerTrust<'_>,
    identity: (&Path, &Path),
) -> Result<rustls::ClientConfig, ConfigError> {
    let provider = crate::provider();
    let verifier = verifier(trust, &provider)?;
    let identity = crate::verify::FollowedIdentity::new(identity.0, identity.1)?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ConfigError::ProtocolVersions)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(identity));
    config.alpn_protocols = vec![crate::ALPN_HTTP1.to_vec()];
    Ok(config)
}

/// The server certificate verifier of `trust`.
fn verifier(
    trust: &ServerTrust<'_>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, ConfigError> {
    Ok(match trust {
        ServerTrust::CaFile(path) => Arc::new(crate::verify::FollowedServerVerifier::new(
            path,
            provider.clone(),
        )?),
        ServerTrust::CaPem(ca) => {
            WebPkiServerVerifier::builder_with_provider(Arc::new(root_store(ca)?), provider.clone())
                .build()
                .map_err(ConfigError::ServerVerifier)?
        }
        ServerTrust::DangerAcceptAny => danger_accept_any_server_certificate(),
    })
}

/// A verifier that accepts every server certificate (the handshake signature is still
/// checked, so the server holds the key of the certificate it shows — of any certificate).
///
/// Two callers need it today, and each is a gap to close rather than a design:
/// - the API server's client for an `APIService` with `insecureSkipTLSVerify: true`, which
///   Kubernetes honours and so do we;
/// - virt-api's client to the node agents: they serve a self-signed certificate (as
///   kubelet does by default) that no CA virt-api knows signed. Fixed by signing the node
///   agents' serving certificates with the cluster CA (as kubelet's serving-certificate
///   bootstrap does) and verifying against it with [`ServerTrust::CaPem`].
pub fn danger_accept_any_server_certificate() -> Arc<dyn ServerCertVerifier> {
    Arc::new(AcceptAnyServerCertificate(crate::provider()))
}

#[derive(Debug)]
struct AcceptAnyServerCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyServerCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
