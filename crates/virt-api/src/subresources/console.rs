//! `console` and `vnc`: websocket streams of the VMI's serial console and VNC display.
//!
//! Data flow: checks on the VMI (Status objects with their own code on refusal) → the
//! node agent's websocket is opened first, so its refusal still reaches the client as an
//! HTTP error → the client's request is upgraded (subprotocol `plain.kubevirt.io`, raw
//! bytes in binary frames) → frames are copied both ways until either side closes.

use std::sync::Arc;

use axum::extract::ws::{Message as ClientMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstancePhase};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as NodeMessage;

use super::error::{Res, SubError};
use super::node::{NodeClient, PLAIN_STREAM_PROTOCOL};
use super::state_change::phase;
use super::{Ctx, get_vmi};
use crate::metrics::StreamKind;

/// Upstream's checks before `console`.
///
/// # Errors
/// 400 without serial console or not running, 409 when failed.
pub fn check_console(vmi: &VirtualMachineInstance) -> Result<(), SubError> {
    if vmi.spec.domain.devices.autoattach_serial_console == Some(false) {
        return Err(SubError::bad_request("No serial consoles are present."));
    }
    match phase(vmi) {
        VirtualMachineInstancePhase::Failed => Err(SubError::conflict(
            Res::Vmi,
            vmi.metadata.name.as_deref().unwrap_or(""),
            "VMI is in failed status",
        )),
        VirtualMachineInstancePhase::Running => Ok(()),
        _ => Err(SubError::bad_request("VMI is not running")),
    }
}

/// Upstream's checks before `vnc`.
///
/// # Errors
/// 400 without graphics device or not running.
pub fn check_vnc(vmi: &VirtualMachineInstance) -> Result<(), SubError> {
    if vmi.spec.domain.devices.autoattach_graphics_device == Some(false) {
        return Err(SubError::bad_request("No graphics devices are present."));
    }
    if phase(vmi) != VirtualMachineInstancePhase::Running {
        return Err(SubError::bad_request("VMI is not running"));
    }
    Ok(())
}

async fn bridge<S>(client: WebSocket, node: WebSocketStream<S>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_tx, mut client_rx) = client.split();
    let (mut node_tx, mut node_rx) = node.split();
    let up = async {
        while let Some(Ok(msg)) = client_rx.next().await {
            let data = match msg {
                ClientMessage::Binary(b) => b,
                ClientMessage::Text(t) => axum::body::Bytes::copy_from_slice(t.as_str().as_bytes()),
                ClientMessage::Close(_) => break,
                ClientMessage::Ping(_) | ClientMessage::Pong(_) => continue,
            };
            if node_tx.send(NodeMessage::Binary(data)).await.is_err() {
                break;
            }
        }
        let _ = node_tx.close().await;
    };
    let down = async {
        while let Some(Ok(msg)) = node_rx.next().await {
            let data = match msg {
                NodeMessage::Binary(b) => b,
                NodeMessage::Text(t) => axum::body::Bytes::copy_from_slice(t.as_str().as_bytes()),
                NodeMessage::Close(_) => break,
                _ => continue,
            };
            if client_tx.send(ClientMessage::Binary(data)).await.is_err() {
                break;
            }
        }
        let _ = client_tx.close().await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

async fn stream(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    sub: &'static str,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, SubError> {
    let vmi = get_vmi(ctx, ns, name).await?;
    if sub == "console" {
        check_console(&vmi)?;
    } else {
        check_vnc(&vmi)?;
    }
    let upgrade = upgrade.map_err(|e| SubError::bad_request(e.body_text()))?;
    let node = ctx
        .node
        .as_ref()
        .ok_or_else(|| SubError::internal("no client credentials for node agents configured"))?;
    let target = NodeClient::locate(&ctx.client, &vmi).await?;
    let node_ws = node.websocket(&target, sub).await?;
    let kind = if sub == "console" {
        StreamKind::Console
    } else {
        StreamKind::Vnc
    };
    let active = ctx.metrics.open(kind, ns, name);
    Ok(upgrade
        .protocols([PLAIN_STREAM_PROTOCOL])
        .on_upgrade(move |socket| async move {
            bridge(socket, node_ws).await;
            drop(active);
        }))
}

/// `GET …/virtualmachineinstances/{name}/console` (websocket).
pub(super) async fn console_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    stream(&ctx, &ns, &name, "console", upgrade)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET …/virtualmachineinstances/{name}/vnc` (websocket).
pub(super) async fn vnc_handler(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, name)): Path<(String, String)>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    stream(&ctx, &ns, &name, "vnc", upgrade)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn vmi(phase: &str, devices: serde_json::Value) -> VirtualMachineInstance {
        let mut v = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v"},
            "spec": {"domain": {}}, "status": {"phase": phase},
        });
        v["spec"]["domain"]["devices"] = devices;
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn console_refuses_missing_serial_failed_and_not_running_vmis() {
        assert!(check_console(&vmi("Running", json!({}))).is_ok());
        let e =
            check_console(&vmi("Running", json!({"autoattachSerialConsole": false}))).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "No serial consoles are present.")
        );
        assert_eq!(
            check_console(&vmi("Failed", json!({}))).unwrap_err().code,
            409
        );
        let e = check_console(&vmi("Scheduled", json!({}))).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, "VMI is not running"));
    }

    #[test]
    fn vnc_refuses_missing_graphics_and_not_running_vmis() {
        let e = check_vnc(&vmi("Running", json!({"autoattachGraphicsDevice": false}))).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "No graphics devices are present.")
        );
        assert_eq!(check_vnc(&vmi("Pending", json!({}))).unwrap_err().code, 400);
    }
}
