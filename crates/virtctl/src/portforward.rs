//! `port-forward TYPE/NAME[/NAMESPACE] [PROTOCOL/]LOCAL[:REMOTE]...`: local ports tunnelled to
//! the guest through the VM's or VMI's `portforward` subresource.
//!
//! Data flow: each local port gets a listener on `--address`; every accepted connection opens
//! its own websocket `…/{name}/portforward/{remote}/tcp` through the kube client (so the
//! kubeconfig's credentials apply), and bytes are copied both ways in binary frames until
//! either side closes. `--stdio` streams one port over stdin/stdout instead (what
//! `virtctl ssh` uses as ssh's `ProxyCommand`). Runs until interrupted.
//!
//! `udp/` ports forward datagrams: a tunnel per local client address (upstream's
//! `udpProxy`), one websocket frame per datagram.

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio_tungstenite::tungstenite::Message;

use crate::Error;
use crate::cli::PortForward;
use crate::client::{Ctx, Kind, subresource_path};
use crate::console::{Stream, open_path};

/// `TYPE/NAME[/NAMESPACE]`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// VM or VMI.
    pub kind: Kind,
    /// The name.
    pub name: String,
    /// The namespace, when given.
    pub namespace: Option<String>,
}

/// One forwarded port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    /// The local port.
    pub local: u16,
    /// The guest's port.
    pub remote: u16,
    /// UDP rather than TCP.
    pub udp: bool,
}

/// Parses `TYPE/NAME[/NAMESPACE]` with upstream's kinds and messages.
///
/// # Errors
/// An unknown kind, an empty part, or too many `/`.
pub fn parse_target(target: &str) -> Result<Target, Error> {
    let fail = |m: &str| Err(Error::Message(m.to_owned()));
    if target.is_empty() {
        return fail("target cannot be empty");
    }
    let parts: Vec<&str> = target.split('/').collect();
    let (kind, name, namespace) = match parts.as_slice() {
        [_] => return fail("target must contain type and name separated by '/'"),
        [kind, name] => (*kind, *name, None),
        [_, _, ""] => return fail("namespace cannot be empty"),
        [kind, name, ns] => (*kind, *name, Some((*ns).to_owned())),
        _ => return fail("target is not valid with more than two '/'"),
    };
    let kind = match kind.to_lowercase().as_str() {
        "vm" | "vms" | "virtualmachine" | "virtualmachines" => Kind::Vm,
        "vmi" | "vmis" | "virtualmachineinstance" | "virtualmachineinstances" => Kind::Vmi,
        _ => {
            return Err(Error::Message(format!(
                "unsupported resource type '{kind}'"
            )));
        }
    };
    if name.is_empty() {
        return fail("name cannot be empty");
    }
    Ok(Target {
        kind,
        name: name.to_owned(),
        namespace,
    })
}

/// Parses `[PROTOCOL/]LOCAL[:REMOTE]` (REMOTE defaults to LOCAL).
///
/// # Errors
/// A port that is not a number, a missing port, or a protocol other than tcp and udp.
pub fn parse_port(arg: &str) -> Result<Forward, Error> {
    let (protocol, ports) = arg.split_once('/').unwrap_or(("tcp", arg));
    let udp = match protocol {
        "tcp" => false,
        "udp" => true,
        other => return Err(Error::Message(format!("unknown protocol: {other}"))),
    };
    let mut split = ports.split(':').filter(|p| !p.is_empty());
    let number = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| Error::Message(format!("invalid port: {p}")))
    };
    let local = split
        .next()
        .ok_or_else(|| Error::Message("invalid port, missing local and/or remote port".into()))?;
    let local = number(local)?;
    let remote = split.next().map_or(Ok(local), number)?;
    Ok(Forward { local, remote, udp })
}

async fn open(ctx: &Ctx, target: &Target, remote: u16, udp: bool) -> Result<Stream, Error> {
    let ns = target.namespace.as_deref().unwrap_or(&ctx.namespace);
    let protocol = if udp { "udp" } else { "tcp" };
    let path = subresource_path(
        ns,
        target.kind,
        &target.name,
        &format!("portforward/{remote}/{protocol}"),
    );
    let kind = match target.kind {
        Kind::Vm => "vm",
        Kind::Vmi => "vmi",
    };
    open_path(ctx, path, &format!("{kind}/{}.{ns}", target.name)).await
}

/// Copies `local` (read and write halves) to and from the websocket until either ends.
async fn pipe<R, W>(ws: Stream, mut read: R, mut write: W) -> Result<(), Error>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (mut tx, mut rx) = ws.split();
    let up = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = read.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            if tx
                .send(Message::Binary(buf[..n].to_vec().into()))
                .await
                .is_err()
            {
                break;
            }
        }
        // End of local input: close the tunnel's sending side; the answer may still come.
        let _ = tx.close().await;
        Ok::<(), Error>(())
    };
    let down = async {
        while let Some(Ok(msg)) = rx.next().await {
            match msg {
                Message::Binary(b) => write.write_all(&b).await?,
                Message::Text(t) => write.write_all(t.as_bytes()).await?,
                Message::Close(_) => break,
                _ => continue,
            }
            write.flush().await?;
        }
        let _ = write.shutdown().await;
        Ok::<(), Error>(())
    };
    let (up, down) = tokio::join!(up, down);
    up.and(down)
}

async fn serve(ctx: &Ctx, target: &Target, listener: TcpListener, remote: u16) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let ws = match open(ctx, target, remote, false).await {
            Ok(ws) => ws,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        tokio::spawn(async move {
            let (read, write) = conn.into_split();
            // A connection reset by either side just ends this tunnel.
            let _ = pipe(ws, read, write).await;
        });
    }
}

/// UDP, as upstream's `udpProxy`: a tunnel per local client address, opened by its first
/// datagram; a frame is a datagram both ways; a client's tunnel ends when the guest side
/// closes it.
async fn serve_udp(ctx: &Ctx, target: &Target, socket: UdpSocket, remote: u16) {
    use std::collections::HashMap;
    use std::net::SocketAddr;
    let socket = std::sync::Arc::new(socket);
    let (gone_tx, mut gone_rx) = tokio::sync::mpsc::unbounded_channel::<SocketAddr>();
    let mut clients: HashMap<SocketAddr, tokio::sync::mpsc::UnboundedSender<Vec<u8>>> =
        HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let (n, client) = tokio::select! {
            received = socket.recv_from(&mut buf) => match received {
                Ok(received) => received,
                Err(_) => continue,
            },
            Some(gone) = gone_rx.recv() => {
                clients.remove(&gone);
                continue;
            }
        };
        let datagram = buf[..n].to_vec();
        if let Some(tunnel) = clients.get(&client)
            && tunnel.send(datagram.clone()).is_ok()
        {
            continue;
        }
        let ws = match open(ctx, target, remote, true).await {
            Ok(ws) => ws,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        let (to_guest, mut datagrams) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let _ = to_guest.send(datagram);
        clients.insert(client, to_guest);
        let (socket, gone) = (std::sync::Arc::clone(&socket), gone_tx.clone());
        tokio::spawn(async move {
            let (mut tx, mut rx) = ws.split();
            let up = async {
                while let Some(d) = datagrams.recv().await {
                    if tx.send(Message::Binary(d.into())).await.is_err() {
                        break;
                    }
                }
            };
            let down = async {
                while let Some(Ok(msg)) = rx.next().await {
                    let data = match msg {
                        Message::Binary(b) => b.to_vec(),
                        Message::Text(t) => t.as_bytes().to_vec(),
                        Message::Close(_) => break,
                        _ => continue,
                    };
                    let _ = socket.send_to(&data, client).await;
                }
            };
            tokio::select! {
                () = up => {}
                () = down => {}
            }
            let _ = gone.send(client);
        });
    }
}

/// `virtctl port-forward TARGET PORT...`.
///
/// # Errors
/// Bad arguments, a port that cannot be listened on, or (with `--stdio`) a refused tunnel.
pub async fn run(ctx: &Ctx, a: &PortForward) -> Result<(), Error> {
    let target = parse_target(&a.target)?;
    let forwards = a
        .ports
        .iter()
        .map(|p| parse_port(p))
        .collect::<Result<Vec<_>, _>>()?;
    if a.stdio {
        let [forward] = forwards.as_slice() else {
            return Err(Error::Message(
                "only one port supported when forwarding to stdout".into(),
            ));
        };
        if forward.udp {
            return Err(Error::Message(
                "only tcp is supported when forwarding to stdout".into(),
            ));
        }
        let ws = open(ctx, &target, forward.remote, false).await?;
        return pipe(ws, tokio::io::stdin(), tokio::io::stdout()).await;
    }
    let mut tasks: Vec<futures::future::BoxFuture<'_, ()>> = Vec::new();
    for forward in forwards {
        let addr = format!("{}:{}", a.address, forward.local);
        let cannot = |e: std::io::Error| Error::Message(format!("can't listen on {addr}: {e}"));
        if forward.udp {
            let socket = UdpSocket::bind(&addr).await.map_err(cannot)?;
            eprintln!(
                "forwarding udp {} to {}",
                socket.local_addr()?,
                forward.remote
            );
            tasks.push(Box::pin(serve_udp(ctx, &target, socket, forward.remote)));
            continue;
        }
        let listener = TcpListener::bind(&addr).await.map_err(cannot)?;
        let bound = listener.local_addr()?;
        eprintln!("forwarding tcp {bound} to {}", forward.remote);
        tasks.push(Box::pin(serve(ctx, &target, listener, forward.remote)));
    }
    tokio::select! {
        _ = futures::future::join_all(tasks) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(e: &Error) -> String {
        e.to_string()
    }

    #[test]
    fn targets_take_upstreams_kinds_and_an_optional_namespace() {
        let t = parse_target("vm/web").unwrap();
        assert!(matches!(t.kind, Kind::Vm));
        assert_eq!((t.name.as_str(), t.namespace), ("web", None));
        let t = parse_target("VirtualMachineInstances/web/prod").unwrap();
        assert!(matches!(t.kind, Kind::Vmi));
        assert_eq!(t.namespace.as_deref(), Some("prod"));
        for (bad, want) in [
            ("", "target cannot be empty"),
            ("web", "target must contain type and name separated by '/'"),
            ("vm/web/", "namespace cannot be empty"),
            ("vm/a/b/c", "target is not valid with more than two '/'"),
            ("pod/web", "unsupported resource type 'pod'"),
            ("vm/", "name cannot be empty"),
        ] {
            assert_eq!(message(&parse_target(bad).unwrap_err()), want, "{bad}");
        }
    }

    #[test]
    fn ports_default_the_remote_to_the_local_and_the_protocol_to_tcp() {
        assert_eq!(
            parse_port("18080:8080").unwrap(),
            Forward {
                local: 18080,
                remote: 8080,
                udp: false
            }
        );
        assert_eq!(
            parse_port("tcp/22").unwrap(),
            Forward {
                local: 22,
                remote: 22,
                udp: false
            }
        );
        assert_eq!(
            parse_port("udp/5353:53").unwrap(),
            Forward {
                local: 5353,
                remote: 53,
                udp: true
            }
        );
        assert!(parse_port("x:1").is_err());
        assert_eq!(
            message(&parse_port(":").unwrap_err()),
            "invalid port, missing local and/or remote port"
        );
    }
}
