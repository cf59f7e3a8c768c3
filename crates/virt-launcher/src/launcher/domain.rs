//! The one domain a launcher runs: starting QEMU, following it over QMP, and the
//! commands of the protocol.
//!
//! State lives in a `watch` channel: every change is published there and each handler
//! connection forwards it. QEMU's exit is watched by a supervisor task that owns the
//! child process; it decides the final state from what QMP reported on the way (a guest
//! `SHUTDOWN`, a panic) and from what the handler asked for (`shutdown`, `kill`). While QEMU
//! runs, the supervisor also keeps the serial console log and QEMU's own log under
//! [`MAX_LOG_BYTES`] ([`crate::log_rotation`]).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command as Process};
use tokio::sync::watch;

use super::LauncherOptions;
use super::guest_agent::GuestAgentLink;
use crate::log_rotation::{MAX_LOG_BYTES, rotate_if_larger};
use crate::protocol::PodInterface;
use crate::protocol::{Command, CpuTopology, DomainState, DomainStatus, GuestMemory, StateReason};
use crate::qmp::{QmpClient, QmpEventKind, QmpEvents};
use crate::spec::{InterfaceBinding, LauncherSpec};

/// What the handler last asked the domain to do; decides how an exit is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Intent {
    #[default]
    None,
    Pause,
    Shutdown,
    Kill,
    /// The domain has migrated away: QEMU is told to quit.
    Migrated,
    /// A soft reboot by the ACPI power button: the guest's shutdown becomes a reset
    /// ([`super::soft_reboot`]).
    Reboot,
}

/// How long `domainStats` waits for the guest agent's filesystems.
const STATS_AGENT_TIMEOUT: Duration = Duration::from_secs(1);

/// State shared with the supervisor task.
#[derive(Debug)]
pub(super) struct Shared {
    status: watch::Sender<DomainStatus>,
    /// Ids of devices QEMU reported deleted (`DEVICE_DELETED`), for a detach to wait on.
    device_deleted: tokio::sync::broadcast::Sender<String>,
    delivered: watch::Sender<bool>,
    intent: Mutex<Intent>,
    /// Events for the VMI, sent to every connected handler ([`UpMessage::Event`](crate::protocol::UpMessage::Event)).
    events: tokio::sync::broadcast::Sender<crate::protocol::LauncherEvent>,
}

impl Shared {
    pub(super) fn intent(&self) -> Intent {
        *self.intent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn set_intent(&self, intent: Intent) {
        *self.intent.lock().unwrap_or_else(PoisonError::into_inner) = intent;
    }

    /// Moves to `state`/`reason`, keeping pid and start time; final states are sticky.
    pub(super) fn transition(&self, state: DomainState, reason: StateReason) {
        self.status.send_if_modified(|status| {
            if status.is_final() || (status.state == state && status.reason == reason) {
                return false;
            }
            status.state = state;
            status.reason = reason;
            true
        });
    }

    /// Records the domain's vCPUs and memory after a start or a live change.
    fn set_resources(&self, cpu: CpuTopology, requested_memory: u64) {
        self.status.send_if_modified(|status| {
            let memory = status.memory.get_or_insert(GuestMemory {
                at_boot_bytes: 0,
                current_bytes: 0,
                requested_bytes: 0,
            });
            let changed = status.cpu != Some(cpu) || memory.requested_bytes != requested_memory;
            status.cpu = Some(cpu);
            memory.requested_bytes = requested_memory;
            changed
        });
    }

    /// Records what the virtio-mem device plugs now (`MEMORY_DEVICE_SIZE_CHANGE`).
    fn set_plugged_memory(&self, plugged: u64) {
        self.status
            .send_if_modified(|status| match &mut status.memory {
                Some(memory) if memory.current_bytes != memory.at_boot_bytes + plugged => {
                    memory.current_bytes = memory.at_boot_bytes + plugged;
                    true
                }
                _ => false,
            });
    }

    /// Records the outgoing migration's progress.
    pub(super) fn set_migration(
        &self,
        update: impl FnOnce(&mut Option<crate::protocol::MigrationInfo>),
    ) {
        self.status
            .send_modify(|status| update(&mut status.migration));
    }

    pub(super) fn current(&self) -> DomainStatus {
        self.status.borrow().clone()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<DomainStatus> {
        self.status.subscribe()
    }

    /// Records what the guest agent poller saw; published only when it changed. A final
    /// domain keeps what it had.
    pub(super) fn set_guest_agent(
        &self,
        update: impl FnOnce(&mut Option<Box<crate::protocol::GuestAgent>>),
    ) {
        self.status.send_if_modified(|status| {
            if status.is_final() {
                return false;
            }
            let before = status.guest_agent.clone();
            update(&mut status.guest_agent);
            status.guest_agent != before
        });
    }

    fn publish(&self, status: DomainStatus) {
        tracing::info!(state = ?status.state, reason = ?status.reason, "domain state");
        self.status.send_replace(status);
    }
}

/// A started domain: the spec it runs (as changed live since), QEMU's pid (none in fake
/// mode), its QMP connection, and the services of its interfaces.
#[derive(Debug)]
struct Started {
    spec: LauncherSpec,
    /// Disks attached live, with their root ports.
    attached: super::live::AttachedDisks,
    /// Interfaces attached live, with their root ports.
    nics: super::live::AttachedNics,
    pid: Option<u32>,
    qmp: Option<Arc<QmpClient>>,
    _network: NetworkServices,
}

impl Started {
    /// A domain just started from `spec`, nothing attached live yet.
    fn new(spec: &LauncherSpec, pid: Option<u32>, qmp: Option<Arc<QmpClient>>) -> Self {
        Self {
            spec: spec.clone(),
            attached: super::live::AttachedDisks::default(),
            nics: super::live::AttachedNics::default(),
            pid,
            qmp,
            _network: NetworkServices::default(),
        }
    }
}

/// What serves a domain's interfaces: the DHCP servers of the masquerade and bridge
/// bindings (tasks that run as long as the launcher), and the passt processes of the passt
/// binding (killed when the domain is dropped; each also ends by itself when its QEMU
/// disconnects, `--one-off`, which covers a launcher killed outright).
#[derive(Debug, Default)]
struct NetworkServices {
    _dhcp: Vec<tokio::task::JoinHandle<()>>,
    _passt: Vec<Child>,
}

/// The domain and everything needed to run it.
#[derive(Debug)]
pub(super) struct Domain {
    opts: LauncherOptions,
    pod_interface: Option<PodInterface>,
    /// The pod interface's IPv4 configuration, read at start (the bridge binding hands it
    /// to the guest).
    pod_ipv4: Option<crate::netsetup::bridge::PodIpv4>,
    shared: Arc<Shared>,
    started: tokio::sync::Mutex<Option<Started>>,
    /// The files the handler passed (`passFile`).
    passed: super::passed_files::PassedFiles,
    /// The guest agent's channel.
    agent: Arc<GuestAgentLink>,
}

impl Domain {
    pub(super) fn new(
        opts: LauncherOptions,
        pod_interface: Option<PodInterface>,
        pod_ipv4: Option<crate::netsetup::bridge::PodIpv4>,
    ) -> Self {
        let shared = Shared {
            status: watch::Sender::new(DomainStatus::pending()),
            device_deleted: tokio::sync::broadcast::Sender::new(16),
            delivered: watch::Sender::new(false),
            intent: Mutex::new(Intent::None),
            events: tokio::sync::broadcast::Sender::new(16),
        };
        let agent_socket = crate::pod_layout::PodLayout::new(
            opts.socket_path.parent().unwrap_or_else(|| Path::new("/")),
        )
        .guest_agent_socket();
        Self {
            opts,
            pod_interface,
            pod_ipv4,
            shared: Arc::new(shared),
            started: tokio::sync::Mutex::new(None),
            passed: Default::default(),
            agent: Arc::new(GuestAgentLink::new(agent_socket)),
        }
    }

    /// The pod interface found at start, when the launcher has its own network namespace.
    pub(super) fn pod_interface(&self) -> Option<&PodInterface> {
        self.pod_interface.as_ref()
    }

    /// The UID of the VMI this launcher runs, when it was given one.
    pub(super) fn vmi_uid(&self) -> Option<&str> {
        self.opts.vmi_uid.as_deref()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<DomainStatus> {
        self.shared.status.subscribe()
    }

    /// The Events for the handler from now on.
    pub(super) fn subscribe_events(
        &self,
    ) -> tokio::sync::broadcast::Receiver<crate::protocol::LauncherEvent> {
        self.shared.events.subscribe()
    }

    pub(super) fn subscribe_delivered(&self) -> watch::Receiver<bool> {
        self.shared.delivered.subscribe()
    }

    /// Records that a handler has been sent the final state.
    pub(super) fn mark_delivered(&self) {
        self.shared.delivered.send_replace(true);
    }

    fn current(&self) -> DomainStatus {
        self.shared.status.borrow().clone()
    }

    fn current_value(&self) -> Value {
        serde_json::to_value(self.current()).unwrap_or(Value::Null)
    }

    /// The files the handler passed, by key.
    #[cfg(test)]
    pub(super) fn passed_files(&self) -> &super::passed_files::PassedFiles {
        &self.passed
    }

    /// Executes one protocol command; the result becomes the ack. `fd` is the descriptor
    /// that came with a `passFile` line.
    pub(super) async fn execute(
        &self,
        command: Command,
        fd: Option<OwnedFd>,
    ) -> Result<Value, String> {
        match command {
            Command::PassFile { key } => {
                self.passed.insert(&key, fd)?;
                Ok(serde_json::json!({}))
            }
            Command::Sync(spec) => self.sync(&spec, None).await,
            Command::Receive {
                spec,
                socket,
                block_socket,
                block_disks,
                post_copy,
            } => {
                let value = self.sync(&spec, Some(&socket)).await?;
                if post_copy {
                    let (_, qmp) = self.started().await?;
                    if let Some(qmp) = qmp {
                        super::migration::accept_post_copy(&qmp).await?;
                    }
                }
                if let Some(block_socket) = block_socket {
                    let nodes = self.block_nodes(&block_disks).await;
                    let (_, qmp) = self.started().await?;
                    if let Some(qmp) = qmp {
                        super::migration::export_disks(&qmp, &block_socket, &nodes).await?;
                    }
                }
                Ok(value)
            }
            Command::Migrate {
                uri,
                progress_timeout_seconds,
                completion_timeout_seconds,
                bandwidth_bytes_per_second,
                block_socket,
                block_disks,
                auto_converge,
                post_copy,
            } => {
                let (_, qmp) = self.started().await?;
                let mirror = match block_socket {
                    Some(socket) => Some((socket, self.block_nodes(&block_disks).await)),
                    None => None,
                };
                super::migration::start(
                    &self.shared,
                    qmp,
                    &uri,
                    super::migration::Options {
                        progress_timeout: Duration::from_secs(progress_timeout_seconds),
                        completion_timeout: Duration::from_secs(completion_timeout_seconds),
                        bandwidth_bytes_per_second,
                        auto_converge,
                        post_copy,
                        mirror,
                    },
                )
                .await?;
                Ok(self.current_value())
            }
            Command::CancelMigration => {
                let (_, qmp) = self.started().await?;
                super::migration::cancel(&self.shared, qmp).await?;
                Ok(self.current_value())
            }
            Command::Status => Ok(self.current_value()),
            Command::Shutdown {
                grace_period_seconds,
            } => {
                self.shutdown(Duration::from_secs(grace_period_seconds))
                    .await
            }
            Command::Kill => self.kill().await,
            Command::SoftReboot => self.soft_reboot().await,
            command @ (Command::GuestAgentInfo
            | Command::GuestPing
            | Command::GuestExec { .. }
            | Command::Freeze { .. }
            | Command::Unfreeze) => self.guest_agent_command(command).await,
            Command::Pause => self.pause(true).await,
            Command::Unpause => self.pause(false).await,
            Command::DomainStats => {
                let stats = self.stats().await?;
                serde_json::to_value(stats).map_err(|e| e.to_string())
            }
        }
    }

    /// The commands answered by the guest agent.
    async fn guest_agent_command(&self, command: Command) -> Result<Value, String> {
        match command {
            Command::GuestAgentInfo => {
                let info = self
                    .agent
                    .info(self.current().guest_agent.map(|a| *a))
                    .await?;
                serde_json::to_value(info).map_err(|e| e.to_string())
            }
            Command::GuestPing => match self.agent.ping().await {
                Ok(()) => Ok(serde_json::json!({})),
                Err(e) => {
                    // Upstream's launcher reports a failed `guestAgentPing` probe as an Event.
                    tracing::warn!(error = %e, "GuestAgentPing probe failed");
                    let vmi = match &*self.started.lock().await {
                        Some(started) => started.spec.vmi.name.clone(),
                        None => String::new(),
                    };
                    // Nobody listening (no handler connected) loses the Event, as upstream's
                    // notify client does.
                    let _ = self.shared.events.send(crate::protocol::LauncherEvent {
                        warning: true,
                        reason: "GuestAgentPingFailed".into(),
                        message: format!("GuestAgentPing probe failed for VMI {vmi}"),
                    });
                    Err(e)
                }
            },
            Command::GuestExec {
                command,
                timeout_seconds,
            } => {
                let result = self
                    .agent
                    .exec(&command, Duration::from_secs(timeout_seconds))
                    .await?;
                serde_json::to_value(result).map_err(|e| e.to_string())
            }
            Command::Freeze {
                unfreeze_timeout_seconds,
            } => {
                let migrating = self
                    .current()
                    .migration
                    .is_some_and(|m| m.ended_at.is_none());
                if migrating {
                    return Err("failed to freeze VMI, VMI is currently during migration".into());
                }
                self.agent
                    .freeze(&self.shared, Duration::from_secs(unfreeze_timeout_seconds))
                    .await
                    .map(|()| serde_json::json!({}))
            }
            Command::Unfreeze => self
                .agent
                .thaw(&self.shared)
                .await
                .map(|()| serde_json::json!({})),
            other => Err(format!("not a guest agent command: {other:?}")),
        }
    }

    /// Starts the domain (as a migration target listening on `incoming`, when given) or
    /// applies the live changes of a running one.
    async fn sync(&self, spec: &LauncherSpec, incoming: Option<&str>) -> Result<Value, String> {
        let mut started = self.started.lock().await;
        if let Some(running) = started.as_mut() {
            if !self.current().is_final() && incoming.is_none() {
                self.update_live(running, spec).await?;
            }
            return Ok(self.current_value());
        }
        if self.current().state != DomainState::Pending {
            // The domain failed to start: report where it is.
            return Ok(self.current_value());
        }
        let mut argv = crate::argv::qemu_argv(spec).map_err(|e| e.to_string())?;
        if let Some(socket) = incoming {
            remove_stale_socket(Path::new(socket));
            argv.extend(["-incoming".to_owned(), format!("unix:{socket}")]);
        }
        super::host_paths::create_overlay_dirs(spec)?;
        if let Some(base) = &self.opts.base_dir {
            super::host_paths::check(base, self.opts.claim_disks_dir.as_deref(), spec)?;
        }
        // The boot disks' passed files, inherited by QEMU into the fd sets their nodes open.
        let passed = self.passed.for_disks(&spec.disks)?;
        let inherited: Vec<(usize, RawFd)> = spec
            .disks
            .iter()
            .enumerate()
            .filter_map(|(index, d)| passed.get(&d.name).map(|fd| (index, fd.as_raw_fd())))
            .collect();
        argv.extend(crate::argv::disks::passed_file_args(&inherited));
        argv.extend(crate::argv::channels::guest_agent_args(
            &self.agent.socket().to_string_lossy(),
        ));
        super::host_paths::create_claim_disks(self.opts.claim_disks_dir.as_deref(), spec)?;
        super::host_paths::create_overlays(self.opts.claim_disks_dir.as_deref(), spec)?;
        *started = Some(if self.opts.fake_qemu {
            let (state, reason) = match incoming {
                Some(socket) => {
                    super::migration::fake_incoming(&self.shared, socket)?;
                    (DomainState::Paused, StateReason::Migration)
                }
                None => (DomainState::Running, StateReason::Booted),
            };
            self.shared.publish(DomainStatus {
                state,
                reason,
                started_at: Some(jiff::Timestamp::now().to_string()),
                ..booted(spec)
            });
            Started::new(spec, None, None)
        } else {
            let network = self.setup_network(spec).await?;
            let inherited = inherited.into_iter().map(|(_, fd)| fd).collect();
            let mut started = self
                .start_qemu(spec, &argv, incoming.is_some(), inherited)
                .await?;
            drop(passed);
            started._network = network;
            if let Some(qmp) = &started.qmp {
                for iface in spec.interfaces.iter().filter(|i| i.link_down) {
                    super::live_nic::set_link(qmp, &iface.name, false).await?;
                }
            }
            started
        });
        if self.opts.fake_qemu {
            self.shared.set_plugged_memory(spec.memory.hotplugged_bytes);
        }
        Ok(self.current_value())
    }

    /// Applies what may change on a running domain ([`super::live`]); on a refusal nothing
    /// has changed and the error says why.
    async fn update_live(&self, running: &mut Started, spec: &LauncherSpec) -> Result<(), String> {
        let steps = super::live::plan(&running.spec, spec, &running.attached, &running.nics)?;
        if let Some(base) = &self.opts.base_dir
            && steps
                .iter()
                .any(|s| matches!(s, super::live::Step::AttachDisk(_)))
        {
            super::host_paths::check(base, self.opts.claim_disks_dir.as_deref(), spec)?;
        }
        use super::live::{self, Step};
        // Every passed file the new disks name is there, or nothing is changed.
        let mut passed = self.passed.for_disks(steps.iter().filter_map(|s| match s {
            Step::AttachDisk(disk) => Some(&**disk),
            _ => None,
        }))?;
        for step in &steps {
            tracing::info!(?step, "changing the running domain");
            let qmp = running.qmp.clone();
            match step {
                Step::PlugSockets { sockets } => {
                    if let Some(qmp) = &qmp {
                        live::plug_sockets(qmp, *sockets).await?;
                    }
                    running.spec.cpu.sockets = *sockets;
                }
                Step::ResizeHotplugMemory { bytes } => {
                    match &qmp {
                        Some(qmp) => live::resize_memory(qmp, *bytes).await?,
                        None => self.shared.set_plugged_memory(*bytes),
                    }
                    running.spec.memory.hotplugged_bytes = *bytes;
                }
                Step::AttachDisk(disk) => {
                    let slot =
                        live::free_slot(&running.spec, &running.attached, &running.nics, disk)
                            .ok_or_else(|| format!("disk {:?}: no free hotplug slot", disk.name))?;
                    let file = passed.remove(&disk.name);
                    let file = file.as_ref().map(std::os::fd::AsFd::as_fd);
                    let added = match &qmp {
                        Some(qmp) => live::attach_disk(qmp, disk, file, slot).await?,
                        None => live::AttachedDisk { slot, fdset: None },
                    };
                    running.attached.insert(disk.name.clone(), added);
                    running.spec.disks.push((**disk).clone());
                }
                Step::DetachDisk(name) => {
                    let fdset = running.attached.get(name).and_then(|a| a.fdset);
                    if let Some(qmp) = &qmp {
                        live::detach_disk(qmp, name, fdset, self.shared.device_deleted.subscribe())
                            .await?;
                    }
                    running.attached.remove(name);
                    let key = running
                        .spec
                        .disks
                        .iter()
                        .find(|d| &d.name == name)
                        .and_then(|d| d.passed_file.clone());
                    running.spec.disks.retain(|d| &d.name != name);
                    if let Some(key) = key
                        && !running
                            .spec
                            .disks
                            .iter()
                            .any(|d| d.passed_file.as_ref() == Some(&key))
                    {
                        self.passed.remove(&key);
                    }
                }
                Step::AttachInterface(iface) => self.attach_interface(running, iface).await?,
                Step::DetachInterface(name) => self.detach_interface(running, name).await?,
                Step::SetLink { name, up } => {
                    if let Some(qmp) = &qmp {
                        super::live_nic::set_link(qmp, name, *up).await?;
                    }
                    if let Some(iface) =
                        running.spec.interfaces.iter_mut().find(|i| &i.name == name)
                    {
                        iface.link_down = !*up;
                    }
                }
            }
            self.shared
                .set_resources(cpu_topology(&running.spec), requested_memory(&running.spec));
        }
        Ok(())
    }

    /// Builds the bridge and tap of `iface` on its pod interface and plugs it into QEMU on a
    /// free root port ([`super::live_nic`]).
    async fn attach_interface(
        &self,
        running: &mut Started,
        iface: &crate::spec::Interface,
    ) -> Result<(), String> {
        let port = super::live::free_port(&running.spec, &running.attached, &running.nics)
            .ok_or_else(|| format!("interface {:?}: no free hotplug port", iface.name))?;
        if let InterfaceBinding::Bridge(b) = &iface.binding
            && running.qmp.is_some()
        {
            let pod = self.pod_interface_for(iface, "bridge", &b.pod_interface)?;
            crate::netsetup::bridge::setup_bridge(b, &pod, None)
                .await
                .map_err(|e| format!("interface {:?}: {}", iface.name, error_chain(&e)))?;
        }
        if let Some(qmp) = &running.qmp {
            super::live_nic::attach(qmp, iface, port).await?;
        }
        running.nics.insert(iface.name.clone(), port);
        running.spec.interfaces.push(iface.clone());
        Ok(())
    }

    /// Unplugs interface `name` from QEMU and removes its links in the pod.
    async fn detach_interface(&self, running: &mut Started, name: &str) -> Result<(), String> {
        if let Some(qmp) = &running.qmp {
            super::live_nic::detach(qmp, name, self.shared.device_deleted.subscribe()).await?;
        }
        let links = running
            .spec
            .interfaces
            .iter()
            .find(|i| i.name == name)
            .and_then(|i| match &i.binding {
                InterfaceBinding::Bridge(b) => Some(b.clone()),
                _ => None,
            });
        if let Some(b) = links
            && running.qmp.is_some()
        {
            crate::netsetup::bridge::remove_bridge(&b).await;
        }
        running.nics.remove(name);
        running.spec.interfaces.retain(|i| i.name != name);
        Ok(())
    }

    /// Starts QEMU with `argv`; QEMU inherits the descriptors `inherited` (the passed files
    /// of the boot disks, which the caller keeps open until this returns).
    async fn start_qemu(
        &self,
        spec: &LauncherSpec,
        argv: &[String],
        incoming: bool,
        inherited: Vec<RawFd>,
    ) -> Result<Started, String> {
        let qmp_path = Path::new(&spec.paths.qmp_socket);
        remove_stale_socket(qmp_path);
        remove_stale_socket(self.agent.socket());
        if let Some(graphics) = &spec.graphics {
            remove_stale_socket(Path::new(&graphics.vnc_socket));
        }
        let log_path = self.opts.qemu_log();
        let fail = |message: String| {
            self.shared.publish(DomainStatus {
                state: DomainState::Crashed,
                reason: StateReason::FailedToStart,
                message: Some(message.clone()),
                ..DomainStatus::pending()
            });
            message
        };
        let log = crate::private_fs::open_append(&log_path).map_err(|e| {
            fail(format!(
                "cannot open the QEMU log {}: {e}",
                log_path.display()
            ))
        })?;
        let log_err = log
            .try_clone()
            .map_err(|e| fail(format!("cannot share the QEMU log: {e}")))?;
        let mut qemu = Process::new(&self.opts.qemu_binary);
        qemu.args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err));
        super::qemu_process::confine(&mut qemu);
        super::qemu_process::inherit(&mut qemu, inherited);
        let mut child = qemu.spawn().map_err(|e| {
            fail(format!(
                "cannot start {}: {e}",
                self.opts.qemu_binary.display()
            ))
        })?;
        let pid = child.id();
        let started_at = jiff::Timestamp::now().to_string();
        tracing::info!(pid, "QEMU started");
        let (qmp, events) = match self.connect_qmp(&mut child, qmp_path).await {
            Ok(connected) => connected,
            Err(why) => {
                if let Some(pid) = pid {
                    kill_group(pid);
                }
                let _ = child.wait().await;
                let detail = last_log_line(&log_path)
                    .map(|l| format!(": {l}"))
                    .unwrap_or_default();
                return Err(fail(format!("{why}{detail}")));
            }
        };
        if let Some(graphics) = &spec.graphics
            && let Err(why) = self
                .wait_for_vnc(&mut child, Path::new(&graphics.vnc_socket))
                .await
        {
            if let Some(pid) = pid {
                kill_group(pid);
            }
            let _ = child.wait().await;
            return Err(fail(why));
        }
        let qmp = Arc::new(qmp);
        // A migration target waits, paused, for the incoming state; QEMU resumes it itself
        // when the migration completes (a `RESUME` event, see `supervise`).
        let (state, reason) = if incoming {
            (DomainState::Paused, StateReason::Migration)
        } else {
            (DomainState::Running, StateReason::Booted)
        };
        self.shared.publish(DomainStatus {
            state,
            reason,
            qemu_pid: pid,
            started_at: Some(started_at),
            ..booted(spec)
        });
        let capped_logs = vec![PathBuf::from(&spec.paths.serial_log), log_path.clone()];
        tokio::spawn(supervise(
            child,
            (Arc::clone(&qmp), events),
            Arc::clone(&self.shared),
            Arc::clone(&self.agent),
            log_path,
            capped_logs,
        ));
        tokio::spawn(super::guest_agent::poll(
            Arc::clone(&self.agent),
            Arc::clone(&self.shared),
        ));
        Ok(Started::new(spec, pid, Some(qmp)))
    }

    /// Builds the in-pod network of every masquerade and bridge interface and starts its
    /// DHCP server, and starts passt for every passt interface. A failure leaves the domain
    /// Pending: the handler retries the `sync`, and the set-up starts clean again
    /// ([`crate::netsetup`]).
    async fn setup_network(&self, spec: &LauncherSpec) -> Result<NetworkServices, String> {
        let mut servers = Vec::new();
        let mut passts = Vec::new();
        for iface in &spec.interfaces {
            if let InterfaceBinding::Bridge(b) = &iface.binding {
                servers.extend(self.setup_bridge(spec, iface, b).await?);
                continue;
            }
            if let InterfaceBinding::Passt(p) = &iface.binding {
                passts.push(self.start_passt(iface, p).await?);
                continue;
            }
            let InterfaceBinding::Masquerade(m) = &iface.binding else {
                continue;
            };
            let pod = self.pod_interface_for(iface, "masquerade", &m.pod_interface)?;
            let network = |e: crate::netsetup::NetSetupError| {
                format!("interface {:?}: {}", iface.name, error_chain(&e))
            };
            crate::netsetup::setup_masquerade(m, &pod)
                .await
                .map_err(network)?;
            servers.push(crate::netsetup::start_dhcp(m, &pod, &spec.vmi.name).map_err(network)?);
        }
        Ok(NetworkServices {
            _dhcp: servers,
            _passt: passts,
        })
    }

    /// The pod interface `name` that `binding` of `iface` needs, when the launcher runs in a
    /// network namespace of its own that has it.
    fn pod_interface_for(
        &self,
        iface: &crate::spec::Interface,
        binding: &str,
        name: &str,
    ) -> Result<PodInterface, String> {
        self.pod_interface
            .as_ref()
            .filter(|p| p.name == name)
            .cloned()
            .or_else(|| {
                // A secondary (Multus) interface: the node adds it to the namespace, also
                // after the launcher started (NIC hotplug).
                let primary = self.pod_interface.as_ref()?;
                (primary.name != name)
                    .then(|| crate::netsetup::discover(name))
                    .flatten()
            })
            .ok_or_else(|| {
                format!(
                    "interface {:?}: the {binding} binding needs the pod interface {name:?} in the launcher's own network namespace",
                    iface.name
                )
            })
    }

    /// Starts passt for the passt interface `iface` ([`crate::netsetup::passt`]) and waits
    /// until it listens on its socket (QEMU connects at start and gives up when nothing
    /// listens).
    async fn start_passt(
        &self,
        iface: &crate::spec::Interface,
        p: &crate::spec::Passt,
    ) -> Result<Child, String> {
        let fail = |why: String| format!("interface {:?}: {why}", iface.name);
        self.pod_interface_for(iface, "passt", &p.pod_interface)?;
        let socket = Path::new(&p.socket);
        // A stale socket of an earlier start would look like a listening passt.
        remove_stale_socket(socket);
        let mut command = Process::new(crate::netsetup::program("passt"));
        command
            .args(crate::netsetup::passt::args(p))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        super::qemu_process::confine(&mut command);
        super::qemu_process::raise_open_files(&mut command);
        let mut child = command
            .spawn()
            .map_err(|e| fail(format!("cannot start passt: {e}")))?;
        let deadline = Instant::now() + self.opts.qmp_timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let detail = last_log_line(Path::new(&p.log))
                    .map(|l| format!(": {l}"))
                    .unwrap_or_default();
                return Err(fail(format!(
                    "passt exited during start-up ({status}){detail}"
                )));
            }
            // Not probed by connecting: passt serves one client only (`--one-off`), and
            // that is QEMU. It listens right after it binds.
            if std::fs::symlink_metadata(socket)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            {
                return Ok(child);
            }
            if Instant::now() >= deadline {
                return Err(fail(
                    "passt did not listen on its socket in time".to_owned(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Builds the bridge binding of `iface` and starts its DHCP server (none when the pod has
    /// no IPv4 address).
    async fn setup_bridge(
        &self,
        spec: &LauncherSpec,
        iface: &crate::spec::Interface,
        b: &crate::spec::PodBridge,
    ) -> Result<Option<tokio::task::JoinHandle<()>>, String> {
        let pod = self.pod_interface_for(iface, "bridge", &b.pod_interface)?;
        let network = |e: crate::netsetup::NetSetupError| {
            format!("interface {:?}: {}", iface.name, error_chain(&e))
        };
        // The pod network's address goes to the guest; a secondary network is bridged at
        // layer 2 only.
        let primary = self
            .pod_interface
            .as_ref()
            .is_some_and(|p| p.name == b.pod_interface);
        let ipv4 = self.pod_ipv4.as_ref().filter(|_| primary);
        crate::netsetup::bridge::setup_bridge(b, &pod, ipv4)
            .await
            .map_err(network)?;
        let resolv = std::fs::read_to_string(crate::netsetup::RESOLV_CONF).unwrap_or_default();
        let mac = iface.mac_address.as_deref().unwrap_or(&pod.mac);
        let Some(config) =
            crate::netsetup::bridge::dhcp_config(b, &pod, ipv4, mac, &spec.vmi.name, &resolv)
        else {
            return Ok(None);
        };
        crate::netsetup::serve_dhcp(&b.bridge, config)
            .map(Some)
            .map_err(network)
    }

    /// Waits for QEMU's QMP socket, giving up when QEMU exits or the timeout passes.
    async fn connect_qmp(
        &self,
        child: &mut Child,
        path: &Path,
    ) -> Result<(QmpClient, QmpEvents), String> {
        let deadline = Instant::now() + self.opts.qmp_timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("QEMU exited during start-up ({status})"));
            }
            match QmpClient::connect(path).await {
                Ok(connected) => return Ok(connected),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("QEMU's QMP socket did not answer in time: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Waits until QEMU's VNC server accepts connections. QMP can answer before QEMU has
    /// set its displays up (its monitor runs in an I/O thread of its own), and a domain is
    /// only reported Running once every socket the handler bridges to is there.
    async fn wait_for_vnc(&self, child: &mut Child, path: &Path) -> Result<(), String> {
        let deadline = Instant::now() + self.opts.qmp_timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("QEMU exited during start-up ({status})"));
            }
            match crate::unix_socket::connect(path).await {
                Ok(probe) => {
                    drop(probe);
                    return Ok(());
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("QEMU's VNC socket did not answer in time: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// The format node names (`disk-<index>`) of the boot-time, writable disks of the running
    /// spec named in `names`.
    async fn block_nodes(&self, names: &[String]) -> Vec<String> {
        let started = self.started.lock().await;
        let Some(running) = started.as_ref() else {
            return Vec::new();
        };
        running
            .spec
            .disks
            .iter()
            .enumerate()
            .filter(|(_, d)| names.contains(&d.name) && !d.readonly && !d.cdrom)
            .filter(|(_, d)| !running.attached.contains_key(&d.name))
            .map(|(i, _)| format!("disk-{i}"))
            .collect()
    }

    /// The running domain's counters ([`super::stats`]).
    async fn stats(&self) -> Result<crate::protocol::DomainStats, String> {
        let (pid, qmp, spec) = match &*self.started.lock().await {
            Some(s) => (s.pid, s.qmp.clone(), s.spec.clone()),
            None => return Err("no domain is running: sync first".to_owned()),
        };
        let (Some(pid), Some(qmp)) = (pid, qmp) else {
            return Err("no QEMU runs (fake mode): there are no domain stats".into());
        };
        let current = self.current();
        if current.is_final() {
            return Err("the domain has ended".into());
        }
        let memory_bytes = current
            .memory
            .map_or(spec.memory.guest_bytes, |m| m.current_bytes);
        let migrating = current
            .migration
            .as_ref()
            .is_some_and(|m| m.state == crate::protocol::MigrationJobState::Active);
        let mut stats = super::stats::read(super::stats::Subject {
            pid,
            qmp: &qmp,
            spec: &spec,
            memory_bytes,
            migrating,
        })
        .await?;
        // A slow agent costs only its filesystems, never QEMU's counters (the handler waits
        // 3 s for the whole answer).
        let filesystems = self.agent.filesystems(current.guest_agent.map(|a| *a));
        stats.filesystems = tokio::time::timeout(STATS_AGENT_TIMEOUT, filesystems)
            .await
            .unwrap_or_default();
        Ok(stats)
    }

    async fn started(&self) -> Result<(Option<u32>, Option<Arc<QmpClient>>), String> {
        match &*self.started.lock().await {
            Some(s) => Ok((s.pid, s.qmp.clone())),
            None => Err("no domain is running: sync first".to_owned()),
        }
    }

    async fn shutdown(&self, grace: Duration) -> Result<Value, String> {
        let (pid, qmp) = self.started().await?;
        if self.current().is_final() {
            return Ok(self.current_value());
        }
        if self.shared.intent() == Intent::Reboot
            && let Some(qmp) = &qmp
        {
            super::soft_reboot::restore_shutdown_action(qmp).await;
        }
        self.shared.set_intent(Intent::Shutdown);
        let (Some(pid), Some(qmp)) = (pid, qmp) else {
            self.shared
                .transition(DomainState::Shutoff, StateReason::GuestShutdown);
            return Ok(self.current_value());
        };
        // The escalation runs whatever the power button does: a hung QEMU answers no QMP
        // command, and must still be gone after the grace period.
        tokio::spawn(escalate(self.subscribe(), grace, qmp.clone(), pid));
        match tokio::time::timeout(QMP_ANSWER_TIMEOUT, qmp.system_powerdown()).await {
            Ok(pressed) => pressed
                .map(|()| self.current_value())
                .map_err(|e| e.to_string()),
            Err(_) => {
                tracing::warn!(
                    pid,
                    "QEMU does not answer the power button; it is stopped after the grace period"
                );
                Ok(self.current_value())
            }
        }
    }

    /// Reboots the guest from inside ([`super::soft_reboot`]).
    async fn soft_reboot(&self) -> Result<Value, String> {
        let (_, qmp) = self.started().await?;
        if self.current().is_final() {
            return Err("the domain has ended".to_owned());
        }
        if let Some(qmp) = qmp {
            super::soft_reboot::request(&self.shared, &self.agent, &qmp).await?;
        }
        Ok(self.current_value())
    }

    async fn kill(&self) -> Result<Value, String> {
        let (pid, _) = self.started().await?;
        if self.current().is_final() {
            return Ok(self.current_value());
        }
        self.shared.set_intent(Intent::Kill);
        match pid {
            Some(pid) => kill_group(pid),
            None => self
                .shared
                .transition(DomainState::Shutoff, StateReason::Destroyed),
        }
        Ok(self.current_value())
    }

    async fn pause(&self, pause: bool) -> Result<Value, String> {
        let (_, qmp) = self.started().await?;
        if self.current().is_final() {
            return Err("the domain has ended".to_owned());
        }
        if let Some(qmp) = qmp {
            let result = if pause {
                qmp.stop().await
            } else {
                qmp.cont().await
            };
            result.map_err(|e| e.to_string())?;
        }
        if pause {
            self.shared.set_intent(Intent::Pause);
            self.shared
                .transition(DomainState::Paused, StateReason::User);
        } else {
            self.shared.set_intent(Intent::None);
            self.shared
                .transition(DomainState::Running, StateReason::Unpaused);
        }
        Ok(self.current_value())
    }
}

/// After `grace`, asks QEMU to quit; five seconds later, kills it.
/// How long a QMP command that must not block a command of the handler may take.
const QMP_ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

async fn escalate(
    mut status: watch::Receiver<DomainStatus>,
    grace: Duration,
    qmp: Arc<QmpClient>,
    pid: u32,
) {
    if tokio::time::timeout(grace, status.wait_for(DomainStatus::is_final))
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        pid,
        "guest did not power off within the grace period, stopping QEMU"
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), qmp.quit()).await;
    if tokio::time::timeout(
        Duration::from_secs(5),
        status.wait_for(DomainStatus::is_final),
    )
    .await
    .is_err()
    {
        kill_group(pid);
    }
}

/// How often the serial and QEMU logs are checked against [`MAX_LOG_BYTES`].
const LOG_CHECK: Duration = Duration::from_secs(10);

/// Rotates those of `logs` past [`MAX_LOG_BYTES`] (off the runtime threads).
async fn cap_logs(logs: &[PathBuf]) {
    let logs = logs.to_vec();
    let checked = tokio::task::spawn_blocking(move || {
        for log in &logs {
            match rotate_if_larger(log, MAX_LOG_BYTES) {
                Ok(true) => {
                    tracing::info!(log = %log.display(), "rotated a log past its size limit")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(log = %log.display(), error = %e, "cannot rotate a log"),
            }
        }
    });
    let _ = checked.await;
}

/// Follows QMP events until QEMU exits, then publishes the final state. Meanwhile it keeps
/// `capped_logs` (the serial console log, QEMU's output) under their size limit.
async fn supervise(
    mut child: Child,
    (qmp, mut events): (Arc<QmpClient>, QmpEvents),
    shared: Arc<Shared>,
    agent: Arc<GuestAgentLink>,
    log_path: PathBuf,
    capped_logs: Vec<PathBuf>,
) {
    let mut guest_shutdown = false;
    let mut panicked = false;
    let mut rebooting = false;
    let mut qmp_open = true;
    let mut log_check = tokio::time::interval(LOG_CHECK);
    let exit = loop {
        tokio::select! {
            exit = child.wait() => break exit,
            _ = log_check.tick() => cap_logs(&capped_logs).await,
            event = events.recv(), if qmp_open => {
                let Some(event) = event else { qmp_open = false; continue };
                tracing::debug!(event = %event.name, data = %event.data, "QMP event");
                match event.kind() {
                    QmpEventKind::Shutdown { guest: true, .. } if shared.intent() == Intent::Reboot => {
                        rebooting = true;
                        tokio::spawn(super::soft_reboot::reset_after_shutdown(Arc::clone(&qmp)));
                    }
                    QmpEventKind::Shutdown { guest, .. } => guest_shutdown |= guest,
                    QmpEventKind::Stop if rebooting => {}
                    QmpEventKind::Resume if rebooting => {
                        rebooting = false;
                        shared.set_intent(Intent::None);
                    }
                    QmpEventKind::GuestPanicked => panicked = true,
                    QmpEventKind::Stop if !guest_shutdown => {
                        let migrating = shared.current().migration.is_some_and(|m| m.state == crate::protocol::MigrationJobState::Active);
                        let reason = if shared.intent() == Intent::Pause {
                            StateReason::User
                        } else if migrating {
                            StateReason::Migration
                        } else {
                            StateReason::Emulator
                        };
                        shared.transition(DomainState::Paused, reason);
                    }
                    QmpEventKind::Resume => {
                        let reason = if shared.current().reason == StateReason::Migration {
                            tracing::info!("the incoming migration completed; the domain runs here");
                            StateReason::Migrated
                        } else {
                            StateReason::Unpaused
                        };
                        shared.transition(DomainState::Running, reason);
                    }
                    QmpEventKind::MemoryDeviceSizeChange { device, size }
                        if device.as_deref() == Some(crate::argv::memory::HOTPLUG_MEMORY_DEVICE) =>
                    {
                        tracing::info!(plugged = size, "the guest's hotplug memory changed");
                        shared.set_plugged_memory(size);
                    }
                    QmpEventKind::DeviceDeleted { device: Some(device) } => {
                        let _ = shared.device_deleted.send(device);
                    }
                    QmpEventKind::SerialPortChange { id, open }
                        if id == crate::argv::channels::GUEST_AGENT_PORT_ID =>
                    {
                        agent.set_open(open);
                    }
                    _ => {}
                }
            }
        }
    };
    let mut status = shared.status.borrow().clone();
    let (state, reason) = final_state(
        exit.as_ref().ok(),
        guest_shutdown,
        panicked,
        shared.intent(),
    );
    // QEMU's own log says "terminating on signal" when it was killed; this line says how
    // it ended in the launcher's log, which is the compute container's log.
    match &exit {
        Ok(exit) => tracing::info!(?state, ?reason, exit = %exit, "QEMU ended"),
        Err(e) => tracing::warn!(?state, ?reason, error = %e, "QEMU ended"),
    }
    status.state = state;
    status.reason = reason;
    status.exit_code = exit.as_ref().ok().and_then(ExitStatus::code);
    if state == DomainState::Crashed {
        status.message = match &exit {
            Ok(exit) => Some(last_log_line(&log_path).unwrap_or_else(|| format!("QEMU {exit}"))),
            Err(e) => Some(format!("cannot wait for QEMU: {e}")),
        };
    }
    shared.publish(status);
}

/// The status fields a domain has from its boot: its vCPUs and memory (the virtio-mem device
/// plugs its share later and reports it).
fn booted(spec: &LauncherSpec) -> DomainStatus {
    DomainStatus {
        cpu: Some(cpu_topology(spec)),
        memory: Some(GuestMemory {
            at_boot_bytes: spec.memory.guest_bytes,
            current_bytes: spec.memory.guest_bytes,
            requested_bytes: requested_memory(spec),
        }),
        ..DomainStatus::pending()
    }
}

fn cpu_topology(spec: &LauncherSpec) -> CpuTopology {
    CpuTopology {
        sockets: spec.cpu.sockets,
        cores: spec.cpu.cores,
        threads: spec.cpu.threads,
    }
}

fn requested_memory(spec: &LauncherSpec) -> u64 {
    spec.memory.guest_bytes + spec.memory.hotplugged_bytes
}

/// The final state from how QEMU ended and what led there.
fn final_state(
    exit: Option<&ExitStatus>,
    guest_shutdown: bool,
    panicked: bool,
    intent: Intent,
) -> (DomainState, StateReason) {
    if panicked {
        (DomainState::Crashed, StateReason::Panicked)
    } else if guest_shutdown {
        (DomainState::Shutoff, StateReason::GuestShutdown)
    } else if intent == Intent::Migrated {
        (DomainState::Shutoff, StateReason::Migrated)
    } else if matches!(intent, Intent::Shutdown | Intent::Kill) {
        (DomainState::Shutoff, StateReason::Destroyed)
    } else if exit.is_some_and(ExitStatus::success) {
        (DomainState::Shutoff, StateReason::Unknown)
    } else {
        (DomainState::Crashed, StateReason::QemuExited)
    }
}

/// SIGKILL to QEMU. QEMU stays in the launcher's process group, so whoever stops the
/// launcher's group (the pod runner, kubelet's cgroup kill) stops QEMU with it.
fn kill_group(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    if let Err(e) = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    ) {
        tracing::warn!(pid, error = %e, "cannot kill QEMU");
    }
}

fn remove_stale_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// The last non-empty line of QEMU's log, for the user-facing message.
fn last_log_line(path: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(4096))).ok()?;
    let mut tail = String::new();
    file.take(4096).read_to_string(&mut tail).ok()?;
    tail.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
}

/// `error: cause: cause …`, for messages that travel as text.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_guest_power_off_is_a_guest_shutdown_even_when_a_shutdown_was_requested() {
        let ok = ExitStatus::from_raw(0);
        assert_eq!(
            final_state(Some(&ok), true, false, Intent::Shutdown),
            (DomainState::Shutoff, StateReason::GuestShutdown)
        );
    }

    #[test]
    fn a_requested_kill_is_destroyed_not_crashed() {
        let killed = ExitStatus::from_raw(9);
        assert_eq!(
            final_state(Some(&killed), false, false, Intent::Kill),
            (DomainState::Shutoff, StateReason::Destroyed)
        );
    }

    #[test]
    fn an_unrequested_death_is_a_crash() {
        let killed = ExitStatus::from_raw(9);
        assert_eq!(
            final_state(Some(&killed), false, false, Intent::None),
            (DomainState::Crashed, StateReason::QemuExited)
        );
        assert_eq!(
            final_state(Some(&ExitStatus::from_raw(0)), false, true, Intent::None),
            (DomainState::Crashed, StateReason::Panicked)
        );
    }
}
