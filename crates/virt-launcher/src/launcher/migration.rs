//! The outgoing live migration of the running domain (upstream's `live-migration-source.go`,
//! with QMP instead of libvirt).
//!
//! [`start`] sends QMP `migrate` to the URI virt-handler gives (its migration proxy's unix
//! socket in the launcher directory) and spawns a monitor that polls `query-migrate` every
//! 400 ms, as upstream's monitor polls the job: progress is the remaining RAM shrinking below
//! its previous low; no progress for the progress timeout, or no completion within the
//! completion timeout, aborts (`migrate_cancel`) with upstream's messages. Every change goes
//! into [`crate::protocol::DomainStatus::migration`]. On completion QEMU is told to quit: the
//! domain ends `Shutoff`/`Migrated` and the launcher exits, so the source pod completes.
//! [`cancel`] is upstream's abort: `migrate_cancel`, reported as the failure reason
//! "Live migration has been aborted".
//!
//! Block migration (local disks) is libvirt's NBD scheme: the target serves its fresh disks
//! over NBD ([`export_disks`], on a unix socket the handlers proxy), the source mirrors each
//! disk there (`blockdev-mirror`, `write-blocking`) and starts the memory migration once every
//! mirror is in sync; after the switch-over the mirrors are ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::domain::{Intent, Shared};
use crate::protocol::{MigrationInfo, MigrationJobState};
use crate::qmp::QmpClient;

/// How often the migration job is polled (upstream's monitor interval).
const POLL: Duration = Duration::from_millis(400);
/// Upstream's failure reason of an aborted migration.
pub const ABORTED: &str = "Live migration has been aborted";

/// Upstream's limits — no progress for `progress_timeout`, or not completed after
/// `completion_timeout` (zero: no limit) — and the bandwidth cap (`bandwidthPerMigration`;
/// zero leaves QEMU's default).
#[derive(Debug, Clone)]
pub(super) struct Options {
    pub progress_timeout: Duration,
    pub completion_timeout: Duration,
    pub bandwidth_bytes_per_second: u64,
    /// `allowAutoConverge`: QEMU's `auto-converge` capability.
    pub auto_converge: bool,
    /// `allowPostCopy`: `postcopy-ram`, and a switch to post-copy when the completion timeout
    /// passes (instead of the abort).
    pub post_copy: bool,
    /// Block migration: the target's NBD socket (as this launcher sees the handler's proxy)
    /// and the format nodes to mirror there before the memory goes.
    pub mirror: Option<(String, Vec<String>)>,
}

/// How long mirror jobs may take to settle after the switch-over.
const MIRROR_SETTLE: Duration = Duration::from_secs(10);

fn mirror_node(node: &str) -> String {
    format!("migration-{node}")
}

/// The target of a block migration: QEMU serves `nodes` over NBD on the unix socket `socket`
/// (upstream's libvirt does the same with `nbd-server-start` before the memory arrives).
pub(super) async fn export_disks(
    qmp: &QmpClient,
    socket: &str,
    nodes: &[String],
) -> Result<(), String> {
    qmp.execute(
        "nbd-server-start",
        Some(json!({"addr": {"type": "unix", "data": {"path": socket}}})),
    )
    .await
    .map_err(|e| e.to_string())?;
    for node in nodes {
        qmp.execute(
            "block-export-add",
            Some(json!({"type": "nbd", "id": mirror_node(node), "node-name": node, "name": node, "writable": true})),
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    tracing::info!(
        ?nodes,
        socket,
        "disks exported for the incoming block migration"
    );
    Ok(())
}

/// Mirrors every node to the target's export of the same name (`blockdev-mirror`, full sync,
/// writes blocking until they reached both sides, as libvirt migrates non-shared disks).
async fn start_mirrors(qmp: &QmpClient, socket: &str, nodes: &[String]) -> Result<(), String> {
    for node in nodes {
        let target = mirror_node(node);
        qmp.execute(
            "blockdev-add",
            Some(json!({"driver": "nbd", "node-name": target, "export": node,
                "server": {"type": "unix", "path": socket}})),
        )
        .await
        .map_err(|e| e.to_string())?;
        qmp.execute(
            "blockdev-mirror",
            Some(
                json!({"job-id": target, "device": node, "target": target, "sync": "full",
                "copy-mode": "write-blocking", "auto-dismiss": false}),
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The mirror jobs' state: `Ok(true)` when every one is ready (in sync), `Err` when one is gone.
async fn mirrors_ready(qmp: &QmpClient, nodes: &[String]) -> Result<bool, String> {
    let jobs = qmp
        .execute("query-block-jobs", None)
        .await
        .map_err(|e| e.to_string())?;
    let jobs = jobs.as_array().cloned().unwrap_or_default();
    let mut ready = true;
    for node in nodes {
        let id = mirror_node(node);
        let job = jobs
            .iter()
            .find(|j| j.get("device").and_then(Value::as_str) == Some(id.as_str()))
            .ok_or_else(|| format!("the mirror of {node} ended"))?;
        if let Some(error) = job.get("error").and_then(Value::as_str) {
            return Err(format!("the mirror of {node} failed: {error}"));
        }
        ready &= job.get("ready").and_then(Value::as_bool) == Some(true);
    }
    Ok(ready)
}

/// Ends the mirror jobs (the target keeps what they copied) and removes their NBD nodes.
async fn stop_mirrors(qmp: &QmpClient, nodes: &[String]) {
    for node in nodes {
        let id = mirror_node(node);
        if let Err(e) = qmp
            .execute(
                "block-job-cancel",
                Some(json!({"device": id, "force": true})),
            )
            .await
        {
            tracing::debug!(node, error = %e, "block-job-cancel");
        }
    }
    let deadline = Instant::now() + MIRROR_SETTLE;
    while Instant::now() < deadline {
        let jobs = qmp
            .execute("query-block-jobs", None)
            .await
            .unwrap_or_default();
        let concluded = jobs.as_array().is_none_or(|jobs| {
            jobs.iter()
                .all(|j| j.get("status").and_then(Value::as_str) == Some("concluded"))
        });
        if concluded {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for node in nodes {
        let id = mirror_node(node);
        let _ = qmp.execute("job-dismiss", Some(json!({"id": id}))).await;
        let _ = qmp
            .execute("blockdev-del", Some(json!({"node-name": id})))
            .await;
    }
}

/// Readies an incoming QEMU for a migration that may switch to post-copy: `postcopy-ram` must
/// be set on both ends before the migration starts.
pub(super) async fn accept_post_copy(qmp: &QmpClient) -> Result<(), String> {
    set_capabilities(qmp, &[("postcopy-ram", true)]).await
}

async fn set_capabilities(qmp: &QmpClient, capabilities: &[(&str, bool)]) -> Result<(), String> {
    let list: Vec<Value> = capabilities
        .iter()
        .map(|(capability, state)| json!({"capability": capability, "state": state}))
        .collect();
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": list})),
    )
    .await
    .map(drop)
    .map_err(|e| format!("migrate-set-capabilities: {e}"))
}

async fn begin_memory(qmp: &QmpClient, uri: &str, options: &Options) -> Result<(), String> {
    let capabilities: Vec<(&str, bool)> = [
        ("auto-converge", options.auto_converge),
        ("postcopy-ram", options.post_copy),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .collect();
    if !capabilities.is_empty() {
        set_capabilities(qmp, &capabilities).await?;
    }
    if options.bandwidth_bytes_per_second > 0 {
        qmp.execute(
            "migrate-set-parameters",
            Some(json!({"max-bandwidth": options.bandwidth_bytes_per_second})),
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    qmp.execute("migrate", Some(json!({"uri": uri})))
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(
        uri,
        bandwidth = options.bandwidth_bytes_per_second,
        auto_converge = options.auto_converge,
        post_copy = options.post_copy,
        "memory migration started"
    );
    Ok(())
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Starts the migration to `uri`; a migration already under way is left alone.
pub(super) async fn start(
    shared: &Arc<Shared>,
    qmp: Option<Arc<QmpClient>>,
    uri: &str,
    options: Options,
) -> Result<(), String> {
    let current = shared.current();
    if current.is_final() {
        return Err("the domain has ended".to_owned());
    }
    if current
        .migration
        .as_ref()
        .is_some_and(|m| m.state == MigrationJobState::Active)
    {
        return Ok(());
    }
    let Some(qmp) = qmp else {
        return fake_outgoing(shared, uri).await;
    };
    let mut options = options;
    if options.post_copy && options.mirror.as_ref().is_some_and(|(_, n)| !n.is_empty()) {
        // QEMU 7.2 fails to start post-copy while mirror jobs hold the disks ("postcopy failed
        // to start"), so a block migration stays pre-copy (and its completion timeout aborts).
        tracing::info!("block migration: post-copy is not used");
        options.post_copy = false;
    }
    match &options.mirror {
        Some((socket, nodes)) if !nodes.is_empty() => {
            tracing::info!(?nodes, "block migration: mirroring the disks first");
            start_mirrors(&qmp, socket, nodes).await.inspect_err(|_| {
                let (qmp, nodes) = (Arc::clone(&qmp), nodes.clone());
                tokio::spawn(async move { stop_mirrors(&qmp, &nodes).await });
            })?;
        }
        _ => begin_memory(&qmp, uri, &options).await?,
    }
    shared.set_migration(|m| {
        *m = Some(MigrationInfo {
            state: MigrationJobState::Active,
            started_at: now(),
            ended_at: None,
            failure_reason: None,
            abort_requested: false,
            post_copy: false,
        });
    });
    tokio::spawn(monitor(Arc::clone(shared), qmp, uri.to_owned(), options));
    Ok(())
}

/// Asks QEMU to abort the outgoing migration; ignored when none is under way.
pub(super) async fn cancel(
    shared: &Arc<Shared>,
    qmp: Option<Arc<QmpClient>>,
) -> Result<(), String> {
    let active = shared
        .current()
        .migration
        .is_some_and(|m| m.state == MigrationJobState::Active);
    if !active {
        return Ok(());
    }
    shared.set_migration(|m| {
        if let Some(m) = m {
            m.abort_requested = true;
        }
    });
    if let Some(qmp) = qmp {
        // Also fine while the disks are still being mirrored (the monitor ends the mirrors).
        qmp.execute("migrate_cancel", None)
            .await
            .map_err(|e| e.to_string())?;
    }
    tracing::info!("live migration abort requested");
    Ok(())
}

fn end(shared: &Shared, state: MigrationJobState, reason: Option<String>) {
    shared.set_migration(|m| {
        if let Some(m) = m {
            m.state = state;
            m.ended_at = Some(now());
            m.failure_reason = reason;
        }
    });
}

/// Follows the job until it ends.
async fn monitor(shared: Arc<Shared>, qmp: Arc<QmpClient>, uri: String, options: Options) {
    let nodes = options
        .mirror
        .as_ref()
        .map(|(_, n)| n.clone())
        .unwrap_or_default();
    if !nodes.is_empty()
        && let Err(reason) = mirror_phase(&shared, &qmp, &uri, &options, &nodes).await
    {
        tracing::warn!(%reason, "block migration ended without success");
        stop_mirrors(&qmp, &nodes).await;
        end(&shared, MigrationJobState::Failed, Some(reason));
        return;
    }
    let started = Instant::now();
    let mut low_water = u64::MAX;
    let mut last_progress = Instant::now();
    let mut abort_reason: Option<String> = None;
    let mut switched_to_post_copy = false;
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        let info = match qmp.execute("query-migrate", None).await {
            Ok(info) => info,
            Err(e) => {
                tracing::warn!(error = %e, "query-migrate failed; the migration is given up");
                end(
                    &shared,
                    MigrationJobState::Failed,
                    Some(format!("query-migrate: {e}")),
                );
                return;
            }
        };
        let status = info.get("status").and_then(Value::as_str).unwrap_or("");
        match status {
            "completed" => {
                tracing::info!(elapsed = ?started.elapsed(), "live migration completed; QEMU quits");
                if !nodes.is_empty() {
                    stop_mirrors(&qmp, &nodes).await;
                }
                end(&shared, MigrationJobState::Completed, None);
                shared.set_intent(Intent::Migrated);
                if let Err(e) = qmp.quit().await {
                    tracing::warn!(error = %e, "cannot tell QEMU to quit after the migration");
                }
                return;
            }
            "failed" | "cancelled" => {
                let aborted = shared
                    .current()
                    .migration
                    .is_some_and(|m| m.abort_requested);
                let reason = if aborted || status == "cancelled" {
                    abort_reason.clone().unwrap_or_else(|| ABORTED.to_owned())
                } else {
                    info.get("error-desc")
                        .and_then(Value::as_str)
                        .unwrap_or("migration failed")
                        .to_owned()
                };
                tracing::warn!(status, %reason, "live migration ended without success");
                if !nodes.is_empty() {
                    stop_mirrors(&qmp, &nodes).await;
                }
                end(&shared, MigrationJobState::Failed, Some(reason));
                return;
            }
            _ => {}
        }
        if abort_reason.is_some() || switched_to_post_copy {
            // Past the switch to post-copy there is nothing to abort: the guest runs on the
            // target.
            continue;
        }
        let remaining = info
            .pointer("/ram/remaining")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        if remaining < low_water {
            low_water = remaining;
            last_progress = Instant::now();
        }
        if options.post_copy
            && !options.completion_timeout.is_zero()
            && started.elapsed() > options.completion_timeout
            && switch_to_post_copy(&shared, &qmp).await
        {
            switched_to_post_copy = true;
            continue;
        }
        let reason = timed_out(&options, last_progress.elapsed(), started.elapsed());
        if let Some(reason) = reason {
            tracing::warn!(%reason, "aborting the live migration");
            abort_reason = Some(reason);
            if let Err(e) = qmp.execute("migrate_cancel", None).await {
                tracing::warn!(error = %e, "migrate_cancel failed");
            }
        }
    }
}

/// Upstream: a migration allowed to switch to post-copy does so when it would be aborted for
/// its completion timeout. False when QEMU refused (the migration is aborted then).
async fn switch_to_post_copy(shared: &Shared, qmp: &QmpClient) -> bool {
    let switched = qmp.execute("migrate-start-postcopy", None).await;
    match switched {
        Ok(_) => {
            tracing::info!("switched the migration to post-copy");
            shared.set_migration(|m| {
                if let Some(m) = m {
                    m.post_copy = true;
                }
            });
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot switch to post-copy; aborting");
            false
        }
    }
}

/// Waits until every mirror is in sync, then starts the memory migration; `Err` with the
/// failure reason when a mirror fails, the migration is aborted or the timeouts pass.
async fn mirror_phase(
    shared: &Shared,
    qmp: &QmpClient,
    uri: &str,
    options: &Options,
    nodes: &[String],
) -> Result<(), String> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(POLL);
    loop {
        tick.tick().await;
        if shared
            .current()
            .migration
            .is_some_and(|m| m.abort_requested)
        {
            return Err(ABORTED.to_owned());
        }
        // A migration allowed to switch to post-copy does so in the memory phase instead.
        if !options.post_copy
            && !options.completion_timeout.is_zero()
            && started.elapsed() > options.completion_timeout
        {
            return Err(format!(
                "Aborting migration: not completed after {} seconds",
                started.elapsed().as_secs()
            ));
        }
        if mirrors_ready(qmp, nodes).await? {
            tracing::info!(elapsed = ?started.elapsed(), "disks in sync; migrating the memory");
            return begin_memory(qmp, uri, options).await;
        }
    }
}

/// Fake QEMU, target side: listens on the incoming socket and runs on (`Running`, `Migrated`)
/// once a source has connected and closed its stream, as a real incoming migration ends.
pub(super) fn fake_incoming(shared: &Arc<Shared>, socket: &str) -> Result<(), String> {
    use tokio::io::AsyncReadExt;
    let _ = std::fs::remove_file(socket);
    let listener = crate::unix_socket::bind(std::path::Path::new(socket))
        .map_err(|e| format!("cannot listen on {socket}: {e}"))?;
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut received = Vec::new();
        if stream.read_to_end(&mut received).await.is_ok() && !received.is_empty() {
            tracing::info!(bytes = received.len(), "fake incoming migration completed");
            shared.transition(
                crate::protocol::DomainState::Running,
                crate::protocol::StateReason::Migrated,
            );
        }
    });
    Ok(())
}

/// Fake QEMU, source side: sends a token stream to `uri` (`unix:<path>`), then ends as a
/// migrated domain.
async fn fake_outgoing(shared: &Arc<Shared>, uri: &str) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let path = uri.strip_prefix("unix:").unwrap_or(uri);
    shared.set_migration(|m| {
        *m = Some(MigrationInfo {
            state: MigrationJobState::Active,
            started_at: now(),
            ended_at: None,
            failure_reason: None,
            abort_requested: false,
            post_copy: false,
        });
    });
    let sent = async {
        let mut stream = crate::unix_socket::connect(std::path::Path::new(path)).await?;
        stream.write_all(b"fake migration stream").await?;
        stream.shutdown().await
    }
    .await;
    match sent {
        Ok(()) => {
            end(shared, MigrationJobState::Completed, None);
            shared.set_intent(Intent::Migrated);
            shared.transition(
                crate::protocol::DomainState::Shutoff,
                crate::protocol::StateReason::Migrated,
            );
        }
        Err(e) => end(
            shared,
            MigrationJobState::Failed,
            Some(format!("fake migration: {e}")),
        ),
    }
    Ok(())
}

/// Upstream's monitor decisions 3 and 4: the abort reason when no progress was made for the
/// progress timeout or the migration has not completed within the completion timeout.
fn timed_out(options: &Options, stuck: Duration, elapsed: Duration) -> Option<String> {
    if !options.progress_timeout.is_zero() && stuck > options.progress_timeout {
        Some(format!(
            "Aborting migration: stuck for {} seconds",
            stuck.as_secs()
        ))
    } else if !options.completion_timeout.is_zero() && elapsed > options.completion_timeout {
        Some(format!(
            "Aborting migration: not completed after {} seconds",
            elapsed.as_secs()
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_or_overlong_migration_is_aborted_with_upstreams_messages() {
        let options = Options {
            progress_timeout: Duration::from_secs(150),
            completion_timeout: Duration::from_secs(300),
            bandwidth_bytes_per_second: 0,
            auto_converge: false,
            post_copy: false,
            mirror: None,
        };
        let s = Duration::from_secs;
        assert_eq!(timed_out(&options, s(10), s(10)), None);
        assert_eq!(
            timed_out(&options, s(151), s(200)).as_deref(),
            Some("Aborting migration: stuck for 151 seconds")
        );
        assert_eq!(
            timed_out(&options, s(1), s(301)).as_deref(),
            Some("Aborting migration: not completed after 301 seconds")
        );
        let unlimited = Options {
            progress_timeout: Duration::ZERO,
            completion_timeout: Duration::ZERO,
            ..options
        };
        assert_eq!(timed_out(&unlimited, s(1000), s(1000)), None);
    }
}
