//! A small asynchronous QMP (QEMU Machine Protocol) client.
//!
//! Why our own instead of the `qapi` crate: `qapi` works against Debian's QEMU 7.2, but it
//! is generated from the whole QAPI schema (hundreds of commands and types) and is large
//! to build; the launcher needs about ten commands and a handful of events, and it wants
//! to keep its own memory small. QMP itself is simple — newline-delimited JSON over a unix
//! socket — so [`QmpClient`] is a few hundred lines that we fully understand and test.
//!
//! Data flow: [`QmpClient::connect`] reads the greeting, starts one reader task and
//! negotiates capabilities. [`QmpClient::execute`] writes `{"execute", "arguments", "id"}`
//! and waits for the reply carrying the same id; the reader task routes replies by id and
//! pushes asynchronous events into the [`QmpEvents`] stream.
//!
//! # Guarantees
//! - Replies are matched by id, so concurrent `execute` calls from several tasks are safe.
//! - When the socket closes (QEMU exited), every waiting and every later `execute` fails
//!   with [`QmpError::Disconnected`] and the event stream ends after the events that were
//!   received before the close.
//!
//! # Caveats
//! - No timeouts inside: callers wrap calls in `tokio::time::timeout` as they see fit.

mod event;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};

pub use event::{QmpEvent, QmpEventKind};

/// A failed QMP exchange.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Connecting to the QMP socket failed.
    #[error("cannot connect to the QMP socket")]
    Connect(#[source] std::io::Error),
    /// Reading or writing the socket failed.
    #[error("QMP socket I/O failed")]
    Io(#[source] std::io::Error),
    /// The peer sent something that is not QMP.
    #[error("unexpected QMP message: {0}")]
    Protocol(String),
    /// QEMU refused the command.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command sent.
        command: String,
        /// QMP error class, e.g. `GenericError`, `DeviceNotFound`.
        class: String,
        /// QEMU's description.
        desc: String,
    },
    /// The connection closed before the reply arrived.
    #[error("the QMP connection is closed")]
    Disconnected,
}

type Reply = Result<Value, (String, String)>;

#[derive(Default)]
struct Pending {
    waiters: HashMap<u64, oneshot::Sender<Reply>>,
    closed: bool,
}

/// QEMU's version from the greeting or `query-version`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct QemuVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Micro version.
    pub micro: u32,
    /// Distribution package string, e.g. `Debian 1:7.2+dfsg-7+deb12u18`.
    #[serde(default)]
    pub package: String,
}

#[derive(Deserialize)]
struct VersionReply {
    qemu: QemuVersion,
    #[serde(default)]
    package: String,
}

/// The reply of `query-status`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct VmStatus {
    /// QEMU run state: `running`, `paused`, `shutdown`, `prelaunch`, `internal-error` …
    pub status: String,
    /// Whether the vCPUs run.
    pub running: bool,
}

/// The stream of asynchronous QMP events.
#[derive(Debug)]
pub struct QmpEvents(mpsc::UnboundedReceiver<QmpEvent>);

impl QmpEvents {
    /// The next event; `None` once the connection has closed and all events were taken.
    pub async fn recv(&mut self) -> Option<QmpEvent> {
        self.0.recv().await
    }
}

/// A negotiated QMP connection.
#[derive(Debug)]
pub struct QmpClient {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    version: QemuVersion,
    reader: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("waiting", &self.waiters.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl Drop for QmpClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl QmpClient {
    /// Connects to the QMP socket at `path` and negotiates capabilities.
    ///
    /// # Errors
    /// [`QmpError::Connect`] when the socket does not accept, others when the greeting
    /// or `qmp_capabilities` fail.
    pub async fn connect(path: &Path) -> Result<(Self, QmpEvents), QmpError> {
        let stream = UnixStream::connect(path).await.map_err(QmpError::Connect)?;
        Self::handshake(stream).await
    }

    /// Runs the QMP handshake on an already connected stream.
    ///
    /// # Errors
    /// As [`QmpClient::connect`].
    pub async fn handshake(stream: UnixStream) -> Result<(Self, QmpEvents), QmpError> {
        let (read, writer) = stream.into_split();
        let mut lines = BufReader::new(read);
        let mut line = String::new();
        if lines.read_line(&mut line).await.map_err(QmpError::Io)? == 0 {
            return Err(QmpError::Disconnected);
        }
        let greeting: Value = serde_json::from_str(&line)
            .map_err(|e| QmpError::Protocol(format!("greeting: {e}")))?;
        let version = greeting
            .pointer("/QMP/version")
            .cloned()
            .and_then(|v| serde_json::from_value::<VersionReply>(v).ok())
            .map(|v| QemuVersion {
                package: v.package,
                ..v.qemu
            })
            .ok_or_else(|| {
                QmpError::Protocol(format!("greeting without version: {}", line.trim()))
            })?;
        let pending = Arc::new(Mutex::new(Pending::default()));
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_loop(lines, Arc::clone(&pending), events_tx));
        let client = Self {
            writer: tokio::sync::Mutex::new(writer),
            pending,
            next_id: AtomicU64::new(1),
            version,
            reader,
        };
        client.execute("qmp_capabilities", None).await?;
        Ok((client, QmpEvents(events_rx)))
    }

    /// QEMU's version as announced in the greeting.
    pub fn version(&self) -> &QemuVersion {
        &self.version
    }

    /// Executes `command` with optional `arguments` and returns its `return` value.
    ///
    /// # Errors
    /// [`QmpError::Command`] when QEMU answers with an error, [`QmpError::Disconnected`]
    /// when the connection closes first.
    pub async fn execute(
        &self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        self.execute_passing(command, arguments, None).await
    }

    /// As [`QmpClient::execute`], with `fd` sent along with the command line (`SCM_RIGHTS`)
    /// when given, for the commands that take a descriptor (`add-fd`, `getfd`).
    ///
    /// Caveat: QEMU keeps only the descriptors of the latest read that carried any, until a
    /// command takes them; two such commands must not be in flight at once (the launcher
    /// sends them one at a time, each awaited, under the domain's lock).
    async fn execute_passing(
        &self,
        command: &str,
        arguments: Option<Value>,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Value, QmpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if pending.closed {
                return Err(QmpError::Disconnected);
            }
            pending.waiters.insert(id, tx);
        }
        let mut message = json!({"execute": command, "id": id});
        if let Some(arguments) = arguments {
            message["arguments"] = arguments;
        }
        let mut bytes = message.to_string().into_bytes();
        bytes.push(b'\n');
        let written = {
            let mut writer = self.writer.lock().await;
            match fd {
                Some(fd) => crate::fd_passing::send_with_fd(writer.as_ref(), &bytes, fd).await,
                None => writer.write_all(&bytes).await,
            }
        };
        if let Err(e) = written {
            self.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .waiters
                .remove(&id);
            return Err(match e.kind() {
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                    QmpError::Disconnected
                }
                _ => QmpError::Io(e),
            });
        }
        match rx.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err((class, desc))) => Err(QmpError::Command {
                command: command.to_owned(),
                class,
                desc,
            }),
            Err(_) => Err(QmpError::Disconnected),
        }
    }

    /// `query-status`.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn query_status(&self) -> Result<VmStatus, QmpError> {
        let value = self.execute("query-status", None).await?;
        serde_json::from_value(value).map_err(|e| QmpError::Protocol(format!("query-status: {e}")))
    }

    /// `query-version`.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn query_version(&self) -> Result<QemuVersion, QmpError> {
        let value = self.execute("query-version", None).await?;
        let reply: VersionReply = serde_json::from_value(value)
            .map_err(|e| QmpError::Protocol(format!("query-version: {e}")))?;
        Ok(QemuVersion {
            package: reply.package,
            ..reply.qemu
        })
    }

    /// `system_powerdown`: presses the ACPI power button.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn system_powerdown(&self) -> Result<(), QmpError> {
        self.execute("system_powerdown", None).await.map(drop)
    }

    /// `system_reset`: a hard reset of the machine.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn system_reset(&self) -> Result<(), QmpError> {
        self.execute("system_reset", None).await.map(drop)
    }

    /// `stop`: pauses the vCPUs.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn stop(&self) -> Result<(), QmpError> {
        self.execute("stop", None).await.map(drop)
    }

    /// `cont`: resumes the vCPUs.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn cont(&self) -> Result<(), QmpError> {
        self.execute("cont", None).await.map(drop)
    }

    /// `quit`: QEMU exits at once. The connection may close before the reply, which
    /// counts as success.
    ///
    /// # Errors
    /// As [`QmpClient::execute`], except for [`QmpError::Disconnected`].
    pub async fn quit(&self) -> Result<(), QmpError> {
        match self.execute("quit", None).await {
            Ok(_) | Err(QmpError::Disconnected) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `device_add` with the device's properties (`driver`, `id`, …).
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn device_add(&self, properties: Value) -> Result<(), QmpError> {
        self.execute("device_add", Some(properties)).await.map(drop)
    }

    /// `device_del`: asks the guest to release the device; completion is the
    /// `DEVICE_DELETED` event.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn device_del(&self, id: &str) -> Result<(), QmpError> {
        self.execute("device_del", Some(json!({"id": id})))
            .await
            .map(drop)
    }

    /// `blockdev-add` with the node's options.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn blockdev_add(&self, options: Value) -> Result<(), QmpError> {
        self.execute("blockdev-add", Some(options)).await.map(drop)
    }

    /// `add-fd`: sends `fd` to QEMU, which keeps a copy in a new fd set (opened as
    /// `/dev/fdset/<id>`); returns the set's id. `opaque` is shown by `query-fdsets`.
    ///
    /// # Errors
    /// As [`QmpClient::execute`]; [`QmpError::Protocol`] for a reply without `fdset-id`.
    pub async fn add_fd(
        &self,
        fd: std::os::fd::BorrowedFd<'_>,
        opaque: &str,
    ) -> Result<u64, QmpError> {
        let reply = self
            .execute_passing("add-fd", Some(json!({"opaque": opaque})), Some(fd))
            .await?;
        reply
            .get("fdset-id")
            .and_then(Value::as_u64)
            .ok_or_else(|| QmpError::Protocol(format!("add-fd: {reply}")))
    }

    /// `remove-fd` of a whole fd set: QEMU closes its copies once no block node uses them.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn remove_fd(&self, fdset_id: u64) -> Result<(), QmpError> {
        self.execute("remove-fd", Some(json!({"fdset-id": fdset_id})))
            .await
            .map(drop)
    }

    /// `blockdev-del` of a node.
    ///
    /// # Errors
    /// As [`QmpClient::execute`].
    pub async fn blockdev_del(&self, node_name: &str) -> Result<(), QmpError> {
        self.execute("blockdev-del", Some(json!({"node-name": node_name})))
            .await
            .map(drop)
    }
}

async fn read_loop(
    mut lines: BufReader<OwnedReadHalf>,
    pending: Arc<Mutex<Pending>>,
    events: mpsc::UnboundedSender<QmpEvent>,
) {
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            tracing::warn!(line = line.trim(), "ignoring a QMP line that is not JSON");
            continue;
        };
        if let Some(event) = QmpEvent::from_message(&message) {
            // A dropped receiver only means nobody listens for events any more.
            let _ = events.send(event);
            continue;
        }
        let Some(id) = message.get("id").and_then(Value::as_u64) else {
            tracing::debug!(%message, "QMP reply without an id of ours");
            continue;
        };
        let reply = match (message.get("return"), message.get("error")) {
            (Some(value), _) => Ok(value.clone()),
            (None, Some(error)) => Err((
                error
                    .get("class")
                    .and_then(Value::as_str)
                    .unwrap_or("Unknown")
                    .to_owned(),
                error
                    .get("desc")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            )),
            (None, None) => Err((
                "Protocol".to_owned(),
                format!("reply without return: {message}"),
            )),
        };
        let waiter = pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiters
            .remove(&id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(reply);
        }
    }
    let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
    pending.closed = true;
    pending.waiters.clear(); // dropping the senders wakes every waiter with Disconnected
}

#[cfg(test)]
mod tests;
