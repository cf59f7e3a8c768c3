//! One connection to a launcher's command socket, safe to use in `tokio::select!`.
//!
//! `virt_launcher::protocol::LauncherClient` reads lines inside its futures, which loses data
//! when such a future is dropped by `select!`. Here a reader task owns the read half and
//! forwards every decoded [`UpMessage`] into a channel (receiving from a channel is
//! cancel-safe); commands are written directly on the write half.

use std::path::Path;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;
use virt_launcher::protocol::{
    Command, DownMessage, Hello, PROTOCOL_VERSION, PodInterface, ProtocolError, UpMessage,
};

/// A connected, version-checked launcher connection.
#[derive(Debug)]
pub struct LauncherLink {
    writer: OwnedWriteHalf,
    messages: mpsc::Receiver<UpMessage>,
    reader: tokio::task::JoinHandle<()>,
    next_id: u64,
    pod_interface: Option<PodInterface>,
    vmi_uid: Option<String>,
}

impl Drop for LauncherLink {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl LauncherLink {
    /// Connects to `socket` and exchanges hellos.
    ///
    /// # Errors
    /// [`ProtocolError`] when the socket does not accept, the launcher closes, or it speaks
    /// another protocol version.
    pub async fn connect(socket: &Path) -> Result<Self, ProtocolError> {
        let stream = virt_launcher::unix_socket::connect(socket)
            .await
            .map_err(ProtocolError::Io)?;
        let (read, mut writer) = stream.into_split();
        let hello = DownMessage::Hello(Hello::current());
        writer
            .write_all(hello.encode().as_bytes())
            .await
            .map_err(ProtocolError::Io)?;
        let mut reader = BufReader::new(read);
        let mut line = String::new();
        if reader
            .read_line(&mut line)
            .await
            .map_err(ProtocolError::Io)?
            == 0
        {
            return Err(ProtocolError::Closed);
        }
        let (pod_interface, vmi_uid) = match UpMessage::decode(&line)? {
            UpMessage::Hello(Hello {
                version: PROTOCOL_VERSION,
                pod_interface,
                vmi_uid,
            }) => (pod_interface, vmi_uid),
            UpMessage::Hello(Hello { version, .. }) => {
                return Err(ProtocolError::Version { peer: version });
            }
            other => {
                return Err(ProtocolError::Malformed(format!(
                    "expected hello, got {other:?}"
                )));
            }
        };
        let (tx, messages) = mpsc::channel(16);
        let reader = tokio::spawn(async move {
            let mut line = String::new();
            loop {
                line.clear();
                match reader.read_line(&mut line).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => match UpMessage::decode(&line) {
                        Ok(message) => {
                            if tx.send(message).await.is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "ignoring a malformed launcher message")
                        }
                    },
                }
            }
        });
        Ok(Self {
            writer,
            messages,
            reader,
            next_id: 1,
            pod_interface,
            vmi_uid,
        })
    }

    /// The pod interface the launcher reported in its hello (it has its own network).
    pub fn pod_interface(&self) -> Option<&PodInterface> {
        self.pod_interface.as_ref()
    }

    /// The UID of the VMI the launcher says it runs (`None` from a launcher started without
    /// one).
    pub fn vmi_uid(&self) -> Option<&str> {
        self.vmi_uid.as_deref()
    }

    /// Sends `command`; its ack arrives later through [`Self::recv`] with the returned id.
    ///
    /// # Errors
    /// [`ProtocolError::Io`] when the socket is broken.
    pub async fn send(&mut self, command: Command) -> Result<u64, ProtocolError> {
        let id = self.next_id;
        self.next_id += 1;
        let line = DownMessage::Command { id, command }.encode();
        self.writer
            .write_all(line.as_bytes())
            .await
            .map_err(ProtocolError::Io)?;
        Ok(id)
    }

    /// Passes `file` to the launcher under `key` (`passFile`, the file descriptor travels with
    /// the line); its ack arrives later through [`Self::recv`] with the returned id.
    ///
    /// # Errors
    /// [`ProtocolError::Io`] when the socket is broken.
    pub async fn pass_file(
        &mut self,
        key: &str,
        file: &std::fs::File,
    ) -> Result<u64, ProtocolError> {
        use std::os::fd::AsFd;
        let id = self.next_id;
        self.next_id += 1;
        let command = Command::PassFile {
            key: key.to_owned(),
        };
        let line = DownMessage::Command { id, command }.encode();
        virt_launcher::fd_passing::send_with_fd(
            self.writer.as_ref(),
            line.as_bytes(),
            file.as_fd(),
        )
        .await
        .map_err(ProtocolError::Io)?;
        Ok(id)
    }

    /// The next message from the launcher; `None` once the connection has closed.
    /// Cancel-safe.
    pub async fn recv(&mut self) -> Option<UpMessage> {
        self.messages.recv().await
    }
}
