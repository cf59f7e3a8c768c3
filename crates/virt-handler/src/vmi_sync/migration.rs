//! Live migration on the handler's side: the migration proxies, the target's preparation
//! and acknowledgement, and the source's `migrate` (upstream's `migration-source.go`,
//! `migration-target.go` and `migration-proxy/`).
//!
//! Data flow. The migration controller hands a migration over by writing the VMI's
//! `status.migrationState` (`migrationUid`, `sourceNode`, `targetNode`, `targetPod`) and the
//! label `kubevirt.io/migrationTargetNodeName`.
//! - **Target** (the handler of `targetNode`, which watches VMIs with that label, see
//!   [`super::run`]): a target worker ([`Follow::run_target`]) builds the launcher spec as for
//!   a start and sends it to the target pod's launcher as `receive`; QEMU starts with
//!   `-incoming unix:<pod dir>/migration-target.sock` and the domain is `Paused`
//!   (`Migration`). The handler then listens on a TCP port of its own address (upstream's
//!   target proxy) and forwards each connection to that socket, and reports
//!   `targetNodeAddress` and `targetDirectMigrationNodePorts` (`{"<port>": 49152}`, upstream's
//!   direct-migration port). When the incoming migration completes, QEMU resumes the guest
//!   (`Running`, `Migrated`) and the handler acknowledges: `targetNodeDomainDetected`,
//!   `targetNodeDomainReadyTimestamp`, `endTimestamp`, `completed`, `status.nodeName` and the
//!   label `kubevirt.io/nodeName` become this node, and the VMI leaves the source handler's
//!   watch for this one's (event `Migrated`).
//! - **Source** (the handler of `sourceNode`, in its VMI worker, [`SourceMigration`]): once the
//!   target reported its address, it listens on `<pod dir>/migration-source.sock` (upstream's
//!   source proxy) forwarding to the target's port, and sends `migrate` with that socket to its
//!   launcher, with upstream's progress timeout (150 s) and completion timeout (150 s per
//!   started GB of guest memory). It copies `startTimestamp`/`mode` and, on failure,
//!   `failed`, `completed`, `endTimestamp`, `failureReason`, `abortStatus` from the launcher's
//!   migration report; `abortRequested` (the migration deleted after hand-off) sends
//!   `cancelMigration`. After success the source launcher's QEMU quits and the launcher exits,
//!   so the source pod completes.
//!
//! Why proxies ([`crate::migration_proxy`]): QEMU only ever sees a unix socket in its
//! launcher directory, which every handler already reaches; the handlers talk TCP between
//! their own addresses (the pod IPs of the handler pods, which the node network routes between
//! nodes), in mutual TLS with their certificates unless the migration's configuration sets
//! `disableTLS`. This is upstream's design.
//!
//! # Caveats
//! - Local disks (containerDisk overlays, emptyDisks, cloud-init) go with QEMU's block
//!   migration (`blk`, `status.migrationMethod=BlockMigration`) onto the fresh files the target
//!   handler prepares; unshared claims and host disks make the VMI not `LiveMigratable`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use kube::api::{Api, Patch, PatchParams};
use kubevirt_api::constants as c;
use kubevirt_api::events::EventType;
use kubevirt_api::v1::{VirtualMachineInstance, VirtualMachineInstanceMigrationState};
use serde_json::{Value, json};
use tracing::{debug, info, warn};
use virt_launcher::pod_layout::PodLayout;
use virt_launcher::protocol::{
    Command, DomainState, DomainStatus, MigrationJobState, StateReason, UpMessage,
};

use super::link::LauncherLink;
use super::worker::Follow;
use crate::migration_proxy::{MigrationProxy, MigrationTls, source_proxy, target_proxy};

/// Upstream's direct-migration port in the target pod (libvirt's), the value side of
/// `targetDirectMigrationNodePorts`.
pub const DIRECT_MIGRATION_PORT: i32 = 49152;
/// Upstream's block-migration port (the NBD server of the target).
pub const BLOCK_MIGRATION_PORT: i32 = 49153;
/// Upstream's default `progressTimeout` (seconds).
pub const PROGRESS_TIMEOUT_SECONDS: u64 = 150;
/// Upstream's default `completionTimeoutPerGiB` (seconds).
pub const COMPLETION_TIMEOUT_PER_GIB_SECONDS: u64 = 150;

/// The address the handler announces as `targetNodeAddress`: its pod IP, else loopback (a
/// handler sharing the host's network on a one-machine cluster).
pub fn announced_ip(pod_ip: Option<IpAddr>) -> IpAddr {
    pod_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The VMI's migration state.
pub fn state(vmi: &VirtualMachineInstance) -> Option<&VirtualMachineInstanceMigrationState> {
    vmi.status.as_ref()?.migration_state.as_ref()
}

fn open(s: &VirtualMachineInstanceMigrationState) -> bool {
    s.migration_uid.is_some() && s.completed != Some(true) && s.failed != Some(true)
}

/// Whether this node must prepare the VMI's migration target: the open migration targets it
/// and the VMI does not run here yet.
pub fn target_wanted(vmi: &VirtualMachineInstance, node: &str) -> bool {
    let here = vmi.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
    vmi.metadata.deletion_timestamp.is_none()
        && !here
        && !super::worker::is_final(vmi)
        && state(vmi).is_some_and(|s| open(s) && s.target_node.as_deref() == Some(node))
}

/// Upstream's completion timeout: `completionTimeoutPerGiB` × the guest memory in GB
/// (decimal, rounded up, as `ScaledValue(Giga)`).
pub fn completion_timeout_seconds(guest_bytes: u64, per_gib: u64) -> u64 {
    guest_bytes.div_ceil(1_000_000_000).max(1) * per_gib
}

/// What the source applies, from the `migrationConfiguration` the controller handed over
/// (upstream's defaults where it says nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationOptions {
    /// `progressTimeout`.
    pub progress_timeout_seconds: u64,
    /// `completionTimeoutPerGiB` × guest GB.
    pub completion_timeout_seconds: u64,
    /// `bandwidthPerMigration` in bytes per second (0: no cap).
    pub bandwidth_bytes_per_second: u64,
    /// `allowAutoConverge`.
    pub auto_converge: bool,
    /// `allowPostCopy`.
    pub post_copy: bool,
}

impl MigrationOptions {
    /// The options of `config` for a guest of `guest_bytes`.
    pub fn of(config: Option<&kubevirt_api::v1::MigrationConfiguration>, guest_bytes: u64) -> Self {
        let seconds =
            |v: Option<i64>, default: u64| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default);
        let per_gib = seconds(
            config.and_then(|c| c.completion_timeout_per_gi_b),
            COMPLETION_TIMEOUT_PER_GIB_SECONDS,
        );
        let bandwidth = config
            .and_then(|c| c.bandwidth_per_migration.as_ref())
            .and_then(|q| kubevirt_api::quantity::Quantity::try_from(q).ok())
            .and_then(|q| u64::try_from(q.value()).ok())
            .unwrap_or(0);
        MigrationOptions {
            progress_timeout_seconds: seconds(
                config.and_then(|c| c.progress_timeout),
                PROGRESS_TIMEOUT_SECONDS,
            ),
            completion_timeout_seconds: completion_timeout_seconds(guest_bytes, per_gib),
            bandwidth_bytes_per_second: bandwidth,
            auto_converge: config.and_then(|c| c.allow_auto_converge).unwrap_or(false),
            post_copy: config.and_then(|c| c.allow_post_copy).unwrap_or(false),
        }
    }
}

/// `~` and `/` escaped for a JSON Pointer.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// JSON Patch operations setting `fields` of `migrationState`, guarded by a `test` of the
/// migration UID.
pub fn state_ops(uid: &str, fields: &[(&str, Value)]) -> Vec<Value> {
    let mut ops =
        vec![json!({"op": "test", "path": "/status/migrationState/migrationUid", "value": uid})];
    ops.extend(fields.iter().map(
        |(k, v)| json!({"op": "add", "path": format!("/status/migrationState/{k}"), "value": v}),
    ));
    ops
}

/// Applies a JSON Patch to the VMI.
pub async fn patch_vmi(
    client: &kube::Client,
    vmi: &VirtualMachineInstance,
    ops: Vec<Value>,
) -> Result<VirtualMachineInstance, kube::Error> {
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
    let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let api: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), ns);
    api.patch(
        vmi.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await
}

/// How a migration target's domain starts: its sockets as the launcher sees them and the
/// disks a block migration fills.
#[derive(Debug, Clone)]
pub struct Receive {
    /// Where QEMU listens for the memory.
    pub socket: String,
    /// Where QEMU serves the disks over NBD (block migration only).
    pub block_socket: Option<String>,
    /// The disks (volume names) the source copies.
    pub block_disks: Vec<String>,
    /// The source may switch to post-copy (`allowPostCopy`).
    pub post_copy: bool,
}

/// The source side of the VMI's current migration, kept by its worker's launcher session.
#[derive(Debug, Default)]
pub struct SourceMigration {
    uid: String,
    proxy: Option<MigrationProxy>,
    block_proxy: Option<MigrationProxy>,
    migrate_id: Option<u64>,
    cancel_sent: bool,
    start_reported: bool,
    post_copy_reported: bool,
    end_reported: bool,
}

impl Follow {
    /// One look at the source side of the VMI's migration (after a VMI update or a domain
    /// event): start it, report its progress, abort it. `Err` when the connection broke.
    pub(super) async fn source_step(
        &mut self,
        link: &mut LauncherLink,
        dir: &Path,
        domain: &DomainStatus,
        src: &mut SourceMigration,
    ) -> Result<(), ()> {
        let node = self.config.node_name.clone();
        let Some(st) = state(&self.current).cloned() else {
            return Ok(());
        };
        if !open(&st) || st.source_node.as_deref() != Some(node.as_str()) {
            return Ok(());
        }
        let uid = st.migration_uid.clone().unwrap_or_default();
        if src.uid != uid {
            *src = SourceMigration {
                uid: uid.clone(),
                ..SourceMigration::default()
            };
        }
        if src.end_reported {
            return Ok(());
        }
        let info = domain
            .migration
            .as_ref()
            .filter(|_| src.migrate_id.is_some());
        if let Some(info) = info {
            if !src.start_reported && st.start_timestamp.is_none() {
                let ops = state_ops(
                    &uid,
                    &[
                        ("startTimestamp", json!(crate::now_rfc3339())),
                        ("mode", json!("PreCopy")),
                    ],
                );
                self.patch_migration(ops).await;
                src.start_reported = true;
            }
            if info.post_copy && !src.post_copy_reported {
                // Upstream's `migrationState.mode` once the source switched.
                let ops = state_ops(&uid, &[("mode", json!("PostCopy"))]);
                self.patch_migration(ops).await;
                src.post_copy_reported = true;
            }
            if info.state == MigrationJobState::Failed {
                let reason = info.failure_reason.clone().unwrap_or_default();
                self.report_source_failure(&st, &reason, info.abort_requested)
                    .await;
                src.end_reported = true;
                src.proxy = None;
                return Ok(());
            }
        }
        if st.abort_requested == Some(true) {
            if src.migrate_id.is_none() {
                // Nothing was sent yet: the migration ends here, aborted.
                self.report_source_failure(&st, "Live migration has been aborted", true)
                    .await;
                src.end_reported = true;
            } else if !src.cancel_sent && info.is_some_and(|i| i.state == MigrationJobState::Active)
            {
                info!(vmi = %self.name(), "aborting the live migration");
                link.send(Command::CancelMigration).await.map_err(drop)?;
                src.cancel_sent = true;
                self.events
                    .record(
                        &*self.current,
                        EventType::Normal,
                        "Migrating",
                        "VirtualMachineInstance is aborting migration.",
                    )
                    .await;
            }
            return Ok(());
        }
        if src.migrate_id.is_some() || domain.state != DomainState::Running {
            return Ok(());
        }
        self.start_source(link, dir, &st, src).await
    }

    /// Starts the migration once the target has reported where it listens: the source
    /// proxies, then `migrate`. `Err` when the connection broke.
    async fn start_source(
        &mut self,
        link: &mut LauncherLink,
        dir: &Path,
        st: &VirtualMachineInstanceMigrationState,
        src: &mut SourceMigration,
    ) -> Result<(), ()> {
        let port_of = |wanted: i32| {
            st.target_direct_migration_node_ports
                .iter()
                .filter(|(_, to)| **to == wanted)
                .find_map(|(p, _)| p.parse::<u16>().ok())
        };
        let (Some(address), Some(port)) = (
            st.target_node_address
                .as_deref()
                .and_then(|a| a.parse::<IpAddr>().ok()),
            port_of(DIRECT_MIGRATION_PORT),
        ) else {
            return Ok(()); // the target is not ready yet
        };
        let (disks, _) = super::status::migratable::volumes_to_copy(&self.current);
        let block_port = port_of(BLOCK_MIGRATION_PORT);
        if !disks.is_empty() && block_port.is_none() {
            return Ok(()); // the target has not exported its disks yet
        }
        let target = SocketAddr::new(address, port);
        let layout = PodLayout::new(dir);
        let tls = self.migration_tls(st);
        let proxies = source_proxy(&layout.migration_source_socket(), target, tls.clone())
            .and_then(|p| {
                let block = match block_port.filter(|_| !disks.is_empty()) {
                    Some(bp) => Some(source_proxy(
                        &layout.migration_source_block_socket(),
                        SocketAddr::new(address, bp),
                        tls,
                    )?),
                    None => None,
                };
                Ok((p, block))
            });
        match proxies {
            Ok((proxy, block)) => {
                src.proxy = Some(proxy);
                src.block_proxy = block;
            }
            Err(e) => {
                warn!(vmi = %self.name(), error = %e, "cannot start the migration source proxy");
                self.report_source_failure(st, &format!("migration proxy: {e}"), false)
                    .await;
                src.end_reported = true;
                return Ok(());
            }
        }
        let in_pod = PodLayout::new(self.config.launcher_dir_in_pod.as_deref().unwrap_or(dir));
        let socket = in_pod.migration_source_socket();
        let block_socket = (!disks.is_empty())
            .then(|| in_pod.migration_source_block_socket().display().to_string());
        let guest_bytes = self.facts.spec.as_ref().map_or(0, |s| s.memory.guest_bytes);
        let options = MigrationOptions::of(st.migration_configuration.as_ref(), guest_bytes);
        info!(vmi = %self.name(), %target, ?options, "starting the live migration");
        let id = link
            .send(Command::Migrate {
                uri: format!("unix:{}", socket.display()),
                progress_timeout_seconds: options.progress_timeout_seconds,
                completion_timeout_seconds: options.completion_timeout_seconds,
                bandwidth_bytes_per_second: options.bandwidth_bytes_per_second,
                block_socket,
                block_disks: disks,
                auto_converge: options.auto_converge,
                post_copy: options.post_copy,
            })
            .await
            .map_err(drop)?;
        src.migrate_id = Some(id);
        self.events
            .record(
                &*self.current,
                EventType::Normal,
                "Migrating",
                "VirtualMachineInstance is migrating.",
            )
            .await;
        Ok(())
    }

    /// The TLS of this migration's proxies: the handler's, unless the configuration handed
    /// over with the migration sets `disableTLS` (both handlers read the same one).
    fn migration_tls(&self, st: &VirtualMachineInstanceMigrationState) -> Option<MigrationTls> {
        let disabled = st
            .migration_configuration
            .as_ref()
            .and_then(|c| c.disable_tls)
            .unwrap_or(false);
        if disabled {
            return None;
        }
        self.config.migration_tls.clone()
    }

    /// The launcher refused command `id`: a refused `migrate` fails the migration.
    pub(super) async fn source_refused(
        &mut self,
        id: u64,
        message: &str,
        src: &mut SourceMigration,
    ) {
        if src.migrate_id != Some(id) || src.end_reported {
            return;
        }
        if let Some(st) = state(&self.current).cloned() {
            self.report_source_failure(&st, message, false).await;
        }
        src.end_reported = true;
        src.proxy = None;
    }

    async fn report_source_failure(
        &mut self,
        st: &VirtualMachineInstanceMigrationState,
        reason: &str,
        aborted: bool,
    ) {
        let uid = st.migration_uid.clone().unwrap_or_default();
        let now = crate::now_rfc3339();
        let mut fields = vec![
            ("failed", json!(true)),
            ("completed", json!(true)),
            ("endTimestamp", json!(now)),
            ("failureReason", json!(reason)),
        ];
        if st.start_timestamp.is_none() {
            fields.push(("startTimestamp", json!(now)));
        }
        if aborted {
            fields.push(("abortStatus", json!("Succeeded")));
        }
        warn!(vmi = %self.name(), %reason, "the live migration failed");
        self.patch_migration(state_ops(&uid, &fields)).await;
        let message = format!("VirtualMachineInstance migration uid {uid} failed. reason:{reason}");
        self.events
            .record(&*self.current, EventType::Warning, "Migrated", &message)
            .await;
    }

    async fn patch_migration(&mut self, ops: Vec<Value>) {
        match patch_vmi(&self.client, &self.current, ops).await {
            Ok(patched) => self.current = std::sync::Arc::new(patched),
            Err(e) => warn!(vmi = %self.name(), error = %e, "cannot update the migration state"),
        }
    }

    /// Follows the VMI as the target of its migration until the domain runs here (or the
    /// migration is over).
    pub(super) async fn run_target(&mut self) {
        let node = self.config.node_name.clone();
        loop {
            if !target_wanted(&self.current, &node) {
                return;
            }
            let dir =
                super::worker::active_pod_dir(&self.current, &node, &self.config.kubelet_pods_dir);
            let Some(dir) = dir else {
                if !self.wait_change(Some(super::worker::RETRY)).await {
                    return;
                }
                continue;
            };
            match LauncherLink::connect(&PodLayout::new(&dir).launcher_socket()).await {
                Ok(link) if super::worker::serves(&link, &self.current) => {
                    if self.target_session(link, &dir).await {
                        return;
                    }
                }
                Ok(_) => {
                    warn!(vmi = %self.name(), "the target pod's launcher does not run this VMI");
                    if !self.wait_change(None).await {
                        return;
                    }
                }
                Err(e) => {
                    debug!(vmi = %self.name(), error = %e, "target launcher not up yet");
                    if !self.wait_change(Some(super::worker::RETRY)).await {
                        return;
                    }
                }
            }
        }
    }

    /// One connection to the target launcher; true when the target's work is done.
    async fn target_session(&mut self, mut link: LauncherLink, dir: &Path) -> bool {
        self.facts.pod_interface = link.pod_interface().cloned();
        let node = self.config.node_name.clone();
        let in_pod = self
            .config
            .launcher_dir_in_pod
            .clone()
            .unwrap_or_else(|| dir.to_owned());
        let in_pod = PodLayout::new(&in_pod);
        let (disks, _) = super::status::migratable::volumes_to_copy(&self.current);
        let receive = Receive {
            socket: in_pod.migration_target_socket().display().to_string(),
            block_socket: (!disks.is_empty())
                .then(|| in_pod.migration_target_block_socket().display().to_string()),
            block_disks: disks,
            post_copy: state(&self.current)
                .and_then(|s| s.migration_configuration.as_ref())
                .and_then(|c| c.allow_post_copy)
                .unwrap_or(false),
        };
        let mut receive_id = None;
        // The target listens only once the launcher acknowledged `receive` (its disks are
        // exported then) and the domain waits for the memory.
        let mut received = false;
        let mut proxy: Option<Vec<MigrationProxy>> = None;
        let mut retry = tokio::time::interval(std::time::Duration::from_secs(10));
        retry.reset();
        let mut domain = DomainStatus::pending();
        loop {
            tokio::select! {
                message = link.recv() => match message {
                    None => return false,
                    Some(UpMessage::Domain(status)) => {
                        domain = status;
                        if domain.state == DomainState::Pending && receive_id.is_none() {
                            receive_id = self.sync_as(&mut link, dir, Some(receive.clone())).await;
                        }
                        if received && domain.state == DomainState::Paused && domain.reason == StateReason::Migration && proxy.is_none() {
                            proxy = self.announce_target(dir, receive.block_socket.is_some()).await;
                        }
                        if domain.state == DomainState::Running {
                            self.acknowledge_target().await;
                            return true;
                        }
                        if domain.is_final() {
                            warn!(vmi = %self.name(), state = ?domain.state, message = ?domain.message, "the migration target domain ended");
                            return true;
                        }
                    }
                    Some(UpMessage::Ack { id, result: Err(message) }) if Some(id) == receive_id => {
                        warn!(vmi = %self.name(), %message, "the target launcher refused the spec");
                        receive_id = None;
                    }
                    Some(UpMessage::Ack { id, result: Ok(_) }) if Some(id) == receive_id => {
                        received = true;
                        if domain.state == DomainState::Paused && domain.reason == StateReason::Migration && proxy.is_none() {
                            proxy = self.announce_target(dir, receive.block_socket.is_some()).await;
                        }
                    }
                    Some(_) => {}
                },
                changed = self.vmi.changed() => {
                    if changed.is_err() {
                        return true;
                    }
                    self.current = self.vmi.borrow_and_update().clone();
                    if !target_wanted(&self.current, &node) {
                        if domain.state != DomainState::Running {
                            info!(vmi = %self.name(), "the migration is over without this target; stopping the target domain");
                            let _ = link.send(Command::Kill).await;
                        }
                        return true;
                    }
                }
                _ = retry.tick() => {
                    if domain.state == DomainState::Pending && receive_id.is_none() {
                        receive_id = self.sync_as(&mut link, dir, Some(receive.clone())).await;
                    }
                }
            }
        }
    }

    /// Starts the target proxies (memory, and disks for a block migration) and reports where
    /// they listen.
    async fn announce_target(&mut self, dir: &Path, block: bool) -> Option<Vec<MigrationProxy>> {
        let ip = announced_ip(self.config.migration_ip);
        let layout = PodLayout::new(dir);
        let mut wanted = vec![(layout.migration_target_socket(), DIRECT_MIGRATION_PORT)];
        if block {
            wanted.push((layout.migration_target_block_socket(), BLOCK_MIGRATION_PORT));
        }
        let tls = state(&self.current).and_then(|st| self.migration_tls(st));
        let mut proxies = Vec::new();
        let mut ports = serde_json::Map::new();
        for (socket, to) in wanted {
            match target_proxy(ip, socket, tls.clone()).await {
                Ok((port, proxy)) => {
                    proxies.push(proxy);
                    ports.insert(port.to_string(), json!(to));
                }
                Err(e) => {
                    warn!(vmi = %self.name(), error = %e, "cannot start the migration target proxy");
                    return None;
                }
            }
        }
        let listed: Vec<&String> = ports.keys().collect();
        let port = listed
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let uid = state(&self.current)
            .and_then(|s| s.migration_uid.clone())
            .unwrap_or_default();
        let ops = state_ops(
            &uid,
            &[
                ("targetNodeAddress", json!(ip.to_string())),
                (
                    "targetDirectMigrationNodePorts",
                    Value::Object(ports.clone()),
                ),
                ("targetNodeDomainDetected", json!(false)),
            ],
        );
        let tls = tls.is_some();
        info!(vmi = %self.name(), %ip, ports = %port, tls, "migration target listening");
        self.patch_migration(ops).await;
        let message = format!("Migration Target is listening at {ip}, on ports: {port}");
        self.events
            .record(
                &*self.current,
                EventType::Normal,
                "PreparingTarget",
                &message,
            )
            .await;
        Some(proxies)
    }

    /// The domain runs here: the migration is complete and the VMI moves to this node.
    async fn acknowledge_target(&mut self) {
        let node = self.config.node_name.clone();
        let uid = state(&self.current)
            .and_then(|s| s.migration_uid.clone())
            .unwrap_or_default();
        let now = crate::now_rfc3339();
        let mut ops = state_ops(
            &uid,
            &[
                ("targetNodeDomainDetected", json!(true)),
                ("targetNodeDomainReadyTimestamp", json!(now)),
                ("endTimestamp", json!(now)),
                ("completed", json!(true)),
            ],
        );
        ops.push(json!({"op": "replace", "path": "/status/nodeName", "value": node}));
        ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", escape(c::NODE_NAME_LABEL)), "value": node}));
        if self
            .current
            .status
            .as_ref()
            .is_some_and(|s| s.evacuation_node_name.is_some())
        {
            ops.push(json!({"op": "remove", "path": "/status/evacuationNodeName"}));
        }
        info!(vmi = %self.name(), node = %node, "the VMI migrated to this node");
        self.patch_migration(ops).await;
        let message = format!("The VirtualMachineInstance migrated to node {node}.");
        self.events
            .record(&*self.current, EventType::Normal, "Migrated", &message)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_completion_timeout_is_per_started_gigabyte_as_upstream() {
        assert_eq!(completion_timeout_seconds(0, 150), 150);
        assert_eq!(
            completion_timeout_seconds(1 << 30, 150),
            300,
            "1Gi is 2 GB rounded up"
        );
        assert_eq!(completion_timeout_seconds(64 << 20, 150), 150);
    }

    #[test]
    fn the_handed_over_configuration_sets_the_options_and_defaults_fill_the_rest() {
        let defaults = MigrationOptions::of(None, 128 << 20);
        assert_eq!(
            defaults,
            MigrationOptions {
                progress_timeout_seconds: 150,
                completion_timeout_seconds: 150,
                bandwidth_bytes_per_second: 0,
                auto_converge: false,
                post_copy: false,
            }
        );
        let config: kubevirt_api::v1::MigrationConfiguration = serde_json::from_value(json!({
            "bandwidthPerMigration": "1Mi", "progressTimeout": 20, "completionTimeoutPerGiB": 10,
            "allowAutoConverge": true, "allowPostCopy": true
        }))
        .expect("config");
        let set = MigrationOptions::of(Some(&config), 3_000_000_000);
        assert_eq!(
            set,
            MigrationOptions {
                progress_timeout_seconds: 20,
                completion_timeout_seconds: 30,
                bandwidth_bytes_per_second: 1 << 20,
                auto_converge: true,
                post_copy: true,
            }
        );
    }

    #[test]
    fn only_an_open_migration_targeting_this_node_is_prepared_here() {
        let vmi = |node: &str, state: Value| -> VirtualMachineInstance {
            serde_json::from_value(json!({
                "metadata": {"name": "a", "namespace": "default"},
                "spec": {"domain": {"devices": {}}},
                "status": {"phase": "Running", "nodeName": node, "migrationState": state},
            }))
            .expect("vmi")
        };
        let open = json!({"migrationUid": "u", "targetNode": "node02"});
        assert!(target_wanted(&vmi("node01", open.clone()), "node02"));
        assert!(!target_wanted(&vmi("node01", open.clone()), "node03"));
        assert!(
            !target_wanted(&vmi("node02", open), "node02"),
            "already here"
        );
        let done = json!({"migrationUid": "u", "targetNode": "node02", "completed": true});
        assert!(!target_wanted(&vmi("node01", done), "node02"));
    }
}
