//! `console`: the websocket client of the VMI's serial console (and the websocket opening
//! [`vnc`](crate::vnc) shares).
//!
//! Data flow: a `GET` with websocket upgrade headers (subprotocol `plain.kubevirt.io`)
//! goes through the kube client, so the kubeconfig's credentials apply; the upgraded
//! connection carries raw bytes in binary frames. `console` puts a terminal stdin into
//! raw mode (restored on exit), copies stdin to the socket until `Ctrl+]` (0x1d), and the
//! socket to stdout. With piped stdin, end of input stops sending; output is still shown
//! until the guest has been quiet for a second or the server closes.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::Error;
use crate::cli::Console;
use crate::client::{Ctx, Kind, subresource_path};

/// The byte that leaves the console (`Ctrl+]`).
pub const ESCAPE: u8 = 0x1d;
const PLAIN_STREAM_PROTOCOL: &str = "plain.kubevirt.io";

pub(crate) type Stream = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Opens the websocket of the VMI's `sub` stream (`console`, `vnc`).
pub(crate) async fn open(ctx: &Ctx, name: &str, sub: &str) -> Result<Stream, Error> {
    let path = subresource_path(&ctx.namespace, Kind::Vmi, name, sub);
    open_path(ctx, path, &format!("VMI {name}")).await
}

/// Opens the websocket at `path` (a streaming subresource of `what`, named in errors).
pub(crate) async fn open_path(ctx: &Ctx, path: String, what: &str) -> Result<Stream, Error> {
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let req = http::Request::get(path)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", key)
        .header("sec-websocket-protocol", PLAIN_STREAM_PROTOCOL)
        .body(kube::client::Body::empty())
        .map_err(|e| Error::Message(e.to_string()))?;
    let res = ctx
        .client
        .send(req)
        .await
        .map_err(|e| Error::Message(crate::client::api_message(&e)))?;
    if res.status() != http::StatusCode::SWITCHING_PROTOCOLS {
        let code = res.status();
        let body = http_body_util_collect(res).await;
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_owned());
        return Err(Error::Message(format!(
            "Can't access {what}: {message} ({code})"
        )));
    }
    let upgraded = hyper::upgrade::on(res)
        .await
        .map_err(|e| Error::Message(format!("websocket upgrade failed: {e}")))?;
    Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await)
}

async fn http_body_util_collect(res: http::Response<kube::client::Body>) -> Vec<u8> {
    use http_body_util::BodyExt;
    res.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes().to_vec())
        .unwrap_or_default()
}

/// Restores the terminal's attributes when dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        use nix::sys::termios::{SetArg, cfmakeraw, tcgetattr, tcsetattr};
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(&stdin) else {
            return Self(None);
        };
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        if tcsetattr(&stdin, SetArg::TCSANOW, &raw).is_err() {
            return Self(None);
        }
        Self(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                saved,
            );
        }
    }
}

/// Splits `input` at the escape byte: the bytes to send, and whether to leave.
pub fn until_escape(input: &[u8]) -> (&[u8], bool) {
    match input.iter().position(|b| *b == ESCAPE) {
        Some(i) => (&input[..i], true),
        None => (input, false),
    }
}

/// `virtctl console NAME`.
///
/// # Errors
/// The refused connection or terminal I/O.
pub async fn console(ctx: &Ctx, a: &Console) -> Result<(), Error> {
    let ws = open(ctx, &a.name, "console").await?;
    eprint!(
        "Successfully connected to {} console. The escape sequence is ^]\r\n",
        a.name
    );
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdin());
    let _raw = tty.then(RawMode::enter);
    let (mut tx, mut rx) = ws.split();
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut buf = vec![0u8; 4096];
    let mut stdin_open = true;
    loop {
        let idle = if stdin_open {
            Duration::MAX
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            n = stdin.read(&mut buf), if stdin_open => {
                let n = n?;
                if n == 0 {
                    stdin_open = false;
                    continue;
                }
                let (send, leave) = until_escape(&buf[..n]);
                if !send.is_empty() && tx.send(Message::Binary(send.to_vec().into())).await.is_err() {
                    break;
                }
                if leave {
                    let _ = tx.close().await;
                    break;
                }
            }
            msg = tokio::time::timeout(idle, rx.next()) => {
                match msg {
                    Ok(Some(Ok(Message::Binary(b)))) => { stdout.write_all(&b).await?; stdout.flush().await?; }
                    Ok(Some(Ok(Message::Text(t)))) => { stdout.write_all(t.as_bytes()).await?; stdout.flush().await?; }
                    Ok(Some(Ok(_))) => {}
                    Ok(Some(Err(_)) | None) | Err(_) => break,
                }
            }
        }
    }
    drop(_raw);
    if tty {
        eprint!("\r\n");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_right_bracket_ends_the_session_and_is_not_sent() {
        assert_eq!(until_escape(b"ls\r"), (&b"ls\r"[..], false));
        assert_eq!(until_escape(b"ab\x1dcd"), (&b"ab"[..], true));
        assert_eq!(until_escape(b"\x1d"), (&b""[..], true));
    }
}
