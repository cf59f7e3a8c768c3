//! One TLS set-up and one serve loop for every HTTPS listener and client of kubevirt-rs.
//!
//! Data flow of a server: PEM certificate and key → [`SwappableCert`] (a certificate
//! resolver whose key can be replaced at run time) → [`server_config`] (with the client
//! authentication of [`ClientAuth`]) → [`serve`]: accept under a connection cap, TLS
//! handshake with a deadline, HTTP/1.1 with a header-read timeout, the peer's verified
//! certificates in the request extensions ([`PeerCertificates`]), graceful shutdown on a
//! `CancellationToken`.
//!
//! Clients: [`client_config`] with roots from PEM ([`ServerTrust`]) and an optional
//! client identity.
//!
//! Renewals: a certificate, key or CA bundle given as a file ([`SwappableCert::following_files`],
//! [`ClientAuth::RequiredFile`], [`ServerTrust::CaFile`], [`client_config_following`]) is
//! looked at on every handshake and read again when it changed — the one mechanism by which
//! every server and client of KubeVirt follows the certificates its operator renews.
//!
//! This crate knows nothing of Kubernetes: the embedded API server uses it too.

mod client;
mod follow;
mod pem;
mod serve;
mod server;
mod verify;

pub use client::{
    ServerTrust, client_config, client_config_following, danger_accept_any_server_certificate,
};
pub use pem::{PemError, certificates_from_pem, private_key_from_pem};
pub use serve::{
    PeerCertificates, ServeOptions, SpawnError, serve, spawn_serving, spawn_serving_cert,
};
pub use server::{ClientAuth, ConfigError, SwappableCert, self_signed_pem, server_config};

/// The ALPN protocols our servers and clients offer: HTTP/1.1 only (upgrades for
/// websockets and `kubectl exec` need it, and no client of ours speaks HTTP/2).
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The crypto provider of every configuration (ring, as in the rest of the workspace).
fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(test)]
mod tests;
