//! virt-api → virt-handler: the node-side half of pause, unpause, softreboot, console and vnc.
//!
//! Data flow: the VMI's `status.nodeName` → the `Node` object → the handler's REST endpoint
//! in its `kubevirt-rs.io/virt-handler-endpoint` annotation (`host:port`, written by the
//! handler; upstream looks up the node's virt-handler pod and uses its pod IP and port 8186)
//! → HTTPS to `/v1/namespaces/{ns}/virtualmachineinstances/{name}/{pause|unpause|softreboot}`
//! (PUT) or a websocket to `…/{console|vnc}`, as upstream's handler serves them.
//!
//! # Assumptions
//! The client certificate given in [`NodeClientConfig`] is signed by the CA the node agent
//! trusts (in embedded mode the cluster CA: `pki/apiserver-kubelet-client.{crt,key}`
//! under the server's data directory will do).
//!
//! # Caveats
//! The node's serving certificate is verified against
//! [`NodeClientConfig::server_ca_pem`] when given: in embedded mode the node agent serves a
//! certificate the cluster CA signed. A stand-alone `handler` serves a self-signed
//! certificate, as kubelet does by default (kube-apiserver does not verify it either);
//! without a CA the certificate is not verified
//! ([`kubevirt_tls::danger_accept_any_server_certificate`]) until node agents get
//! CA-signed serving certificates everywhere.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::{HeaderValue, Request};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kubevirt_api::v1::VirtualMachineInstance;
use kubevirt_tls::ServerTrust;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use super::error::SubError;

/// The websocket subprotocol of the console and vnc streams (raw bytes in binary frames).
pub const PLAIN_STREAM_PROTOCOL: &str = "plain.kubevirt.io";

/// The client credentials virt-api presents to node agents, and whom it trusts.
#[derive(Clone, Debug)]
pub struct NodeClientConfig {
    /// The client certificate and the CA of the node agents' serving certificates.
    pub credentials: NodeCredentials,
    /// The name the node agent's serving certificate must carry, whatever address it is
    /// reached at ([`HANDLER_SERVER_NAME`] for virt-handler pods, whose addresses are not
    /// known when their certificate is issued); `None`: the address itself.
    pub server_name: Option<String>,
}

/// Where virt-api's client certificate towards the node agents comes from.
#[derive(Clone, Debug)]
pub enum NodeCredentials {
    /// PEM material, fixed for the life of the process.
    Pem {
        /// Client certificate chain, PEM, signed by the cluster CA.
        client_cert_pem: Vec<u8>,
        /// Its private key, PEM.
        client_key_pem: Vec<u8>,
        /// The PEM CA that signed the node agents' serving certificates, when there is one
        /// (embedded mode: the cluster CA); `None` accepts any serving certificate (see the
        /// module's caveats).
        server_ca_pem: Option<Vec<u8>>,
    },
    /// `tls.crt`, `tls.key` and `ca.crt` (the CA bundle the handlers' serving certificates
    /// chain to) of a mounted Secret (`kubevirt-virt-handler-certs`), as they are at each
    /// handshake: renewals are presented and trusted from the next connection on.
    Mounted(std::path::PathBuf),
}

/// The DNS name in virt-handler's serving certificate that virt-api verifies, as upstream
/// verifies the handler's identity rather than its pod address.
pub use kubevirt_api::constants::HANDLER_SERVER_NAME;

/// Where a VMI's launcher pod is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTarget {
    /// Node address (IP or host name).
    pub host: String,
    /// Node agent port.
    pub port: u16,
    /// VMI namespace.
    pub namespace: String,
    /// VMI name.
    pub name: String,
}

/// The Node annotation where virt-handler announces its REST endpoint (`host:port`).
pub const HANDLER_ENDPOINT_ANNOTATION: &str = "kubevirt-rs.io/virt-handler-endpoint";

impl NodeTarget {
    fn path(&self, sub: &str) -> String {
        format!(
            "/v1/namespaces/{}/virtualmachineinstances/{}/{sub}",
            self.namespace, self.name
        )
    }
}

/// A TLS client for node agents.
#[derive(Clone)]
pub struct NodeClient {
    tls: TlsConnector,
    server_name: Option<String>,
}

impl NodeClient {
    /// Builds the TLS client.
    ///
    /// # Errors
    /// When the certificate or key cannot be used.
    pub fn new(config: &NodeClientConfig) -> Result<Self, kubevirt_tls::ConfigError> {
        let cfg = match &config.credentials {
            NodeCredentials::Pem {
                client_cert_pem,
                client_key_pem,
                server_ca_pem,
            } => {
                let trust = match server_ca_pem {
                    Some(ca) => ServerTrust::CaPem(ca),
                    None => ServerTrust::DangerAcceptAny,
                };
                kubevirt_tls::client_config(&trust, Some((client_cert_pem, client_key_pem)))?
            }
            NodeCredentials::Mounted(dir) => kubevirt_tls::client_config_following(
                &ServerTrust::CaFile(&dir.join("ca.crt")),
                (&dir.join("tls.crt"), &dir.join("tls.key")),
            )?,
        };
        Ok(Self {
            tls: TlsConnector::from(Arc::new(cfg)),
            server_name: config.server_name.clone(),
        })
    }

    /// Finds the node and launcher pod serving `vmi`.
    ///
    /// # Errors
    /// 500 when the VMI has no node, the node no address, or no launcher pod is found.
    pub async fn locate(
        client: &kube::Client,
        vmi: &VirtualMachineInstance,
    ) -> Result<NodeTarget, SubError> {
        let node_name = vmi
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| SubError::internal("VMI is not scheduled to a node"))?;
        let node = Api::<Node>::all(client.clone())
            .get(&node_name)
            .await
            .map_err(SubError::internal)?;
        let endpoint = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HANDLER_ENDPOINT_ANNOTATION))
            .ok_or_else(|| {
                SubError::internal(format!(
                    "no virt-handler endpoint known for node {node_name}"
                ))
            })?;
        let addr: std::net::SocketAddr = endpoint.parse().map_err(|e| {
            SubError::internal(format!(
                "virt-handler endpoint {endpoint:?} of node {node_name}: {e}"
            ))
        })?;
        Ok(NodeTarget {
            host: addr.ip().to_string(),
            port: addr.port(),
            namespace: vmi.metadata.namespace.clone().unwrap_or_default(),
            name: vmi.metadata.name.clone().unwrap_or_default(),
        })
    }

    async fn connect(&self, target: &NodeTarget) -> Result<TlsStream<TcpStream>, SubError> {
        let tcp = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| SubError::internal(format!("connecting to the node agent: {e}")))?;
        let expected = self.server_name.as_ref().unwrap_or(&target.host);
        let name = ServerName::try_from(expected.clone())
            .map_err(|e| SubError::internal(format!("node name {expected}: {e}")))?;
        self.tls
            .connect(name, tcp)
            .await
            .map_err(|e| SubError::internal(format!("TLS with the node agent: {e}")))
    }

    /// `PUT`s `sub` (pause, unpause, softreboot) to the node agent. A 4xx answer of the
    /// agent is passed on as a 400 with its message; any other failure is a 500.
    ///
    /// # Errors
    /// See above.
    pub async fn put(&self, target: &NodeTarget, sub: &str) -> Result<(), SubError> {
        self.put_body(target, sub, Bytes::new()).await
    }

    /// `PUT`s `sub` with `body` (JSON: freeze's `unfreezeTimeout`); failures as
    /// [`Self::put`]'s.
    ///
    /// # Errors
    /// See [`Self::put`].
    pub async fn put_body(
        &self,
        target: &NodeTarget,
        sub: &str,
        body: Bytes,
    ) -> Result<(), SubError> {
        self.request(target, hyper::Method::PUT, sub, body)
            .await
            .map(drop)
    }

    /// `GET`s `sub` (the guest agent's guestosinfo, userlist, filesystemlist) from the node
    /// agent and returns its body (JSON); failures as [`Self::put`]'s.
    ///
    /// # Errors
    /// See [`Self::put`].
    pub async fn get(&self, target: &NodeTarget, sub: &str) -> Result<Bytes, SubError> {
        self.request(target, hyper::Method::GET, sub, Bytes::new())
            .await
    }

    async fn request(
        &self,
        target: &NodeTarget,
        method: hyper::Method,
        sub: &str,
        body: Bytes,
    ) -> Result<Bytes, SubError> {
        let stream = self.connect(target).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(SubError::internal)?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(target.path(sub))
            .header("host", format!("{}:{}", target.host, target.port))
            .body(axum::body::Body::from(body))
            .map_err(SubError::internal)?;
        let res = sender.send_request(req).await.map_err(SubError::internal)?;
        let status = res.status();
        let body = axum::body::to_bytes(axum::body::Body::new(res.into_body()), 1 << 20)
            .await
            .unwrap_or_default();
        if status.is_success() {
            return Ok(body);
        }
        let message = String::from_utf8_lossy(&body).trim().to_owned();
        if status.is_client_error() {
            Err(SubError::bad_request(message))
        } else {
            Err(SubError::internal(message))
        }
    }

    /// Opens the websocket of `sub` (console, vnc) on the node agent.
    ///
    /// # Errors
    /// The agent's 4xx answer as a 400 with its message; other failures as 500.
    pub async fn websocket(
        &self,
        target: &NodeTarget,
        sub: &str,
    ) -> Result<WebSocketStream<TlsStream<TcpStream>>, SubError> {
        let stream = self.connect(target).await?;
        let url = format!("wss://{}:{}{}", target.host, target.port, target.path(sub));
        let mut req = url.into_client_request().map_err(SubError::internal)?;
        req.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static(PLAIN_STREAM_PROTOCOL),
        );
        match tokio_tungstenite::client_async(req, stream).await {
            Ok((ws, _)) => Ok(ws),
            Err(tokio_tungstenite::tungstenite::Error::Http(res)) => {
                let message = res
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).trim().to_owned())
                    .unwrap_or_default();
                if res.status().is_client_error() {
                    Err(SubError::bad_request(message))
                } else {
                    Err(SubError::internal(message))
                }
            }
            Err(e) => Err(SubError::internal(e)),
        }
    }
}
