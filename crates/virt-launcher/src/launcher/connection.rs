//! One handler connection: hello, then commands in and domain events out.
//!
//! Lines are read with `recvmsg` ([`FdLineReader`]), so that the descriptor a `passFile` line
//! carries (`SCM_RIGHTS`) reaches the command: each `passFile` takes the oldest descriptor
//! received and not yet taken, and descriptors no line claims are closed.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;

use super::domain::Domain;
use crate::fd_passing::FdLineReader;
use crate::protocol::{Command, DownMessage, Hello, PROTOCOL_VERSION, UpMessage};

/// Serves one connection until the handler hangs up or breaks the protocol.
pub(super) async fn serve(domain: Arc<Domain>, stream: UnixStream) {
    if let Err(e) = serve_inner(&domain, stream).await {
        tracing::debug!(error = %e, "handler connection ended");
    }
}

async fn serve_inner(domain: &Domain, stream: UnixStream) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = FdLineReader::new(read);
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
    let mut events = domain.subscribe_events();
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
                        let fd = match &command {
                            Command::PassFile { .. } => lines.take_fd(),
                            _ => None,
                        };
                        UpMessage::Ack { id, result: domain.execute(command, fd).await }
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
            event = events.recv() => match event {
                Ok(event) => send(&mut write, &UpMessage::Event(event)).await?,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
            },
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

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileExt, MetadataExt};

    use serde_json::json;
    use tokio::io::{AsyncBufReadExt, BufReader};

    use super::*;
    use crate::protocol::LauncherClient;
    use crate::test_support::{assert_closed, pipe};

    /// A launcher domain (fake QEMU) served on a socket in `dir`, every connection accepted.
    fn serve_domain(dir: &std::path::Path) -> (Arc<Domain>, std::path::PathBuf) {
        let socket = dir.join("launcher.sock");
        let mut opts = super::super::LauncherOptions::new(&socket);
        opts.fake_qemu = true;
        let domain = Arc::new(Domain::new(opts, None, None));
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let served = Arc::clone(&domain);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(Arc::clone(&served), stream));
            }
        });
        (domain, socket)
    }

    fn identity(fd: impl AsFd) -> (u64, u64) {
        let stat = nix::sys::stat::fstat(fd).unwrap();
        (stat.st_dev, stat.st_ino)
    }

    #[tokio::test]
    async fn a_passed_file_is_kept_by_its_key_and_a_second_pass_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let (domain, socket) = serve_domain(dir.path());
        let mut client = LauncherClient::connect(&socket).await.unwrap();

        let image = tempfile::NamedTempFile::new().unwrap();
        let mut file = File::options()
            .read(true)
            .write(true)
            .open(image.path())
            .unwrap();
        file.write_all(b"claim image").unwrap();
        let ack = client.pass_file("vol1", &file).await.unwrap();
        assert_eq!(ack, Ok(json!({})));
        drop(file);
        let kept = domain.passed_files().get("vol1").expect("the file is kept");
        let meta = std::fs::metadata(image.path()).unwrap();
        assert_eq!(identity(&kept), (meta.dev(), meta.ino()), "the same inode");
        let mut contents = [0u8; 11];
        File::from(kept).read_exact_at(&mut contents, 0).unwrap();
        assert_eq!(&contents, b"claim image");

        // A pipe's write end as the first file: its read end tells when the launcher closes it.
        let (mut closed, first) = pipe();
        let first = File::from(first);
        client.pass_file("vol2", &first).await.unwrap().unwrap();
        drop(first);
        let second = tempfile::tempfile().unwrap();
        client.pass_file("vol2", &second).await.unwrap().unwrap();
        assert_closed(&mut closed).await;
        let kept = domain.passed_files().get("vol2").unwrap();
        assert_eq!(
            identity(&kept),
            identity(&second),
            "the second file replaced the first"
        );
        let still = domain.passed_files().get("vol1").unwrap();
        assert_eq!(
            identity(&still),
            (meta.dev(), meta.ino()),
            "other keys are kept"
        );
    }

    #[tokio::test]
    async fn a_pass_file_without_a_descriptor_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (domain, socket) = serve_domain(dir.path());
        let mut client = LauncherClient::connect(&socket).await.unwrap();
        let ack = client
            .request(Command::PassFile { key: "vol1".into() })
            .await
            .unwrap();
        assert_eq!(ack, Err("passFile carries no file descriptor".to_owned()));
        assert!(domain.passed_files().get("vol1").is_none());
        let file = tempfile::tempfile().unwrap();
        let ack = client.pass_file("", &file).await.unwrap();
        assert!(ack.unwrap_err().contains("key"), "an empty key is refused");
    }

    #[tokio::test]
    async fn a_descriptor_sent_with_another_command_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (domain, socket) = serve_domain(dir.path());
        let stream = UnixStream::connect(&socket).await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let hello = lines.next_line().await.unwrap().unwrap();
        assert!(hello.contains("hello"), "{hello}");
        write
            .write_all(DownMessage::Hello(Hello::current()).encode().as_bytes())
            .await
            .unwrap();
        let (mut closed, stray) = pipe();
        let status = DownMessage::Command {
            id: 1,
            command: Command::Status,
        }
        .encode();
        crate::fd_passing::send_with_fd(write.as_ref(), status.as_bytes(), stray.as_fd())
            .await
            .unwrap();
        drop(stray);
        loop {
            let line = lines.next_line().await.unwrap().expect("an ack");
            if let UpMessage::Ack { id: 1, result } = UpMessage::decode(&line).unwrap() {
                assert!(result.is_ok());
                break;
            }
        }
        assert_closed(&mut closed).await;
        // A later passFile without a descriptor does not get the stray one.
        let pass = DownMessage::Command {
            id: 2,
            command: Command::PassFile { key: "vol1".into() },
        }
        .encode();
        write.write_all(pass.as_bytes()).await.unwrap();
        loop {
            let line = lines.next_line().await.unwrap().expect("an ack");
            if let UpMessage::Ack { id: 2, result } = UpMessage::decode(&line).unwrap() {
                assert_eq!(
                    result,
                    Err("passFile carries no file descriptor".to_owned())
                );
                break;
            }
        }
        assert!(domain.passed_files().get("vol1").is_none());
    }
}
