//! One handler connection: hello, then commands in and domain events out.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;

use super::domain::Domain;
use crate::protocol::{DownMessage, Hello, PROTOCOL_VERSION, UpMessage};

/// Serves one connection until the handler hangs up or breaks the protocol.
pub(super) async fn serve(domain: Arc<Domain>, stream: UnixStream) {
    if let Err(e) = serve_inner(&domain, stream).await {
        tracing::debug!(error = %e, "handler connection ended");
    }
}

async fn serve_inner(domain: &Domain, stream: UnixStream) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    send(
        &mut write,
        &UpMessage::Hello(Hello {
            pod_interface: domain.pod_interface().cloned(),
            vmi_uid: domain.vmi_uid().map(str::to_owned),
            ..Hello::current()
        }),
    )
    .await?;
    let Some(first) = lines.next_line().await? else {
        return Ok(());
    };
    match DownMessage::decode(&first) {
        Ok(DownMessage::Hello(Hello {
            version: PROTOCOL_VERSION,
            ..
        })) => {}
        Ok(DownMessage::Hello(Hello { version, .. })) => {
            let message = format!(
                "unsupported protocol version {version}, this launcher speaks {PROTOCOL_VERSION}"
            );
            return send(&mut write, &UpMessage::Error(message)).await;
        }
        Ok(DownMessage::Command { .. }) | Err(_) => {
            return send(&mut write, &UpMessage::Error("expected hello first".into())).await;
        }
    }
    let mut status = domain.subscribe();
    let current = status.borrow_and_update().clone();
    send(&mut write, &UpMessage::Domain(current.clone())).await?;
    if current.is_final() {
        domain.mark_delivered();
    }
    loop {
        tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line? else { return Ok(()) };
                let reply = match DownMessage::decode(&line) {
                    Ok(DownMessage::Command { id, command }) => {
                        UpMessage::Ack { id, result: domain.execute(command).await }
                    }
                    Ok(DownMessage::Hello(_)) => UpMessage::Error("hello was already exchanged".into()),
                    Err(e) => match DownMessage::undecodable_command_id(&line) {
                        // A newer handler's command (or spec field): answer it, never leave
                        // the handler waiting for an ack.
                        Some(id) => UpMessage::Ack {
                            id,
                            result: Err(format!(
                                "this launcher (protocol version {PROTOCOL_VERSION}) does not understand the command: {e}"
                            )),
                        },
                        None => UpMessage::Error(e.to_string()),
                    },
                };
                send(&mut write, &reply).await?;
            }
            changed = status.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                let latest = status.borrow_and_update().clone();
                send(&mut write, &UpMessage::Domain(latest.clone())).await?;
                if latest.is_final() {
                    domain.mark_delivered();
                }
            }
        }
    }
}

async fn send(write: &mut OwnedWriteHalf, message: &UpMessage) -> std::io::Result<()> {
    write.write_all(message.encode().as_bytes()).await
}
