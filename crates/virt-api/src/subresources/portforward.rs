//! `portforward`: a websocket tunnel to a TCP port of the guest, as upstream's
//! `PortForwardRequestHandler` with its `netDial`.
//!
//! Data flow: `GET …/{virtualmachineinstances|virtualmachines}/{name}/portforward/{port}[/{protocol}]`
//! → the VMI (for a VM: the VMI it created) → upstream's checks ([`check_portforward`]: not
//! paused, an address in `status.interfaces[0]`) → this server dials that address and port
//! (for masquerade the pod IP, whose DNAT leads to the guest; for the bridge binding the
//! guest holds the pod IP itself) → the client's request is upgraded (subprotocol
//! `plain.kubevirt.io`, raw bytes in binary frames) → bytes are copied both ways until either
//! side closes. The dial comes before the upgrade, so a refused port reaches the client as
//! an HTTP error.
//!
//! # Caveats
//! - UDP (`…/portforward/{port}/udp`): one binary frame per datagram, as upstream.
//! - virt-api must reach the pod network (true on one machine, and on clusters whose pod
//!   network virt-api's pod is on).

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstanceConditionType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tracing::{debug, warn};

use super::error::{Res, SubError};
use super::node::PLAIN_STREAM_PROTOCOL;
use super::{Ctx, get_vm, get_vmi};
use crate::metrics::StreamKind;

type Upgrade = Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>;

/// A parsed `{port}[/{protocol}]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The guest port.
    pub port: u16,
    /// TCP or UDP.
    pub udp: bool,
}

/// Reads the path's port and protocol (default `tcp`).
///
/// # Errors
/// 400 for a port that is not a number in 1..=65535 or a protocol other than tcp/udp.
pub fn parse_target(port: &str, protocol: Option<&str>) -> Result<Target, SubError> {
    if port.is_empty() {
        return Err(SubError::bad_request("port must not be empty"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| SubError::bad_request(format!("invalid port: {port}")))?;
    match protocol.unwrap_or("tcp") {
        "tcp" => Ok(Target { port, udp: false }),
        "udp" => Ok(Target { port, udp: true }),
        other => Err(SubError::bad_request(format!("unknown protocol: {other}"))),
    }
}

/// Upstream's checks before `portforward`: the address to dial, `status.interfaces[0]`'s.
///
/// # Errors
/// 409 when paused, 400 without network interfaces (or without an address on the first).
pub fn check_portforward(vmi: &VirtualMachineInstance) -> Result<IpAddr, SubError> {
    let name = vmi.metadata.name.as_deref().unwrap_or("");
    let status = vmi.status.as_ref();
    let paused = status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == VirtualMachineInstanceConditionType::Paused)
    });
    if paused {
        return Err(SubError::conflict(Res::Vmi, name, "VMI is paused"));
    }
    let first = status
        .and_then(|s| s.interfaces.first())
        .ok_or_else(|| SubError::bad_request("no network interfaces are present"))?;
    first
        .ip_address
        .as_deref()
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| SubError::bad_request("no IP address on the first network interface"))
}

/// The VMI a VM created (upstream's `FetchVirtualMachineInstanceForVM`).
async fn vmi_of_vm(ctx: &Ctx, ns: &str, name: &str) -> Result<VirtualMachineInstance, SubError> {
    let vm = get_vm(ctx, ns, name).await?;
    if vm.status.as_ref().and_then(|s| s.created) != Some(true) {
        return Err(SubError::conflict(Res::Vm, name, "VMI is not started"));
    }
    let vmi = get_vmi(ctx, ns, name).await?;
    let owned = vmi
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| Some(&r.uid) == vm.metadata.uid.as_ref());
    if owned {
        Ok(vmi)
    } else {
        Err(SubError::internal(format!(
            "unable to retrieve vmi [{name}] for vm"
        )))
    }
}

/// What a client's websocket message carries for the guest.
enum Payload {
    /// Bytes (a binary frame, or a text frame's bytes).
    Data(axum::body::Bytes),
    /// The client closed.
    Closed,
    /// Ping or pong: nothing for the guest.
    Control,
}

fn payload(msg: Message) -> Payload {
    match msg {
        Message::Binary(b) => Payload::Data(b),
        Message::Text(t) => {
            Payload::Data(axum::body::Bytes::copy_from_slice(t.as_str().as_bytes()))
        }
        Message::Close(_) => Payload::Closed,
        Message::Ping(_) | Message::Pong(_) => Payload::Control,
    }
}

/// One binary frame per datagram, both ways, until the client closes (upstream's UDP
/// tunnel: a frame is a datagram).
async fn udp_tunnel(client: WebSocket, guest: UdpSocket) {
    let (mut tx, mut rx) = client.split();
    let up = async {
        while let Some(Ok(msg)) = rx.next().await {
            let data = match payload(msg) {
                Payload::Data(data) => data,
                Payload::Closed => break,
                Payload::Control => continue,
            };
            // A datagram the guest refuses (ICMP unreachable) is lost, as UDP's are.
            let _ = guest.send(&data).await;
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match guest.recv(&mut buf).await {
                Ok(n) => {
                    let frame = Message::Binary(axum::body::Bytes::copy_from_slice(&buf[..n]));
                    if tx.send(frame).await.is_err() {
                        break;
                    }
                }
                // An earlier datagram was refused: keep listening.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                Err(_) => break,
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

async fn tunnel(client: WebSocket, guest: TcpStream) {
    let (mut tx, mut rx) = client.split();
    let (mut guest_rx, mut guest_tx) = guest.into_split();
    let up = async {
        while let Some(Ok(msg)) = rx.next().await {
            let data = match payload(msg) {
                Payload::Data(data) => data,
                Payload::Closed => break,
                Payload::Control => continue,
            };
            if guest_tx.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = guest_tx.shutdown().await;
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match guest_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let frame = Message::Binary(axum::body::Bytes::copy_from_slice(&buf[..n]));
                    if tx.send(frame).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = tx.close().await;
    };
    // The guest's answer may still be on its way after the client stopped sending, so the
    // tunnel ends when the guest side has closed (or the client went away entirely).
    let (up, down) = (Box::pin(up), Box::pin(down));
    match futures::future::select(up, down).await {
        futures::future::Either::Left(((), down)) => down.await,
        futures::future::Either::Right(((), _)) => {}
    }
}

/// The tunnel is counted under the requested name (for a VM, the VM's), as upstream.
async fn forward(
    ctx: &Ctx,
    (ns, name): (&str, &str),
    vmi: &VirtualMachineInstance,
    target: Target,
    upgrade: Upgrade,
) -> Result<Response, SubError> {
    let ip = check_portforward(vmi)?;
    let upgrade = upgrade.map_err(|e| SubError::bad_request(e.body_text()))?;
    let addr = std::net::SocketAddr::new(ip, target.port);
    if target.udp {
        let unspecified: IpAddr = if ip.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        };
        let dial = async {
            let socket = UdpSocket::bind((unspecified, 0)).await?;
            socket.connect(addr).await?;
            Ok::<_, std::io::Error>(socket)
        };
        let guest = dial
            .await
            .map_err(|e| SubError::internal(format!("dialing VM: dial udp {addr}: {e}")))?;
        debug!(%addr, "port-forward udp tunnel open");
        let active = ctx.metrics.open(StreamKind::PortForward, ns, name);
        return Ok(upgrade.protocols([PLAIN_STREAM_PROTOCOL]).on_upgrade(
            move |socket| async move {
                udp_tunnel(socket, guest).await;
                drop(active);
            },
        ));
    }
    let guest = TcpStream::connect(addr).await.map_err(|e| {
        warn!(%addr, error = %e, "port-forward dial failed");
        SubError::internal(format!("dialing VM: dial tcp {addr}: {e}"))
    })?;
    debug!(%addr, "port-forward tunnel open");
    let active = ctx.metrics.open(StreamKind::PortForward, ns, name);
    Ok(upgrade
        .protocols([PLAIN_STREAM_PROTOCOL])
        .on_upgrade(move |socket| async move {
            tunnel(socket, guest).await;
            drop(active);
        }))
}

async fn vmi_forward(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    port: &str,
    protocol: Option<&str>,
    upgrade: Upgrade,
) -> Result<Response, SubError> {
    let target = parse_target(port, protocol)?;
    let vmi = get_vmi(ctx, ns, name).await?;
    forward(ctx, (ns, name), &vmi, target, upgrade).await
}

async fn vm_forward(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    port: &str,
    protocol: Option<&str>,
    upgrade: Upgrade,
) -> Result<Response, SubError> {
    let target = parse_target(port, protocol)?;
    let vmi = vmi_of_vm(ctx, ns, name).await?;
    forward(ctx, (ns, name), &vmi, target, upgrade).await
}

/// `GET …/virtualmachineinstances/{name}/portforward/{port}` (websocket).
pub(super) async fn vmi_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name, port)): Path<(String, String, String)>,
    upgrade: Upgrade,
) -> Response {
    vmi_forward(&ctx, &ns, &name, &port, None, upgrade)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET …/virtualmachineinstances/{name}/portforward/{port}/{protocol}` (websocket).
pub(super) async fn vmi_protocol_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name, port, protocol)): Path<(String, String, String, String)>,
    upgrade: Upgrade,
) -> Response {
    vmi_forward(&ctx, &ns, &name, &port, Some(&protocol), upgrade)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET …/virtualmachines/{name}/portforward/{port}` (websocket).
pub(super) async fn vm_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name, port)): Path<(String, String, String)>,
    upgrade: Upgrade,
) -> Response {
    vm_forward(&ctx, &ns, &name, &port, None, upgrade)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET …/virtualmachines/{name}/portforward/{port}/{protocol}` (websocket).
pub(super) async fn vm_protocol_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name, port, protocol)): Path<(String, String, String, String)>,
    upgrade: Upgrade,
) -> Response {
    vm_forward(&ctx, &ns, &name, &port, Some(&protocol), upgrade)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vmi(status: &serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}}, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_first_interface_address_is_dialled() {
        let v = vmi(&json!({"phase": "Running", "interfaces": [
            {"name": "default", "ipAddress": "10.245.0.7"}, {"name": "b", "ipAddress": "10.1.1.1"}]}));
        assert_eq!(
            check_portforward(&v).unwrap(),
            "10.245.0.7".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn a_vmi_without_interfaces_or_paused_is_refused_as_upstream() {
        let e = check_portforward(&vmi(&json!({"phase": "Running"}))).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "no network interfaces are present")
        );
        let paused = vmi(
            &json!({"phase": "Running", "interfaces": [{"ipAddress": "10.0.0.1"}],
            "conditions": [{"type": "Paused", "status": "True"}]}),
        );
        let e = check_portforward(&paused).unwrap_err();
        assert_eq!(e.code, 409);
        assert!(e.message.ends_with("VMI is paused"), "{}", e.message);
    }

    #[test]
    fn ports_and_protocols_are_checked() {
        assert_eq!(parse_target("8080", None).unwrap().port, 8080);
        assert_eq!(parse_target("22", Some("tcp")).unwrap().port, 22);
        for (port, protocol) in [("0", None), ("x", None), ("70000", None), ("", None)] {
            assert_eq!(parse_target(port, protocol).unwrap_err().code, 400);
        }
        assert!(parse_target("53", Some("udp")).unwrap().udp);
        assert!(!parse_target("53", None).unwrap().udp);
        assert_eq!(parse_target("53", Some("sctp")).unwrap_err().code, 400);
    }
}
