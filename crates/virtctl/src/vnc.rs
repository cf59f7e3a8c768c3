//! `vnc`: a local TCP proxy to the VMI's VNC websocket, and a viewer started on it.
//!
//! Data flow, as upstream's `virtctl vnc`: the VMI's `vnc` websocket is opened first, so a
//! refusal ("VMI is not running", "No graphics devices are present.") is reported before
//! anything listens → a TCP listener on `--address` (`--proxy-only`) or 127.0.0.1 → with
//! `--proxy-only` its port is printed as `{"port":N}` and the proxy runs until interrupted;
//! otherwise a viewer (`remote-viewer`, else TigerVNC's `vncviewer`) is started on it and the
//! command ends with the viewer. Every accepted connection is bridged to a websocket of its
//! own (the first one to the websocket opened up front), raw RFB bytes in binary frames; the
//! handler keeps one VNC session per VMI, so a new viewer takes the display over.
//!
//! # Caveats
//! Upstream serves one connection and then exits; serving each connection lets a viewer
//! reconnect without restarting the proxy.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;

use crate::Error;
use crate::cli::Vnc;
use crate::client::Ctx;
use crate::console::{Stream, open};

/// `remote-viewer` (virt-viewer), tried first as upstream does.
const REMOTE_VIEWER: &str = "remote-viewer";
/// TigerVNC's viewer.
const TIGER_VNC: &str = "vncviewer";
/// How long a started viewer has to connect (upstream's `LISTEN_TIMEOUT`).
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

/// A viewer to start: its program and arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    /// Program path or name.
    pub program: String,
    /// Arguments naming the proxy.
    pub args: Vec<String>,
}

fn viewer_args(kind: &str, port: u16) -> Vec<String> {
    if kind == REMOTE_VIEWER {
        vec![format!("vnc://127.0.0.1:{port}")]
    } else {
        vec![format!("127.0.0.1:{port}")]
    }
}

/// Which viewer to start on `port`: `--vnc-type`/`--vnc-path` if given, else the first of
/// `remote-viewer` and `vncviewer` that `found` (a `$PATH` lookup) finds.
///
/// # Errors
/// Upstream's words for an unknown type, a missing path or no viewer at all.
pub fn choose_viewer(
    vnc_type: Option<&str>,
    vnc_path: Option<&str>,
    port: u16,
    found: impl Fn(&str) -> Option<String>,
) -> Result<Viewer, Error> {
    let kind = match vnc_type {
        None | Some("") if vnc_path.is_none() => {
            return [REMOTE_VIEWER, TIGER_VNC]
                .into_iter()
                .find_map(|kind| {
                    found(kind).map(|program| Viewer {
                        program,
                        args: viewer_args(kind, port),
                    })
                })
                .ok_or_else(|| {
                    Error::Message(format!(
                        "could not find {REMOTE_VIEWER} or {TIGER_VNC} binary in $PATH; \
                         use --proxy-only and connect a VNC viewer to the port it prints"
                    ))
                });
        }
        None | Some("" | "tiger") => TIGER_VNC,
        Some("remote-viewer") => REMOTE_VIEWER,
        Some(other) => return Err(Error::Message(format!("unsupported vnc-type: {other}"))),
    };
    let program = match vnc_path {
        Some(path) => {
            if !std::path::Path::new(path).exists() {
                return Err(Error::Message(format!(
                    "specified VNC path does not exist: {path}"
                )));
            }
            path.to_owned()
        }
        None => {
            found(kind).ok_or_else(|| Error::Message(format!("could not find {kind} in $PATH")))?
        }
    };
    Ok(Viewer {
        program,
        args: viewer_args(kind, port),
    })
}

/// The first executable file named `program` in `$PATH`.
fn look_path(program: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|p| p.display().to_string())
}

/// `virtctl vnc NAME [--proxy-only] [--port N] [--address A]`.
///
/// # Errors
/// The refused websocket, the bind, or no viewer to start.
pub async fn vnc(ctx: &Ctx, a: &Vnc) -> Result<(), Error> {
    let first = open(ctx, &a.name, "vnc").await?;
    let address = if a.proxy_only {
        a.address.as_str()
    } else {
        "127.0.0.1"
    };
    let listener = TcpListener::bind((address, a.port))
        .await
        .map_err(|e| Error::Message(format!("can't listen on {address}:{}: {e}", a.port)))?;
    let port = listener.local_addr()?.port();
    if a.proxy_only {
        println!("{}", serde_json::json!({"port": port}));
        return tokio::select! {
            () = serve(ctx, &a.name, &listener, first) => Ok(()),
            _ = tokio::signal::ctrl_c() => Ok(()),
        };
    }
    let viewer = choose_viewer(
        a.vnc_type.as_deref(),
        a.vnc_path.as_deref(),
        port,
        look_path,
    )?;
    let mut child = tokio::process::Command::new(&viewer.program)
        .args(&viewer.args)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Message(format!("{} execution failed: {e}", viewer.program)))?;
    let (tcp, _) = tokio::time::timeout(LISTEN_TIMEOUT, listener.accept())
        .await
        .map_err(|_| Error::Message("the VNC viewer did not connect in time".to_owned()))??;
    let first_session = bridge(tcp, first);
    tokio::select! {
        status = child.wait() => {
            let status = status?;
            if !status.success() {
                return Err(Error::Message(format!("{} execution failed: {status}", viewer.program)));
            }
        }
        () = async { first_session.await; serve_more(ctx, &a.name, &listener).await } => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}

/// Bridges the first connection to `first`, then every further one to a new websocket.
async fn serve(ctx: &Ctx, name: &str, listener: &TcpListener, first: Stream) {
    match listener.accept().await {
        Ok((tcp, _)) => {
            tokio::spawn(bridge(tcp, first));
        }
        Err(e) => {
            eprintln!("can't accept a VNC connection: {e}");
            return;
        }
    }
    serve_more(ctx, name, listener).await;
}

/// Bridges every accepted connection to a websocket of its own, until accepting fails.
async fn serve_more(ctx: &Ctx, name: &str, listener: &TcpListener) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                eprintln!("can't accept a VNC connection: {e}");
                return;
            }
        };
        match open(ctx, name, "vnc").await {
            Ok(ws) => {
                tokio::spawn(bridge(tcp, ws));
            }
            Err(e) => eprintln!("{e}"),
        }
    }
}

/// Copies the TCP connection's bytes into binary frames and frames back until either side
/// closes.
async fn bridge(mut tcp: TcpStream, ws: Stream) {
    let (mut tx, mut rx) = ws.split();
    let (mut tcp_rx, mut tcp_tx) = tcp.split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match tcp_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send(Message::Binary(buf[..n].to_vec().into()))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        let _ = tx.close().await;
    };
    let down = async {
        while let Some(Ok(msg)) = rx.next().await {
            let written = match msg {
                Message::Binary(b) => tcp_tx.write_all(&b).await,
                Message::Text(t) => tcp_tx.write_all(t.as_bytes()).await,
                Message::Close(_) => break,
                _ => continue,
            };
            if written.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(names: &'static [&'static str]) -> impl Fn(&str) -> Option<String> {
        move |name| names.contains(&name).then(|| format!("/usr/bin/{name}"))
    }

    #[test]
    fn remote_viewer_is_preferred_and_gets_a_vnc_url() {
        let v = choose_viewer(None, None, 5901, only(&["remote-viewer", "vncviewer"])).unwrap();
        assert_eq!(v.program, "/usr/bin/remote-viewer");
        assert_eq!(v.args, ["vnc://127.0.0.1:5901"]);
        let v = choose_viewer(None, None, 5901, only(&["vncviewer"])).unwrap();
        assert_eq!(
            (v.program.as_str(), v.args.as_slice()),
            ("/usr/bin/vncviewer", &["127.0.0.1:5901".to_owned()][..])
        );
    }

    #[test]
    fn without_a_viewer_the_error_points_to_proxy_only() {
        let e = choose_viewer(None, None, 1, only(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("could not find remote-viewer or vncviewer binary in $PATH"),
            "{e}"
        );
        assert!(e.contains("--proxy-only"), "{e}");
    }

    #[test]
    fn an_unknown_type_or_a_missing_path_is_refused_in_upstreams_words() {
        let e = choose_viewer(Some("chicken"), None, 1, only(&[])).unwrap_err();
        assert_eq!(e.to_string(), "unsupported vnc-type: chicken");
        let e =
            choose_viewer(Some("tiger"), Some("/nonexistent/vncviewer"), 1, only(&[])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "specified VNC path does not exist: /nonexistent/vncviewer"
        );
    }
}
