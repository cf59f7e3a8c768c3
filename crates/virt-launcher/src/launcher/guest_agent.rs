//! The guest agent as the launcher follows it, upstream's agent poller in one task.
//!
//! The agent counts as connected while the guest has its port open: QEMU reports each
//! change of the port as `VSERPORT_CHANGE` (libvirt's channel state, which upstream reads).
//! While connected, [`poll`] asks the agent at once for its version and commands, the OS,
//! host name, time zone and interfaces, and then again every [`SYS_INTERVAL`] (the version
//! every [`VERSION_INTERVAL`]), publishing what changed into the domain status. Upstream's
//! poller waits 10 s before its first round; answering at once is what makes `AgentConnected`
//! and `guestOSInfo` show within a second of the agent starting. Users and filesystems are
//! not polled: [`GuestAgentLink::info`] asks for them when a client does, so they are never
//! stale (upstream serves them from a 10 s / 300 s cache).
//!
//! One session ([`GuestAgentClient`]) is shared by the poller and the commands; a session
//! that failed is dropped and the next use connects again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;

use super::domain::Shared;
use crate::protocol::{
    GuestAgent, GuestAgentCommand, GuestAgentInfo, GuestExecResult, GuestFilesystem,
    GuestFilesystemDisk, GuestInterface, GuestOs, GuestUser,
};
use crate::qga::{AgentError, COMMAND_TIMEOUT, GuestAgentClient};

/// How often the OS, host name, time zone and interfaces are asked again (upstream's
/// `--qemu-agent-sys-interval`).
pub(super) const SYS_INTERVAL: Duration = Duration::from_secs(120);
/// How often the version and command list are asked again (`--qemu-agent-version-interval`).
pub(super) const VERSION_INTERVAL: Duration = Duration::from_secs(300);
/// How soon a round that failed (the agent not answering yet) is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How often `guest-exec-status` is asked while a command runs.
const EXEC_STATUS_POLL: Duration = Duration::from_millis(100);

/// The launcher's link to the guest agent of its domain.
#[derive(Debug)]
pub(super) struct GuestAgentLink {
    socket: PathBuf,
    session: tokio::sync::Mutex<Option<GuestAgentClient>>,
    open: watch::Sender<bool>,
    /// The thaw that follows a freeze when no `unfreeze` comes first.
    auto_thaw: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The value of [`GuestAgent::fs_freeze_status`] while the guest is frozen (upstream's).
pub(super) const FROZEN: &str = "frozen";

impl GuestAgentLink {
    /// A link to the channel whose host end is `socket`; not connected until the guest opens
    /// its port.
    pub(super) fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            session: tokio::sync::Mutex::new(None),
            open: watch::Sender::new(false),
            auto_thaw: std::sync::Mutex::new(None),
        }
    }

    /// The channel's host end.
    pub(super) fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// The guest opened (`true`) or closed its port.
    pub(super) fn set_open(&self, open: bool) {
        self.open
            .send_if_modified(|was| std::mem::replace(was, open) != open);
    }

    /// Whether the guest has the port open.
    pub(super) fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// The shared session, connected first when there is none.
    async fn session(
        &self,
    ) -> Result<tokio::sync::MappedMutexGuard<'_, GuestAgentClient>, AgentError> {
        let mut session = self.session.lock().await;
        if session.is_none() {
            *session = Some(GuestAgentClient::connect(&self.socket, COMMAND_TIMEOUT).await?);
        }
        tokio::sync::MutexGuard::try_map(session, Option::as_mut)
            .map_err(|_| AgentError::Protocol("no session".into()))
    }

    /// Drops the shared session: the next use connects again.
    async fn reset(&self) {
        *self.session.lock().await = None;
    }

    /// Runs one agent command on the shared session.
    async fn execute(&self, command: &str, arguments: Option<Value>) -> Result<Value, AgentError> {
        let result = self.session().await?.execute(command, arguments).await;
        if matches!(
            result,
            Err(AgentError::Io(_) | AgentError::Timeout { .. } | AgentError::Protocol(_))
        ) {
            self.reset().await;
        }
        result
    }

    /// What the agent reports now: `agent` as last polled, users and filesystems asked now.
    pub(super) async fn info(&self, agent: Option<GuestAgent>) -> Result<GuestAgentInfo, String> {
        let agent = agent.filter(|a| a.connected && self.is_open());
        let Some(agent) = agent else {
            return Err("the guest agent is not connected".into());
        };
        if agent.fs_freeze_status.is_some() {
            // A frozen agent refuses these: the answer says frozen, with no users or
            // filesystems.
            return Ok(GuestAgentInfo {
                agent,
                users: Vec::new(),
                filesystems: Vec::new(),
            });
        }
        let users = self
            .execute("guest-get-users", None)
            .await
            .map(|v| users(&v))
            .map_err(|e| e.to_string())?;
        let filesystems = self
            .execute("guest-get-fsinfo", None)
            .await
            .map(|v| filesystems(&v))
            .map_err(|e| e.to_string())?;
        Ok(GuestAgentInfo {
            agent,
            users,
            filesystems,
        })
    }

    /// The guest's filesystems now (`guest-get-fsinfo`), for the domain stats: none when
    /// the agent is not connected, frozen, or does not answer.
    pub(super) async fn filesystems(&self, agent: Option<GuestAgent>) -> Vec<GuestFilesystem> {
        let usable = agent.is_some_and(|a| a.connected && a.fs_freeze_status.is_none());
        if !usable || !self.is_open() {
            return Vec::new();
        }
        self.execute("guest-get-fsinfo", None)
            .await
            .map(|v| filesystems(&v))
            .unwrap_or_default()
    }

    /// `guest-ping`.
    pub(super) async fn ping(&self) -> Result<(), String> {
        if !self.is_open() {
            return Err("the guest agent is not connected".into());
        }
        self.execute("guest-ping", None)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Runs `command` in the guest (`guest-exec` with its output captured, then
    /// `guest-exec-status` until it exited) and waits up to `timeout` for it.
    pub(super) async fn exec(
        &self,
        command: &[String],
        timeout: Duration,
    ) -> Result<GuestExecResult, String> {
        if !self.is_open() {
            return Err("the guest agent is not connected".into());
        }
        let (path, args) = command.split_first().ok_or("no command to run")?;
        let started = self
            .execute(
                "guest-exec",
                Some(json!({"path": path, "arg": args, "capture-output": true})),
            )
            .await
            .map_err(|e| e.to_string())?;
        let pid = started["pid"]
            .as_i64()
            .ok_or_else(|| format!("guest-exec answered without a pid: {started}"))?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let status = self
                .execute("guest-exec-status", Some(json!({"pid": pid})))
                .await
                .map_err(|e| e.to_string())?;
            if status["exited"].as_bool() == Some(true) {
                let code = status["exitcode"]
                    .as_i64()
                    .or_else(|| status["signal"].as_i64().map(|s| 128 + s))
                    .and_then(|c| i32::try_from(c).ok())
                    .unwrap_or(-1);
                return Ok(GuestExecResult {
                    exit_code: code,
                    output: decoded(&status["out-data"]) + &decoded(&status["err-data"]),
                });
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "command {command:?} did not finish within {} s",
                    timeout.as_secs()
                ));
            }
            tokio::time::sleep(EXEC_STATUS_POLL).await;
        }
    }

    /// Freezes the guest's filesystems (`guest-fsfreeze-freeze`) and, unless `unfreeze_after`
    /// is zero, thaws them after it when [`Self::thaw`] has not come first. A frozen guest is
    /// not frozen again; its timer starts over (upstream's launcher does the same).
    pub(super) async fn freeze(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        unfreeze_after: Duration,
    ) -> Result<(), String> {
        if !self.is_open() {
            return Err("the guest agent is not connected".into());
        }
        let frozen = shared
            .current()
            .guest_agent
            .is_some_and(|a| a.fs_freeze_status.as_deref() == Some(FROZEN));
        if !frozen {
            self.execute("guest-fsfreeze-freeze", None)
                .await
                .map_err(|e| format!("failed to freeze the guest's filesystems: {e}"))?;
            shared.set_guest_agent(|agent| {
                agent.get_or_insert_with(Box::default).fs_freeze_status = Some(FROZEN.into());
            });
        }
        let timer = (!unfreeze_after.is_zero()).then(|| {
            let link = Arc::clone(self);
            let shared = Arc::clone(shared);
            tokio::spawn(async move {
                tokio::time::sleep(unfreeze_after).await;
                tracing::info!(after = ?unfreeze_after, "thawing the guest's filesystems: no unfreeze came");
                if let Err(error) = link.thaw_now(&shared).await {
                    tracing::warn!(%error, "the automatic thaw failed");
                }
            })
        });
        self.replace_auto_thaw(timer);
        Ok(())
    }

    /// Thaws the guest's filesystems (`guest-fsfreeze-thaw`); a thawed guest is left as it
    /// is.
    pub(super) async fn thaw(&self, shared: &Shared) -> Result<(), String> {
        self.replace_auto_thaw(None);
        self.thaw_now(shared).await
    }

    async fn thaw_now(&self, shared: &Shared) -> Result<(), String> {
        let frozen = shared
            .current()
            .guest_agent
            .is_some_and(|a| a.fs_freeze_status.is_some());
        if !frozen {
            return Ok(());
        }
        self.execute("guest-fsfreeze-thaw", None)
            .await
            .map_err(|e| format!("failed to thaw the guest's filesystems: {e}"))?;
        shared.set_guest_agent(|agent| {
            if let Some(agent) = agent {
                agent.fs_freeze_status = None;
            }
        });
        Ok(())
    }

    fn replace_auto_thaw(&self, timer: Option<tokio::task::JoinHandle<()>>) {
        let mut slot = self
            .auto_thaw
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(previous) = std::mem::replace(&mut *slot, timer) {
            previous.abort();
        }
    }

    /// Asks the guest to reboot (`guest-shutdown`, mode `reboot`; no reply on success).
    pub(super) async fn reboot(&self) -> Result<(), AgentError> {
        let sent = self
            .session()
            .await?
            .send_only("guest-shutdown", Some(json!({"mode": "reboot"})))
            .await;
        // The agent goes down with the guest: the next use starts a new session.
        self.reset().await;
        sent
    }

    /// One polling round: what the domain status carries.
    async fn poll_round(
        &self,
        previous: &GuestAgent,
        version_due: bool,
    ) -> Result<GuestAgent, AgentError> {
        let mut agent = GuestAgent {
            connected: true,
            ..previous.clone()
        };
        if version_due || agent.version.is_none() {
            let info = self.execute("guest-info", None).await?;
            agent.version = info["version"].as_str().map(str::to_owned);
            agent.supported_commands = supported_commands(&info);
        }
        agent.os = Some(os(&self.execute("guest-get-osinfo", None).await?));
        agent.hostname = self
            .execute("guest-get-host-name", None)
            .await?
            .get("host-name")
            .and_then(Value::as_str)
            .map(str::to_owned);
        // Older agents lack the time zone and interfaces; their absence is no failure.
        agent.timezone = match self.execute("guest-get-timezone", None).await {
            Ok(zone) => Some(timezone(&zone)),
            Err(AgentError::Refused { .. }) => None,
            Err(e) => return Err(e),
        };
        agent.interfaces = match self.execute("guest-network-get-interfaces", None).await {
            Ok(list) => interfaces(&list),
            Err(AgentError::Refused { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        Ok(agent)
    }
}

/// Follows the agent until the domain ends: publishes `connected` as the port opens and
/// closes, and polls while it is open.
pub(super) async fn poll(link: Arc<GuestAgentLink>, shared: Arc<Shared>) {
    let mut open = link.open.subscribe();
    let mut status = shared.subscribe();
    loop {
        // Wait for the port to open (or the domain to end).
        tokio::select! {
            _ = open.wait_for(|o| *o) => {}
            _ = status.wait_for(crate::protocol::DomainStatus::is_final) => return,
        }
        tracing::info!("the guest agent's port is open");
        shared.set_guest_agent(|agent| {
            agent.get_or_insert_with(Box::default).connected = true;
        });
        let mut last_version = None::<tokio::time::Instant>;
        loop {
            let current = shared.current().guest_agent.unwrap_or_default();
            let version_due = last_version.is_none_or(|t| t.elapsed() >= VERSION_INTERVAL);
            // A frozen agent refuses all but a few commands: the round waits for the thaw.
            let round = if current.fs_freeze_status.is_some() {
                Err(AgentError::Protocol(
                    "the guest's filesystems are frozen".into(),
                ))
            } else {
                link.poll_round(&current, version_due).await
            };
            let wait = match round {
                Ok(agent) => {
                    if version_due {
                        last_version = Some(tokio::time::Instant::now());
                    }
                    if link.is_open() {
                        shared.set_guest_agent(|slot| *slot = Some(Box::new(agent)));
                    }
                    SYS_INTERVAL
                }
                Err(error) => {
                    tracing::debug!(%error, "guest agent poll failed; retrying");
                    RETRY
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = open.wait_for(|o| !*o) => break,
                _ = status.wait_for(crate::protocol::DomainStatus::is_final) => return,
            }
        }
        tracing::info!("the guest agent's port closed");
        link.reset().await;
        link.replace_auto_thaw(None);
        // An agent that comes back (a rebooted guest) starts thawed.
        shared.set_guest_agent(|agent| {
            if let Some(agent) = agent {
                agent.connected = false;
                agent.fs_freeze_status = None;
            }
        });
    }
}

/// The agent's base64 output data (empty when absent or not base64).
fn decoded(data: &Value) -> String {
    use base64::Engine as _;
    data.as_str()
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

fn text(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// `guest-info`'s `supported_commands`.
fn supported_commands(info: &Value) -> Vec<GuestAgentCommand> {
    info["supported_commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some(GuestAgentCommand {
                name: text(c, "name")?,
                enabled: c["enabled"].as_bool().unwrap_or(false),
            })
        })
        .collect()
}

/// `guest-get-osinfo`.
fn os(info: &Value) -> GuestOs {
    GuestOs {
        name: text(info, "name"),
        kernel_release: text(info, "kernel-release"),
        version: text(info, "version"),
        pretty_name: text(info, "pretty-name"),
        version_id: text(info, "version-id"),
        kernel_version: text(info, "kernel-version"),
        machine: text(info, "machine"),
        id: text(info, "id"),
    }
}

/// `guest-get-timezone` as upstream formats libvirt's answer: `<zone>, <offset>`.
fn timezone(zone: &Value) -> String {
    format!(
        "{}, {}",
        zone["zone"].as_str().unwrap_or_default(),
        zone["offset"].as_i64().unwrap_or_default()
    )
}

/// `guest-network-get-interfaces` without loopback.
fn interfaces(list: &Value) -> Vec<GuestInterface> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["name"] != "lo")
        .filter_map(|i| {
            let mut addresses: Vec<(bool, String)> = i["ip-addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| Some((a["ip-address-type"] != "ipv4", text(a, "ip-address")?)))
                .collect();
            addresses.sort_by_key(|(v6, _)| *v6);
            Some(GuestInterface {
                name: text(i, "name")?,
                mac: text(i, "hardware-address").map(|m| m.to_ascii_lowercase()),
                ip_addresses: addresses.into_iter().map(|(_, a)| a).collect(),
            })
        })
        .collect()
}

/// `guest-get-users`.
fn users(list: &Value) -> Vec<GuestUser> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|u| {
            Some(GuestUser {
                name: text(u, "user")?,
                domain: text(u, "domain"),
                login_time: u["login-time"].as_f64(),
            })
        })
        .collect()
}

/// `guest-get-fsinfo`.
fn filesystems(list: &Value) -> Vec<GuestFilesystem> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| {
            Some(GuestFilesystem {
                disk_name: text(f, "name")?,
                mount_point: text(f, "mountpoint").unwrap_or_default(),
                file_system_type: text(f, "type").unwrap_or_default(),
                used_bytes: f["used-bytes"].as_u64().unwrap_or_default(),
                total_bytes: f["total-bytes"].as_u64().unwrap_or_default(),
                disks: f["disk"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|d| GuestFilesystemDisk {
                        serial: text(d, "serial"),
                        bus_type: text(d, "bus-type").unwrap_or_default(),
                    })
                    .collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_answers_become_the_protocols_types() {
        let info = json!({"version": "7.2.0", "supported_commands": [
            {"name": "guest-ping", "enabled": true, "success-response": true},
            {"name": "guest-exec", "enabled": false, "success-response": true},
        ]});
        assert_eq!(
            supported_commands(&info),
            vec![
                GuestAgentCommand {
                    name: "guest-ping".into(),
                    enabled: true
                },
                GuestAgentCommand {
                    name: "guest-exec".into(),
                    enabled: false
                },
            ]
        );
        let list = json!([
            {"name": "lo", "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8}]},
            {"name": "eth0", "hardware-address": "52:54:00:AB:CD:EF", "ip-addresses": [
                {"ip-address-type": "ipv6", "ip-address": "fe80::1", "prefix": 64},
                {"ip-address-type": "ipv4", "ip-address": "10.0.2.2", "prefix": 24},
            ]},
        ]);
        assert_eq!(
            interfaces(&list),
            vec![GuestInterface {
                name: "eth0".into(),
                mac: Some("52:54:00:ab:cd:ef".into()),
                ip_addresses: vec!["10.0.2.2".into(), "fe80::1".into()],
            }]
        );
        assert_eq!(timezone(&json!({"zone": "UTC", "offset": 0})), "UTC, 0");
        let fs = json!([{"name": "vda1", "mountpoint": "/", "type": "ext4",
            "used-bytes": 10, "total-bytes": 100, "disk": [{"serial": "s1", "bus-type": "virtio"}]}]);
        assert_eq!(
            filesystems(&fs),
            vec![GuestFilesystem {
                disk_name: "vda1".into(),
                mount_point: "/".into(),
                file_system_type: "ext4".into(),
                used_bytes: 10,
                total_bytes: 100,
                disks: vec![GuestFilesystemDisk {
                    serial: Some("s1".into()),
                    bus_type: "virtio".into()
                }],
            }]
        );
        let who = json!([{"user": "root", "login-time": 1.5e9}]);
        assert_eq!(users(&who)[0].name, "root");
        assert_eq!(
            os(&json!({"pretty-name": "test", "kernel-release": "6.1"}))
                .kernel_release
                .as_deref(),
            Some("6.1")
        );
    }
}
