//! A client of the QEMU guest agent (`qemu-ga`), reached through the unix socket QEMU
//! serves for the guest's virtio-serial port `org.qemu.guest_agent.0`.
//!
//! The agent's protocol is QMP's without the greeting and without ids: one JSON object per
//! command (`{"execute": …, "arguments": …}`), one per reply (`{"return": …}` or
//! `{"error": {"class", "desc"}}`), in order. A reply can arrive late, after its client gave
//! up, and would be read as the answer to the next command; so every session starts with
//! `guest-sync-delimited`: the agent answers it with a `0xFF` byte and the id it was given,
//! and everything before that byte, and every reply carrying another id, is dropped.
//!
//! Only one client can use the channel at a time (QEMU serves one connection per
//! character device); the launcher keeps one, shared by its poller and its commands.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// The name of the guest agent's virtio-serial port (upstream's channel target name).
pub const GUEST_AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// How long a command may take before the agent is given up for this session.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Talking to the guest agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The channel's socket failed.
    #[error("guest agent channel: {0}")]
    Io(#[from] std::io::Error),
    /// The agent did not answer in time (it is not running, or hangs).
    #[error("the guest agent did not answer {command} in time")]
    Timeout {
        /// The command asked.
        command: String,
    },
    /// The agent refused the command.
    #[error("the guest agent answered {command} with {class}: {desc}")]
    Refused {
        /// The command asked.
        command: String,
        /// The agent's error class.
        class: String,
        /// Its description.
        desc: String,
    },
    /// The channel closed or carried something that is not an agent reply.
    #[error("guest agent protocol: {0}")]
    Protocol(String),
}

/// One session with the guest agent.
#[derive(Debug)]
pub struct GuestAgentClient {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    timeout: Duration,
}

impl GuestAgentClient {
    /// Connects to the channel socket `path` and synchronises with the agent, each step
    /// within `timeout`.
    ///
    /// # Errors
    /// [`AgentError`] when the socket cannot be reached or the agent does not answer.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, AgentError> {
        let stream = crate::unix_socket::connect(path).await?;
        Self::from_stream(stream, timeout).await
    }

    /// Wraps an already connected stream and synchronises.
    ///
    /// # Errors
    /// As [`Self::connect`].
    pub async fn from_stream(stream: UnixStream, timeout: Duration) -> Result<Self, AgentError> {
        let (read, writer) = stream.into_split();
        let mut client = Self {
            reader: BufReader::new(read),
            writer,
            timeout,
        };
        client.sync().await?;
        Ok(client)
    }

    /// `guest-sync-delimited` with a fresh id: drops whatever an earlier session left.
    async fn sync(&mut self) -> Result<(), AgentError> {
        let id = u64::from(rand_id());
        let command = "guest-sync-delimited";
        self.send(command, Some(json!({ "id": id }))).await?;
        let reader = &mut self.reader;
        let found = tokio::time::timeout(self.timeout, async {
            let mut skipped = Vec::new();
            loop {
                skipped.clear();
                if reader.read_until(0xFF, &mut skipped).await? == 0 {
                    return Err(AgentError::Protocol("the channel closed".into()));
                }
                if skipped.last() != Some(&0xFF) {
                    continue;
                }
                // The id's reply follows the delimiter; a stale reply of another sync may
                // come first.
                loop {
                    let reply = read_reply(reader).await?;
                    if reply.get("return").and_then(Value::as_u64) == Some(id) {
                        return Ok(());
                    }
                    if reply.get("return").is_none() {
                        break;
                    }
                }
            }
        })
        .await;
        match found {
            Ok(result) => result,
            Err(_) => Err(AgentError::Timeout {
                command: command.into(),
            }),
        }
    }

    /// Runs `command` and returns its `return` value.
    ///
    /// # Errors
    /// [`AgentError::Refused`] with the agent's error; other variants when the session is
    /// unusable (the caller should connect again).
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, AgentError> {
        self.send(command, arguments).await?;
        let reply = match tokio::time::timeout(self.timeout, read_reply(&mut self.reader)).await {
            Ok(reply) => reply?,
            Err(_) => {
                return Err(AgentError::Timeout {
                    command: command.into(),
                });
            }
        };
        if let Some(value) = reply.get("return") {
            return Ok(value.clone());
        }
        if let Some(error) = reply.get("error") {
            let text = |key| {
                error
                    .get(key)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            return Err(AgentError::Refused {
                command: command.into(),
                class: text("class"),
                desc: text("desc"),
            });
        }
        Err(AgentError::Protocol(format!("unexpected reply {reply}")))
    }

    /// Sends `command` without waiting for a reply: `guest-shutdown` answers nothing when it
    /// succeeds (the guest goes down).
    ///
    /// # Errors
    /// [`AgentError::Io`] when the channel is closed.
    pub async fn send_only(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<(), AgentError> {
        self.send(command, arguments).await
    }

    async fn send(&mut self, command: &str, arguments: Option<Value>) -> Result<(), AgentError> {
        let mut message = json!({ "execute": command });
        if let Some(arguments) = arguments {
            message["arguments"] = arguments;
        }
        let mut line = message.to_string();
        line.push('\n');
        tokio::time::timeout(self.timeout, self.writer.write_all(line.as_bytes()))
            .await
            .map_err(|_| AgentError::Timeout {
                command: command.into(),
            })??;
        Ok(())
    }
}

/// Reads one reply line (blank lines skipped).
async fn read_reply(reader: &mut BufReader<OwnedReadHalf>) -> Result<Value, AgentError> {
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).await? == 0 {
            return Err(AgentError::Protocol("the channel closed".into()));
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_matches(|c: char| c.is_whitespace() || c == '\u{FFFD}');
        if text.is_empty() {
            continue;
        }
        return serde_json::from_str(text)
            .map_err(|e| AgentError::Protocol(format!("{e} in {text:?}")));
    }
}

/// A sync id that differs between sessions (the agent echoes it; nothing secret).
fn rand_id() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    // Keep it within what every JSON reader takes as an integer.
    (hasher.finish() >> 33) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A fake agent on the other end of a socket pair: answers each command with
    /// `answer(command, arguments)`; a `guest-sync-delimited` first gets `stale` bytes.
    fn fake_agent(
        stale: &'static [u8],
        answer: impl Fn(&str, &Value) -> Option<Value> + Send + 'static,
    ) -> UnixStream {
        let (ours, theirs) = UnixStream::pair().expect("socket pair");
        tokio::spawn(async move {
            let (read, mut write) = theirs.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let message: Value = serde_json::from_str(&line).expect("json");
                let command = message["execute"].as_str().unwrap_or_default().to_owned();
                let arguments = message.get("arguments").cloned().unwrap_or(Value::Null);
                if command == "guest-sync-delimited" {
                    write.write_all(stale).await.expect("stale");
                    // The delimiter is the raw byte 0xFF.
                    let mut bytes = vec![0xFF];
                    bytes.extend(format!("{{\"return\": {}}}\n", arguments["id"]).bytes());
                    write.write_all(&bytes).await.expect("sync reply");
                    continue;
                }
                if let Some(reply) = answer(&command, &arguments) {
                    let mut text = reply.to_string();
                    text.push('\n');
                    write.write_all(text.as_bytes()).await.expect("reply");
                }
            }
        });
        ours
    }

    #[tokio::test]
    async fn a_stale_reply_before_the_sync_is_dropped_and_commands_get_their_answers() {
        let stream = fake_agent(b"{\"return\": {\"old\": true}}\n", |command, _| {
            Some(match command {
                "guest-get-host-name" => json!({"return": {"host-name": "testguest"}}),
                _ => json!({"error": {"class": "CommandNotFound", "desc": "no such command"}}),
            })
        });
        let mut client = GuestAgentClient::from_stream(stream, Duration::from_secs(5))
            .await
            .expect("sync");
        let host = client
            .execute("guest-get-host-name", None)
            .await
            .expect("host name");
        assert_eq!(host, json!({"host-name": "testguest"}));
        let refused = client.execute("guest-nothing", None).await;
        assert!(
            matches!(&refused, Err(AgentError::Refused { class, .. }) if class == "CommandNotFound"),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn an_agent_that_never_answers_times_out() {
        let (ours, mut theirs) = UnixStream::pair().expect("socket pair");
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = theirs.read_to_end(&mut sink).await;
        });
        let result = GuestAgentClient::from_stream(ours, Duration::from_millis(100)).await;
        assert!(
            matches!(&result, Err(AgentError::Timeout { command }) if command == "guest-sync-delimited"),
            "{result:?}"
        );
        drop(result);
        drain.await.expect("drain");
    }
}
