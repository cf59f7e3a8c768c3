//! The task that follows one VMI: connect to its launcher, sync, report, shut down.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kubevirt_api::constants::LAUNCHER_VOLUME;
use kubevirt_api::events::{EventRecorder, EventType};
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};
use virt_launcher::pod_layout::PodLayout;
use virt_launcher::protocol::{
    Command, DomainState, DomainStatus, LauncherClient, ProtocolError, StateReason, UpMessage,
};

use super::VmiSyncConfig;
use super::hotplug::{self, HandlerPhase};
use super::link::LauncherLink;
use super::migration::SourceMigration;
use super::pull::{PullBackoff, ensure_images};
use super::status::{DomainFacts, Observation, desired_status, status_patch};
use crate::launcher_spec::{
    FileAction, PreparedSpec, SpecContext, build_spec, prepare_files, supports_direct_io,
};

/// How often a missing launcher socket is retried.
pub(super) const RETRY: Duration = Duration::from_millis(500);
/// How often a refused sync is retried when nothing else changes.
const SYNC_RETRY: Duration = Duration::from_secs(10);

/// Whether the VMI's phase is final.
pub fn is_final(vmi: &VirtualMachineInstance) -> bool {
    matches!(phase(vmi), Some(Phase::Succeeded | Phase::Failed))
}

fn phase(vmi: &VirtualMachineInstance) -> Option<Phase> {
    vmi.status.as_ref().and_then(|s| s.phase.clone())
}

fn name(vmi: &VirtualMachineInstance) -> String {
    format!(
        "{}/{}",
        vmi.metadata.namespace.as_deref().unwrap_or_default(),
        vmi.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The launcher pod directory of the VMI's active pod on this node.
///
/// `status.activePods` is written by whoever may patch the VMI's status, and its keys become a
/// path component here: only keys that are pod UIDs in their canonical form (lower-case,
/// hyphenated) are used, so a key can never leave `pods_dir` (`../…`, `/…`, `a/b`). Other keys
/// for this node are ignored with a warning.
///
/// A node can hold more than one pod of the VMI (it migrated away and back: the old pod
/// completed but still exists): a directory whose launcher socket is there and that has no
/// final state is preferred, then one without a final state (its launcher is starting), then
/// the first.
pub fn active_pod_dir(
    vmi: &VirtualMachineInstance,
    node_name: &str,
    kubelet_pods_dir: &Path,
) -> Option<PathBuf> {
    let status = vmi.status.as_ref()?;
    let dirs: Vec<PathBuf> = status
        .active_pods
        .iter()
        .filter(|(_, node)| node.as_str() == node_name)
        .map(|(uid, _)| uid)
        .filter(|uid| {
            let valid = is_canonical_uuid(uid);
            if !valid {
                warn!(vmi = %name(vmi), key = %uid, "ignoring an activePods key that is not a pod UID");
            }
            valid
        })
        .map(|uid| launcher_dir_on_host(kubelet_pods_dir, uid))
        .collect();
    if dirs.len() <= 1 {
        return dirs.into_iter().next();
    }
    let ended = |d: &PathBuf| d.join(virt_launcher::protocol::FINAL_STATE_FILE).exists();
    let live = |d: &PathBuf| PodLayout::new(d).launcher_socket().exists() && !ended(d);
    dirs.iter()
        .find(|d| live(d))
        .or_else(|| dirs.iter().find(|d| !ended(d)))
        .or_else(|| dirs.first())
        .cloned()
}

/// A connection to the launcher of the VMI's active pod on this node
/// ([`active_pod_dir`]) and that directory, once the launcher has said in its hello that it
/// runs this VMI; `None` when no pod of the VMI is here or its launcher runs another VMI (an
/// `activePods` key naming another VMI's pod must not reach that VMI's domain).
///
/// # Errors
/// When the launcher's socket does not answer the handshake.
pub async fn connect_active_launcher(
    vmi: &VirtualMachineInstance,
    node_name: &str,
    kubelet_pods_dir: &Path,
) -> Result<Option<(PathBuf, LauncherClient)>, ProtocolError> {
    let Some(dir) = active_pod_dir(vmi, node_name, kubelet_pods_dir) else {
        return Ok(None);
    };
    let client = LauncherClient::connect(&PodLayout::new(&dir).launcher_socket()).await?;
    let reported = client.hello().vmi_uid.as_deref();
    if reported.is_none() || reported != vmi.metadata.uid.as_deref() {
        warn!(vmi = %name(vmi), launcher_vmi = ?reported, dir = %dir.display(), "the launcher of the VMI's active pod does not run this VMI");
        return Ok(None);
    }
    Ok(Some((dir, client)))
}

/// Where the launcher pod's [`LAUNCHER_VOLUME`] emptyDir is on the node: kubelet's layout
/// below its pod directory.
pub fn launcher_dir_on_host(kubelet_pods_dir: &Path, pod_uid: &str) -> PathBuf {
    kubelet_pods_dir
        .join(pod_uid)
        .join("volumes")
        .join("kubernetes.io~empty-dir")
        .join(LAUNCHER_VOLUME)
}

/// Whether the launcher behind `link` runs `vmi`: it reported `vmi`'s UID in its hello.
///
/// The pod directory named by an `activePods` key exists only for a pod this node runs, and
/// its launcher was started with the UID of the VMI the pod was made for (`--uid`); a key
/// naming another VMI's pod on this node therefore reaches a launcher that reports another
/// UID, and one that reports none is not trusted either.
pub(super) fn serves(link: &LauncherLink, vmi: &VirtualMachineInstance) -> bool {
    reports_vmi(link.vmi_uid(), vmi)
}

fn reports_vmi(reported: Option<&str>, vmi: &VirtualMachineInstance) -> bool {
    matches!((reported, vmi.metadata.uid.as_deref()), (Some(r), Some(u)) if r == u)
}

/// Whether `key` is a UUID written as Kubernetes writes pod UIDs (`8-4-4-4-12` lower-case hex).
pub(super) fn is_canonical_uuid(key: &str) -> bool {
    uuid::Uuid::try_parse(key).is_ok_and(|u| u.hyphenated().to_string() == key)
}

/// The launcher has gone: its socket is there but nobody listens on it any more.
fn launcher_exited(dir: &Path, error: &virt_launcher::protocol::ProtocolError) -> bool {
    PodLayout::new(dir).launcher_socket().exists()
        && matches!(error, virt_launcher::protocol::ProtocolError::Io(e)
            if e.kind() == std::io::ErrorKind::ConnectionRefused)
}

fn grace_seconds(vmi: &VirtualMachineInstance) -> u64 {
    let grace = vmi
        .spec
        .termination_grace_period_seconds
        .unwrap_or(kubevirt_api::v1::DEFAULT_GRACE_PERIOD_SECONDS);
    u64::try_from(grace).unwrap_or(0)
}

/// One VMI's state in the worker.
pub(super) struct Follow {
    pub(super) client: kube::Client,
    pub(super) config: Arc<VmiSyncConfig>,
    pub(super) vmi: watch::Receiver<Arc<VirtualMachineInstance>>,
    pub(super) current: Arc<VirtualMachineInstance>,
    pub(super) facts: DomainFacts,
    observation: Option<Observation>,
    /// The last observation's status write gave up (every attempt lost a race or the API
    /// server was unreachable): it is tried again on the next retry tick, since no VMI update
    /// may ever come to wake this worker.
    status_owed: bool,
    pull_backoff: PullBackoff,
    /// The VMI's Events (upstream's handler reasons). Events are aggregated per involved
    /// object, so one recorder per followed VMI aggregates as one per process would.
    pub(super) events: EventRecorder,
}

/// The Event upstream's handler records when it moves a VMI to `phase`.
fn phase_event(phase: &str) -> Option<(EventType, &'static str, &'static str)> {
    match phase {
        "Running" => Some((
            EventType::Normal,
            "Started",
            "VirtualMachineInstance started.",
        )),
        "Succeeded" => Some((
            EventType::Normal,
            "Stopped",
            "The VirtualMachineInstance was shut down.",
        )),
        "Failed" => Some((
            EventType::Warning,
            "Stopped",
            "The VirtualMachineInstance crashed.",
        )),
        _ => None,
    }
}

/// How a launcher session ended.
enum SessionEnd {
    /// The domain reached a final state (reported).
    Final,
    /// The connection dropped without a final state.
    Disconnected,
    /// The VMI left the store or the handler is stopping.
    Stop,
}

/// Follows one VMI until it is final, leaves this node, or `cancel` fires.
pub async fn run(
    client: kube::Client,
    config: Arc<VmiSyncConfig>,
    vmi: watch::Receiver<Arc<VirtualMachineInstance>>,
    cancel: CancellationToken,
) {
    let mut follow = Follow::new(client, config, vmi);
    tokio::select! {
        () = cancel.cancelled() => {}
        () = follow.run() => {}
    }
}

/// Prepares this node as the target of the VMI's migration until the domain runs here, the
/// migration is over, or `cancel` fires ([`super::migration`]).
pub async fn run_target(
    client: kube::Client,
    config: Arc<VmiSyncConfig>,
    vmi: watch::Receiver<Arc<VirtualMachineInstance>>,
    cancel: CancellationToken,
) {
    let mut follow = Follow::new(client, config, vmi);
    tokio::select! {
        () = cancel.cancelled() => {}
        () = follow.run_target() => {}
    }
}

impl Follow {
    fn new(
        client: kube::Client,
        config: Arc<VmiSyncConfig>,
        vmi: watch::Receiver<Arc<VirtualMachineInstance>>,
    ) -> Self {
        let current = vmi.borrow().clone();
        Follow {
            events: EventRecorder::new(client.clone(), "virt-handler").on_host(&config.node_name),
            client,
            config,
            vmi,
            current,
            facts: DomainFacts {
                spec: None,
                accel_reason: String::new(),
                pod_interface: None,
                hotplug: Default::default(),
            },
            observation: None,
            status_owed: false,
            pull_backoff: PullBackoff::default(),
        }
    }

    /// `namespace/name` of the VMI, for logs.
    pub(super) fn name(&self) -> String {
        name(&self.current)
    }

    async fn run(&mut self) {
        let mut connected_once = false;
        loop {
            if is_final(&self.current) {
                return;
            }
            let Some(dir) = active_pod_dir(
                &self.current,
                &self.config.node_name,
                &self.config.kubelet_pods_dir,
            ) else {
                if !self.wait_change(None).await {
                    return;
                }
                continue;
            };
            match LauncherLink::connect(&PodLayout::new(&dir).launcher_socket()).await {
                Ok(link) if !serves(&link, &self.current) => {
                    // Not this VMI's launcher: never send it this VMI's spec. The key stays
                    // wrong until `activePods` changes, so wait for a VMI update.
                    let message = format!(
                        "the launcher in the pod directory {} does not run this VMI",
                        dir.display()
                    );
                    warn!(vmi = %name(&self.current), launcher_vmi = ?link.vmi_uid(), "{message}");
                    drop(link);
                    self.observe(Observation::SyncFailed("SyncFailed".into(), message))
                        .await;
                    if !self.wait_change(None).await {
                        return;
                    }
                }
                Ok(link) => {
                    connected_once = true;
                    match self.session(link, &dir).await {
                        SessionEnd::Final | SessionEnd::Stop => return,
                        SessionEnd::Disconnected => continue,
                    }
                }
                Err(e) => {
                    let running = phase(&self.current) == Some(Phase::Running);
                    if let Some(last) = final_state(&dir) {
                        // The launcher ended and left the domain's final state behind; a
                        // domain that migrated away runs on the target node.
                        if last.reason != StateReason::Migrated {
                            self.observe(Observation::Domain(last)).await;
                        }
                        return;
                    }
                    if running || connected_once || launcher_exited(&dir, &e) {
                        let message = format!("the launcher of this VMI is gone: {e}");
                        warn!(vmi = %name(&self.current), "{message}");
                        self.observe(Observation::LauncherGone(message)).await;
                        return;
                    }
                    debug!(vmi = %name(&self.current), error = %e, "launcher not up yet");
                    if !self.wait_change(Some(RETRY)).await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits for a VMI update (true) or `timeout` (true); false when the VMI is gone.
    pub(super) async fn wait_change(&mut self, timeout: Option<Duration>) -> bool {
        let changed = async {
            let ok = self.vmi.changed().await.is_ok();
            if ok {
                self.current = self.vmi.borrow_and_update().clone();
            }
            ok
        };
        match timeout {
            Some(t) => tokio::time::timeout(t, changed).await.unwrap_or(true),
            None => changed.await,
        }
    }

    /// Asks the launcher to power the guest off within the VMI's grace period (the VMI is
    /// being deleted) and records `ShuttingDown`.
    async fn power_off(&mut self, link: &mut LauncherLink) -> Result<(), ProtocolError> {
        let grace = grace_seconds(&self.current);
        info!(vmi = %name(&self.current), grace, "VMI is being deleted: powering the guest off");
        link.send(Command::Shutdown {
            grace_period_seconds: grace,
        })
        .await?;
        self.events
            .record(
                &*self.current,
                EventType::Normal,
                "ShuttingDown",
                "Signaled Graceful Shutdown",
            )
            .await;
        Ok(())
    }

    async fn session(&mut self, mut link: LauncherLink, dir: &Path) -> SessionEnd {
        self.facts.pod_interface = link.pod_interface().cloned();
        let mut st = SessionState {
            sync_id: None,
            live_asked: LiveAsk::default(),
            domain: DomainStatus::pending(),
            source: SourceMigration::default(),
        };
        let mut shutdown_sent = false;
        let mut sync_retry = tokio::time::interval(SYNC_RETRY);
        sync_retry.reset();
        loop {
            let deleting = self.current.metadata.deletion_timestamp.is_some();
            let active = matches!(st.domain.state, DomainState::Running | DomainState::Paused);
            if deleting && active && !shutdown_sent {
                if self.power_off(&mut link).await.is_err() {
                    return SessionEnd::Disconnected;
                }
                shutdown_sent = true;
            }
            let pull_retry = self.pull_backoff.next_attempt().filter(|_| {
                st.domain.state == DomainState::Pending && st.sync_id.is_none() && !deleting
            });
            tokio::select! {
                () = sleep_until(pull_retry), if pull_retry.is_some() => {
                    st.sync_id = self.sync(&mut link, dir).await;
                }
                message = link.recv() => match message {
                    None => return SessionEnd::Disconnected,
                    Some(UpMessage::Domain(status)) => {
                        if let Some(end) = self.on_domain(&mut link, dir, status, &mut st).await {
                            return end;
                        }
                    }
                    Some(UpMessage::Ack { id, result: Err(message) }) if Some(id) == st.sync_id => {
                        warn!(vmi = %name(&self.current), %message, "the launcher refused the spec");
                        st.sync_id = None;
                        if st.domain.state == DomainState::Pending {
                            self.observe(Observation::SyncFailed("SyncFailed".into(), message)).await;
                        }
                    }
                    Some(UpMessage::Ack { id, result }) => self.on_ack(id, result, &mut st).await,
                    Some(UpMessage::Hello(_)) => {}
                    Some(UpMessage::Error(message)) => {
                        warn!(vmi = %name(&self.current), %message, "launcher error");
                    }
                    Some(UpMessage::Event(event)) => {
                        let kind = if event.warning { EventType::Warning } else { EventType::Normal };
                        self.events.record(&*self.current, kind, &event.reason, &event.message).await;
                    }
                },
                changed = self.vmi.changed() => {
                    if changed.is_err() {
                        return SessionEnd::Stop;
                    }
                    self.current = self.vmi.borrow_and_update().clone();
                    if is_final(&self.current) {
                        return SessionEnd::Stop;
                    }
                    if let Some(observation) = self.observation.clone() {
                        self.observe(observation).await;
                    }
                    let active = matches!(st.domain.state, DomainState::Running | DomainState::Paused);
                    if active
                        && self.current.metadata.deletion_timestamp.is_none()
                        && self.update_live(&mut link, dir, &st.domain, &mut st.live_asked).await.is_err()
                    {
                        return SessionEnd::Disconnected;
                    }
                    if active && self.source_step(&mut link, dir, &st.domain, &mut st.source).await.is_err() {
                        return SessionEnd::Disconnected;
                    }
                }
                _ = sync_retry.tick() => {
                    if self.status_owed
                        && let Some(observation) = self.observation.clone()
                    {
                        self.observe(observation).await;
                    }
                    if st.domain.state == DomainState::Pending && st.sync_id.is_none() && !deleting {
                        st.sync_id = self.sync(&mut link, dir).await;
                    }
                    // A hotplug disk whose attachment pod could not be reached yet.
                    let active = matches!(st.domain.state, DomainState::Running | DomainState::Paused);
                    if active && !deleting && self.hotplug_pending()
                        && self.update_live(&mut link, dir, &st.domain, &mut st.live_asked).await.is_err()
                    {
                        return SessionEnd::Disconnected;
                    }
                }
            }
        }
    }

    /// The ack of a command other than the pending domain's `sync`.
    async fn on_ack(
        &mut self,
        id: u64,
        result: Result<serde_json::Value, String>,
        st: &mut SessionState,
    ) {
        match result {
            Ok(_) if st.live_asked.is_disk_sync(id) => {
                // The domain has the spec's hotplug disks now.
                if let Some(disks) = st.live_asked.disk_sync.take().map(|(_, d)| d) {
                    for disk in disks {
                        self.facts.hotplug.insert(disk, HandlerPhase::Ready);
                    }
                }
                for volume in std::mem::take(&mut st.live_asked.unplugging) {
                    let message = format!("Volume {volume} has been unplugged");
                    self.events
                        .record(
                            &*self.current,
                            EventType::Normal,
                            "VolumeUnplugged",
                            &message,
                        )
                        .await;
                }
                if let Some(observation) = self.observation.clone() {
                    self.observe(observation).await;
                }
            }
            Ok(_) if st.live_asked.nic_sync == Some(id) => {
                // The domain has the spec's interfaces now: report them.
                st.live_asked.nic_sync = None;
                if let Some(observation) = self.observation.clone() {
                    self.observe(observation).await;
                }
            }
            Ok(_) => {}
            Err(message) => {
                warn!(vmi = %name(&self.current), id, %message, "the launcher refused a command");
                if st.live_asked.nic_sync == Some(id) {
                    // Tried again at the next change of the VMI.
                    st.live_asked.nic_sync = None;
                    st.live_asked.nics_sent = Some(Vec::new());
                    st.live_asked.nics_checked = None;
                }
                if st.live_asked.is_disk_sync(id) {
                    st.live_asked.disk_sync = None;
                    st.live_asked.disks_sent = None;
                    st.live_asked.unplugging.clear();
                    self.events
                        .record(
                            &*self.current,
                            EventType::Warning,
                            "HotplugFailed",
                            &message,
                        )
                        .await;
                }
                self.source_refused(id, &message, &mut st.source).await;
            }
        }
    }

    /// A domain event of the session; `Some` ends the session.
    async fn on_domain(
        &mut self,
        link: &mut LauncherLink,
        dir: &Path,
        status: DomainStatus,
        st: &mut SessionState,
    ) -> Option<SessionEnd> {
        let deleting = self.current.metadata.deletion_timestamp.is_some();
        st.domain = status.clone();
        let domain = &st.domain;
        let migrated_away = domain.is_final() && domain.reason == StateReason::Migrated;
        if domain.reason == StateReason::Migration || migrated_away {
            // Paused for the switch-over, or gone to the target: the target handler reports
            // the VMI from now on.
            let domain = domain.clone();
            if self
                .source_step(link, dir, &domain, &mut st.source)
                .await
                .is_err()
            {
                return Some(SessionEnd::Disconnected);
            }
            return domain.is_final().then_some(SessionEnd::Final);
        }
        let first = self.facts.spec.is_none();
        let mut sync_failed = false;
        if domain.state == DomainState::Pending && st.sync_id.is_none() && !deleting {
            st.sync_id = self.sync(link, dir).await;
            // A pending domain whose sync failed keeps its Synchronized=False (ErrImagePull …):
            // reporting the domain would clear it at once.
            sync_failed = st.sync_id.is_none()
                && matches!(self.observation, Some(Observation::SyncFailed(..)));
        } else if first {
            // Re-attached to a started domain: rebuild the spec for the status fields (files
            // exist) and catch up on live changes.
            self.build(dir).await.ok();
            let domain = st.domain.clone();
            if !deleting
                && self
                    .update_live(link, dir, &domain, &mut st.live_asked)
                    .await
                    .is_err()
            {
                return Some(SessionEnd::Disconnected);
            }
        }
        if !sync_failed {
            self.observe(Observation::Domain(status)).await;
        }
        if st.domain.is_final() {
            return Some(SessionEnd::Final);
        }
        let domain = st.domain.clone();
        if self
            .source_step(link, dir, &domain, &mut st.source)
            .await
            .is_err()
        {
            return Some(SessionEnd::Disconnected);
        }
        None
    }

    /// Sends the VMI's spec to its running domain when it wants vCPUs or memory the domain
    /// has not got (CPU and memory hotplug; the launcher applies what may change live).
    /// `Err` when the connection broke.
    async fn update_live(
        &mut self,
        link: &mut LauncherLink,
        dir: &Path,
        domain: &DomainStatus,
        asked: &mut LiveAsk,
    ) -> Result<(), ()> {
        let passed = self.pass_hotplug_files(link).await?;
        let Some(has) = LiveResources::of_domain(domain) else {
            return Ok(()); // a launcher that does not report them cannot change them
        };
        // Building the spec costs a blocking task: only when the VMI's sockets, guest memory
        // or attached hotplug disks changed since the last look, or the domain has not caught
        // up yet.
        let key = live_key(&self.current);
        let disks_key = hotplug_key(&self.current);
        let nics_key = nic_key(&self.current);
        if !passed
            && asked.checked.as_ref() == Some(&key)
            && asked.disks_checked.as_ref() == Some(&disks_key)
            && asked.nics_checked.as_ref() == Some(&nics_key)
            && asked.resources.is_none_or(|r| r == has)
        {
            return Ok(());
        }
        asked.checked = Some(key);
        asked.disks_checked = Some(disks_key);
        asked.nics_checked = Some(nics_key);
        let nics_before = self.facts.spec.as_ref().map(spec_nics);
        let Ok(prepared) = self.build(dir).await else {
            return Ok(());
        };
        // NIC hotplug: the interfaces (and links) of the spec against those last sent.
        let nics = spec_nics(&prepared.spec);
        let nics_sent = asked
            .nics_sent
            .get_or_insert_with(|| nics_before.unwrap_or_else(|| nics.clone()));
        let nics_change = *nics_sent != nics;
        let wants = LiveResources::of_spec(&prepared.spec);
        let disks = hotplug::spec_hotplug_disks(&prepared.spec);
        // What the domain has after a restart of this handler: the volumes it made Ready.
        let sent = asked
            .disks_sent
            .get_or_insert_with(|| ready_hotplug_volumes(&self.current));
        let disks_change = *sent != disks;
        let removed: Vec<String> = sent
            .iter()
            .filter(|d| !disks.contains(d))
            .cloned()
            .collect();
        if !disks_change && !nics_change && (wants == has || asked.resources == Some(wants)) {
            return Ok(());
        }
        info!(vmi = %name(&self.current), ?has, ?wants, ?disks, ?nics, "changing the running domain");
        asked.resources = Some(wants);
        asked.disks_sent = Some(disks.clone());
        asked.nics_sent = Some(nics);
        let id = link
            .send(Command::Sync(Box::new(prepared.spec)))
            .await
            .map_err(drop)?;
        if disks_change {
            asked.disk_sync = Some((id, disks));
            asked.unplugging = removed;
        }
        if nics_change {
            asked.nic_sync = Some(id);
        }
        Ok(())
    }

    /// Passes the launcher the file of each hotplug volume whose attachment pod is ready and
    /// records `MountedToPod` (see [`hotplug`]); true when a file was passed. `Err` when the
    /// connection broke.
    async fn pass_hotplug_files(&mut self, link: &mut LauncherLink) -> Result<bool, ()> {
        let volumes = &self.current.spec.volumes;
        self.facts
            .hotplug
            .retain(|name, _| volumes.iter().any(|v| &v.name == name));
        let mut passed = false;
        for attach in hotplug::to_attach(&self.current) {
            if self.facts.hotplug.contains_key(&attach.volume) {
                continue;
            }
            let size = crate::launcher_spec::claim_disk_size(&self.current, &attach.volume)
                .ok()
                .flatten();
            match hotplug::open_disk(&self.config.kubelet_pods_dir, &attach, size).await {
                Ok(file) => {
                    link.pass_file(&attach.volume, &file).await.map_err(drop)?;
                    info!(vmi = %name(&self.current), volume = %attach.volume, "passed the hotplugged disk to the launcher");
                    self.facts
                        .hotplug
                        .insert(attach.volume, HandlerPhase::MountedToPod);
                    passed = true;
                }
                Err(error) => {
                    warn!(vmi = %name(&self.current), volume = %attach.volume, %error, "cannot hand the hotplugged disk to the launcher yet");
                }
            }
        }
        if passed && let Some(observation) = self.observation.clone() {
            self.observe(observation).await;
        }
        Ok(passed)
    }

    /// Whether a hotplug volume waits for its file to be passed.
    fn hotplug_pending(&self) -> bool {
        hotplug::to_attach(&self.current)
            .iter()
            .any(|a| !self.facts.hotplug.contains_key(&a.volume))
    }

    /// Builds the spec and prepares its files (blocking work off the runtime threads).
    async fn build(&mut self, dir: &Path) -> Result<PreparedSpec, crate::launcher_spec::SpecError> {
        let decision =
            super::choose_accel(self.config.use_emulation, &self.config.cluster.current());
        self.facts.accel_reason.clone_from(&decision.reason);
        let vmi = Arc::clone(&self.current);
        let config = Arc::clone(&self.config);
        let dir = dir.to_owned();
        let pod_interface = self.facts.pod_interface.clone();
        let built = tokio::task::spawn_blocking(move || {
            let ctx = SpecContext {
                pod_dir: config.launcher_dir_in_pod.as_deref().unwrap_or(&dir),
                images: &config.images,
                host_disk_dir: &config.host_disk_dir,
                accel: decision.accel,
                direct_io: supports_direct_io(&dir),
                pod_interface: pod_interface.as_ref(),
                // The launcher directory is the pod's `volumes/kubernetes.io~empty-dir/public`.
                pod_volumes_dir: dir.parent().and_then(Path::parent).unwrap_or(&dir),
            };
            build_spec(&vmi, &ctx)
        })
        .await
        .map_err(|e| {
            crate::launcher_spec::SpecError::Invalid(format!("spec task failed: {e}"))
        })??;
        self.facts.spec = Some(built.spec.clone());
        Ok(built)
    }

    /// Makes the VMI's images present; on failure reports `ErrImagePull` /
    /// `ImagePullBackOff` and returns false. During a back-off nothing is tried.
    async fn pull_images(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if !self.pull_backoff.may_try(now) {
            return false;
        }
        // A pull can take minutes: the VMI being deleted (or leaving) meanwhile abandons it.
        let mut updates = self.vmi.clone();
        let gone = async move {
            loop {
                let deleting = updates
                    .borrow_and_update()
                    .metadata
                    .deletion_timestamp
                    .is_some();
                if deleting || updates.changed().await.is_err() {
                    return;
                }
            }
        };
        let pulled = tokio::select! {
            pulled = ensure_images(&self.client, &self.config.images, &self.current) => pulled,
            () = gone => {
                info!(vmi = %name(&self.current), "VMI deleted while its images were pulled; pull abandoned");
                return false;
            }
        };
        match pulled {
            Ok(()) => {
                self.pull_backoff.succeeded();
                true
            }
            Err(failure) => {
                let (reason, message) = self
                    .pull_backoff
                    .failed(tokio::time::Instant::now(), &failure);
                warn!(vmi = %name(&self.current), image = %failure.image, %reason, %message, "image not available");
                self.observe(Observation::SyncFailed(reason, message)).await;
                false
            }
        }
    }

    /// Pulls the images, builds, prepares and sends the spec; returns the sync command's id.
    async fn sync(&mut self, link: &mut LauncherLink, dir: &Path) -> Option<u64> {
        self.sync_as(link, dir, None).await
    }

    /// As [`Self::sync`]; with `receive` (the incoming sockets as the launcher sees them) the
    /// domain starts as a migration target.
    pub(super) async fn sync_as(
        &mut self,
        link: &mut LauncherLink,
        dir: &Path,
        receive: Option<super::migration::Receive>,
    ) -> Option<u64> {
        if !self.pull_images().await {
            return None;
        }
        let prepared = match self.build(dir).await {
            Ok(p) => p,
            Err(e) => {
                self.report_sync_error(&e).await;
                return None;
            }
        };
        let files: Vec<FileAction> = prepared
            .files
            .iter()
            .map(|f| match &self.config.launcher_dir_in_pod {
                Some(in_pod) => f.on_host(in_pod, dir),
                None => f.clone(),
            })
            .collect();
        let pod_dir = dir.to_owned();
        let prepared_files = tokio::task::spawn_blocking(move || {
            prepare_files(&files)?;
            restrict_prepared(&pod_dir, &files);
            Ok::<_, crate::launcher_spec::SpecError>(())
        })
        .await;
        match prepared_files {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                self.report_sync_error(&e).await;
                return None;
            }
            Err(e) => {
                warn!(error = %e, "file preparation task failed");
                return None;
            }
        }
        info!(vmi = %name(&self.current), accel = ?prepared.spec.accel, incoming = receive.is_some(), "starting the domain");
        self.events
            .record(
                &*self.current,
                EventType::Normal,
                "Created",
                "VirtualMachineInstance defined.",
            )
            .await;
        let command = match receive {
            Some(receive) => Command::Receive {
                spec: Box::new(prepared.spec),
                socket: receive.socket,
                block_socket: receive.block_socket,
                block_disks: receive.block_disks,
                post_copy: receive.post_copy,
            },
            None => Command::Sync(Box::new(prepared.spec)),
        };
        link.send(command).await.ok()
    }

    async fn report_sync_error(&mut self, e: &crate::launcher_spec::SpecError) {
        warn!(vmi = %name(&self.current), error = %e, "cannot build the launcher spec");
        self.observe(Observation::SyncFailed(
            e.reason().to_owned(),
            e.to_string(),
        ))
        .await;
    }

    /// Records `observation` and patches the VMI if its status should change.
    ///
    /// A patch that loses a race (its `test` operations fail because another writer changed
    /// the VMI) is rebuilt from a fresh read and retried a few times; when every attempt
    /// fails (the API server restarting, say) the write is owed and retried on the next tick
    /// ([`SYNC_RETRY`]), so the observation is not lost when no further VMI update would wake
    /// this worker.
    async fn observe(&mut self, observation: Observation) {
        self.observation = Some(observation.clone());
        self.status_owed = false;
        let namespace = self.current.metadata.namespace.clone().unwrap_or_default();
        let api: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), &namespace);
        let vmi_name = self.current.metadata.name.clone().unwrap_or_default();
        for attempt in 0..5 {
            let now = crate::now_rfc3339();
            let desired = desired_status(&self.current, &observation, &self.facts, &now);
            let Some(patch) = status_patch(&self.current, &desired) else {
                return;
            };
            debug!(vmi = %name(&self.current), %patch, "patching the VMI status");
            let patch: json_patch::Patch = match serde_json::from_value(patch) {
                Ok(p) => p,
                Err(e) => {
                    warn!(error = %e, "built an invalid status patch");
                    return;
                }
            };
            match api
                .patch(
                    &vmi_name,
                    &PatchParams::default(),
                    &Patch::Json::<()>(patch),
                )
                .await
            {
                Ok(patched) => {
                    if let Some(p) = desired.get("phase").and_then(|p| p.as_str())
                        && Some(p) != phase(&self.current).as_ref().map(|p| p.as_str())
                    {
                        info!(vmi = %name(&self.current), phase = p, "VMI phase changed");
                        if let Some((kind, reason, message)) = phase_event(p) {
                            self.events.record(&patched, kind, reason, message).await;
                        }
                    }
                    self.current = Arc::new(patched);
                    return;
                }
                Err(e) => {
                    debug!(vmi = %name(&self.current), attempt, error = %e, "status patch not applied; re-reading the VMI");
                    match api.get_opt(&vmi_name).await {
                        Ok(Some(fresh)) => self.current = Arc::new(fresh),
                        Ok(None) => return,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }
        }
        warn!(vmi = %name(&self.current), "status patch kept losing races; retrying shortly");
        self.status_owed = true;
    }
}

/// What one launcher session keeps between messages.
struct SessionState {
    /// The id of the `sync` sent to a pending domain.
    sync_id: Option<u64>,
    live_asked: LiveAsk,
    /// The domain as last reported.
    domain: DomainStatus,
    /// The source side of the VMI's migration.
    source: SourceMigration,
}

/// What the worker last asked of a running domain, so a refused change is not asked again
/// until the VMI wants something else.
#[derive(Debug, Default)]
struct LiveAsk {
    /// The VMI's `(cpu.sockets, memory.guest)` at the last look.
    checked: Option<(Option<u32>, Option<String>)>,
    /// The resources last sent.
    resources: Option<LiveResources>,
    /// The VMI's hotplug disks whose files the launcher holds, at the last look.
    disks_checked: Option<Vec<String>>,
    /// The hotplug disks of the spec last sent (unknown at the start of a session).
    disks_sent: Option<Vec<String>>,
    /// The live sync that changes the hotplug disks, with them, until it is acknowledged.
    disk_sync: Option<(u64, Vec<String>)>,
    /// The hotplug disks that sync removes (for the `VolumeUnplugged` Events).
    unplugging: Vec<String>,
    /// The VMI's interface states and Multus reports at the last look ([`nic_key`]).
    nics_checked: Option<Vec<(String, String, bool)>>,
    /// The interfaces (name, link down) of the spec last sent.
    nics_sent: Option<Vec<(String, bool)>>,
    /// The live sync that changes the interfaces, until it is acknowledged.
    nic_sync: Option<u64>,
}

/// What of the VMI decides the domain's interfaces: each interface's state, and whether the
/// pod has its (secondary) pod interface (`multus-status`).
fn nic_key(vmi: &VirtualMachineInstance) -> Vec<(String, String, bool)> {
    let statuses = vmi.status.iter().flat_map(|s| s.interfaces.iter());
    let multus: Vec<&str> = statuses
        .filter(|i| {
            i.info_source
                .as_deref()
                .is_some_and(|s| s.contains("multus-status"))
        })
        .filter_map(|i| i.name.as_deref())
        .collect();
    vmi.spec
        .domain
        .devices
        .interfaces
        .iter()
        .map(|i| {
            let state = i
                .state
                .as_ref()
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            (i.name.clone(), state, multus.contains(&i.name.as_str()))
        })
        .collect()
}

/// The interfaces of a spec, with their link state.
fn spec_nics(spec: &virt_launcher::spec::LauncherSpec) -> Vec<(String, bool)> {
    spec.interfaces
        .iter()
        .map(|i| (i.name.clone(), i.link_down))
        .collect()
}

impl LiveAsk {
    fn is_disk_sync(&self, id: u64) -> bool {
        self.disk_sync.as_ref().is_some_and(|(sync, _)| *sync == id)
    }
}

/// The hotplug volumes of the spec whose files the launcher holds (status `MountedToPod` or
/// `Ready`), in spec order.
fn hotplug_key(vmi: &VirtualMachineInstance) -> Vec<String> {
    vmi.spec
        .volumes
        .iter()
        .filter(|v| crate::launcher_spec::is_hotplug_volume(v))
        .filter(|v| crate::launcher_spec::hotplug_file_passed(vmi, &v.name))
        .map(|v| v.name.clone())
        .collect()
}

/// The hotplug volumes whose status is `Ready` (the domain has them), in spec order.
fn ready_hotplug_volumes(vmi: &VirtualMachineInstance) -> Vec<String> {
    let ready = |name: &str| {
        vmi.status
            .iter()
            .flat_map(|s| s.volume_status.iter())
            .any(|s| s.name == name && s.phase == Some(kubevirt_api::v1::VolumePhase::Ready))
    };
    vmi.spec
        .volumes
        .iter()
        .filter(|v| crate::launcher_spec::is_hotplug_volume(v) && ready(&v.name))
        .map(|v| v.name.clone())
        .collect()
}

fn live_key(vmi: &VirtualMachineInstance) -> (Option<u32>, Option<String>) {
    let domain = &vmi.spec.domain;
    (
        domain.cpu.as_ref().and_then(|c| c.sockets),
        domain
            .memory
            .as_ref()
            .and_then(|m| m.guest.as_ref())
            .map(|q| q.0.clone()),
    )
}

/// The parts of a domain that change while it runs: plugged sockets and the memory asked
/// of the virtio-mem device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LiveResources {
    sockets: u32,
    memory_bytes: u64,
}

impl LiveResources {
    fn of_domain(domain: &DomainStatus) -> Option<Self> {
        Some(Self {
            sockets: domain.cpu?.sockets,
            memory_bytes: domain.memory?.requested_bytes,
        })
    }

    fn of_spec(spec: &virt_launcher::spec::LauncherSpec) -> Self {
        Self {
            sockets: spec.cpu.sockets,
            memory_bytes: spec.memory.guest_bytes + spec.memory.hotplugged_bytes,
        }
    }
}

/// Makes the files `prepare_files` made (disks, kernels, cloud-init images) `0600` and the
/// directories between them and the pod directory `0700`: they were created under the
/// handler's umask, inside the owner-only pod directory.
fn restrict_prepared(pod_dir: &Path, files: &[FileAction]) {
    use virt_launcher::private_fs::{DIR_MODE, FILE_MODE, set_mode};
    for action in files {
        let target = action.target();
        if !target.starts_with(pod_dir) {
            continue;
        }
        if let Err(e) = set_mode(target, FILE_MODE) {
            warn!(path = %target.display(), error = %e, "cannot make a pod file owner-only");
        }
        let mut parent = target.parent();
        while let Some(dir) = parent.filter(|d| d.starts_with(pod_dir) && *d != pod_dir) {
            if let Err(e) = set_mode(dir, DIR_MODE) {
                warn!(path = %dir.display(), error = %e, "cannot make a pod directory owner-only");
            }
            parent = dir.parent();
        }
    }
}

/// Sleeps until `at`; never returns without one (the branch is disabled then).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The final domain state a launcher recorded before exiting, if any.
fn final_state(dir: &std::path::Path) -> Option<virt_launcher::protocol::DomainStatus> {
    let bytes = std::fs::read(dir.join(virt_launcher::protocol::FINAL_STATE_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const NODE: &str = "node01";
    const PODS: &str = "/data/pods";

    fn vmi_with_active_pods(pods: &[(&str, &str)]) -> VirtualMachineInstance {
        let active: BTreeMap<String, String> = pods
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "default"},
            "spec": {"domain": {"devices": {}}},
            "status": {"activePods": active},
        }))
        .expect("vmi")
    }

    #[test]
    fn an_active_pod_uid_on_this_node_names_its_pod_directory() {
        let uid = "6f1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b";
        let vmi = vmi_with_active_pods(&[(uid, "node01")]);
        assert_eq!(
            active_pod_dir(&vmi, NODE, Path::new(PODS)),
            Some(launcher_dir_on_host(Path::new("/data/pods"), uid))
        );
    }

    #[test]
    fn active_pod_keys_that_are_not_uuids_are_never_used_as_paths() {
        for key in [
            "../../../tmp/x",
            "/tmp/x",
            "a/b",
            "..",
            "",
            "pod-alpha",
            "6F1B2A34-5C6D-4E7F-8A9B-0C1D2E3F4A5B",
            "{6f1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b}",
            "6f1b2a345c6d4e7f8a9b0c1d2e3f4a5b",
        ] {
            let vmi = vmi_with_active_pods(&[(key, "node01")]);
            assert_eq!(
                active_pod_dir(&vmi, NODE, Path::new(PODS)),
                None,
                "key {key:?}"
            );
        }
    }

    #[test]
    fn a_bad_key_does_not_hide_a_valid_pod_uid_on_this_node() {
        let uid = "6f1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b";
        let vmi = vmi_with_active_pods(&[("../../x", "node01"), (uid, "node01")]);
        assert_eq!(
            active_pod_dir(&vmi, NODE, Path::new(PODS)),
            Some(launcher_dir_on_host(Path::new("/data/pods"), uid))
        );
    }

    #[test]
    fn prepared_disks_are_owner_only_under_a_permissive_umask() {
        use std::os::unix::fs::PermissionsExt;
        nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        let tmp = tempfile::tempdir().expect("tempdir");
        let pod = tmp.path().join("pod");
        virt_launcher::private_fs::create_dir_all(&pod).expect("pod dir");
        let source = tmp.path().join("image.img");
        std::fs::write(&source, "disk").expect("image");
        let files = vec![
            FileAction::Copy {
                from: source,
                to: pod.join("disks/root.img"),
            },
            FileAction::Sparse {
                path: pod.join("disks/empty.img"),
                size: 1 << 20,
            },
        ];
        prepare_files(&files).expect("prepare");
        restrict_prepared(&pod, &files);
        assert_eq!(mode(&pod.join("disks")), 0o700);
        assert_eq!(mode(&pod.join("disks/root.img")), 0o600);
        assert_eq!(mode(&pod.join("disks/empty.img")), 0o600);
    }

    #[test]
    fn only_a_launcher_reporting_the_vmis_uid_serves_it() {
        let mut vmi = vmi_with_active_pods(&[]);
        vmi.metadata.uid = Some("11111111-2222-4333-8444-555555555555".into());
        assert!(reports_vmi(
            Some("11111111-2222-4333-8444-555555555555"),
            &vmi
        ));
        assert!(!reports_vmi(
            Some("99999999-2222-4333-8444-555555555555"),
            &vmi
        ));
        assert!(!reports_vmi(None, &vmi));
        vmi.metadata.uid = None;
        assert!(!reports_vmi(None, &vmi));
    }

    #[test]
    fn of_two_pods_on_this_node_the_one_whose_launcher_lives_is_followed() {
        let (old, new) = (
            "6f1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b",
            "0a1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b",
        );
        let tmp = tempfile::tempdir().expect("tempdir");
        let (old_dir, new_dir) = (
            launcher_dir_on_host(tmp.path(), old),
            launcher_dir_on_host(tmp.path(), new),
        );
        std::fs::create_dir_all(&old_dir).expect("dir");
        std::fs::create_dir_all(&new_dir).expect("dir");
        std::fs::write(
            old_dir.join(virt_launcher::protocol::FINAL_STATE_FILE),
            "{}",
        )
        .expect("final");
        let vmi = vmi_with_active_pods(&[(old, NODE), (new, NODE)]);
        assert_eq!(
            active_pod_dir(&vmi, NODE, tmp.path()),
            Some(new_dir.clone())
        );
        std::fs::write(PodLayout::new(&new_dir).launcher_socket(), "").expect("socket");
        assert_eq!(active_pod_dir(&vmi, NODE, tmp.path()), Some(new_dir));
    }

    #[test]
    fn pods_on_other_nodes_are_not_followed() {
        let vmi = vmi_with_active_pods(&[("6f1b2a34-5c6d-4e7f-8a9b-0c1d2e3f4a5b", "node02")]);
        assert_eq!(active_pod_dir(&vmi, NODE, Path::new(PODS)), None);
    }
}
